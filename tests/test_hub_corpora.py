"""Corpora from Hub dataset repos and several corpora mixed by weight: the download and split
stages as users run them, with only the network replaced (a pre-filled Hub cache read with
HF_HUB_OFFLINE=1, or a loopback server answering the Hub's API)."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest
from conftest import SHARED_DATA
from helpers import (
    assert_one_line_error,
    run_stage,
    scratch_root,
    stage_imports_torch,
    write_pairs,
)
from hub_repos import (
    flores_like,
    offline_env,
    opus_like,
    parquet,
    put_repo,
    readme,
    wmt_like,
)
from loopback import raw_server

from src.core.errors import PipelineError
from src.core.params import DownloadParams, load_params

PAIRS = [(f"Sentence {i}.", f"第{i}句。") for i in range(60)]
OPUS = {"id": "test-org/opus-mini", "config": "en-zh", "split": "train",
        "translation": "translation"}


def hub_root(tmp_path, corpora: list[dict], **split):
    return scratch_root(tmp_path / "p", download={"url": "", "corpora": corpora},
                        split={"valid_size": 5, "test_size": 5, **split})


def download(root, cache):
    return run_stage(root, "download", env=offline_env(cache))


def raw_lines(root, name: str) -> list[str]:
    return (root / f"data/raw/{name}.tsv").read_text(encoding="utf-8").splitlines()


def test_a_branch_is_read_at_its_commit_and_the_commit_recorded(tmp_path):
    cache = tmp_path / "cache"
    commit = opus_like(cache, PAIRS)
    root = hub_root(tmp_path, [{"name": "opus", "hub": OPUS | {"revision": "main"}}])
    result = download(root, cache)
    assert result.returncode == 0, result.stderr
    assert raw_lines(root, "opus") == [f"{en}\t{zh}" for en, zh in PAIRS]
    meta = json.loads((root / "data/download.json").read_text())["corpora"][0]
    assert meta["hub"]["commit"] == commit and meta["hub"]["revision"] == "main"
    assert "dvc repro does not see the branch move" in result.stdout
    # the commit itself as revision: the same bytes, and nothing to warn about
    pinned = hub_root(tmp_path / "pinned", [{"name": "opus", "hub": OPUS | {"revision": commit}}])
    again = download(pinned, cache)
    assert again.returncode == 0, again.stderr
    assert raw_lines(pinned, "opus") == raw_lines(root, "opus")
    assert "branch move" not in again.stdout


def test_only_the_wanted_configs_files_are_read(tmp_path):
    """The de-en config's data is not needed for en-zh: a snapshot without it still reads."""
    cache = tmp_path / "cache"
    commit = opus_like(cache, PAIRS)
    snapshot = cache / "datasets--test-org--opus-mini" / "snapshots" / commit
    (snapshot / "de-en/train-00000-of-00001.parquet").unlink()
    root = hub_root(tmp_path, [{"name": "opus", "hub": OPUS | {"revision": "main"}}])
    assert download(root, cache).returncode == 0


def test_flores_like_configs_are_joined_on_their_id(tmp_path):
    cache = tmp_path / "cache"
    flores_like(cache, PAIRS[:8])
    hub = {"id": "test-org/flores-mini", "configs": ["eng_Latn", "cmn_Hans"],
           "split": "devtest", "revision": "main"}
    root = hub_root(tmp_path, [{"name": "flores", "hub": hub}])
    result = download(root, cache)
    assert result.returncode == 0, result.stderr
    assert raw_lines(root, "flores") == [f"{en}\t{zh}" for en, zh in PAIRS[:8]]


def test_wmt_like_translation_keys_follow_the_pair_not_the_config(tmp_path):
    cache = tmp_path / "cache"
    wmt_like(cache, PAIRS[:5])
    hub = {"id": "test-org/wmt-mini", "config": "zh-en", "split": "train", "revision": "main",
           "translation": "translation"}
    root = hub_root(tmp_path, [{"name": "wmt", "hub": hub}])
    assert download(root, cache).returncode == 0
    assert raw_lines(root, "wmt")[0] == "Sentence 0.\t第0句。"


ARCHIVE = SHARED_DATA / "cmn-eng" / "cmn-eng.zip"


@pytest.mark.skipif(not ARCHIVE.exists(), reason=f"{ARCHIVE} not present")
def test_the_cmn_eng_archive_as_a_hub_table_gives_the_same_corpus_bytes(tmp_path):
    """The real corpus put on the Hub as a table (its three TSV columns as three parquet
    columns) comes back as the very TSV the zip path writes."""
    with zipfile.ZipFile(ARCHIVE) as archive:
        text = archive.read("cmn.txt").decode("utf-8")
    # its one blank line is a row of nulls in a table
    rows = [line.split("\t") if line else [None] * 3 for line in text.split("\n")[:-1]]
    assert {len(row) for row in rows} == {3}
    cache = tmp_path / "cache"
    columns = {name: [row[i] for row in rows] for i, name in enumerate(("en", "zh", "source"))}
    put_repo(cache, "test-org/cmn-eng", {
        "README.md": readme({"default": {"train": "data/train-*"}}),
        "data/train-00000-of-00001.parquet": parquet(columns)})
    hub = {"id": "test-org/cmn-eng", "split": "train", "revision": "main",
           "columns": ["en", "zh"]}
    via_hub = hub_root(tmp_path / "hub", [{"name": "corpus", "hub": hub}])
    assert download(via_hub, cache).returncode == 0
    via_zip = scratch_root(tmp_path / "zip", download={"url": str(ARCHIVE)})
    assert run_stage(via_zip, "download").returncode == 0
    digests = [hashlib.sha256((root / "data/raw/corpus.tsv").read_bytes()).hexdigest()
               for root in (via_hub, via_zip)]
    assert digests[0] == digests[1]


def test_two_corpora_mixed_by_weight_give_the_counts_the_weights_promise(tmp_path, toy_tsv):
    cache = tmp_path / "cache"
    # the second corpus repeats 10 of the first one's pairs and 3 of its own
    opus_like(cache, PAIRS)
    extra = PAIRS[:10] + [(f"Other {i}.", f"别{i}。") for i in range(40)]
    local = tmp_path / "local.tsv"
    write_pairs(local, extra + extra[-3:])
    root = hub_root(tmp_path, [
        {"name": "opus", "hub": OPUS | {"revision": "main"}, "weight": 2},
        {"name": "local", "url": str(local), "weight": 0.5}])
    assert download(root, cache).returncode == 0
    result = run_stage(root, "split")
    assert result.returncode == 0, result.stderr
    stats = json.loads((root / "data/split_stats.json").read_text())
    opus, other = stats["corpora"]["opus"], stats["corpora"]["local"]
    assert (opus["read"], opus["dropped_duplicate"], opus["kept"]) == (60, 0, 60)
    assert (other["read"], other["dropped_duplicate"], other["kept"]) == (53, 13, 40)
    assert opus["train_weighted"] == 2 * opus["train"]
    assert other["train_weighted"] == round(0.5 * other["train"])
    assert opus["valid"] + other["valid"] == stats["n_valid"]
    assert stats["n_train"] == opus["train_weighted"] + other["train_weighted"]
    from datasets import load_from_disk

    train = load_from_disk(str(root / "data/split"))["train"]
    sources = train["source"]
    assert len(sources) == stats["n_train"]
    assert all(sources.count(en) == 2 for en, _ in PAIRS if en in sources)


def test_a_predefined_test_set_removes_its_sources_from_every_corpus(tmp_path):
    cache = tmp_path / "cache"
    opus_like(cache, PAIRS)
    test = tmp_path / "test.tsv"
    test.write_text("Sentence 3.\t第三句。\nSentence 4.\t第4句。\n", encoding="utf-8")
    root = scratch_root(tmp_path / "p", split={"valid_size": 5},
                        download={"url": "", "test_url": str(test), "corpora": [
                            {"name": "opus", "hub": OPUS | {"revision": "main"}}]})
    assert download(root, cache).returncode == 0
    assert run_stage(root, "split").returncode == 0
    stats = json.loads((root / "data/split_stats.json").read_text())
    assert stats["corpora"]["opus"]["dropped_in_test_set"] == 2


def test_max_pairs_takes_a_seeded_sample_in_corpus_order(tmp_path):
    cache = tmp_path / "cache"
    opus_like(cache, PAIRS)
    spec = {"name": "opus", "hub": OPUS | {"revision": "main"}, "max_pairs": 7}
    first, second = (hub_root(tmp_path / name, [spec]) for name in ("a", "b"))
    for root in (first, second):
        assert download(root, cache).returncode == 0
    lines = raw_lines(first, "opus")
    assert lines == raw_lines(second, "opus") and len(lines) == 7
    order = [int(line.split()[1].rstrip(".\t第")) for line in lines]
    assert order == sorted(order) and order != list(range(7))
    other = hub_root(tmp_path / "c", [spec | {"seed": 1}])
    assert download(other, cache).returncode == 0
    assert raw_lines(other, "opus") != lines


@pytest.mark.parametrize("hub, fragment", [
    ({"config": "en-zh"}, "has no config 'en-zh'; did you mean 'zh-en'? (it has: zh-en)"),
    ({"split": "test"}, "has no split 'test' (it has: train, validation)"),
    ({"translation": "pairs"}, "has no column 'pairs' (it has: translation)"),
    ({"keys": ["en", "fr"]}, "has no 'fr' key in its 'translation' dicts (it has: zh, en)"),
    ({"revision": "v2"}, "holds no complete snapshot of test-org/wmt-mini at revision 'v2'"),
])
def test_a_wrong_hub_source_is_one_line_and_writes_nothing(tmp_path, hub, fragment):
    cache = tmp_path / "cache"
    wmt_like(cache, PAIRS[:5])
    spec = {"id": "test-org/wmt-mini", "config": "zh-en", "split": "train", "revision": "main",
            "translation": "translation"} | hub
    root = hub_root(tmp_path, [{"name": "wmt", "hub": spec}])
    assert_one_line_error(download(root, cache), fragment)
    assert not (root / "data/raw").exists() and not (root / "data/download.json").exists()


def test_flores_language_codes_are_suggested(tmp_path):
    cache = tmp_path / "cache"
    flores_like(cache, PAIRS[:3])
    hub = {"id": "test-org/flores-mini", "configs": ["eng_Latn", "zho_Hans"], "split": "dev",
           "revision": "main"}
    root = hub_root(tmp_path, [{"name": "flores", "hub": hub}])
    assert_one_line_error(download(root, cache), "no config 'zho_Hans'; did you mean 'cmn_Hans'?")


def test_a_repo_with_only_a_loading_script_is_refused(tmp_path):
    cache = tmp_path / "cache"
    put_repo(cache, "test-org/scripted", {"README.md": b"# no configs\n",
                                          "scripted.py": b"import datasets\n"})
    hub = {"id": "test-org/scripted", "split": "train", "revision": "main",
           "translation": "translation"}
    root = hub_root(tmp_path, [{"name": "old", "hub": hub}])
    assert_one_line_error(download(root, cache), "needs a loading script (scripted.py)")


def hub_api(status: int, error_code: str, message: str):
    """A Hub endpoint that answers every API call with one error, as huggingface.co does."""
    body = json.dumps({"error": message}).encode()

    def respond(conn, path):
        conn.sendall(f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\n"
                     f"X-Error-Code: {error_code}\r\nX-Error-Message: {message}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
    return respond


@pytest.mark.parametrize("status, code, fragment", [
    (401, "GatedRepo", "test-org/gated is gated: accept its terms at "
                       "https://huggingface.co/datasets/test-org/gated while logged in, then "
                       "set HF_TOKEN"),
    (404, "RepoNotFound", "no dataset test-org/gated on the Hub"),
    (404, "RevisionNotFound", "dataset test-org/gated has no revision 'main'"),
])
def test_hub_refusals_are_one_line(tmp_path, status, code, fragment):
    hub = {"id": "test-org/gated", "split": "train", "revision": "main",
           "translation": "translation"}
    root = hub_root(tmp_path, [{"name": "gated", "hub": hub}])
    with raw_server(hub_api(status, code, "refused")) as endpoint:
        env = offline_env(tmp_path / "cache") | {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint}
        assert_one_line_error(run_stage(root, "download", env=env), fragment)


@pytest.mark.parametrize("corpora, fragment", [
    ([{"name": "a", "url": "x.tsv", "weight": 0}], "download.corpora.0.weight': Input should "
                                                   "be greater than 0"),
    ([{"name": "a", "url": "x.tsv"}, {"name": "a", "url": "y.tsv"}], "two corpora are named 'a'"),
    ([{"name": "a", "url": "x.tsv", "hub": {**OPUS, "revision": "main"}}],
     "corpus 'a' needs exactly one source: url or hub"),
    ([{"name": "a", "hub": {"id": "o/d", "split": "train", "revision": "main"}}],
     "exactly one of translation"),
])
def test_bad_corpus_lists_are_refused_by_the_params_loader(tmp_path, corpora, fragment):
    root = scratch_root(tmp_path, download={"url": "", "corpora": corpora})
    with pytest.raises(PipelineError, match=None) as caught:
        load_params(DownloadParams, root / "params.yaml")
    assert fragment in str(caught.value)


def test_url_and_corpora_together_are_refused(tmp_path):
    root = scratch_root(tmp_path, download={"corpora": [{"name": "a", "url": "x.tsv"}]})
    with pytest.raises(PipelineError, match="set either url .one corpus. or corpora"):
        load_params(DownloadParams, root / "params.yaml")


def test_a_hub_corpus_over_max_bytes_is_refused_and_nothing_written(tmp_path):
    cache = tmp_path / "cache"
    opus_like(cache, PAIRS)
    corpora = [{"name": "opus", "hub": OPUS | {"revision": "main"}}]
    root = scratch_root(tmp_path / "p",
                        download={"url": "", "max_bytes": 500, "corpora": corpora})
    assert_one_line_error(download(root, cache),
                          "corpus 'opus' is larger than download.max_bytes (500 bytes)")
    assert not (root / "data/raw").exists()


def test_max_pairs_of_a_path_corpus_splits_lines_at_newlines_only(tmp_path):
    """A sampled path corpus keeps a lone "\\r" inside its line, as every stage reads lines,
    instead of cutting the pair in two (bytes.splitlines would)."""
    corpus = tmp_path / "corpus.tsv"
    corpus.write_bytes("".join(f"Line {i}\r end.\t第{i}行。\n" for i in range(12)).encode())
    root = hub_root(tmp_path, [{"name": "local", "url": str(corpus), "max_pairs": 5}])
    assert run_stage(root, "download").returncode == 0
    lines = (root / "data/raw/local.tsv").read_bytes().split(b"\n")[:-1]
    assert len(lines) == 5 and all(b"\r end.\t" in line for line in lines)


def test_reading_a_hub_corpus_never_imports_torch(tmp_path):
    """`datasets` imports torch (seconds) for a streamed split where torch is installed, unless
    told otherwise: the stage reads the rows itself, so it must not pay for it."""
    cache = tmp_path / "cache"
    opus_like(cache, PAIRS)
    root = hub_root(tmp_path, [{"name": "opus", "hub": OPUS | {"revision": "main"}}])
    imported_torch = stage_imports_torch(root, "download", offline_env(cache))
    assert raw_lines(root, "opus") == [f"{en}\t{zh}" for en, zh in PAIRS]
    assert not imported_torch
