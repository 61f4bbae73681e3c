"""What a Hub source reads, decided from the repo's metadata alone (src/data/hub_layout.py): the
configs and files per split, the did-you-mean of a wrong config, the columns and keys of the
split, and the TSV line each row becomes. In process and without any dataset library, so the
mutation kit runs them (tests/test_hub_corpora.py runs the download stage end to end)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from src.core.errors import PipelineError
from src.core.params import HubSource, PairParams
from src.data import hub_layout as layout


def pair(source_lang="en", target_lang="zh", source_column=0, target_column=1) -> PairParams:
    return PairParams(source_lang=source_lang, target_lang=target_lang,
                      source_column=source_column, target_column=target_column)


ZH_EN = pair()


def source(**fields) -> HubSource:
    """A Hub source (a `translation` column unless the fields say where the sides are)."""
    base = {"id": "org/set", "split": "train", "revision": "main"}
    if not {"translation", "columns", "configs"} & set(fields):
        base["translation"] = "translation"
    return HubSource(**(base | fields))


@dataclass
class Value:  # a `datasets` feature: only its dtype is read
    dtype: str


@dataclass
class Translation:  # `datasets.Translation`: its languages are the dict's keys
    languages: list[str]


def error_of(call) -> str:
    with pytest.raises(PipelineError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


# -- the README's configs ----------------------------------------------------------------------

def test_every_documented_data_files_form_gives_its_patterns_per_split():
    metadata = {"configs": [
        {"config_name": "one", "data_files": "data/one.parquet"},
        {"config_name": "many", "data_files": ["a.parquet", "b.parquet"]},
        {"config_name": "by-split", "data_files": {"train": "t-*.parquet",
                                                   "test": ["x.parquet", "y.parquet"]}},
        {"config_name": "entries", "data_files": [{"split": "train", "path": "tr.parquet"},
                                                  {"split": "dev", "path": ["d1", "d2"]}]},
        {"data_files": "plain.csv"},
    ]}
    assert layout.card_configs(metadata) == {
        "one": {"train": ["data/one.parquet"]},
        "many": {"train": ["a.parquet", "b.parquet"]},
        "by-split": {"train": ["t-*.parquet"], "test": ["x.parquet", "y.parquet"]},
        "entries": {"train": ["tr.parquet"], "dev": ["d1", "d2"]},
        "default": {"train": ["plain.csv"]},
    }


def test_no_configs_metadata_is_no_configs():
    assert layout.card_configs({}) == {}
    assert layout.card_configs({"configs": None}) == {}
    assert layout.card_configs({"configs": [{"config_name": "empty"}]}) == {"empty": {
        "train": []}}


# -- which files to fetch ----------------------------------------------------------------------

CONFIGS = {"en-zh": {"train": ["en-zh/train.parquet"], "test": ["en-zh/test.parquet"]},
           "de-en": {"train": ["de-en/train.parquet"]}}


def test_the_named_config_and_split_give_the_readme_and_their_files():
    assert layout.data_patterns(source(config="en-zh", split="test"), CONFIGS) == [
        "README.md", "en-zh/test.parquet"]


def test_a_repo_with_one_config_needs_no_name():
    only = {"default": {"train": ["d/a.parquet", "d/b.parquet"]}}
    assert layout.data_patterns(source(), only) == ["README.md", "d/a.parquet", "d/b.parquet"]


def test_configs_joined_fetch_both_configs_files():
    flores = {"eng_Latn": {"devtest": ["eng.parquet"]}, "cmn_Hans": {"devtest": ["cmn.parquet"]},
              "fra_Latn": {"devtest": ["fra.parquet"]}}
    hub = source(configs=["eng_Latn", "cmn_Hans"], split="devtest")
    assert layout.data_patterns(hub, flores) == ["README.md", "eng.parquet", "cmn.parquet"]


def test_several_configs_and_none_named_is_refused_with_the_list():
    message = error_of(lambda: layout.data_patterns(source(), CONFIGS))
    assert message == "org/set has 2 configs; name one in hub.config: de-en, en-zh"


@pytest.mark.parametrize("wanted, hint", [
    ("zh-en", "; did you mean 'en-zh'?"),  # the pair the other way round
    ("en-zhh", "; did you mean 'en-zh'?"),  # a near name
    ("fr-es", ""),  # nothing close
])
def test_an_unknown_config_names_the_configs_and_a_near_one(wanted, hint):
    message = error_of(lambda: layout.data_patterns(source(config=wanted), CONFIGS))
    assert message == f"org/set has no config '{wanted}'{hint} (it has: de-en, en-zh)"


def test_an_unknown_split_names_the_splits_the_config_has():
    message = error_of(lambda: layout.data_patterns(source(config="en-zh", split="dev"),
                                                    CONFIGS))
    assert message == "org/set (en-zh) has no split 'dev' (it has: train, test)"


def test_suggestions_the_other_way_round_the_hub_spelling_and_near_names():
    assert layout.suggestion("zh-en", ["en-zh"]) == "; did you mean 'en-zh'?"
    assert layout.suggestion("zho_Hans", ["cmn_Hans", "zho_Hant"]) == (
        "; did you mean 'cmn_Hans'?")
    assert layout.suggestion("zho_Hant", ["cmn_Hant"]) == "; did you mean 'cmn_Hant'?"
    assert layout.suggestion("eng_Latm", ["eng_Latn", "fra_Latn"]) == (
        "; did you mean 'eng_Latn'?")
    # the reversed pair is preferred to a near name, and only names that exist are offered
    assert layout.suggestion("zh-en", ["en-zh", "zh-en2"]) == "; did you mean 'en-zh'?"
    assert layout.suggestion("zh-en", ["de-fr"]) == ""
    assert layout.suggestion("zho_Hans", ["deu_Latn"]) == ""


def test_long_lists_are_cut_after_the_limit_with_a_count():
    names = [f"c{i:02}" for i in range(23)]
    assert layout.listed(names) == ", ".join(names[:20]) + " and 3 more"
    assert layout.listed(names[:20]) == ", ".join(names[:20])
    assert layout.listed(names[:3], limit=2) == "c00, c01 and 1 more"


def test_a_list_of_many_configs_is_cut_in_the_refusal():
    many = {f"c{i:02}": {"train": ["x"]} for i in range(25)}
    message = error_of(lambda: layout.data_patterns(source(), many))
    assert message.startswith("org/set has 25 configs; name one in hub.config: c00, c01")
    assert message.endswith("c19 and 5 more")


# -- which columns and keys to read ------------------------------------------------------------

def test_translation_keys_follow_the_pair_unless_keys_are_given():
    features = {"translation": Translation(["en", "zh"])}
    hub = source(translation="translation")
    assert layout.translation_keys(hub, ZH_EN, features) == ["en", "zh"]
    reversed_pair = pair("zh", "en")
    assert layout.translation_keys(hub, reversed_pair, features) == ["zh", "en"]
    keyed = source(translation="translation", keys=["zh", "en"])
    assert layout.translation_keys(keyed, ZH_EN, features) == ["zh", "en"]
    # a plain dict feature lists its keys too
    assert layout.translation_keys(hub, ZH_EN, {"translation": {"en": 1, "zh": 2}}) == [
        "en", "zh"]


def test_a_translation_column_of_unknown_keys_is_read_as_is():
    hub = source(translation="pair")
    assert layout.translation_keys(hub, ZH_EN, {"pair": Value("string")}) == ["en", "zh"]


def test_a_missing_translation_column_or_key_is_one_line_with_what_there_is():
    hub = source(config="en-zh", translation="translation")
    message = error_of(lambda: layout.translation_keys(hub, ZH_EN, {"text": Value("string"),
                                                                    "id": Value("int64")}))
    assert message == "org/set (en-zh, train) has no column 'translation' (it has: text, id)"
    features = {"translation": Translation(["de", "en"])}
    message = error_of(lambda: layout.translation_keys(hub, ZH_EN, features))
    assert message == ("org/set (en-zh, train) has no 'zh' key in its 'translation' dicts "
                       "(it has: de, en)")


def test_text_columns_are_the_named_pair_then_the_other_text_columns_in_order():
    features = {"id": Value("int64"), "zh": Value("string"), "note": Value("large_string"),
                "en": Value("string"), "score": Value("float32"), "extra": Value("string")}
    hub = source(columns=["en", "zh"])
    assert layout.text_columns(hub, features) == ["en", "zh", "note", "extra"]


def test_a_missing_text_column_is_one_line_naming_the_first_missing():
    hub = source(columns=["en", "zh"])
    message = error_of(lambda: layout.text_columns(hub, {"en": Value("string")}))
    assert message == "org/set (default, train) has no column 'zh' (it has: en)"
    message = error_of(lambda: layout.text_columns(hub, {}))
    assert message == "org/set (default, train) has no column 'en' (it has: nothing)"


def test_joined_configs_need_their_id_and_text_columns():
    hub = source(configs=["eng_Latn", "cmn_Hans"], split="devtest")
    layout.joined_columns(hub, {"id": Value("int32"), "text": Value("string")}, "eng_Latn")
    message = error_of(lambda: layout.joined_columns(hub, {"id": Value("int32")}, "cmn_Hans"))
    assert message == "org/set (cmn_Hans, devtest) has no column 'text' (it has: id)"
    message = error_of(lambda: layout.joined_columns(hub, {"text": Value("string")}, "x"))
    assert message == "org/set (x, devtest) has no column 'id' (it has: text)"


# -- rows as TSV lines -------------------------------------------------------------------------

def test_fields_lose_tabs_and_line_breaks_and_nulls_stay_null():
    assert layout.clean_field("a\tb\nc\r\nd") == "a b c d"
    assert layout.clean_field(3) == "3"
    assert layout.clean_field(None) is None
    assert layout.clean_field("") == ""


def test_tsv_lines_put_each_side_in_its_column_and_extras_in_the_gaps():
    assert layout.tsv_line(["hi", "你好"], ZH_EN) == "hi\t你好\n"
    flipped = pair(source_column=1, target_column=0)
    assert layout.tsv_line(["hi", "你好"], flipped) == "你好\thi\n"
    # cmn-eng's layout: source 0, target 1, the attribution after them
    assert layout.tsv_line(["hi", "你好", "CC-BY"], ZH_EN) == "hi\t你好\tCC-BY\n"
    wide = pair(target_column=2)
    assert layout.tsv_line(["hi", "你好", "mid", "end"], wide) == "hi\tmid\t你好\tend\n"
    assert layout.tsv_line(["hi", "你好"], wide) == "hi\t\t你好\n"  # a gap without an extra
    assert layout.tsv_line(["hi", None], ZH_EN) == "hi\t\n"
    assert layout.tsv_line([None, None, None], ZH_EN) == "\n"


def test_the_sample_is_seeded_uniform_and_in_corpus_order():
    lines = [f"{i}\n" for i in range(1000)]
    sample = layout.sample_lines(iter(lines), 100, seed=5)
    assert len(sample) == 100 and len(set(sample)) == 100
    assert sample == sorted(sample, key=lambda line: int(line))  # corpus order
    assert sample == layout.sample_lines(iter(lines), 100, seed=5)
    assert sample != layout.sample_lines(iter(lines), 100, seed=6)
    assert layout.sample_lines(iter(lines[:50]), 100, seed=5) == lines[:50]
    # uniform: lines from the end of the corpus are as likely as from the start
    late = sum(int(line) >= 500 for line in sample)
    assert 35 <= late <= 65
    counts = [0] * 10
    for seed in range(200):
        for line in layout.sample_lines(iter(lines[:10]), 3, seed):
            counts[int(line)] += 1
    assert min(counts) >= 35 and max(counts) <= 85  # each line ~60 times of 200 x 3


def test_a_name_with_two_dashes_is_reversed_at_its_first():
    assert layout.suggestion("zh-en-news", ["en-news-zh"]) == "; did you mean 'en-news-zh'?"
    assert layout.suggestion("zh-en-news", ["news-zh-en", "x"]) == ""


def test_a_dict_feature_lists_the_keys_it_has():
    hub = source(translation="translation")
    message = error_of(lambda: layout.translation_keys(hub, ZH_EN, {
        "translation": {"en": Value("string"), "de": Value("string")}}))
    assert message == ("org/set (default, train) has no 'zh' key in its 'translation' dicts "
                       "(it has: en, de)")


def test_a_null_side_stays_empty_in_its_own_column_and_extras_keep_theirs():
    assert layout.tsv_line([None, "你好", "CC-BY"], ZH_EN) == "\t你好\tCC-BY\n"
    assert layout.tsv_line(["hi", None, "CC-BY"], ZH_EN) == "hi\t\tCC-BY\n"


def test_each_line_is_equally_likely_to_be_sampled():
    """3 of 10 lines over 3,000 seeds: each line ~900 times, the last as often as the first."""
    lines = [f"{i}\n" for i in range(10)]
    counts = [0] * 10
    for seed in range(3000):
        for line in layout.sample_lines(iter(lines), 3, seed):
            counts[int(line)] += 1
    assert all(840 <= c <= 960 for c in counts), counts  # a std of ~25
