"""Reward functions in every framework's documented form (reasonrl/rewards/styles.py, reward.fn_style,
reward.fns): told by their parameter names, passed by keyword, in the training process and in the
reward worker pool alike, with hand-computed scores. The functions are tests/fixtures/reward_styles.py's,
written with exactly each framework's signature and return (no framework is installed). Then TRL's
None (a weighted sum without it; advantage 0 where no function applies), what the functions log,
the refusals at start-up, the worker pool's timeouts and memory bound, and two steps of training
with each example config of configs/reward_styles/."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from reasonrl.batch import Example, Rollouts, Scores, StepBatch
from reasonrl.cli import main
from reasonrl.config import AlgoConfig, RewardConfig, load_config
from reasonrl.errors import ConfigError
from reasonrl.rewards import check_examples, score_examples
from reasonrl.rewards.styles import decode_truth, detect, invoke, resolve, trl_columns
from reasonrl.rewards.verifiers import load_target
from reasonrl.train.advantage_stage import estimate_advantages
from reasonrl.train.step_metrics import batch_metrics

REPO = Path(__file__).parents[2]
F = str(REPO / "tests" / "fixtures" / "reward_styles.py")
ISOLATE = pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "worker-pool"])


def fn(name: str):
    return load_target(f"{F}:{name}")


def cfg_for(name: str, isolate: bool = False, **changes) -> RewardConfig:
    return RewardConfig(fn=f"{F}:{name}", isolate_fn=isolate, **changes)


def examples(*specs) -> list[Example]:
    """(prompt, ground truth, data_source, extra_info) -> Examples, origin f:<line>."""
    return [Example(p, t, s, {**info, "origin": f"f:{i}"}) for i, (p, t, s, info) in enumerate(specs, 1)]


SUMS = examples(("What is 3 + 4?", "7", "toy", {"bonus": 1}), ("What is 1 + 1?", "2", "toy", {}))


# ---- which style a signature is -------------------------------------------------------------------

@pytest.mark.parametrize("name, style", [
    ("own", "reasonrl"), ("own_reordered", "reasonrl"), ("own_batch", "reasonrl_batch"),
    ("trl_accuracy", "trl"), ("trl_math_only", "trl"), ("trl_async_length", "trl"), ("trl_ids", "trl"),
    ("compute_score", "verl"), ("compute_score_async", "verl"), ("tinyzero_style", "verl"),
    ("reward_func", "openrlhf"), ("mystery", None), ("positional", None)])
def test_a_style_is_told_by_the_parameter_names(name, style):
    assert detect(fn(name)) == style


def test_a_signature_of_no_style_is_refused_at_start_up_in_one_line():
    with pytest.raises(ConfigError) as info:
        check_examples(SUMS, cfg_for("mystery"))
    message = str(info.value)
    assert "\n" not in message
    assert message == (
        f"reward.fn: cannot use '{F}:mystery': TypeError: mystery(text, answer) matches no reward-function "
        "style (reasonrl f(completion, ground_truth, extra_info); reasonrl_batch f(completions, "
        "ground_truths, groups, extra_infos); trl f(prompts, completions, completion_ids, **columns); verl "
        "f(data_source, solution_str, ground_truth, extra_info); openrlhf f(queries, prompts, labels)): name "
        "its parameters as one of them, or set reward.fn_style")
    with pytest.raises(TypeError, match="matches no reward-function style"):
        resolve(fn("mystery"), "auto")
    assert resolve(fn("mystery"), "trl") == "trl"  # asked for: then its call is checked (below)


# ---- the misbinding of issue #41: verl's compute_score -----------------------------------------

VERL = examples(("What is 3 + 4?", '{"target": 7}', "toy", {"weight": 2.0}),
                ("What is 1 + 1?", '{"target": 2}', "other", {}))


@ISOLATE
def test_verls_compute_score_is_bound_by_keyword(isolate):
    """compute_score(data_source, solution_str, ground_truth, extra_info): row 1 is "toy" with
    weight 2 and a hit, 2 x 1 + 0.5 = 2.5; row 2 is "other" without a hit, 0. Called by
    position as reasonrl used to, compute_score_scaled got the completion as data_source, the
    ground truth as solution_str and extra_info as ground_truth: 0 for a right answer, and no
    message (the bug); by keyword it scores 1."""
    check_examples(VERL, cfg_for("compute_score", isolate))
    scores = score_examples(["it is 7", "no"], VERL, cfg_for("compute_score", isolate))
    assert scores.total.tolist() == [2.5, 0.0] and scores.errors == 0
    scaled = cfg_for("compute_score_scaled", isolate)
    assert score_examples(["it is 7"], SUMS[:1], scaled).total.tolist() == [1.0]
    assert fn("compute_score_scaled")("it is 7", "7", {"bonus": 1}) == 0.0  # the old positional call


def test_the_misbinding_is_refused_when_reasonrl_style_is_forced():
    """reward.fn_style=reasonrl calls by position a function that does not name reasonrl's
    arguments; one whose names are another style's is refused instead of misbound."""
    with pytest.raises(ConfigError, match=r"compute_score\(data_source, solution_str, ground_truth, "
                                          r"extra_info=None\) is called as a reasonrl reward function, "
                                          r"f\(completion, ground_truth, extra_info\) by position, but its "
                                          r"parameter names are verl's.*set reward.fn_style=verl or auto$"):
        check_examples(VERL, cfg_for("compute_score", fn_style="reasonrl"))


def test_openrlhfs_reward_func_is_no_longer_called_with_reasonrls_arguments():
    """reward_func(queries, prompts, labels) bound reasonrl's (completion, ground_truth,
    extra_info) and failed on every call; now it gets its own arguments."""
    check_examples(SUMS, cfg_for("reward_func"))
    assert score_examples(["it is 7", "3"], SUMS, cfg_for("reward_func")).total.tolist() == [1.0, 0.0]


# ---- each style, in the training process and in the worker pool --------------------------------

@ISOLATE
@pytest.mark.parametrize("name, fn_style, kwargs, completions, expected", [
    # reasonrl's own: 1 for a hit + 0.25 for extra_info's "bonus" (row 1 has it)
    ("own", "auto", {}, ["it is 7", "3"], [1.25, 0.0]),
    ("own_reordered", "auto", {}, ["it is 7", "3"], [1.25, 0.0]),  # by name, whatever the order
    ("positional", "reasonrl", {}, ["it is 7", "3"], [2.0, 0.0]),  # asked for: by position, as before
    # reasonrl's batch form: groups [0, 1]; each row the first hit of its group: 1.5
    ("own_batch", "auto", {}, ["7", "2"], [1.5, 1.5]),
    # TRL: the ground_truth column by name; async: characters / 10
    ("trl_accuracy", "auto", {}, ["it is 7", "3"], [1.0, 0.0]),
    ("trl_async_length", "auto", {}, ["it is 7", "3"], [0.7, 0.1]),
    ("trl_ids", "trl", {}, ["a", "b"], [3.0, 1.0]),  # completion_ids [[1, 2, 3], [4]]
    # verl: reward_kwargs (reward.fn_kwargs) over the call's keywords; async; TinyZero's names only
    ("compute_score_scaled", "verl", {"scale": 3.0}, ["it is 7", "3"], [3.0, 0.0]),
    ("compute_score_async", "auto", {}, ["it is 7", "3"], [3.0, 0.0]),
    ("tinyzero_style", "auto", {}, ["it is 7", "3"], [1.0, 0.1]),
    # OpenRLHF: the response is the query after its prompt
    ("reward_func", "openrlhf", {}, ["it is 7", "3"], [1.0, 0.0]),
])
def test_each_style_scores_as_its_framework_calls_it(isolate, name, fn_style, kwargs, completions, expected):
    cfg = cfg_for(name, isolate, fn_style=fn_style, fn_kwargs=kwargs)
    check_examples(SUMS, cfg)
    scores = score_examples(completions, SUMS, cfg, groups=[0, 1], completion_ids=[[1, 2, 3], [4]])
    assert scores.errors == scores.timeouts == 0, scores.failures
    assert scores.total.tolist() == pytest.approx(expected)


@ISOLATE
def test_trl_gets_what_trl_passes(isolate):
    """trl_sees adds 10 for conversational prompts, 20 for completions as assistant messages, 40
    for a dict ground truth (the reader's JSON text decoded), 80 for data_source "toy", 160 for
    extra_info without reasonrl's origin, and the extra_info key `level` given as a column."""
    chat = [{"role": "user", "content": "What is 3 + 4?"}]
    rows = examples((chat, '{"target": 7}', "toy", {"level": 3}),
                    ("What is 1 + 1?", "2", "other", {"level": 5}))
    scores = score_examples(["7", "2"], rows, cfg_for("trl_sees", isolate), completion_ids=[[1], [2]])
    assert scores.total.tolist() == [10 + 20 + 40 + 80 + 160 + 3, 160 + 5] and scores.errors == 0


def test_an_extra_info_key_never_shadows_trls_own_arguments():
    """extra_info {"completions": ..., "ground_truth": ...}: TRL's completions and the record's
    ground truth win; the key `extra` is a column."""
    rows = examples(("q", "7", "x", {"completions": ["no"], "ground_truth": "no", "extra": 1}))
    assert check_examples(rows, cfg_for("trl_accuracy")) is None
    assert score_examples(["it is 7"], rows, cfg_for("trl_accuracy")).total.tolist() == [1.0]
    assert trl_columns([r.meta for r in rows]) == ("ground_truth", "data_source", "extra_info", "extra")


def test_returns_as_tensors_or_arrays_are_read_as_their_values():
    """A [N, 1] tensor of rewards (a reward model's logits) is N rewards; numpy scalars are
    numbers; a one-element tensor in extra_logs is its value."""
    import numpy as np

    from reasonrl.rewards.styles import _listed, _numbers
    assert _listed(torch.tensor([[1.0], [0.5]]), "x") == [1.0, 0.5]
    assert _listed([np.float32(0.25), 1], "x") == [0.25, 1] and _listed(torch.tensor(2.0), "x") == [2.0]
    assert _numbers(torch.tensor([3.0])) == [3.0] and _numbers("text") == []
    assert _numbers([1, "a", True]) == [1.0, 1.0]
    with pytest.raises(TypeError, match="must be a list"):
        _listed(3.0, "a TRL reward function's return")


def test_a_trl_completion_is_a_message_when_the_prompt_is_a_conversation():
    out = invoke("trl", fn("trl_accuracy"), {
        "completions": ["it is 7"], "ground_truths": ["7"], "groups": [0], "extra_infos": [{}],
        "prompts": [[{"role": "user", "content": "3 + 4?"}]], "completion_ids": [[1]], "data_sources": ["x"]})
    assert out == {"values": [1.0], "logged": [{}]}


def test_ground_truths_come_back_as_the_data_file_held_them():
    """reasonrl's reader keeps an object as its sorted JSON text; TRL, verl and OpenRLHF get the
    object. Text that is no JSON object stays text: "72" (verl's GSM8K compares strings), a
    MATH interval "[0, 1]"."""
    assert decode_truth('{"numbers": [3, 5], "target": 8}') == {"numbers": [3, 5], "target": 8}
    for text in ("72", "[0, 1]", "{1, 2}"):
        assert decode_truth(text) == text


# ---- what the functions log -----------------------------------------------------------------------

@ISOLATE
def test_verl_dict_extra_keys_are_parts_and_logged(isolate):
    """{"score", "acc": bool, "pred": str}: acc is a part and reward/verl/acc (its mean), pred (text,
    which verl only dumps) is neither."""
    scores = score_examples(["it is 7", "no"], VERL, cfg_for("compute_score", isolate))
    assert scores.parts == [{"acc": 1.0}, {"acc": 0.0}]
    assert scores.logged == [{"verl/acc": 1.0}, {"verl/acc": 0.0}]
    metrics = batch_metrics(step_batch(scores, [0, 1]), torch.zeros(2))
    assert metrics["reward/verl/acc"] == 0.5 and metrics["reward/correct"] == 1.25


@ISOLATE
def test_openrlhf_dict_of_tensors_rewards_and_logs(isolate):
    """rewards [1, 0]; scores (0.5 per hit) and extra_logs' per-completion query_chars ("What is 3 +
    4?" + "it is 7" = 14 + 7 = 21, 14 + 1 = 15 characters) per row; hit_rate (a batch mean) on
    every row."""
    scores = score_examples(["it is 7", "3"], SUMS, cfg_for("reward_func", isolate))
    assert scores.total.tolist() == [1.0, 0.0]
    assert scores.logged == [
        {"openrlhf/scores": 0.5, "openrlhf/query_chars": 21.0, "openrlhf/hit_rate": 0.5},
        {"openrlhf/scores": 0.0, "openrlhf/query_chars": 15.0, "openrlhf/hit_rate": 0.5}]
    metrics = batch_metrics(step_batch(scores, [0, 1]), torch.zeros(2))
    assert (metrics["reward/openrlhf/scores"], metrics["reward/openrlhf/query_chars"],
            metrics["reward/openrlhf/hit_rate"]) == (0.25, 18.0, 0.5)


def test_trl_log_metric_is_logged_and_log_extra_is_not_passed():
    scores = score_examples(["it is 7", "3"], SUMS, cfg_for("trl_logging"))
    assert scores.total.tolist() == [1.0, 0.0] and scores.errors == 0
    assert scores.logged == [{"trl/accuracy": 0.5}] * 2


# ---- TRL's None: "this function does not apply" ----------------------------------------------------

MIXED = examples(("Solve x + 1 = 5", "4", "mix", {"task": "math"}), ("Write f", "0", "mix", {"task": "code"}),
                 ("Tell a story", "0", "mix", {"task": "story"}))
TWO_FUNCTIONS = RewardConfig(fns={"math": f"{F}:trl_math_only", "code": f"{F}:trl_code_only"},
                             weights={"math": 1.0, "code": 2.0}, isolate_fn=False)


@ISOLATE
def test_a_none_leaves_its_function_out_of_the_weighted_sum(isolate):
    """TRL's docs' mixed dataset: math applies to row 1 (a digit: 1.0), code to row 2 (0.5 x 2),
    neither to row 3, which nothing scores. Each function's metric is its mean over the rows it
    applied to (TRL's nanmean)."""
    cfg = dataclasses.replace(TWO_FUNCTIONS, isolate_fn=isolate)
    check_examples(MIXED, cfg)
    scores = score_examples(["x = 4", "def f(): pass", "once"], MIXED, cfg)
    assert scores.total.tolist() == [1.0, 1.0, 0.0] and scores.errors == 0
    assert {k: v.tolist() for k, v in scores.applied.items()} == {"math": [True, False, False],
                                                                   "code": [False, True, False]}
    assert scores.unscored.tolist() == [False, False, True]
    metrics = batch_metrics(step_batch(scores, [0, 1, 2]), torch.zeros(3))
    assert (metrics["reward/math"], metrics["reward/code"], metrics["reward/unscored"]) == (1.0, 0.5, 1.0)


def test_a_component_that_always_applies_keeps_every_row_scored():
    """A built-in component (format) beside a TRL function that returns None: no row is unscored."""
    cfg = RewardConfig(fns={"never": f"{F}:trl_never"}, weights={"never": 1.0, "format": 0.5},
                       isolate_fn=False)
    scores = score_examples(["a", "b"], SUMS, cfg)
    assert scores.applied["never"].tolist() == [False, False] and scores.unscored.tolist() == [False, False]


def rollouts_for(groups: list[int], texts: list[str]) -> Rollouts:
    n = len(groups)
    return Rollouts(prompt_ids=[[1]] * n, completion_ids=[[5, 6]] * n, texts=texts,
                    group=torch.tensor(groups), truncated=torch.zeros(n, dtype=torch.bool),
                    examples=[SUMS[0]] * n)


def step_batch(scores: Scores, groups: list[int], texts: list[str] | None = None) -> StepBatch:
    return StepBatch(rollouts_for(groups, texts or ["x"] * len(groups)), scores, scores.total.clone(),
                     torch.ones(len(groups), dtype=torch.bool))


def test_a_completion_no_function_applies_to_has_advantage_0_and_stays_out_of_its_group():
    """Group 0 scores [3, 1, None, 2]: grpo's mean and std come from 3, 1, 2 (mean 2, unbiased std
    1), so A = (r - 2) / (1 + 1e-4) for those and 0 for the None; counted as 0 instead, the mean
    would be 1.5. Group 1 scores nothing: all 0. TRL: NaN reward, nanmean / nanstd, nan_to_num."""
    texts = ["3", "1", "none", "2", "x", "y"]
    cfg = RewardConfig(fns={"num": f"{F}:trl_numbers_only"}, weights={"num": 1.0}, isolate_fn=False)
    scores = score_examples(texts, [SUMS[0]] * 6, cfg, groups=[0, 0, 0, 0, 1, 1])
    assert scores.unscored.tolist() == [False, False, True, False, True, True]
    batch = step_batch(scores, [0, 0, 0, 0, 1, 1], texts)
    advantages, _, _ = estimate_advantages(batch, None, None, batch.trainable, AlgoConfig(advantage="grpo"))
    a = 1 / (1 + 1e-4)
    torch.testing.assert_close(advantages, torch.tensor([a, -a, 0.0, 0.0, 0.0, 0.0]))
    rloo, _, _ = estimate_advantages(batch, None, None, batch.trainable, AlgoConfig(advantage="rloo"))
    # RLOO over 3, 1, 2: r - mean of the other two
    torch.testing.assert_close(rloo, torch.tensor([1.5, -1.5, 0.0, 0.0, 0.0, 0.0]))


def test_under_a_critic_an_unscored_row_has_no_advantage_and_no_critic_target():
    """GAE, gamma = lam = 1, no whitening: row 0 (reward 1, values 0.1, 0.3) A = 1 - V = [0.9, 0.7];
    row 1, unscored, 0 and out of the critic's loss."""
    rollouts = Rollouts(prompt_ids=[[1], [1]], completion_ids=[[5, 6], [7, 8]], texts=["a", "b"],
                        group=torch.tensor([0, 1]), truncated=torch.tensor([False, False]), examples=SUMS)
    scores = Scores(torch.tensor([1.0, 0.0]), {"correct": torch.tensor([1.0, 0.0])},
                    applied={"correct": torch.tensor([True, False])})
    batch = StepBatch(rollouts, scores, scores.total.clone(), torch.tensor([True, True]))
    values = [torch.tensor([0.1, 0.3]), torch.tensor([0.5, 0.25])]
    advantages, critic, _ = estimate_advantages(batch, None, values, batch.trainable,
                                                AlgoConfig(advantage="gae", whiten_advantages=False))
    torch.testing.assert_close(advantages, torch.tensor([[0.9, 0.7], [0.0, 0.0]]))
    assert critic.loss_mask.tolist() == [True, False]


# ---- what every style keeps: counted failures, finite checks, timeouts, the memory bound -----------

@ISOLATE
def test_a_nan_or_a_missing_score_is_a_counted_failure(isolate):
    nan = score_examples(["a", "b"], SUMS, cfg_for("trl_nan", isolate))
    assert nan.total.tolist() == [0.0, 1.0] and nan.errors == 1
    assert nan.failures[0] == f"reward.fn {F}:trl_nan: ValueError: reward is nan"
    bad = score_examples(["a"], SUMS[:1], cfg_for("compute_score_no_score_key", isolate))
    assert bad.errors == 1 and bad.failures[0].endswith(
        "ValueError: verl's compute_score returned a dict without 'score' (keys ['acc'])")
    short = score_examples(["a", "b"], SUMS, cfg_for("reward_func_short", isolate))
    assert short.errors == 2 and short.failures[0].endswith(
        "ValueError: OpenRLHF's reward_func 'rewards' must give one score per completion (2), got 1")
    unknown_ids = score_examples(["a"], SUMS[:1], cfg_for("trl_ids", isolate))  # `reasonrl reward`: no ids
    assert unknown_ids.errors == 1 and "NoneType" in unknown_ids.failures[0]


def test_a_hanging_trl_function_is_cut_at_its_timeout():
    cfg = cfg_for("trl_hang", True, timeout=0.2)
    scores = score_examples(["a", "b"], SUMS, cfg)
    assert scores.timeouts == 2 and scores.errors == 0 and scores.total.tolist() == [0.0, 0.0]
    assert scores.failures[0] == f"reward.fn {F}:trl_hang: timed out (reward.timeout: 0.4 s)"


def test_a_styled_function_in_the_pool_is_held_to_the_memory_bound():
    scores = score_examples(["a"], SUMS[:1], cfg_for("trl_hog", True, max_memory_mb=512))
    assert scores.errors == 1 and scores.failures[0].startswith(
        f"reward.fn {F}:trl_hog: out of memory (reward.max_memory_mb: 512 MB): MemoryError")


# ---- refused at start-up, one line each -------------------------------------------------------------

@pytest.mark.parametrize("name, rows, needle", [
    ("trl_curriculum", SUMS, r"missing a required argument: 'trainer_state' \(trainer_state is TRL's and "
                             r"reasonrl does not pass it\)$"),
    ("trl_solution", SUMS, r"missing a required argument: 'solution' \(the records' columns: ground_truth, "
                           r"data_source, extra_info, bonus\)$"),
    ("reward_func", examples(([{"role": "user", "content": "q"}], "1", "x", {})),
     r"f:1: the prompt is a list of chat messages, and OpenRLHF's reward_func reads text"),
    ("own", SUMS, r"own\(completion, ground_truth, extra_info\) is called as a reasonrl reward function, "
                  r"f\(completion, ground_truth, extra_info\): it takes no keyword 'scale' of "
                  r"reward.fn_kwargs$"),
])
def test_a_function_its_style_cannot_call_is_refused(name, rows, needle):
    kwargs = {"scale": 2.0} if name == "own" else {}
    with pytest.raises(ConfigError, match=rf"^reward.fn: cannot use '.*:{name}': .*{needle}") as info:
        check_examples(rows, cfg_for(name, fn_kwargs=kwargs))
    assert "\n" not in str(info.value)


def test_a_trl_column_from_extra_info_satisfies_the_check():
    rows = examples(("q", "7", "x", {"solution": "7"}))
    check_examples(rows, cfg_for("trl_solution"))
    assert score_examples(["it is 7"], rows, cfg_for("trl_solution")).total.tolist() == [1.0]


def test_reward_fns_keys_in_the_config():
    fns = f"reward.fns={{math: {F}:trl_math_only}}"
    cfg = load_config(None, [fns, "reward.weights={math: 1.0, format: 0.5}", "reward.gate=[math]"])
    assert cfg.reward.fns == {"math": f"{F}:trl_math_only"} and cfg.reward.fn_style == "auto"
    for overrides, message in [
        ([fns, "reward.weights={mathh: 1.0}"], "reward.weights.mathh: unknown reward component; allowed: "
         "correct, format, format_paired, format_trl_grpo, format_r1_zero, boxed, answer_present, judge, "
         "classifier, or a name of reward.fns: math"),
        ([fns], "reward.fns.math: not in reward.weights, so it is not computed; add reward.weights.math "
                "(TRL's reward_weights default to 1.0 each)"),
        ([f"reward.fns={{format: {F}:trl_never}}", "reward.weights={format: 1}"],
         "reward.fns.format: 'format' is a built-in reward component; give the function another name"),
        ([f"reward.fns={{accuracy: {F}:trl_never}}", "reward.weights={accuracy: 1}"],
         "reward.fns.accuracy: its metric would be reward/accuracy, which the step logs already; give the "
         "function another name (letters, digits, _ and -)"),
        (["reward.fn_kwargs={scale: 2}"], "reward.fn_kwargs: set, but there is no reward.fn, reward.fns or "
                                          "reward.batch_fn to pass them to"),
        ([f"reward.batch_fn={F}:own_batch", "reward.fn_style=trl"],
         "reward.batch_fn: reasonrl's batch form, but reward.fn_style=trl; give a function of another style "
         "as reward.fn"),
    ]:
        with pytest.raises(ConfigError) as info:
            load_config(None, overrides)
        assert str(info.value) == message


# ---- two steps of training with each example config --------------------------------------------------

TINY = ["model.path=tiny", "trainer.steps=2", "trainer.batch_size=8", "rollout.n=4",
        "rollout.max_new_tokens=12", "trainer.progress=false", "tracking.report=false",
        "data.arithmetic.train_size=64", "data.arithmetic.val_size=4", "trainer.eval_every=0"]


def recomputed(style: str, sample: dict) -> float:
    """A logged sample's reward, computed again from its completion by the config's own function."""
    target = {"verl": "verl_reward.py:compute_score", "openrlhf": "openrlhf_reward.py:reward_func"}
    if style == "trl":  # correct 1.0, brevity 0.1, sums 0.1; a None is left out
        rows = {"completions": [sample["completion"]], "ground_truths": [sample["ground_truth"]],
                "groups": [0], "extra_infos": [{}], "prompts": [sample["prompt"]], "completion_ids": [[0]],
                "data_sources": ["arithmetic"]}
        module = "configs/reward_styles/trl_reward.py"
        weights = {"accuracy_reward": 1.0, "brevity_reward": 0.1, "sum_only_reward": 0.1}
        return sum(w * (invoke("trl", load_target(f"{module}:{name}"), rows)["values"][0] or 0.0)
                   for name, w in weights.items())
    f = load_target(f"configs/reward_styles/{target[style]}")
    if style == "verl":
        return f("arithmetic", sample["completion"], sample["ground_truth"], {}, format_score=0.1)["score"]
    out = f([sample["prompt"] + sample["completion"]], [sample["prompt"]], [sample["ground_truth"]])
    return out["rewards"][0].item()


@pytest.mark.parametrize("style, logged", [("verl", ["reward/verl/acc", "reward/verl/answered"]),
                                           ("trl", ["reward/correct", "reward/brevity", "reward/sums",
                                                    "reward/unscored"]),
                                           ("openrlhf", ["reward/openrlhf/scores",
                                                         "reward/openrlhf/answer_rate"])])
def test_each_example_config_trains_two_steps(tmp_path, style, logged):
    """configs/reward_styles/<style>.yaml, two steps on the tiny model: every logged reward is its
    function's score of the logged completion (whatever the model sampled), no reward failed,
    and the style's own metrics are logged."""
    assert main(["train", f"configs/reward_styles/{style}.yaml", *TINY, f"trainer.output_dir={tmp_path}",
                 "trainer.run_name=r", "trainer.log_samples=8"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    for line in lines[1:]:
        assert line["reward/errors"] == line["reward/timeouts"] == 0
        for key in logged:
            assert key in line, key
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert samples
    for sample in samples:
        assert sample["reward"] == pytest.approx(recomputed(style, sample), abs=1e-6), sample
