"""The critic of PPO: the value model, its worker (values, the clipped value loss, micro-batch
invariance), its config rules and bad-step handling, and a PPO run through the trainer."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from reasonrl.batch import CriticBatch
from reasonrl.config import CriticConfig, OptimConfig, load_config
from reasonrl.errors import ConfigError, TrainingAborted
from reasonrl.train.trainer import Trainer
from reasonrl.workers.critic import CriticWorker, ValueModel

REPO = Path(__file__).parents[2]
PROMPTS = [[1, 5, 9, 11], [1, 5, 9, 11], [3, 4], [2, 3, 7]]
COMPLETIONS = [[20, 21], [30, 31, 32], [40], [50, 51, 52, 53]]


def worker(tiny, micro_batch_size: int = 8, share_prompt: bool = True, lr: float = 1e-3,
           random_head: bool = False, checkpointing: bool = False) -> CriticWorker:
    model = ValueModel(copy.deepcopy(tiny[0]))
    if random_head:  # a head that is not zero: the body gets gradients too
        with torch.no_grad():
            model.value_head.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    return CriticWorker(model, 0, CriticConfig(lr=lr, micro_batch_size=micro_batch_size),
                        OptimConfig(share_prompt=share_prompt, gradient_checkpointing=checkpointing))


def test_the_value_head_starts_at_zero(tiny):
    values = worker(tiny).values(PROMPTS, COMPLETIONS)
    assert [len(v) for v in values] == [len(c) for c in COMPLETIONS]
    assert all(torch.equal(v, torch.zeros(len(v))) for v in values)


def test_value_loss_is_the_token_mean_of_half_the_squared_error(tiny):
    """Values 0 (zero head), returns [1, 2], [3, 0, 1], [2], [1, 1, 1, 1]: squares 1 + 4 + 9 + 0 + 1
    + 4 + 4 = 23 over 10 tokens -> vf_loss = 0.5 * 2.3 = 1.15; nothing clipped (V = old V)."""
    w = worker(tiny)
    returns = [torch.tensor(r) for r in ([1.0, 2.0], [3.0, 0.0, 1.0], [2.0], [1.0, 1.0, 1.0, 1.0])]
    old = [torch.zeros(len(c)) for c in COMPLETIONS]
    m = w.train_step(CriticBatch(PROMPTS, COMPLETIONS, returns, old))
    assert m["critic/vf_loss"] == pytest.approx(1.15, rel=1e-6)
    assert m["critic/vf_clipfrac"] == 0.0 and m["critic/updates"] == 1 and m["critic/grad_norm"] > 0
    after = w.values(PROMPTS, COMPLETIONS)
    assert all((a > 0).all() for a in after)  # every target is >= 0 and most > 0: the values rose


def gradients(w: CriticWorker, batch: CriticBatch) -> dict[str, torch.Tensor]:
    captured, step = {}, w.learner.optimizer.step

    def capture(*args, **kwargs):
        captured.update({n: p.grad.clone() for n, p in w.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    w.learner.optimizer.step = capture
    w.train_step(batch)
    return captured


@pytest.mark.parametrize("share_prompt", [False, True])
def test_gradient_does_not_depend_on_the_micro_batch_size(tiny, share_prompt):
    """The loss is normalised by the step's token count, so micro-batches of 1, 2 and 4 rows
    give the full-batch gradient. Tolerance: float32 reduction order over <= 10-token sums
    and a 64-wide hidden state (~n * eps relative, n <= 640): 1e-5 of each tensor's largest entry."""
    returns = [torch.linspace(-1, 1, len(c)) for c in COMPLETIONS]
    base = worker(tiny, micro_batch_size=4, share_prompt=share_prompt, random_head=True)
    old = base.values(PROMPTS, COMPLETIONS)
    batch = CriticBatch(PROMPTS, COMPLETIONS, returns, [o + 0.05 for o in old])
    expected = gradients(base, batch)
    assert len(expected) > 2 and max(g.abs().max().item() for g in expected.values()) > 1e-4
    for size in (1, 2):
        other = worker(tiny, micro_batch_size=size, share_prompt=share_prompt, random_head=True)
        got = gradients(other, batch)
        assert got.keys() == expected.keys()
        for name, g in got.items():
            scale = expected[name].abs().max().item()
            assert (g - expected[name]).abs().max().item() <= 1e-5 * scale + 1e-9, (size, name)


def test_gradient_checkpointing_gives_the_critic_the_same_gradient(tiny):
    returns = [torch.linspace(-1, 1, len(c)) for c in COMPLETIONS]
    base = worker(tiny, share_prompt=False, random_head=True)
    batch = CriticBatch(PROMPTS, COMPLETIONS, returns, base.values(PROMPTS, COMPLETIONS))
    expected = gradients(base, batch)
    checkpointed = worker(tiny, share_prompt=False, random_head=True, checkpointing=True)
    assert not checkpointed.learner.share_prompt
    got = gradients(checkpointed, batch)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[n], expected[n]) for n in got)  # the same operations, recomputed


def test_value_clipping_keeps_the_update_near_the_old_values(tiny):
    """Old values far below the targets: the clipped term bounds how far a step can move."""
    w = worker(tiny)
    old = [torch.zeros(len(c)) for c in COMPLETIONS]
    returns = [torch.full((len(c),), 5.0) for c in COMPLETIONS]
    values = [torch.full((len(c),), 1.0) for c in COMPLETIONS]  # as if V had moved +1 already
    from helpers import value_loss_settings

    from reasonrl.algo.value_loss import clipped_value_loss

    loss, stats = clipped_value_loss(torch.cat(values), torch.cat(old), torch.cat(returns), torch.ones(10),
                                     value_loss_settings(cliprange_value=0.5))
    assert stats["vf_clipfrac"].all()
    assert loss.tolist() == pytest.approx([0.5 * 4.5 ** 2] * 10)  # V_clip = 0.5
    m = w.train_step(CriticBatch(PROMPTS, COMPLETIONS, returns, old))
    assert m["critic/vf_clipfrac"] == 0.0  # V = old V at the first update: nothing clipped yet
    # V a whole unit above the old values (clip range 0.5) and below the targets: the clipped
    # term is the larger on every token and has no gradient, so the worker's step has none
    current = w.values(PROMPTS, COMPLETIONS)
    targets, olds = [v + 5.0 for v in current], [v - 1.0 for v in current]
    m = w.train_step(CriticBatch(PROMPTS, COMPLETIONS, targets, olds))
    assert m["critic/vf_clipfrac"] == 1.0 and m["critic/grad_norm"] == 0.0


# ---- config and trainer ----------------------------------------------------------------------


def smoke(tmp_path, *overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "trainer.progress=false",
        "trainer.threads=1", "tracking.report=false",
        f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:length", "reward.isolate_fn=false",
        *overrides])


@pytest.mark.parametrize("overrides, message", [
    (["critic.lr=1e-4"],
     "critic.lr: set, but algo.advantage=grpo uses no critic; estimators with a critic: gae"),
    (["placement.critic.num_cpus=2"],
     "placement.critic.num_cpus: set, but algo.advantage=grpo uses no critic"),
    (["algo.lam=0.95"], "algo.gamma/algo.lam: only used by critic estimators"),
    (["algo.advantage=gae", "critic.lr=0"], r"critic.lr: must be in \(0, 1\]"),
    (["algo.advantage=gae", "placement.critic.ranks=2"],
     "placement.critic.ranks: 2 ranks need placement.mode=ray"),
])
def test_critic_settings_and_estimators_must_agree(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs" / "smoke.yaml", overrides)


def test_ppo_trains_the_critic_and_the_policy(tmp_path):
    """n = 1 (no groups needed): token advantages from the critic's values, whitened; the
    critic learns (its values move toward the returns) and the policy moves."""
    trainer = Trainer(smoke(tmp_path, "algo.advantage=gae", "rollout.n=1", "trainer.steps=3",
                            "critic.lr=1e-3", "optim.lr=1e-3", "algo.gamma=0.99", "algo.lam=0.95"))
    assert trainer.critic is not None and trainer.policy.ref_model is None
    before = [p.detach().clone() for p in trainer.policy.model.parameters()]
    rows = [trainer.step()[0] for _ in range(3)]
    for m in rows:
        assert m["train/updates"] == 1 and m["critic/updates"] == 1
        assert m["advantage/mean"] == pytest.approx(0.0, abs=1e-5)  # whitened over the batch's tokens
        assert m["advantage/std"] == pytest.approx(1.0, rel=1e-3)
        assert 0.0 <= m["critic/vf_clipfrac"] <= 1.0 and m["time/critic"] > 0
    assert rows[0]["critic/value_mean"] == 0.0 and rows[-1]["critic/value_mean"] != 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.policy.model.parameters(), strict=True))


def test_a_non_finite_critic_loss_counts_as_a_bad_step(tmp_path):
    trainer = Trainer(smoke(tmp_path, "algo.advantage=gae", "rollout.n=1", "trainer.steps=4",
                            "trainer.max_bad_steps=2"))
    trainer.critic.model.value_head.register_forward_hook(
        lambda module, args, out: out * float("nan") if torch.is_grad_enabled() else None)
    with pytest.raises(TrainingAborted, match="2 bad steps in a row .* the last: non-finite loss"):
        trainer.fit()


@pytest.mark.parametrize("kl_in, warmup_reference", [("loss", False), ("reward", True)])
def test_the_reference_runs_in_warm_up_only_when_the_reward_needs_it(tmp_path, kl_in, warmup_reference):
    """During critic-only warm-up steps no policy update reads the reference: it runs there
    only for KL in the reward (which the critic's returns include), and from then on every step."""
    trainer = Trainer(smoke(tmp_path, "algo.advantage=gae", "critic.warmup_steps=1", "algo.beta=0.1",
                            f"algo.kl_in={kl_in}", "trainer.steps=2", "trainer.eval_every=0"))
    warm = trainer.step()[0]
    trained = trainer.step()[0]
    assert ("time/reference" in warm) == warmup_reference and "train/loss" not in warm
    assert "time/reference" in trained and "train/loss" in trained
