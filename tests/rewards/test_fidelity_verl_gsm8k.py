"""Fidelity: data whose data_source is "openai/gsm8k" scores exactly as verl scores it.

The original is volcengine/verl's verl/utils/reward_score/gsm8k.py at 152c599 (the commit that
clips the text to its last 300 characters): `extract_solution` (l.20-49; strict l.29-36,
flexible l.37-48) and `compute_score` (l.52-72: format_score 0.0, score 1.0, the extracted
string compared with the ground truth string), reached through verl/utils/reward_score/
__init__.py's `default_compute_score`, which sends the data_source "openai/gsm8k" (that exact
string) there with compute_score's defaults (method "strict"). Each expected score below was
computed by running that function itself (outside this repository) on the response and ground
truth of its row; the comment above a case names the function and line that decide it.

Each response is scored through a config, as training scores it: `load_config` (the default
config, reward.task=auto; and the verl_countdown recipe with reward.task=auto, whose header
claims verl's GSM8K scoring for verl's GSM8K Parquet files), `verifier_for` the data_source
"openai/gsm8k", `score_examples`; and once from a verl-layout Parquet file read by `load_file`.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.data.files import load_file
from reasonrl.data.readers import write_records
from reasonrl.errors import GroundTruthError
from reasonrl.rewards import check_examples, score_examples, task_for_source, verifier_for
from reasonrl.rewards.gsm8k import extract_verl_gsm8k, gsm8k_reward, verl_gsm8k_answer

RECIPE = Path(__file__).parents[2] / "configs" / "recipes" / "verl_countdown.yaml"
SOURCE = "openai/gsm8k"


@functools.cache
def config(path: str | None, *overrides: str):
    return load_config(path, list(overrides))


def assert_no_failure(scored) -> None:
    """No component of any row raised or timed out: a failure scores 0, which a row expecting 0
    would pass. `errors` counts every component's (a format check's too, which leaves no message
    in `failures`), `timeouts` the calls cut."""
    assert (scored.errors, scored.timeouts) == (0, 0), scored.failures
    assert scored.failures == [None] * len(scored.total) and not any(scored.timed_out), scored.failures


def verl_score(completion: str, ground_truth: str, method: str, path: str | None = None) -> float:
    """The reward of one response to an openai/gsm8k record under the config at `path` (None:
    the default config) with reward.task=auto and reward.verl_gsm8k_method=`method`."""
    overrides = ["reward.task=auto"] + ([] if method == "strict" else [f"reward.verl_gsm8k_method={method}"])
    cfg = config(path, *overrides)
    example = Example("Natalia sold clips ...", ground_truth, SOURCE)
    scored = score_examples([completion], [example], cfg.reward)
    assert_no_failure(scored)  # a crash scores 0.0, the expected score of many rows
    return scored.total.item()


# (response, ground truth, method, verl's score)
TABLE = [
    # compute_score l.69: the strict answer '72' is the ground truth -> score
    ("#### 72", "72", "strict", 1.0),
    # extract_solution l.31: GSM8K's own solution format
    ("Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72", "72", "strict", 1.0),
    # extract_solution l.31: '#### ' needs one space -> None -> 0
    ("####72", "72", "strict", 0.0),
    # extract_solution l.31: two spaces -> None -> 0
    ("####  72", "72", "strict", 0.0),
    # extract_solution l.31: a tab is not the space -> 0
    ("####\t72", "72", "strict", 0.0),
    # extract_solution l.31: '$' before the digits -> no match -> 0
    ("#### $72", "72", "strict", 0.0),
    # extract_solution l.31: LaTeX dollar -> no match -> 0
    ("#### \\$72", "72", "strict", 0.0),
    # extract_solution l.31: the digits only -> score
    ("#### 72 dollars", "72", "strict", 1.0),
    # extract_solution l.31: '.' is in the class: '72.' != '72' -> format_score 0.0
    ("#### 72.", "72", "strict", 0.0),
    # compute_score l.69: strings compared: '72.0' != '72' -> 0.0
    ("#### 72.0", "72", "strict", 0.0),
    # compute_score l.69: '072' != '72' -> 0.0
    ("#### 072", "72", "strict", 0.0),
    # extract_solution l.36: commas removed anywhere -> '72' -> score
    ("#### 7,2", "72", "strict", 1.0),
    # extract_solution l.36: a trailing comma removed -> score
    ("#### 72,", "72", "strict", 1.0),
    # extract_solution l.36: thousands commas removed -> score
    ("#### 1,548,556", "1548556", "strict", 1.0),
    # compute_score l.69: a near-miss integer is wrong (no tolerance) -> 0.0
    ("#### 1548557", "1548556", "strict", 0.0),
    # compute_score l.69: -> 0.0
    ("#### 1,548,557", "1548556", "strict", 0.0),
    # compute_score l.69: -> score
    ("#### 1548556", "1548556", "strict", 1.0),
    # compute_score l.69: '3.0000003' != '3' -> 0.0
    ("#### 3.0000003", "3", "strict", 0.0),
    # extract_solution l.31: an optional leading '-' -> score
    ("#### -3", "-3", "strict", 1.0),
    # extract_solution l.31: '-' then a space -> no match -> 0
    ("#### - 3", "-3", "strict", 0.0),
    # extract_solution l.31: U+2212 is not '-' -> 0
    ("#### \u22123", "-3", "strict", 0.0),
    # compute_score l.69: '-72' != '72' -> 0.0
    ("#### -72", "72", "strict", 0.0),
    # compute_score l.69: -> score
    ("#### 0", "0", "strict", 1.0),
    # compute_score l.69: '-0' != '0' -> 0.0
    ("#### -0", "0", "strict", 0.0),
    # compute_score l.69: -> score
    ("#### 0.5", "0.5", "strict", 1.0),
    # compute_score l.69: '.5' != '0.5' -> 0.0
    ("#### .5", "0.5", "strict", 0.0),
    # extract_solution l.31: '/' ends the run: '1' -> 0.0
    ("#### 1/2", "0.5", "strict", 0.0),
    # extract_solution l.31: '7.2.3' is one run -> 0.0
    ("#### 7.2.3", "72", "strict", 0.0),
    # extract_solution l.36: ',' becomes '' -> 0.0
    ("#### ,", "72", "strict", 0.0),
    # extract_solution l.31: no digit, '.' or ',' after '-' -> None -> 0
    ("#### -", "72", "strict", 0.0),
    # extract_solution l.31: [0-9] is ASCII: fullwidth digits -> 0
    ("#### \uff17\uff12", "72", "strict", 0.0),
    # extract_solution l.31: CRLF after the number -> score
    ("#### 72\r\n", "72", "strict", 1.0),
    # extract_solution l.31: the marker need not end the text -> score
    ("#### 72\nThat was three steps.", "72", "strict", 1.0),
    # extract_solution l.36: solutions[-1], the last marker -> score
    ("#### 71\n#### 72", "72", "strict", 1.0),
    # extract_solution l.36: the last marker is wrong -> 0.0
    ("#### 72\n#### 71", "72", "strict", 0.0),
    # extract_solution l.31: an empty last marker does not match -> '72' -> score
    ("#### 72\n#### ", "72", "strict", 1.0),
    # extract_solution l.31: -> score
    ("#### 72 #### seventy-two", "72", "strict", 1.0),
    # extract_solution l.36: '73' is the last -> 0.0
    ("#### 72#### 73", "72", "strict", 0.0),
    # extract_solution l.31: five hashes hold '#### 72' -> score
    ("##### 72", "72", "strict", 1.0),
    # extract_solution l.31: three hashes -> 0
    ("### 72", "72", "strict", 0.0),
    # extract_solution l.31: the second marker -> score
    ("#### #### 72", "72", "strict", 1.0),
    # extract_solution l.36: the last -> 0.0
    ("The answer is #### 72 and not #### 7", "72", "strict", 0.0),
    # extract_solution l.31: no marker -> None -> 0
    ("\\boxed{72}", "72", "strict", 0.0),
    # extract_solution l.31: -> 0
    ("<answer>72</answer>", "72", "strict", 0.0),
    # extract_solution l.31: no last-number fallback in strict -> 0
    ("The answer is 72.", "72", "strict", 0.0),
    # extract_solution l.31: #### only; the box is not read -> score
    ("\\boxed{71}\n#### 72", "72", "strict", 1.0),
    # extract_solution l.31: -> score
    ("<answer>71</answer> #### 72", "72", "strict", 1.0),
    # extract_solution l.31: -> score
    ("#### 72 so \\boxed{71}", "72", "strict", 1.0),
    # extract_solution l.31: LaTeX after the marker -> 0
    ("#### \\frac{144}{2}", "72", "strict", 0.0),
    # extract_solution l.31-33: empty -> 0
    ("", "72", "strict", 0.0),
    # extract_solution l.26-27: the marker is before the last 300 characters -> 0
    ("#### 72 " + "x" * 300, "72", "strict", 0.0),
    # extract_solution l.26-27: '#### 72' is exactly the first 7 of the last 300 -> score
    ("#### 72" + "x" * 293, "72", "strict", 1.0),
    # extract_solution l.26-27: the clip cuts the first '#' ('### 72') -> 0
    ("#### 72" + "x" * 294, "72", "strict", 0.0),
    # extract_solution l.26-27: the clip leaves '# 72' -> 0
    ("#### 72" + "x" * 296, "72", "strict", 0.0),
    # extract_solution l.26-27: 301 characters: the clip cuts one '#' ('### 123') -> 0
    ("#### 123" + "x" * 293, "123", "strict", 0.0),
    # extract_solution l.26-27: a long response, the marker last -> score
    ("x" * 5000 + "\n#### 72", "72", "strict", 1.0),
    # extract_solution l.36: both within 300 -> the last -> score
    ("#### 71 " + "x" * 200 + " #### 72", "72", "strict", 1.0),
    # extract_solution l.38-48: the last number -> score
    ("The answer is 72", "72", "flexible", 1.0),
    # extract_solution l.38: '.' is in the class: '72.' -> 0.0
    ("The answer is 72.", "72", "flexible", 0.0),
    # extract_solution l.44-48: the lone '.' is skipped -> '72' -> score
    ("The answer is 72 apples.", "72", "flexible", 1.0),
    # extract_solution l.38: '72,' keeps its comma (no replace in flexible) -> 0.0
    ("It is 72, I think", "72", "flexible", 0.0),
    # extract_solution l.46: the last number is 5 -> 0.0
    ("72 then 5", "72", "flexible", 0.0),
    # extract_solution l.38: commas kept: '1,548,556' != '1548556' -> 0.0
    ("1,548,556", "1548556", "flexible", 0.0),
    # extract_solution l.38: -> score
    ("#### 72", "72", "flexible", 1.0),
    # extract_solution l.46: the last number is 3 -> 0.0
    ("#### 72\nThat was 3 steps", "72", "flexible", 0.0),
    # extract_solution l.38: -> score
    ("$72", "72", "flexible", 1.0),
    # extract_solution l.38: -> score
    ("72%", "72", "flexible", 1.0),
    # extract_solution l.38: -> score
    ("\\boxed{72}", "72", "flexible", 1.0),
    # extract_solution l.46: the last number is 2 -> 0.0
    ("\\frac{144}{2}", "72", "flexible", 0.0),
    # extract_solution l.38: '-72' is a run -> score
    ("10-72", "-72", "flexible", 1.0),
    # extract_solution l.38: '-72' != '72' -> 0.0
    ("10-72", "72", "flexible", 0.0),
    # extract_solution l.47: '...' is not in invalid_str -> 0.0
    ("...", "72", "flexible", 0.0),
    # extract_solution l.46-48: every run is '.': the loop leaves '.' -> 0.0
    (".", "72", "flexible", 0.0),
    # extract_solution l.40-42: no run -> None -> 0
    ("no numbers here", "72", "flexible", 0.0),
    # extract_solution l.26-27: the number is clipped away -> 0
    ("72 " + "x" * 300, "72", "flexible", 0.0),
    # extract_solution l.46-48: the trailing '.' is skipped -> score
    ("72\n.", "72", "flexible", 1.0),
    # compute_score l.69: -> 0.0
    ("3.0000003", "3", "flexible", 0.0),
]


@pytest.mark.parametrize("completion, ground_truth, method, expected", TABLE)
def test_openai_gsm8k_scores_as_verl(completion, ground_truth, method, expected):
    assert verl_score(completion, ground_truth, method) == expected
    assert verl_score(completion, ground_truth, method, str(RECIPE)) == expected


def test_the_table_covers_each_score_and_method():
    assert len(TABLE) >= 60
    assert {row[3] for row in TABLE} == {0.0, 1.0} and {row[2] for row in TABLE} == {"strict", "flexible"}


def test_dispatch_is_verls():
    """verl's default_compute_score: `data_source == "openai/gsm8k"` and nothing else; reasonrl's
    own GSM8K rule keeps the sources reasonrl writes ("gsm8k") and the other spellings."""
    assert task_for_source(SOURCE) == "verl_gsm8k"
    for source in ("gsm8k", "OpenAI/GSM8K", "openai/gsm8k_socratic", "my/gsm8k"):
        assert task_for_source(source) == "gsm8k", source
    cfg = load_config(None)
    assert (cfg.reward.task, cfg.reward.verl_gsm8k_method) == ("auto", "strict")  # verl's default method
    v = verifier_for(SOURCE, cfg.reward)
    assert (v.task, dict(v.options), v.isolated) == ("verl_gsm8k", {"method": "strict"}, False)


def test_verl_parquet_file_scores_as_verl(tmp_path):
    """A record as verl's examples/data_preprocess/gsm8k.py writes it, read from Parquet."""
    question = 'How many? Let\'s think step by step and output the final answer after "####".'
    record = {"data_source": SOURCE, "prompt": [{"role": "user", "content": question}], "ability": "math",
              "reward_model": {"style": "rule", "ground_truth": "1548556"},
              "extra_info": {"split": "test", "index": 0}}
    write_records([record], tmp_path / "test.parquet")
    examples = load_file(tmp_path / "test.parquet")
    assert [(e.data_source, e.ground_truth) for e in examples] == [(SOURCE, "1548556")]
    completions = ["#### 1548557", "#### 1,548,556", "####1548556", "The answer is 1548556",
                   "\\boxed{1548556}"]
    scores = score_examples(completions, examples * len(completions), config(None).reward)
    assert scores.total.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert_no_failure(scores)


def test_a_ground_truth_verl_can_never_match_stops_the_run():
    """verl compares strings: a ground truth that no extraction can return ("seventy-two",
    "$72") would score every response 0 without a word; here the start-up check names it."""
    cfg = config(None)
    check_examples([Example("q", "72", SOURCE, {"origin": "t.jsonl:1"})], cfg.reward)
    for bad in ("seventy-two", "$72", " 72", "72 apples"):
        with pytest.raises(GroundTruthError, match="t.jsonl:2: field 'ground_truth'.*verl's GSM8K"):
            check_examples([Example("q", bad, SOURCE, {"origin": "t.jsonl:2"})], cfg.reward)


@pytest.mark.parametrize("text, strict, flexible", [
    ("#### 1,000", "1000", "1,000"),
    ("#### 72.\nso 5 apples.", "72.", "5"),
    ("x" * 300 + "#### 9", "9", "9"),
    ("#### 9" + "x" * 300, None, None),
    (". .", None, "."),
    ("", None, None),
])
def test_extract_verl_gsm8k(text, strict, flexible):
    assert extract_verl_gsm8k(text, "strict") == strict and verl_gsm8k_answer(text) == strict
    assert extract_verl_gsm8k(text, "flexible") == flexible


def test_extract_verl_gsm8k_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="strict, flexible"):
        extract_verl_gsm8k("#### 1", "loose")


# --------------------------------------- reasonrl's own GSM8K rule: exact numbers, no tolerance


@pytest.mark.parametrize("completion, truth, expected", [
    ("#### 1548557", "1548556", 0.0),  # a relative 1e-6 accepted this
    ("#### 1,548,556", "1548556", 1.0),
    ("#### 3.0000003", "3", 0.0),  # and this
    ("#### 3.0", "3", 1.0),
    ("\\boxed{9007199254740993}", "9007199254740992", 0.0),  # one float above 2**53
    ("\\boxed{9007199254740993}", "9007199254740993", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.333333", 0.0),
    ("\\boxed{\\frac{36}{2}}", "18", 1.0),
    ("#### 0.1", "1e-1", 1.0),
])
def test_reasonrl_gsm8k_compares_numbers_exactly(completion, truth, expected):
    assert gsm8k_reward(completion, truth, {}) == expected
    cfg = config(None)
    scored = score_examples([completion], [Example("q", truth, "gsm8k")], cfg.reward)
    assert scored.total.item() == expected
    assert_no_failure(scored)
