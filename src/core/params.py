"""Typed view of params.yaml: one pydantic model per section, unknown or missing keys rejected.

Each stage loads only the sections it reads, one typed call each
(`cfg = load_params(TrainParams)` returns a `TrainParams`), and dvc.yaml lists exactly those
keys, so DVC re-runs a stage exactly when something it reads has changed.

Every call validates the **whole** file, so a typo in `export` fails the first stage, not the
last one hours later. Types are strict (`epochs: "5"`, `seed: true`, `shared_vocab: "yes"` are
refused, not coerced), infinities and NaN are refused, duplicate keys are refused, and
cross-field rules (`d_model` divisible by `n_heads`, distinct source/target columns) are
checked here rather than deep inside a stage.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Hashable
from pathlib import Path
from typing import ClassVar, Literal, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from src.core import paths
from src.core.errors import PipelineError

_noted: set[str] = set()
# a registered model version, by alias or by number (train.init_from; src/core/registry.py)
MODEL_URI = re.compile(
    r"models:/(?P<name>[^/@\s]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>\d+))")


def _note_once(message: str) -> None:
    if message not in _noted:
        _noted.add(message)
        print(f"note: {message}", file=sys.stderr)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
    section: ClassVar[str]  # its name in params.yaml


class PairParams(Section):
    """Which language is which, and where each sits in the corpus TSV."""

    section: ClassVar[str] = "pair"
    source_lang: str = Field(min_length=2)
    target_lang: str = Field(min_length=2)
    source_column: int = Field(ge=0)
    target_column: int = Field(ge=0)

    @model_validator(mode="after")
    def _distinct_columns(self):
        if self.source_column == self.target_column:
            raise ValueError("source_column and target_column must differ")
        return self

    def column_of(self, lang: str) -> int:
        """The TSV column of `lang`'s side, `lang` one of the pair's two languages."""
        return self.source_column if lang == self.source_lang else self.target_column


class Entry(BaseModel):
    """A mapping inside a section (a list item): same strictness, optional keys have defaults."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class HubSource(Entry):
    """A dataset repo on the Hugging Face Hub, read at one revision, and where its two sides sit:
    a column of {lang: text} dicts (`translation`, as OPUS-100 and WMT have it), two plain
    text columns (`columns: [source, target]`), or two configs joined on an id column
    (`configs: [source, target]`, as FLORES+ has one config per language)."""

    id: str = Field(pattern=r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # owner/name
    config: str = ""  # "" for a repo with one (default) config, and with `configs`
    split: str = Field(min_length=1)
    revision: str = Field(min_length=1)  # a commit pins the bytes; a branch is resolved once
    translation: str = ""  # column holding {lang: text} dicts
    keys: list[str] = []  # that dict's [source, target] keys; []: the pair's languages
    columns: list[str] = []  # [source, target] plain text columns
    configs: list[str] = []  # [source, target] configs, rows joined on `join_on`
    join_on: str = "id"
    text: str = "text"  # the text column of each of `configs`

    @model_validator(mode="after")
    def _one_layout(self):
        given = [k for k in ("translation", "columns", "configs") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("say where the two sides are with exactly one of translation "
                             f"(a column of {{lang: text}} dicts), columns or configs (got "
                             f"{', '.join(given) or 'none'})")
        for key in ("keys", "columns", "configs"):
            if getattr(self, key) and len(getattr(self, key)) != 2:
                raise ValueError(f"{key} must name two: [source, target]")
        if self.keys and not self.translation:
            raise ValueError("keys name the translation dict's keys: set translation too")
        if self.configs and self.config:
            raise ValueError("with configs (one per side) leave config empty")
        return self

    def described(self) -> str:
        config = self.config or "+".join(self.configs)
        return f"{self.id} ({config + ', ' if config else ''}{self.split}, {self.revision})"


class CorpusSpec(Entry):
    """One training corpus: a name, exactly one source (`url` or `hub`), and its weight in the
    mix (see src/data/mixing.py: each kept training pair is taken `weight` times, in the data
    or, with `per_epoch`, drawn by the train stage each epoch)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=64)
    url: str = ""  # as download.url: zip, TSV, or one file per language with {lang}
    hub: HubSource | None = None
    member: str = ""  # file inside a zip; "" picks the largest .txt/.tsv member
    sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")  # pins this corpus's TSV
    weight: float = Field(1.0, gt=0)
    # true: the weight is drawn afresh each epoch (train.seed, epoch) instead of fixed in the
    # data, so at a weight below 1 a large corpus (a dictionary) shows a new part every epoch
    per_epoch: bool = False
    # true: only ever in the training part, never in valid or test (a cedict dictionary always
    # is: its entries are words, not the sentences the valid and test splits measure)
    train_only: bool = False
    max_pairs: int = Field(0, ge=0)  # > 0: a seeded sample of this many lines, in corpus order
    seed: int = 0  # the sample's seed
    # tsv: a corpus of pairs; cedict: CC-CEDICT's text (plain or gzip), each English gloss
    # paired with its simplified headword (src/data/cedict.py), sha256 then pins that file
    format: Literal["tsv", "cedict"] = "tsv"
    max_gloss_words: int = Field(5, ge=1)  # cedict: longer glosses are explanations, dropped

    @model_validator(mode="after")
    def _one_source(self):
        if self.format == "cedict" and "train_only" in self.model_fields_set and not \
                self.train_only:
            raise ValueError(f"corpus '{self.name}': a cedict dictionary is always train_only")
        if bool(self.url) == bool(self.hub):
            raise ValueError(f"corpus '{self.name}' needs exactly one source: url or hub")
        if self.format == "cedict" and "{lang}" in self.url:
            raise ValueError(f"corpus '{self.name}': a cedict dictionary is one file, not one "
                             "per language ({lang})")
        if self.format != "cedict" and "max_gloss_words" in self.model_fields_set:
            raise ValueError(f"corpus '{self.name}': max_gloss_words is for format cedict")
        if self.name == "test":
            raise ValueError("'test' names the predefined test set; call the corpus otherwise")
        if self.hub and (self.member or self.sha256):
            raise ValueError(f"corpus '{self.name}': member and sha256 are for url sources; a "
                             "hub source is pinned by its revision")
        return self


class TestSetSpec(Entry):
    """A named test set, scored on its own by evaluate beside the test split: a name and exactly
    one source: `url` (as download.url), `hub` (as a corpus's) or `sacrebleu`, one of
    sacreBLEU's named sets (e.g. wmt20) in the direction of `pair.*`."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_]*$", max_length=64)
    url: str = ""
    hub: HubSource | None = None
    sacrebleu: str = ""
    member: str = ""  # file inside a zip url
    # tsv: pairs as they are; hsk: the HSK sentence set's JSON (src/data/hsk.py), its `part`
    # (dev or test) without the rows whose side the corpus `unseen_in` holds
    format: Literal["tsv", "hsk"] = "tsv"
    part: Literal["", "dev", "test"] = ""
    unseen_in: str = ""  # hsk: a corpus name of download.corpora ("corpus" for download.url)
    sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")  # tsv: the TSV; hsk: the JSON file

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("url", "hub", "sacrebleu") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"test set '{self.name}' needs exactly one source: url, hub or "
                             f"sacrebleu (got {', '.join(given) or 'none'})")
        if self.name == "test":
            raise ValueError("'test' names the test split; call the test set otherwise")
        if self.sha256 and not self.url:
            raise ValueError(f"test set '{self.name}': sha256 pins a url source")
        if self.format == "hsk":
            if not self.url or not self.part:
                raise ValueError(f"test set '{self.name}': format hsk reads a url and needs "
                                 "part: dev or test")
        elif self.part or self.unseen_in:
            raise ValueError(f"test set '{self.name}': part and unseen_in are for format hsk")
        return self


class DownloadParams(Section):
    section: ClassVar[str] = "download"
    url: str  # "{lang}" in it: one text file per language; "" when `corpora` lists them
    # Several corpora, mixed by weight (each: name, url or hub, weight, max_pairs); [] reads
    # `url` alone, as the corpus named "corpus" with `member` and `sha256` below
    corpora: list[CorpusSpec] = []
    test_url: str  # a predefined test set in the same forms; "": split carves one out
    # Named test sets, each scored on its own beside the test split (name + url, hub or
    # sacrebleu); training pairs whose source is in any of them are dropped
    test_sets: list[TestSetSpec] = []
    member: str  # file inside a zip archive; "" picks the largest .txt/.tsv member
    timeout_s: float = Field(gt=0)  # deadline per file (a stalled read fails sooner)
    max_bytes: int = Field(gt=0)  # cap on a downloaded payload and on an unzipped member
    sha256: str = Field(pattern=r"^([0-9a-f]{64})?$")  # pins the corpus TSV; "": not pinned

    @model_validator(mode="after")
    def _url_or_corpora(self):
        if bool(self.url) == bool(self.corpora):
            raise ValueError("set either url (one corpus) or corpora (a list), not "
                             + ("both" if self.url else "neither"))
        if self.corpora and (self.member or self.sha256):
            raise ValueError("with corpora, give member and sha256 inside each corpus")
        for what, names in (("corpora", [c.name for c in self.corpora]),
                            ("test sets", [t.name for t in self.test_sets])):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"two {what} are named '{twice[0]}'; names must be unique")
        corpus_names = [c.name for c in self.corpus_list()]
        for spec in self.test_sets:
            if spec.unseen_in and spec.unseen_in not in corpus_names:
                raise ValueError(f"test set '{spec.name}': unseen_in names no corpus (the "
                                 f"corpora: {', '.join(corpus_names)})")
        return self

    def corpus_list(self) -> list[CorpusSpec]:
        """The corpora to read: `corpora`, or `url` as a list of one named "corpus"."""
        if self.corpora:
            return list(self.corpora)
        return [CorpusSpec(name="corpus", url=self.url, member=self.member, sha256=self.sha256)]


class SplitParams(Section):
    section: ClassVar[str] = "split"
    seed: int
    valid_size: float = Field(gt=0)  # < 1: fraction of source sentences; >= 1: their count
    test_size: float = Field(gt=0)
    max_chars: int = Field(gt=0)  # longer lines (either side) are dropped and counted
    # share of the training source sentences kept (seeded; valid and test are the same whatever
    # it is): a parent trained on part of the data, then fine-tuned on all of it
    train_fraction: float = Field(default=1.0, gt=0, le=1)

    @field_validator("valid_size", "test_size")
    @classmethod
    def _fraction_or_count(cls, value: float) -> float:
        if value >= 1 and value != int(value):
            raise ValueError("must be a fraction below 1 or a whole count of sentences")
        return value


class TokenizeParams(Section):
    section: ClassVar[str] = "tokenize"
    vocab_size: int = Field(ge=32)
    shared_vocab: bool
    model_type: Literal["unigram", "bpe"]
    character_coverage: float = Field(gt=0, le=1)
    byte_fallback: bool  # rare characters become byte pieces instead of <unk>
    # SentencePiece's text normalisation. "identity" keeps the text as written: nmt_nfkc would
    # turn Chinese fullwidth punctuation (？！，) into ASCII, which the references do not use.
    normalization: Literal["identity", "nmt_nfkc", "nfkc"]
    seed: int
    # SentencePiece learns from a seeded sample of at most this many sentences (both sides
    # together): its memory grows with the sample, not with the corpus.
    max_sentences: int = Field(ge=1000)
    num_proc: int = Field(ge=0)  # processes encoding a large split; 0: one per core


class ModelParams(Section):
    section: ClassVar[str] = "model"
    d_model: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    n_layers: int = Field(gt=0)
    ffn_dim: int = Field(gt=0)
    dropout: float = Field(ge=0, lt=1)
    pre_norm: bool
    max_positions: int = Field(gt=0)
    tie_embeddings: bool
    decoder_layerdrop: float = Field(ge=0, lt=1)  # chance a decoder layer is skipped in training
    decoder_layers: int = Field(ge=0)  # 0: as many as n_layers

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(f"d_model ({self.d_model}) must be n_heads ({self.n_heads}) times "
                             "an even head size")
        return self


class TrainParams(Section):
    section: ClassVar[str] = "train"
    seed: int
    epochs: int = Field(gt=0)
    max_steps: int = Field(ge=0)  # 0: no cap
    max_tokens: int = Field(gt=0)  # source+target tokens per batch (before accumulation)
    accumulation_steps: int = Field(gt=0)
    lr: float = Field(gt=0)
    warmup_steps: int = Field(ge=0)
    schedule: Literal["inverse_sqrt", "cosine"]
    weight_decay: float = Field(ge=0)
    label_smoothing: float = Field(ge=0, lt=1)
    # R-Drop: each batch runs twice (two dropout masks) and the symmetric KL between the two
    # predictions, times this, joins the loss; a step costs about twice as much; 0: off
    rdrop_alpha: float = Field(ge=0)
    # extra pairs per epoch, as a fraction of the corpus, each joining two random training
    # pairs (concatenation augmentation: length and position variety); 0: off
    concat_ratio: float = Field(ge=0, le=4)
    # subword regularisation: each epoch a training sentence takes one of its 32 best
    # SentencePiece segmentations, P ∝ P(seg)^alpha (0.1-0.5 typical); 0: the best one always
    subword_alpha: float = Field(ge=0, le=1)
    # the first N epochs also train on every pair reversed (needs tokenize.shared_vocab); 0: off
    bidirectional_epochs: int = Field(ge=0)
    # probability that a decoder-input subword is replaced by <unk> in training; 0: off
    target_word_dropout: float = Field(ge=0, lt=1)
    clip_norm: float = Field(ge=0)  # 0: no clipping
    max_minutes: float = Field(ge=0)  # training-time budget (validation excluded); 0: none
    # What ranks epochs for early stopping, best.pt and averaging: greedy BLEU on the valid split
    # (what users care about; the lowest-loss epoch is often not the best-BLEU one) or its loss.
    select_by: Literal["bleu", "loss"]
    patience: int = Field(ge=0)  # epochs without valid improvement before stopping; 0: never
    average_best: int = Field(ge=1)  # model.pt averages the N best epoch checkpoints
    threads: int = Field(ge=0)  # torch intra-op threads per process; 0: all cores / ranks
    log_every_steps: int = Field(gt=0)
    # > 1: train starts itself under torchrun with this many data-parallel ranks (DDP) here
    nproc_per_node: int = Field(ge=1)
    # auto: bf16 autocast where the CPU multiplies bf16 natively (AMX, AVX-512 BF16), fp32 with
    # TF32 matmuls on a GPU, fp32 elsewhere; weights and checkpoints stay fp32
    precision: Literal["auto", "fp32", "bf16"]
    # the process's malloc: auto = tcmalloc where the machine has it (the stage restarts itself
    # with it preloaded), glibc's otherwise; tcmalloc = an error without it; system = never
    # preload. Speed only: the numbers are the same bits (src/training/host_memory.py)
    allocator: Literal["auto", "tcmalloc", "system"] = "auto"
    # batch widths (source, target) padded up to a multiple of this, so a run meets a few
    # dozen distinct batch shapes instead of hundreds; 1: pad to the longest sentence only
    length_multiple: int = Field(ge=1, le=64)
    # greedy valid BLEU lets an output reach ratio x source tokens + 10 (evaluate's rule)
    valid_max_length_ratio: float = Field(gt=0)
    # where training starts: "" random weights; a model.pt of ours (its tokenizer/ beside it);
    # or a registered version, models:/<name>@<alias> or models:/<name>/<version> (the parent
    # stage resolves it to models/parent/, and the finetune section's recipe applies)
    init_from: str = ""

    @field_validator("init_from")
    @classmethod
    def _init_from_form(cls, value: str) -> str:
        value = value.strip()
        if value.startswith("models:/") and not MODEL_URI.fullmatch(value):
            raise ValueError(f"{value!r} is not a registered model: write "
                             "models:/<name>@<alias> or models:/<name>/<version>")
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data):
        """`average_last` was the old name of `average_best` (it always averaged the best
        epochs): still read, with one line saying so."""
        if isinstance(data, dict) and "average_last" in data:
            data = dict(data)
            old = data.pop("average_last")
            if "average_best" in data and data["average_best"] != old:
                raise ValueError("train.average_last is the old name of train.average_best and "
                                 "both are set to different values: keep average_best only")
            data.setdefault("average_best", old)
            _note_once("params.yaml: train.average_last is now train.average_best (it averages "
                       "the best epochs, not the last); rename it")
        return data


class FinetuneParams(Section):
    """The recipe of a run that starts from a trained model (train.init_from set): the optimizer
    and schedule restart (fairseq's --reset-optimizer), with these instead of train.lr,
    warmup_steps, epochs and bidirectional_epochs."""

    section: ClassVar[str] = "finetune"
    lr: float = Field(gt=0)
    warmup_steps: int = Field(ge=0)
    epochs: int = Field(gt=0)
    bidirectional_epochs: int = Field(ge=0)


class EvaluateParams(Section):
    section: ClassVar[str] = "evaluate"
    beam_size: int = Field(ge=1)
    length_penalty: float = Field(ge=0)
    max_length_ratio: float = Field(gt=0)  # output may be up to ratio * source + 10 tokens
    batch_size: int = Field(gt=0)
    num_samples: int = Field(ge=0)  # sample translations logged to MLflow


class ExportParams(Section):
    section: ClassVar[str] = "export"
    opset: int = Field(ge=18, le=23)  # ONNX opset of the exported subgraphs (dynamo: 18+)
    quantize: bool  # also write models/model.int8.onnx (int8 weights), with its own BLEU
    fp16: bool  # also write models/model.fp16.onnx (float16, runs on CUDA only)
    parity_sentences: int = Field(gt=0)  # test sentences decoded by both PyTorch and ORT
    beam_size: int = Field(ge=1)  # beam of the parity check; infer's default beam too
    length_penalty: float = Field(ge=0)
    max_length_ratio: float = Field(gt=0)  # output may be up to ratio * source + 10 tokens
    batch_size: int = Field(gt=0)  # sentences per session.run in the checks
    min_beam_parity: float = Field(ge=0, le=1)  # greedy must match 100%; beam may tie-break
    # BLEU and chrF points the int8 file may lose against model.onnx on the test split, or
    # export fails and writes neither (a broken quantization loses far more)
    max_int8_drop: float = Field(ge=0)


SECTIONS: dict[str, type[Section]] = {
    cls.section: cls
    for cls in (PairParams, DownloadParams, SplitParams, TokenizeParams, ModelParams,
                TrainParams, FinetuneParams, EvaluateParams, ExportParams)
}
S = TypeVar("S", bound=Section)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML loader that refuses a key given twice (PyYAML silently keeps the last one).

    `deep` is passed through as PyYAML gives it: keys are scalars and the safe loader builds
    the same plain dicts and lists either way, so its mutants are equivalent (no mutate)."""

    def construct_object(self, node, deep=False):  # pragma: no mutate
        """A tag that does not fit its text (`!!int x`, `!!bool maybe`, `!!timestamp now`)
        makes PyYAML raise ValueError, KeyError, …: a YAML error at the node's line instead."""
        try:
            return super().construct_object(node, deep)  # pragma: no mutate
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read this {node.tag} ({type(exc).__name__}: {exc})",
                node.start_mark) from None

    def construct_mapping(self, node, deep=False):  # pragma: no mutate
        if not isinstance(node, yaml.MappingNode):  # `!!map [1]`: PyYAML names the line
            return super().construct_mapping(node, deep)  # pragma: no mutate
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)  # pragma: no mutate
            if not isinstance(key, Hashable):
                break  # a list or mapping as a key: PyYAML's own error names its line
            if key in seen:
                raise PipelineError(f"params.yaml line {key_node.start_mark.line + 1}: "
                                    f"duplicate key {_quoted(key)}")
            seen.add(key)
        return super().construct_mapping(node, deep)  # pragma: no mutate


def _quoted(key) -> str:
    """A key as a message shows it, 'name', with a newline, a tab or any other character that
    would break the one-line message escaped as repr escapes it."""
    text = str(key)
    return f"'{text if text.isprintable() else repr(text)[1:-1]}'"


def read_yaml(path: Path | None = None) -> dict:
    path = Path(path or paths.PARAMS)
    try:
        # codec names are case-insensitive; None is the locale's, UTF-8 on our machines
        text = path.read_text(encoding="utf-8")  # pragma: no mutate
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise PipelineError(f"params file not found: {path}") from None
    except UnicodeDecodeError:
        raise PipelineError(f"{path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise PipelineError(f"{path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(raw, dict):
        raise PipelineError(f"{path} must be a mapping of sections")
    unknown = sorted(set(raw) - set(SECTIONS), key=str)
    if unknown:
        raise PipelineError(f"params.yaml: unknown section '{unknown[0]}'")
    return raw


def _validate(kind: type[S], raw: dict) -> S:
    name = kind.section
    if name not in raw:
        raise PipelineError(f"params.yaml: missing section '{name}'")
    values = raw[name]
    if not isinstance(values, dict):
        raise PipelineError(f"params.yaml: section '{name}' must be a mapping")
    try:
        return kind(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _quoted(".".join([name, *(str(p) for p in err["loc"])]))
        error = err["type"]
        if error == "extra_forbidden":
            raise PipelineError(f"params.yaml: unknown key {key}") from None
        if error == "missing":
            raise PipelineError(f"params.yaml: missing key {key}") from None
        message = err["msg"].removeprefix("Value error, ")
        got = f" (got {err['input']!r})" if err["loc"] else ""
        raise PipelineError(f"params.yaml: bad value for {key}: {message}{got}") from None


def load_params(kind: type[S], path: Path | None = None) -> S:
    """One section of params.yaml, after validating every section of the file.

    Errors name the offending key, e.g. `params.yaml: bad value for 'train.lr'`.
    """
    raw = read_yaml(path)
    for section in SECTIONS.values():
        _validate(section, raw)
    return _validate(kind, raw)
