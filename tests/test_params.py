"""The typed params loader: the committed file loads; unknown, missing and bad keys are named."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from src.core.errors import PipelineError
from src.core.params import SECTIONS, ModelParams, TrainParams, load_params

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def committed() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def test_committed_params_load_every_section():
    for name, kind in SECTIONS.items():
        assert isinstance(load_params(kind, path=REPO / "params.yaml"), kind), name


def test_unknown_key_is_named(tmp_path):
    raw = committed()
    raw["train"]["learning_rate"] = 0.1
    with pytest.raises(PipelineError, match=r"unknown key 'train\.learning_rate'"):
        load_params(TrainParams, path=write(tmp_path, raw))


def test_missing_key_is_named(tmp_path):
    raw = committed()
    del raw["model"]["d_model"]
    with pytest.raises(PipelineError, match=r"missing key 'model\.d_model'"):
        load_params(ModelParams, path=write(tmp_path, raw))


def test_bad_value_is_named(tmp_path):
    raw = committed()
    raw["train"]["epochs"] = "many"
    with pytest.raises(PipelineError, match=r"bad value for 'train\.epochs'"):
        load_params(TrainParams, path=write(tmp_path, raw))
    raw["train"]["epochs"] = 0
    with pytest.raises(PipelineError, match=r"train\.epochs"):
        load_params(TrainParams, path=write(tmp_path, raw))


def test_unknown_section_and_missing_file(tmp_path):
    raw = committed()
    raw["trian"] = {}
    with pytest.raises(PipelineError, match="unknown section 'trian'"):
        load_params(TrainParams, path=write(tmp_path, raw))
    with pytest.raises(PipelineError, match="params file not found"):
        load_params(TrainParams, path=tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "section, key, value, fragment",
    [
        ("train", "epochs", "5", "train.epochs"),  # a string is not coerced to a number
        ("train", "seed", True, "train.seed"),  # nor a bool to an int
        ("tokenize", "shared_vocab", "yes", "tokenize.shared_vocab"),
        ("split", "valid_size", 1.7, "fraction below 1 or a whole count"),
        ("split", "test_size", float("inf"), "split.test_size"),  # used to be OverflowError
        ("train", "lr", float("nan"), "train.lr"),
    ],
)
def test_values_are_strictly_typed_not_coerced(tmp_path, section, key, value, fragment):
    raw = committed()
    raw[section][key] = value
    with pytest.raises(PipelineError, match=fragment.replace(".", r"\.")):
        load_params(SECTIONS[section], path=write(tmp_path, raw))


def test_duplicate_keys_are_refused(tmp_path):
    text = (REPO / "params.yaml").read_text(encoding="utf-8")
    path = tmp_path / "params.yaml"
    path.write_text(text.replace("  epochs:", "  epochs: 2\n  epochs:", 1), encoding="utf-8")
    with pytest.raises(PipelineError, match="duplicate key 'epochs'"):
        load_params(TrainParams, path=path)


def test_heads_that_do_not_divide_the_width_are_refused_at_load(tmp_path):
    raw = committed()
    raw["model"].update(d_model=30, n_heads=4)
    with pytest.raises(PipelineError, match=r"bad value for 'model': d_model \(30\)") as info:
        load_params(ModelParams, path=write(tmp_path, raw))
    assert str(info.value).endswith("times an even head size")  # across keys: no value shown


def test_equal_source_and_target_columns_are_refused(tmp_path):
    raw = committed()
    raw["pair"]["target_column"] = raw["pair"]["source_column"]
    with pytest.raises(PipelineError, match="source_column and target_column must differ"):
        load_params(SECTIONS["pair"], path=write(tmp_path, raw))


def test_a_typo_in_a_later_section_fails_the_first_stage(tmp_path):
    """download reads only pair/download, yet a bad export key stops it (not hours later)."""
    raw = committed()
    raw["export"]["opset"] = "eighteen"
    with pytest.raises(PipelineError, match=r"export\.opset"):
        load_params(SECTIONS["download"], path=write(tmp_path, raw))


def test_the_old_name_average_last_is_read_as_average_best_with_a_note(tmp_path, capsys,
                                                                     monkeypatch):
    """Renamed because it averages the best epochs, not the last; old params.yaml files and
    `dvc exp run -S train.average_last=N` still work."""
    from src.core import params

    monkeypatch.setattr(params, "_noted", set())  # the note is said once per process
    raw = committed()
    raw["train"]["average_last"] = raw["train"].pop("average_best") - 3
    cfg = load_params(TrainParams, path=write(tmp_path, raw))
    assert cfg.average_best == committed()["train"]["average_best"] - 3
    assert "train.average_last is now train.average_best" in capsys.readouterr().err
    # both names, different values: which one was meant is unknown
    raw["train"]["average_best"] = raw["train"]["average_last"] + 1
    with pytest.raises(PipelineError, match="average_last is the old name"):
        load_params(TrainParams, path=write(tmp_path, raw))


def test_the_file_level_errors_say_exactly_what_is_wrong(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"train:\n  seed: 0 # " + "中".encode("gbk"))
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=path)
    assert str(info.value) == f"{path} is not UTF-8 text"
    path.write_text("train: [unclosed\n  seed: 0\n", encoding="utf-8")
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=path)
    assert str(info.value).startswith(f"{path} is not valid YAML: ")
    assert "\n" not in str(info.value) and "  " in str(info.value)  # one line, spaces kept
    path.write_text("- a list\n", encoding="utf-8")
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=path)
    assert str(info.value) == f"{path} must be a mapping of sections"


def test_section_errors_name_the_section(tmp_path):
    raw = committed()
    raw[1] = {}  # a section name YAML reads as a number sorts with the others, by text
    raw["zeta"] = {}
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=write(tmp_path, raw))
    assert str(info.value) == "params.yaml: unknown section '1'"
    raw = committed()
    del raw["export"]
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=write(tmp_path, raw))
    assert str(info.value) == "params.yaml: missing section 'export'"
    raw = committed()
    raw["export"] = [1, 2]
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=write(tmp_path, raw))
    assert str(info.value) == "params.yaml: section 'export' must be a mapping"


def test_a_bad_value_is_shown_beside_its_key_and_a_duplicate_names_its_line(tmp_path):
    raw = committed()
    raw["train"]["epochs"] = "many"
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=write(tmp_path, raw))
    assert str(info.value).startswith("params.yaml: bad value for 'train.epochs': ")
    assert str(info.value).endswith(" (got 'many')")
    path = tmp_path / "params.yaml"
    path.write_text("pair:\n  source_lang: en\n  source_lang: de\n", encoding="utf-8")
    with pytest.raises(PipelineError) as info:
        load_params(TrainParams, path=path)
    assert str(info.value) == "params.yaml line 3: duplicate key 'source_lang'"


def test_the_renamed_key_note_is_said_once_per_process(tmp_path, capsys, monkeypatch):
    from src.core import params

    monkeypatch.setattr(params, "_noted", set())
    raw = committed()
    raw["train"]["average_last"] = raw["train"].pop("average_best")
    for _ in range(3):
        load_params(TrainParams, path=write(tmp_path, raw))
    assert capsys.readouterr().err.count("train.average_last is now") == 1


def test_a_hub_source_is_described_by_its_config_or_configs():
    from src.core.params import HubSource

    base = {"id": "org/set", "split": "train", "revision": "main"}
    assert HubSource(**base, config="en-zh", translation="t").described() == (
        "org/set (en-zh, train, main)")
    assert HubSource(**base, translation="t").described() == "org/set (train, main)"
    assert HubSource(**base, configs=["eng_Latn", "cmn_Hans"]).described() == (
        "org/set (eng_Latn+cmn_Hans, train, main)")


def test_a_plain_url_is_the_corpus_list_of_one_named_corpus():
    from src.core.params import DownloadParams

    digest = "ab" * 32
    data = committed()["download"] | {"url": "data/c.zip", "member": "c.txt", "sha256": digest}
    (only,) = DownloadParams(**data).corpus_list()
    assert (only.name, only.url, only.member, only.sha256) == ("corpus", "data/c.zip", "c.txt",
                                                               digest)
    corpora = [{"name": "a", "url": "a.tsv"}, {"name": "b", "url": "b.tsv", "weight": 2}]
    mixed = data | {"url": "", "member": "", "sha256": "", "corpora": corpora, "test_sets": []}
    assert [c.name for c in DownloadParams(**mixed).corpus_list()] == ["a", "b"]


def test_a_yaml_tag_that_does_not_fit_names_the_tag_and_the_python_error(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train:\n  lr: !!int x\n", encoding="utf-8")
    with pytest.raises(PipelineError) as caught:
        load_params(TrainParams, path=path)
    message = str(caught.value)
    assert "cannot read this tag:yaml.org,2002:int (ValueError: invalid literal" in message
    assert "line 2" in message and "\n" not in message


def test_keys_that_are_not_printable_are_shown_escaped_on_one_line(tmp_path):
    data = committed()
    data["train"]["a\nb\\c"] = 1
    with pytest.raises(PipelineError) as caught:
        load_params(TrainParams, path=write(tmp_path, data))
    assert str(caught.value) == "params.yaml: unknown key 'train.a\\nb\\\\c'"
    data["train"] = committed()["train"] | {"back\\slash": 2}
    with pytest.raises(PipelineError) as caught:
        load_params(TrainParams, path=write(tmp_path, data))
    assert str(caught.value) == "params.yaml: unknown key 'train.back\\slash'"  # printable
    data["train"] = committed()["train"] | {"x'y": 2}
    with pytest.raises(PipelineError) as caught:
        load_params(TrainParams, path=write(tmp_path, data))
    assert "unknown key 'train.x'y'" in str(caught.value)


def test_a_yaml_syntax_error_is_one_line_with_single_spaces_for_line_breaks(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train: [1, 2\n", encoding="utf-8")
    with pytest.raises(PipelineError) as caught:
        load_params(TrainParams, path=path)
    assert str(caught.value).startswith(f"{path} is not valid YAML: while parsing a flow "
                                        f"sequence   in ")
