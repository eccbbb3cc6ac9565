"""reward.combine=gdpo where a step's rewards are made (`reasonrl.source.collect.step_rewards`):
the components it normalises (the gate, the environment's reward, DAPO's overlong penalty), its
dynamic sampling, its per-component metrics, and whole runs through the `Trainer` on the tiny
model. The formula itself is tests/algo/test_gdpo.py's."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import REPO, keep_torch_threads, smoke_cfg  # noqa: F401 - an autouse fixture

import reasonrl.model.colocate
import reasonrl.source.collect
from reasonrl.algo import AdvantageInputs, estimate, gdpo_rewards
from reasonrl.batch import Example, Rollouts, Scores
from reasonrl.config import load_config
from reasonrl.source.collect import step_rewards
from reasonrl.train.trainer import Trainer

RANKED = f"{REPO / 'tests' / 'fixtures' / 'batch_reward.py'}:ranked"  # never flat, groups apart
A = math.sqrt(3) / 2  # +-A: a 0/1 component split 2-2 in a group of 4, normalised (unbiased std 1/sqrt(3))


def rollouts(lengths: list[int]) -> Rollouts:
    """One group of len(lengths) single-turn rows whose completions have these lengths."""
    n = len(lengths)
    return Rollouts(prompt_ids=[[1]] * n, completion_ids=[[7] * k for k in lengths], texts=[""] * n,
                    group=torch.zeros(n, dtype=torch.long), truncated=torch.zeros(n, dtype=torch.bool),
                    examples=[Example(prompt="", ground_truth="0")] * n)


def scores(**components: list[float]) -> Scores:
    values = {k: torch.tensor(v) for k, v in components.items()}
    return Scores(total=sum(values.values()), components=values)


def test_a_gate_zeroes_every_component_of_a_row_that_fails_it():
    """gate=[correct], weights {correct: 1, format: 0.5}, one group of 4, std_eps=0:
    correct [1, 0, 1, 0] -> [A, -A, A, -A] (A = sqrt(3)/2); format [1, 1, 0, 0] as the gate leaves
    it is [1, 0, 0, 0] (row 1 is wrong): mean 1/4, std sqrt((9/16 + 3 * 1/16) / 3) = 1/2, so
    [3/2, -1/2, -1/2, -1/2]; the rewards are [A + 3/4, -A - 1/4, A - 1/4, -A - 1/4]. Without the
    gate format [1, 1, 0, 0] -> [A, A, -A, -A] and row 1 would get -A + A/2."""
    cfg = load_config(None, ["reward.combine=gdpo", "reward.weights={correct: 1.0, format: 0.5}",
                             "reward.gate=[correct]", "algo.std_eps=0"])
    s = scores(correct=[1.0, 0.0, 1.0, 0.0], format=[1.0, 1.0, 0.0, 0.0])
    got = step_rewards(s, rollouts([3, 3, 3, 3]), 16, cfg)
    torch.testing.assert_close(got, torch.tensor([A + 0.75, -A - 0.25, A - 0.25, -A - 0.25]))
    cfg.reward.gate = []
    assert step_rewards(s, rollouts([3, 3, 3, 3]), 16, cfg)[1].item() == pytest.approx(-A / 2)


def test_the_environments_reward_and_the_overlong_penalty_are_components():
    """Multi-turn's `env` (weight 1, as the sum adds it) and DAPO's overlong penalty (weight
    algo.overlong_penalty = 0.5) are normalised like the weighted components. One group of 4,
    lengths [4, 4, 8, 8] with max_new_tokens 8 and a buffer of 4: penalty at factor 1 [0, 0, -1, -1]
    -> [A, A, -A, -A]; correct [1, 0, 1, 0] -> [A, -A, A, -A]; env [0, 0, 0, 2] (mean 1/2, std 1)
    -> [-1/2, -1/2, -1/2, 3/2]. Rewards: [3A/2 - 1/2, -A/2 - 1/2, A/2 - 1/2, -3A/2 + 3/2].
    reward.combine=sum adds them as they are: total [1, 0, 1, 2] + penalty [0, 0, -0.5, -0.5]."""
    over = ["algo.overlong_buffer=4", "algo.overlong_penalty=0.5", "algo.std_eps=0"]
    s = scores(correct=[1.0, 0.0, 1.0, 0.0], env=[0.0, 0.0, 0.0, 2.0])
    got = step_rewards(s, rollouts([4, 4, 8, 8]), 8, load_config(None, ["reward.combine=gdpo", *over]))
    torch.testing.assert_close(got, torch.tensor([1.5 * A - 0.5, -A / 2 - 0.5, A / 2 - 0.5, -1.5 * A + 1.5]))
    summed = step_rewards(s, rollouts([4, 4, 8, 8]), 8, load_config(None, over))
    assert summed.tolist() == [1.0, 0.0, 0.5, 1.5]


def test_a_batch_reward_is_the_correct_component():
    """reward.batch_fn scores `correct` (tests/fixtures/batch_reward.py:group_rank: 1 for a hit,
    +0.5 for the group's first), which GDPO normalises like any component; answer_present (weight
    0.5) is the other. Two groups of 4, std_eps=0, A = sqrt(3)/2.
    Group 0 (truth 7), texts [7, 7, x, x]: correct [1.5, 1, 0, 0], mean 5/8, std
    sqrt((49 + 9 + 25 + 25) / 64 / 3) = 3/4, so [7/6, 1/2, -5/6, -5/6]; answer_present [1, 1, 0, 0]
    -> [A, A, -A, -A]. Group 1 (truth 3), texts [no, 3, 3, no]: correct [0, 1.5, 1, 0] -> [-5/6,
    7/6, 1/2, -5/6]; answer_present [0, 1, 1, 0] -> [-A, A, A, -A]."""
    cfg = load_config(None, ["reward.combine=gdpo", "reward.weights={correct: 1.0, answer_present: 0.5}",
                             f"reward.batch_fn={REPO / 'tests' / 'fixtures' / 'batch_reward.py'}:group_rank",
                             "reward.isolate_fn=false", "algo.std_eps=0"])
    texts = ["7", "7", "x", "x", "no", "3", "3", "no"]
    batch = rollouts([1] * 8)
    batch.group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    batch.examples = [Example(prompt="", ground_truth=t) for t in ["7"] * 4 + ["3"] * 4]
    s = reasonrl.source.collect.score_rollouts(texts, batch.examples, cfg.reward, groups=batch.group.tolist())
    assert s.components["correct"].tolist() == [1.5, 1.0, 0.0, 0.0, 0.0, 1.5, 1.0, 0.0]
    high, low = 7 / 6 + A / 2, -5 / 6 - A / 2
    torch.testing.assert_close(step_rewards(s, batch, 16, cfg),
                               torch.tensor([high, 0.5 + A / 2, low, low, low, high, 0.5 + A / 2, low]))


# ------------------------------------------------------- through the trainer, scores scripted

BASE = ["trainer.progress=false", "data.arithmetic.val_size=0", "data.arithmetic.train_size=32",
        "trainer.batch_size=8", "rollout.n=2", "rollout.max_new_tokens=8", "trainer.threads=1",
        "reward.combine=gdpo", "reward.weights={correct: 1.0, format: 0.5}"]


class ScriptedComponents:
    """Call k scores the k-th script's groups of two: "flat" (correct [0, 0], format [1, 1]),
    "format" (correct [0, 0], format [0, 1]: only format varies), "both" (correct [1, 0],
    format [0, 1])."""

    KINDS = {"flat": ([0.0, 0.0], [1.0, 1.0]), "format": ([0.0, 0.0], [0.0, 1.0]),
             "both": ([1.0, 0.0], [0.0, 1.0])}

    def __init__(self, *script):
        self.script, self.calls = list(script), 0

    def __call__(self, texts, *args, **kwargs) -> Scores:
        kinds = self.script[min(self.calls, len(self.script) - 1)]
        assert len(texts) == 2 * len(kinds)
        self.calls += 1
        correct = [v for k in kinds for v in self.KINDS[k][0]]
        form = [v for k in kinds for v in self.KINDS[k][1]]
        return scores(correct=correct, format=form)


def trainer_with(tmp_path, monkeypatch, tiny, fake, *overrides) -> Trainer:
    model, tokenizer = tiny
    monkeypatch.setattr(reasonrl.model.colocate, "load_model_and_tokenizer",
                        lambda *args, **kwargs: (copy.deepcopy(model), tokenizer))
    monkeypatch.setattr(reasonrl.source.collect, "score_rollouts", fake)
    return Trainer(load_config(REPO / "configs" / "smoke.yaml", [f"trainer.output_dir={tmp_path}", *BASE,
                                                                 *overrides]))


@pytest.mark.parametrize("advantage", ["reinforce_pp", "rloo"])
def test_dynamic_sampling_keeps_the_groups_any_component_moves(tmp_path, monkeypatch, tiny, advantage):
    """A group in which only format varies carries GDPO signal and is kept; one in which no
    component varies is dropped. 4 groups wanted: round 1 keeps 2 of 4, round 2 (2 prompts) keeps
    1, round 3 (1 prompt) keeps 1. The advantages are the configured estimator of `gdpo_rewards`
    over the kept rows, and reward/<component>_zero_std_groups counts the groups a component is
    constant in: correct in the two "format" groups, format in none."""
    fake = ScriptedComponents(["flat", "format", "flat", "both"], ["format", "flat"], ["both"])
    trainer = trainer_with(tmp_path, monkeypatch, tiny, fake, "algo.dynamic_sampling=true",
                           f"algo.advantage={advantage}")
    metrics, batch, advantages = trainer.step()
    assert fake.calls == 3 and metrics["rollout/dropped_groups"] == 3 and metrics["rollout/groups"] == 4
    group = batch.rollouts.group
    assert group.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.scores.components["format"].tolist() == [0.0, 1.0] * 4
    assert batch.scores.components["correct"].tolist() == [0.0, 0.0, 1.0, 0.0] * 2
    columns = torch.stack([batch.scores.components["correct"], batch.scores.components["format"]], dim=1)
    expected_rewards = gdpo_rewards(columns, [1.0, 0.5], group)
    torch.testing.assert_close(batch.rewards, expected_rewards)
    torch.testing.assert_close(advantages, estimate(advantage, AdvantageInputs(expected_rewards, group))[0])
    assert metrics["reward/correct_zero_std_groups"] == 2 and metrics["reward/format_zero_std_groups"] == 0
    assert metrics["train/sequences"] == 8


# ------------------------------------------------------------ whole runs on the tiny model


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_tiny_run_trains_on_gdpo(tmp_path, staleness):
    """Two steps of the smoke run (`correct` from a batch reward of tests/fixtures that ranks the
    rows in each group and sets the groups apart, whatever the model samples; `format`, which a
    random model never satisfies) with reward.combine=gdpo and the paper's batch normalisation
    (algo.advantage=reinforce_pp), on-policy and one step ahead (trainer.max_staleness=1: the
    batch is collected in the rollout process). Each step trains on reinforce_pp of
    `gdpo_rewards` of the batch's scored components: `format` is constant in both groups, so it
    contributes nothing, and `correct` counts normalised in its group (its plain value would give
    other advantages: the groups lie apart); the weights move. (The length reward left both on
    what the model sampled: flat groups, or two groups of the same spread and mean, ~2% a step.)"""
    cfg = smoke_cfg(tmp_path, f"gdpo{staleness}", "reward.fn=", f"reward.batch_fn={RANKED}",
                    "reward.combine=gdpo", "algo.advantage=reinforce_pp",
                    "reward.weights={correct: 1.0, format: 0.5}", "trainer.steps=2",
                    f"trainer.max_staleness={staleness}")
    trainer = Trainer(cfg)
    try:
        for _ in range(2):
            metrics, batch, advantages = trainer.step()
            correct, form, group = batch.scores.components["correct"], batch.scores.components["format"], \
                batch.rollouts.group
            assert form.tolist() == [0.0] * 8 and metrics["reward/format_zero_std_groups"] == 2.0
            assert correct.tolist() == [0.0, 0.25, 0.5, 0.75, 2.0, 2.25, 2.5, 2.75]
            assert metrics["reward/correct_zero_std_groups"] == 0.0
            rewards = gdpo_rewards(torch.stack([correct, form], dim=1), [1.0, 0.5], group)
            expected = estimate("reinforce_pp", AdvantageInputs(rewards, group))[0]
            torch.testing.assert_close(advantages, expected)
            plain = estimate("reinforce_pp", AdvantageInputs(batch.scores.total, group))[0]
            assert not torch.allclose(advantages, plain, atol=1e-3)
            assert metrics["advantage/std"] == pytest.approx(1.0, abs=1e-3)
            assert metrics["train/grad_norm"] > 0
    finally:
        trainer.source.close()
        trainer.run.release()
