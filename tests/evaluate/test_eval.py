"""`reasonrl eval` / `probe`: pass@k, majority vote, metrics, probe verdicts, --compare, and
end-to-end runs on the tiny model."""

import copy
import dataclasses
import itertools
import json
import math
from fractions import Fraction

import pytest
import torch
from helpers import policy_settings

from reasonrl.batch import Example
from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.errors import ConfigError, DataError
from reasonrl.evaluate import (
    EvalSettings,
    ProbeThresholds,
    PromptResult,
    compare_deltas,
    eval_settings,
    final_answer,
    format_compare,
    majority_vote,
    pass_at_k,
    probe_metrics,
    probe_verdict,
    record_plan,
    summarize,
)
from reasonrl.registry import VERIFIERS
from reasonrl.train.trainer import Trainer
from reasonrl.workers.policy import PolicyWorker

SMOKE = ["--config", "configs/smoke.yaml", "--no-progress"]
LENGTH_REWARD = ["reward.fn=tests/fixtures/length_reward.py:length", "reward.isolate_fn=false"]

# ---- pass@k ---------------------------------------------------------------------------


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Share of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_enumeration_over_all_k_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12)


def test_pass_at_k_hand_values_and_large_n():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    # n = 500: the binomials have ~150 digits; the product form stays exact to float precision
    exact = 1 - Fraction(math.comb(490, 100), math.comb(500, 100))
    assert pass_at_k(500, 10, 100) == pytest.approx(float(exact), rel=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


# ---- answers and majority vote ----------------------------------------------------------


@pytest.mark.parametrize("text, task, answer", [
    ("The answer is 17.", "numeric", "17"),
    ("so \\boxed{17.0}", "numeric", "17"),
    ("It costs $1,000 in total", "numeric", "1000"),
    ("no idea", "numeric", None),
    ("\\boxed{x}", "numeric", None),  # extracted, but not a number: a format error
    ("She makes 9 * 2 = 18 dollars.\n#### 18", "gsm8k", "18"),
    ("<answer>3 * 5 + 7 = 22</answer>", "countdown", "3*5+7"),
    ("I think 3 * 5 + 7", "countdown", None),
    ("\\boxed{\\frac{1}{2}}", "math", "0.5"),
    ("\\boxed{x^2 + 1}", "math", "x^2+1"),
])
def test_final_answer_uses_the_task_rule_and_normalises(text, task, answer):
    assert final_answer(text, task) == answer


def test_every_verifier_registers_its_answer_rule():
    """The eval tables read answers by the rule each verifier registers with itself."""
    assert set(VERIFIERS.names()) == {"numeric", "gsm8k", "verl_gsm8k", "math", "countdown", "piecewise",
                                      "reasoning_gym", "verifiers"}
    for entry in VERIFIERS:
        if entry.name == "verl_gsm8k":  # verl's strict rule reads only '#### N'
            assert entry.answer("so \\boxed{7.0}", True) is None
            assert entry.answer("so #### 7", True) == "7"
            continue
        assert entry.answer("so \\boxed{7.0}", True) == "7", entry.name
    assert final_answer("<answer>x + 1</answer>", "custom") == "x+1"  # a custom reward: any text


def test_majority_vote_counts_answers_and_breaks_ties_by_first_appearance():
    assert majority_vote(["5", "7", "5", None], [True, False, True, False]) == ("5", True)
    # 2 votes each for "7" and "5": "7" came first, and it is wrong
    assert majority_vote(["7", "5", "5", "7"], [False, True, True, False]) == ("7", False)
    # missing answers do not vote: one "3" beats three format errors
    assert majority_vote([None, None, "3", None], [False, False, True, False]) == ("3", True)
    assert majority_vote([None, None], [False, False]) == (None, False)


# ---- metrics on a hand-made table ----------------------------------------------------------

TABLE = [
    PromptResult("a", rewards=[1, 0, 1, 0], correct=[True, False, True, False], answers=["5", "7", "5", None],
                 lengths=[10, 20, 30, 40], truncated=[False, False, False, True], entropy_sums=[1, 2, 3, 4]),
    PromptResult("b", rewards=[0, 0, 0, 0], correct=[False] * 4, answers=[None, None, None, "3"],
                 lengths=[5, 5, 5, 5], truncated=[True, True, False, False], entropy_sums=[0.5] * 4,
                 reward_errors=1),
]


def test_summarize_hand_computed():
    m = summarize(TABLE, ks=(1, 2, 4))
    assert m["num_prompts"] == 2 and m["num_samples"] == 8
    assert m["reward_mean"] == pytest.approx(2 / 8)
    assert m["pass@1"] == pytest.approx((2 / 4 + 0) / 2)
    assert m["pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)  # 1 - C(2,2)/C(4,2) for prompt a
    assert m["pass@4"] == pytest.approx(0.5)
    assert m["majority_accuracy"] == pytest.approx(0.5)  # a: "5" (right); b: "3" (wrong)
    assert m["entropy_mean"] == pytest.approx((10 + 2) / 120)  # token-weighted
    assert m["response_length_mean"] == pytest.approx(15)
    assert m["response_length_p95"] == pytest.approx(36.5)  # sorted[6] + 0.65 * (sorted[7] - sorted[6])
    assert m["truncated_frac"] == pytest.approx(3 / 8)
    assert m["format_error_rate"] == pytest.approx(4 / 8)
    assert m["reward_errors"] == 1


def test_summarize_with_records_of_their_own_n_and_k():
    """Prompts with n_i samples and their own pass@k (EasyRL's records): pass@k over the prompts
    that report k; accuracy = pass@1, each prompt's share of right samples averaged over the
    prompts (the aime prompt's 4 samples count once). Hand-computed."""
    def prompt(source, correct, ks):
        n = len(correct)
        return PromptResult(source, [float(c) for c in correct], correct, ["1"] * n, [4] * n, [False] * n,
                            ks=ks)

    results = [prompt("aime", [True, False, False, False], (1, 4)),  # n 4, c 1
               prompt("gsm8k", [True], (1,)),  # n 1, c 1
               prompt("gsm8k", [False], (1,))]
    m = summarize(results, ks=(1,))
    assert m["num_prompts"] == 3 and m["num_samples"] == 6
    assert m["accuracy"] == m["pass@1"] == pytest.approx((1 / 4 + 1 + 0) / 3)  # not 2 of 6 samples
    assert m["pass@4"] == pytest.approx(1.0)  # only the aime prompt reports it: 1 - C(3,4)/C(4,4) = 1
    # without ks of their own, each prompt reports the given ks up to its n
    plain = [dataclasses.replace(r, ks=()) for r in results]
    assert set(summarize(plain, ks=(1, 4))) >= {"pass@1", "pass@4"}
    assert summarize(plain, ks=(1, 4))["pass@4"] == pytest.approx(1.0)


def example(**extra):
    return Example("q", "1", "s", {**extra, "origin": "v.parquet:3"})


@pytest.mark.parametrize("settings, extra, plan", [
    (EvalSettings(n=1, greedy=True), {}, (1, (1,))),  # the default: greedy, one sample
    (EvalSettings(n=2, ks=(1, 2), temperature=0.6), {"pass@k": 8}, (8, (1, 2, 8))),  # k raises n
    (EvalSettings(n=2, ks=(1, 2), temperature=0.6), {"n": 16, "pass@k": 8}, (16, (1, 2, 8))),
    (EvalSettings(n=4, ks=(1, 4), temperature=0.6), {"n": 2}, (2, (1,))),  # pass@4 > n left out
    (EvalSettings(n=4, ks=(1, 4), temperature=0.6, record_overrides=False), {"n": 2}, (4, (1, 4))),
])
def test_record_plan(settings, extra, plan):
    assert record_plan([example(**extra)], settings) == [plan]


@pytest.mark.parametrize("settings, extra, needle", [
    (EvalSettings(n=1, greedy=True), {"pass@k": 4}, "v.parquet:3: the record asks for 4 samples"),
    (EvalSettings(n=2), {"n": 2, "pass@k": 4}, "v.parquet:3: field 'extra_info.pass@k' is 4"),
    (EvalSettings(n=2), {"n": 0}, "v.parquet:3: field 'extra_info.n' must be an integer >= 1"),
    (EvalSettings(n=2, temperature=1.0), {"pass@k": "8"}, "field 'extra_info.pass@k' must be an integer"),
])
def test_record_plan_errors_name_the_record(settings, extra, needle):
    with pytest.raises(DataError) as err:
        record_plan([example(**extra)], settings)
    assert needle in str(err.value)


def test_eval_settings_come_from_the_eval_section():
    default = eval_settings(load_config("configs/default.yaml"))
    assert (default.n, default.greedy, default.ks, default.max_new_tokens) == (1, True, (1,), 40)
    cfg = load_config("configs/default.yaml", ["eval.n=4", "eval.temperature=0.7", "eval.top_p=0.9",
                                               "eval.top_k=5", "eval.max_new_tokens=12"])
    s = eval_settings(cfg, entropy=False)
    assert (s.n, s.greedy, s.temperature, s.top_p, s.top_k, s.ks, s.max_new_tokens, s.entropy) == (
        4, False, 0.7, 0.9, 5, (1, 4), 12, False)
    assert eval_settings(load_config(None, ["eval.n=8", "eval.temperature=1", "eval.k=[2, 8]"])).ks == (2, 8)
    for bad, needle in [(["eval.n=4"], "eval.n: greedy evaluation"),
                        (["eval.n=2", "eval.temperature=1", "eval.k=[4]"], "eval.k: pass@4 needs"),
                        (["rollout.eval_max_new_tokens=8"], "rollout.eval_max_new_tokens is now "
                                                            "eval.max_new_tokens")]:
        with pytest.raises(ConfigError, match=needle):
            load_config(None, bad)


def test_probe_metrics_hand_computed():
    m = probe_metrics(TABLE)
    assert m["accuracy"] == pytest.approx(2 / 8)
    assert m["reward_variance"] == pytest.approx((0.25 + 0) / 2)  # population variance per prompt
    assert m["zero_variance_frac"] == 0.5 and m["all_wrong_frac"] == 0.5 and m["all_correct_frac"] == 0
    assert m["entropy_mean"] == pytest.approx(12 / 120)


# ---- probe verdicts on synthetic reward tables ----------------------------------------------


def table(rows: list[list[int]], entropy: float = 0.5) -> list[PromptResult]:
    """One prompt per row of 0/1 rewards; every sample 10 tokens at the given entropy."""
    return [PromptResult("s", rewards=[float(x) for x in r], correct=[bool(x) for x in r],
                         answers=[str(x) for x in r], lengths=[10] * len(r), truncated=[False] * len(r),
                         entropy_sums=[10 * entropy] * len(r)) for r in rows]


def verdict_of(results):
    m = probe_metrics(results)
    return probe_verdict(m["accuracy"], m["reward_variance"], m.get("entropy_mean"))


@pytest.mark.parametrize("rows, entropy, status, advice", [
    ([[1, 0, 0, 0, 0, 0, 0, 0]] + [[0] * 8] * 9, 0.5, "too_hard", "SFT first"),  # 1 of 80 right
    ([[1] * 8] * 9 + [[1, 1, 1, 1, 1, 1, 1, 0]], 0.5, "too_easy", "harder data"),  # 79 of 80
    ([[1, 0, 1, 0, 1, 0, 1, 0]] * 10, 0.5, "fine", "fine"),  # 50 %, variance 0.25 everywhere
    ([[1] * 8] * 5 + [[0] * 8] * 5, 0.5, "low_variance", "sometimes solves"),  # 50 %, but no group varies
    ([[1, 0, 1, 0, 1, 0, 1, 0]] * 10, 0.1, "fine", "fine"),  # entropy out of range: a note (below)
    ([[1, 0, 1, 0, 1, 0, 1, 0]] * 10, 1.5, "fine", "fine"),
])
def test_probe_verdict_on_synthetic_tables(rows, entropy, status, advice):
    verdict = verdict_of(table(rows, entropy))
    assert verdict.status == status and advice in verdict.suggestion


def test_probe_verdict_bounds():
    th = ProbeThresholds()
    assert probe_verdict(0.10, 0.06, 0.2, th).status == "fine"  # inclusive accuracy / entropy bounds
    assert probe_verdict(0.80, 0.06, 0.8, th).status == "fine"
    v = probe_verdict(0.5, 0.05, 0.5, th)  # variance must exceed 0.05
    assert v.status == "low_variance" and v.checks == {"accuracy": True, "variance": False, "entropy": True}
    assert probe_verdict(0.09, 0.2, 0.5, th).checks["accuracy"] is False
    assert probe_verdict(0.5, 0.2, None, th).status == "fine"  # entropy not measured


# ---- --compare --------------------------------------------------------------------------------


def test_compare_table_and_deltas():
    base = {"settings": {"n": 8}, "overall": {"pass@1": 0.2, "reward_mean": 0.25, "num_prompts": 100.0}}
    new = {"settings": {"n": 4}, "overall": {"pass@1": 0.62, "reward_mean": 0.5, "num_prompts": 100.0,
                                              "entropy_mean": 0.4}}
    deltas = compare_deltas(base, new)
    assert deltas == pytest.approx({"num_prompts": 0.0, "pass@1": 0.42, "reward_mean": 0.25})
    text = format_compare(base, new, "base", "trained")
    line = next(x for x in text.splitlines() if x.startswith("pass@1"))
    assert "0.200 -> 0.620" in line and line.endswith("+0.420")
    entropy = next(x for x in text.splitlines() if x.startswith("entropy_mean"))
    assert "- -> 0.400" in entropy and entropy.rstrip().endswith("-")
    assert "note: the two evaluations differ in n 8 vs 4" in text


# ---- the entropy forward pass -------------------------------------------------------------------


def test_row_entropies_match_a_full_forward(tiny):
    model, tok = tiny
    worker = PolicyWorker(copy.deepcopy(model), tok.pad_token_id, policy_settings(micro_batch_size=1))
    prompts, completions = [[1, 2, 3], [4, 5]], [[6, 7], [8, 9, 10, 11]]
    got = worker.row_entropies(prompts, completions, temperature=0.7)
    for p, c, e in zip(prompts, completions, got, strict=True):
        with torch.no_grad():
            logits = worker.model(torch.tensor([p + c])).logits[0, len(p) - 1: len(p) + len(c) - 1] / 0.7
        logp = torch.log_softmax(logits.float(), -1)
        assert e.shape == (len(c),)
        assert torch.allclose(e, -(logp.exp() * logp).sum(-1), atol=1e-4)


# ---- end to end on the tiny model ---------------------------------------------------------------


def test_eval_greedy_matches_the_trainers_held_out_eval(tmp_path, capsys):
    """`reasonrl eval --greedy` and the trainer's held-out eval run one function
    (`reasonrl.evaluate.evaluate`, then `eval_metrics`): every metric the trainer logs is the
    CLI's, equal."""
    out = tmp_path / "greedy.json"
    assert main(["eval", *SMOKE, "--greedy", "--no-entropy", "--output", str(out), *LENGTH_REWARD]) == 0
    report = json.loads(out.read_text())
    trainer = Trainer(load_config("configs/smoke.yaml", LENGTH_REWARD))
    try:
        trained = trainer.evaluate()
    finally:
        trainer.workers.close()
    m = report["overall"]
    assert report["settings"]["n"] == 1 and m["num_prompts"] == trained["eval/num_prompts"] == 8
    assert m["pass@1"] == m["accuracy"] == pytest.approx(trained["eval/accuracy"])
    assert 0 < m["reward_mean"] < 1  # the length reward varies: a real comparison
    assert {f"eval/{k}" for k in m} | {"time/eval"} == set(trained)
    for key, value in m.items():
        assert trained[f"eval/{key}"] == value, key


def test_eval_sampled_writes_consistent_metrics_and_compares(tmp_path, capsys):
    first, second = tmp_path / "base.json", tmp_path / "other.json"
    data = "tests/fixtures/tiny_math.jsonl"  # sources tiny_math (3 records) and mult (1)
    assert main(["eval", *SMOKE, "--data", data, "--n", "4", "--k", "1,2,4", "--output", str(first),
                 *LENGTH_REWARD]) == 0
    out = capsys.readouterr().out
    assert "pass@4" in out and "mult" in out and "tiny_math" in out  # a column per source
    report = json.loads(first.read_text())
    assert set(report["sources"]) == {"mult", "tiny_math"}
    assert report["sources"]["mult"]["num_prompts"] == 1 and report["overall"]["num_samples"] == 16
    # the metrics are those of the completions written beside them
    prompts = report["prompts"]
    correct = [[s["correct"] for s in p["samples"]] for p in prompts]
    for k in (1, 2, 4):
        want = sum(pass_at_k(4, sum(c), k) for c in correct) / len(correct)
        assert report["overall"][f"pass@{k}"] == pytest.approx(want)
    rewards = [s["reward"] for p in prompts for s in p["samples"]]
    assert report["overall"]["reward_mean"] == pytest.approx(sum(rewards) / 16)
    assert 0 < report["overall"]["reward_mean"] < 1
    assert 9 < report["overall"]["entropy_mean"] < 11  # random model: near log(49152) = 10.8
    assert report["times"]["wall_s"] > report["times"]["generate_s"] > 0

    assert main(["eval", *SMOKE, "--data", data, "--greedy", "--output", str(second), "--compare",
                 str(first), *LENGTH_REWARD]) == 0
    out = capsys.readouterr().out
    assert "base.json -> this evaluation" in out and "note: the two evaluations differ in n 4 vs 1" in out
    other = json.loads(second.read_text())
    deltas = other["compare"]["deltas"]
    want = other["overall"]["reward_mean"] - report["overall"]["reward_mean"]
    assert deltas["reward_mean"] == pytest.approx(want)
    assert "pass@4" not in deltas and "mult/pass@1" in deltas


def test_probe_end_to_end_gives_a_verdict(tmp_path, capsys, tokenizer):
    """Accuracy 0 by construction, not by what the random model samples: each answer of
    unreachable_math.jsonl has 18 digits, compared exactly, and this tokenizer writes one digit
    a token, so no completion of 16 new tokens (rollout.max_new_tokens) holds one (tiny_math's
    one-digit answers were a few random tokens away)."""
    assert max(sum(c.isdigit() for c in t) for t in tokenizer.get_vocab()) == 1
    out = tmp_path / "probe.json"
    # a file task's held-out set is read without its training files
    data = ["data.task=file", "data.train_path=no/such/train.jsonl",
            "data.val_path=tests/fixtures/unreachable_math.jsonl"]
    assert main(["probe", *SMOKE, *data, "--limit", "4", "--entropy-range", "0.1,20",
                 "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["settings"]["n"] == 4  # rollout.n of configs/smoke.yaml
    assert report["settings"]["data"].endswith("(tests/fixtures/unreachable_math.jsonl)")
    assert report["settings"]["max_new_tokens"] == 16
    assert report["overall"]["num_prompts"] == 4 and report["overall"]["accuracy"] == 0.0  # unreachable
    assert report["overall"]["all_wrong_frac"] == 1.0
    assert report["verdict"]["status"] == "too_hard" and "verdict: too_hard: SFT first" in printed
    assert report["verdict"]["thresholds"] == {"min_accuracy": 0.10, "max_accuracy": 0.80,
                                               "min_variance": 0.05, "min_entropy": 0.1, "max_entropy": 20.0}
    assert report["verdict"]["checks"] == {"accuracy": False, "variance": False, "entropy": True}


@pytest.mark.parametrize("args, needle", [
    (["eval", "--n", "4", "--k", "1,8"], "--k: pass@8 needs 1 <= k <= n = 4"),
    (["eval", "--greedy", "--n", "4"], "--greedy"),
    (["probe", "--data", "no/such.jsonl"], "--data no/such.jsonl: no such file, and not a built-in task"),
    (["eval", "--compare", "configs/smoke.yaml"], "not a JSON file written by `reasonrl eval`"),
    (["eval", "rollout.enigne=hf"], "rollout.enigne"),
    (["probe", "--entropy-range", "0.8,0.2"], "--entropy-range: LOW 0.8 is above HIGH 0.2"),
])
def test_eval_errors_are_clean_and_early(args, needle, capsys):
    assert main([*args, *SMOKE]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.slow
def test_default_model_eval_on_arithmetic(tmp_path):
    """The real SmolLM2-135M-Instruct on 8 held-out sums: it gets some right, entropy is sane."""
    out = tmp_path / "eval.json"
    assert main(["eval", "--config", "configs/default.yaml", "--n", "4", "--limit", "8", "--no-progress",
                 "--output", str(out)]) == 0
    m = json.loads(out.read_text())["overall"]
    assert m["num_samples"] == 32 and 0 < m["pass@4"] <= 1 and m["pass@1"] <= m["pass@4"]
    assert 0.05 < m["entropy_mean"] < 3


def test_eval_options_fill_the_eval_section(tmp_path, capsys):
    """`reasonrl eval` and the trainer read one section: with no option, the config's eval
    section (here sampled, n 2, top-k 5); options replace its keys; --n > 1 on a greedy section
    samples at rollout.temperature."""
    out = tmp_path / "e.json"
    base = [*SMOKE, "--no-entropy", "--limit", "2", "--output", str(out), *LENGTH_REWARD]
    assert main(["eval", *base, "eval.n=2", "eval.temperature=0.5", "eval.top_k=5"]) == 0
    s = json.loads(out.read_text())["settings"]
    assert (s["n"], s["greedy"], s["temperature"], s["top_k"], s["ks"]) == (2, False, 0.5, 5, [1, 2])
    assert main(["eval", *base, "eval.n=2", "eval.temperature=0.5", "--n", "4", "--top-p", "0.9"]) == 0
    s = json.loads(out.read_text())["settings"]
    assert (s["n"], s["temperature"], s["top_p"], s["ks"]) == (4, 0.5, 0.9, [1, 4])
    assert main(["eval", *base, "--n", "3"]) == 0  # greedy section: rollout.temperature (1.0)
    s = json.loads(out.read_text())["settings"]
    assert (s["n"], s["greedy"], s["temperature"]) == (3, False, 1.0)
    assert main(["eval", *base]) == 0  # the default section: greedy, one sample
    s = json.loads(out.read_text())["settings"]
    assert (s["n"], s["greedy"], s["ks"]) == (1, True, [1])
