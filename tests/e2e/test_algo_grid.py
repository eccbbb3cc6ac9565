"""Every algorithm combination trains through the real `Trainer`, and the trainer-level
tricks (dynamic sampling, overlong shaping, truncation masking, KL placement) do what
docs/algorithms.md says. Rewards are faked so that groups carry signal on a random model."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

import reasonrl.model.colocate
import reasonrl.source.collect
from reasonrl.algo import group_advantages, overlong_penalty
from reasonrl.batch import Scores
from reasonrl.config import load_config
from reasonrl.errors import ConfigError
from reasonrl.registry import (
    ADVANTAGES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    RATIO_LEVELS,
    needs_critic,
)
from reasonrl.train.trainer import Trainer

REPO_ROOT = Path(__file__).parents[2]
BASE = ["trainer.progress=false", "data.arithmetic.val_size=0", "data.arithmetic.train_size=32",
        "trainer.batch_size=8", "rollout.n=2", "rollout.max_new_tokens=8", "trainer.threads=1",
        "optim.lr=1e-3"]


@pytest.fixture(autouse=True)
def cached_tiny_model(tiny, monkeypatch):
    """Trainers get a fresh copy of the session's tiny model instead of building one."""
    model, tokenizer = tiny
    monkeypatch.setattr(reasonrl.model.colocate, "load_model_and_tokenizer",
                        lambda *args, **kwargs: (copy.deepcopy(model), tokenizer))


def length_rewards(texts, *args, groups, **kwargs) -> Scores:
    """A deterministic reward with spread inside every group, by construction: a row's rank in
    its group plus its text's length mod 3 over 8 (less than 1, so ranks stay apart). The length
    alone (mod 3, halved) left a group of 2 flat one time in 3, and a step without signal
    1 in 81 (every group flat): how often depended on what the model sampled on this CPU."""
    ranks, seen = [], {}
    for g in groups:
        ranks.append(seen.setdefault(g, 0))
        seen[g] += 1
    total = torch.tensor([r + (len(t) % 3) / 8 for r, t in zip(ranks, texts, strict=True)],
                         dtype=torch.float32)
    return Scores(total=total, components={"correct": total})


def step(trainer: Trainer):
    """(metrics, rollouts, scores, advantages) of one step."""
    metrics, batch, advantages = trainer.step()
    return metrics, batch.rollouts, batch.scores, advantages


def make_trainer(tmp_path, *overrides, rewards=length_rewards, monkeypatch=None) -> Trainer:
    cfg = load_config("configs/smoke.yaml", [f"trainer.output_dir={tmp_path}", *BASE, *overrides])
    monkeypatch.setattr(reasonrl.source.collect, "score_rollouts", rewards)
    return Trainer(cfg)


def params(trainer):
    return [p.detach().clone() for p in trainer.policy.model.parameters()]


# ------------------------------------------------------------------------------ the grid


@pytest.mark.parametrize("ratio_level", RATIO_LEVELS.names())
@pytest.mark.parametrize("loss_agg", LOSS_AGGREGATIONS.names())
@pytest.mark.parametrize("advantage", ADVANTAGES.names())
def test_every_combination_trains_two_steps(tmp_path, monkeypatch, advantage, loss_agg, ratio_level):
    trainer = make_trainer(tmp_path, f"algo.advantage={advantage}", f"algo.loss_agg={loss_agg}",
                           f"algo.ratio_level={ratio_level}", monkeypatch=monkeypatch)
    s = trainer.policy.settings
    assert (s.algo.loss_agg, s.algo.ratio_level, s.max_response_length) == (loss_agg, ratio_level, 8)
    before = params(trainer)
    moved = False
    for _ in range(2):
        metrics, rollouts, scores, advantages = step(trainer)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        if needs_critic(advantage):  # token advantages from the critic (test_critic.py)
            assert advantages.shape == (8, max(len(c) for c in rollouts.completion_ids))
            assert metrics["critic/updates"] == 1
        else:  # the advantages trained on are the configured formula of these rewards
            torch.testing.assert_close(advantages, group_advantages(scores.total, rollouts.group, advantage,
                                                                    trainer.cfg.algo.std_eps))
        assert metrics["train/updates"] == 1 and metrics["train/sequences"] == 8
        assert metrics["train/ratio_max"] == pytest.approx(1.0, abs=1e-4)  # one update: on-policy
        moved |= metrics["train/grad_norm"] > 0
    assert moved, "no step had a gradient: the fake rewards gave no signal"
    assert any(not torch.equal(a, b) for a, b in zip(before, params(trainer), strict=True))


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES.names())
def test_every_policy_loss_trains_on_and_off_policy(tmp_path, monkeypatch, policy_loss):
    """Two steps of each `algo.policy_loss` through the real trainer, two mini-batches each (the
    second update off-policy): finite metrics, and the weights move."""
    trainer = make_trainer(tmp_path, f"algo.policy_loss={policy_loss}", "optim.mini_batches=2",
                           monkeypatch=monkeypatch)
    before = params(trainer)
    for _ in range(2):
        metrics = step(trainer)[0]
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["train/updates"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, params(trainer), strict=True))


@pytest.mark.parametrize("estimator", KL_ESTIMATORS.names())
@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_kl_estimators_in_reward_or_loss(tmp_path, monkeypatch, estimator, kl_in):
    beta = 0.1
    trainer = make_trainer(tmp_path, "algo.advantage=raw", f"algo.beta={beta}",
                           f"algo.kl_estimator={estimator}", f"algo.kl_in={kl_in}", monkeypatch=monkeypatch)
    for _ in range(2):
        metrics, rollouts, scores, advantages = step(trainer)
    assert math.isfinite(metrics["train/kl"]) and metrics["train/kl"] != 0.0  # the policy moved
    if estimator != "k1":
        assert metrics["train/kl"] > 0
    if kl_in == "reward":
        # raw advantages = reward - beta * sum_t KL_t, and the metric is the mean of that sum
        penalty = (scores.total - advantages) / beta
        assert penalty.abs().max().item() > 0
        assert penalty.mean().item() == pytest.approx(metrics["train/kl_in_reward"], rel=1e-3, abs=1e-6)
    else:
        assert "train/kl_in_reward" not in metrics
        torch.testing.assert_close(advantages, scores.total)


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_the_reference_model_runs_once_per_step_in_its_stage(tmp_path, monkeypatch, kl_in):
    """Every forward of the reference model happens inside one `reference_logprobs` call (the
    reference stage, timed as time/reference); the KL in the reward and the update's KL term
    both read its log-probs."""
    trainer = make_trainer(tmp_path, "algo.beta=0.1", f"algo.kl_in={kl_in}", monkeypatch=monkeypatch)
    policy, forwards, calls = trainer.policy, [0], []
    policy.ref_model.get_decoder().register_forward_hook(
        lambda *args: forwards.__setitem__(0, forwards[0] + 1))
    stage = policy.reference_logprobs

    def spy(*args):
        before = forwards[0]
        out = stage(*args)
        calls.append(forwards[0] - before)
        return out

    monkeypatch.setattr(policy, "reference_logprobs", spy)
    for _ in range(2):
        metrics = step(trainer)[0]
        assert metrics["time/reference"] > 0
    assert len(calls) == 2 and calls[0] > 0 and sum(calls) == forwards[0]
    assert metrics["train/kl"] != 0  # the second step's, read from the stage by the update


def test_kl_is_logged_only_with_a_reference_model(tmp_path, monkeypatch):
    metrics = make_trainer(tmp_path / "a", monkeypatch=monkeypatch).step()[0]
    assert "train/kl" not in metrics
    trainer = make_trainer(tmp_path / "b", "algo.log_kl=true", monkeypatch=monkeypatch)
    assert trainer.policy.ref_model is not None
    trainer.step()
    assert trainer.step()[0]["train/kl"] > 0


def test_everything_at_once(tmp_path, monkeypatch):
    """DAPO + PPO knobs together: 2 x 2 updates, dual clip, entropy, overlong shaping, KL."""
    trainer = make_trainer(tmp_path, "optim.ppo_epochs=2", "optim.mini_batches=2", "algo.clip_ratio_c=3",
                           "algo.entropy_coef=0.01", "algo.clip_high=0.28", "algo.overlong_buffer=4",
                           "algo.dynamic_sampling=true", "algo.beta=0.05", "algo.kl_estimator=k2",
                           "algo.advantage=rloo", "algo.loss_agg=seq_mean_token_sum_norm",
                           "optim.lr=5e-2", monkeypatch=monkeypatch)
    for _ in range(2):
        metrics = trainer.step()[0]
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["train/updates"] == 4
    assert metrics["train/ratio_max"] > 1.0 + 1e-3 or metrics["train/ratio_min"] < 1.0 - 1e-3


# ------------------------------------------------------------------ dynamic sampling (DAPO)


class ScriptedRewards:
    """Call k returns the k-th script: one entry per group, "mixed" -> [1, 0], "flat" -> [0.5,
    0.5 + 1e-8] (equal up to float noise). Records the texts of every call."""

    def __init__(self, *script):
        self.script, self.calls = list(script), []

    def __call__(self, texts, *args, **kwargs) -> Scores:
        kinds = self.script[min(len(self.calls), len(self.script) - 1)]
        assert len(texts) == 2 * len(kinds), (len(texts), kinds)
        self.calls.append(list(texts))
        values = [v for k in kinds for v in ([1.0, 0.0] if k == "mixed" else [0.5, 0.5 + 1e-8])]
        total = torch.tensor(values)
        return Scores(total=total, components={"correct": total})


def test_dynamic_sampling_drops_flat_groups_and_resamples(tmp_path, monkeypatch):
    # want 4 groups: round 1 keeps 2 of 4, round 2 (2 prompts) keeps 1, round 3 (1 prompt) keeps 1
    fake = ScriptedRewards(["flat", "mixed", "flat", "mixed"], ["mixed", "flat"], ["mixed"])
    trainer = make_trainer(tmp_path, "algo.dynamic_sampling=true", rewards=fake, monkeypatch=monkeypatch)
    metrics, rollouts, scores, advantages = step(trainer)
    assert len(fake.calls) == 3
    assert metrics["rollout/dropped_groups"] == 3 and metrics["rollout/resample_rounds"] == 2
    assert metrics["rollout/groups"] == 4 and metrics["train/sequences"] == 8
    assert rollouts.group.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # exactly the mixed groups' rows, in order, with their own texts, prompts and examples
    first, second, third = fake.calls
    assert rollouts.texts == first[2:4] + first[6:8] + second[0:2] + third
    assert scores.total.tolist() == [1.0, 0.0] * 4
    assert all(rollouts.examples[i] is rollouts.examples[i + 1] for i in (0, 2, 4, 6))
    assert len({e.prompt for e in rollouts.examples}) == 4
    torch.testing.assert_close(advantages, group_advantages(scores.total, rollouts.group, "grpo", 1e-4))
    # all 16 completions sampled: 6 rewarded 1, 6 rewarded 0, 4 rewarded ~0.5
    assert metrics["reward/mean_before_filter"] == pytest.approx(8 / 16)


def test_dynamic_sampling_stops_after_max_resample(tmp_path, monkeypatch):
    fake = ScriptedRewards(["mixed", "flat", "flat", "flat"], ["flat", "flat", "flat"])
    trainer = make_trainer(tmp_path, "algo.dynamic_sampling=true", "algo.max_resample=1", rewards=fake,
                           monkeypatch=monkeypatch)
    metrics, rollouts, _, _ = step(trainer)
    assert len(fake.calls) == 2  # the first round and one resample
    assert metrics["rollout/resample_rounds"] == 1 and metrics["rollout/dropped_groups"] == 6
    assert metrics["rollout/groups"] == 1 and len(rollouts) == 2 and metrics["train/sequences"] == 2


def test_dynamic_sampling_with_nothing_informative_makes_no_update(tmp_path, monkeypatch):
    fake = ScriptedRewards(["flat"] * 4)
    trainer = make_trainer(tmp_path, "algo.dynamic_sampling=true", "algo.max_resample=2", rewards=fake,
                           monkeypatch=monkeypatch)
    before = params(trainer)
    metrics = trainer.step()[0]
    assert len(fake.calls) == 3 and metrics["rollout/dropped_groups"] == 4 + 4 + 4
    assert metrics["rollout/groups"] == 0 and metrics["train/skipped_update"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params(trainer), strict=True))


def test_without_dynamic_sampling_flat_groups_stay(tmp_path, monkeypatch):
    fake = ScriptedRewards(["flat", "mixed", "flat", "mixed"])
    metrics, rollouts, _, _ = step(make_trainer(tmp_path, rewards=fake, monkeypatch=monkeypatch))
    assert len(fake.calls) == 1 and len(rollouts) == 8
    assert metrics["rollout/dropped_groups"] == 0 and metrics["reward/zero_std_groups"] == 2


# ------------------------------------------------------------ overlong shaping, truncation


def zero_rewards(texts, *args, **kwargs) -> Scores:
    return Scores(total=torch.zeros(len(texts)), components={"correct": torch.zeros(len(texts))})


def test_overlong_penalty_is_added_to_the_reward(tmp_path, monkeypatch):
    # raw advantages = the shaped reward = 0 + penalty; max_new_tokens 8, buffer 4
    trainer = make_trainer(tmp_path, "algo.advantage=raw", "algo.overlong_buffer=4",
                           "rollout.max_new_tokens=8", rewards=zero_rewards, monkeypatch=monkeypatch)
    metrics, rollouts, _, advantages = step(trainer)
    expected = overlong_penalty(rollouts.completion_lengths, 8, 4)
    assert expected.min().item() == -1.0  # the random model runs to the budget
    torch.testing.assert_close(advantages, expected)
    assert metrics["reward/overlong_penalty"] == pytest.approx(expected.mean().item())
    assert metrics["reward/mean"] == 0.0  # the task reward is logged unshaped


def test_truncated_completions_can_be_masked_out_of_the_loss(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, "algo.mask_truncated=true", monkeypatch=monkeypatch)
    metrics, rollouts, _, _ = step(trainer)
    kept = (~rollouts.truncated).sum().item()
    assert rollouts.truncated.any()  # a random model rarely stops within 8 tokens
    assert metrics["train/sequences"] == kept
    lengths = [len(c) for c, t in zip(rollouts.completion_ids, rollouts.truncated, strict=True) if not t]
    assert metrics["train/tokens"] == sum(lengths)


# ------------------------------------------------------------------ config and the docs


@pytest.mark.parametrize("override, message", [
    ("algo.advantage=ppo", "algo.advantage: 'ppo' is not allowed; allowed values: "
                           + ", ".join(ADVANTAGES.names())),
    ("algo.loss_agg=mean", "algo.loss_agg: 'mean' is not allowed; allowed values: token, sequence, "
                           "seq_mean_token_sum, seq_mean_token_sum_norm"),
    ("algo.ratio_level=group", "algo.ratio_level: 'group' is not allowed; allowed values: token, sequence"),
    ("algo.kl_estimator=k4", "algo.kl_estimator: 'k4' is not allowed; allowed values: k1, k2, k3, k3+"),
    ("algo.clip_ratio_c=0.5", "algo.clip_ratio_c: must be 0 (off) or > 1, got 0.5"),
    ("algo.max_resample=-1", "algo.max_resample: must be >= 0, got -1"),
    ("algo.dynamic_sampling_tol=-1", "algo.dynamic_sampling_tol: must be >= 0, got -1.0"),
    ("algo.overlong_buffer=64", "algo.overlong_buffer: must be in [0, rollout.max_new_tokens=64), got 64"),
    ("algo.overlong_penalty=-1", "algo.overlong_penalty: must be >= 0, got -1.0"),
    ("algo.std_eps=-1", "algo.std_eps: must be >= 0, got -1.0"),
    ("optim.ppo_epochs=0", "optim.ppo_epochs: must be >= 1, got 0"),
    ("optim.mini_batches=0", "optim.mini_batches: must be >= 1, got 0"),
    ("optim.mini_batches=64", "optim.mini_batches: 64 is more than trainer.batch_size=32 completions"),
    ("algo.dynamic_sampling=maybe", "algo.dynamic_sampling: expected true or false, got 'maybe'"),
])
def test_config_errors_name_key_and_allowed_values(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


def test_n_equal_one_is_allowed_only_without_a_group_baseline():
    for advantage in ("raw", "reinforce_pp"):
        load_config(None, [f"algo.advantage={advantage}", "rollout.n=1", "trainer.batch_size=4"])
    for advantage in ("rloo", "dr_grpo", "reinforce_pp_baseline"):
        with pytest.raises(ConfigError, match=rf"^rollout.n: group advantages \({advantage}\) need n >= 2"):
            load_config(None, [f"algo.advantage={advantage}", "rollout.n=1", "trainer.batch_size=4"])
    with pytest.raises(ConfigError, match="^algo.dynamic_sampling: needs rollout.n >= 2"):
        load_config(None, ["algo.advantage=raw", "rollout.n=1", "trainer.batch_size=4",
                           "algo.dynamic_sampling=true"])


def test_policy_settings_carry_the_config_sections():
    from reasonrl.workers.policy import PolicySettings

    cfg = load_config(None, ["algo.clip_ratio_c=3", "algo.ratio_level=sequence", "algo.entropy_coef=0.01",
                             "algo.log_kl=true", "optim.ppo_epochs=2", "optim.mini_batches=4",
                             "rollout.max_new_tokens=48", "rollout.temperature=0.7", "trainer.steps=9"])
    s = PolicySettings.from_config(cfg)
    assert s.algo is cfg.algo and s.optim is cfg.optim  # every algo and optim key, by construction
    assert (s.max_response_length, s.temperature, s.total_steps) == (48, 0.7, 9)
