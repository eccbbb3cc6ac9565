"""A setting changed on resume is a changed run: each key of `RESUME_CHANGEABLE` (the keys
`--allow-config-change` can accept), changed on a resume from step 2 of a 4-step run, is what
steps 3 and 4 used (the optimizer's parameter groups when it steps, the gradient it steps with,
`train/lr`, the micro-batch layout, the workers' placement); a key a resume cannot change is
refused at start-up, allowed or not.

The base runs use a cosine schedule with a floor (`optim.min_lr_ratio=0.1`), so that the
expected learning rates below are hand-computed from `lr_multiplier`'s formula at the resumed
steps: factor(i) = 0.1 + 0.9 * 0.5 * (1 + cos(pi * i / (steps - 1))) at 0-based step i.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from helpers import assert_metrics_close, interrupt_after, keep_torch_threads, metrics, smoke_cfg  # noqa: F401

from reasonrl.checkpoint.config_check import RESUME_CHANGEABLE
from reasonrl.cli import main
from reasonrl.errors import ConfigError, TrainingInterrupted
from reasonrl.train.trainer import Trainer

BASE = ["trainer.steps=4", "optim.schedule=cosine", "optim.min_lr_ratio=0.1", "trainer.save_every=2",
        "trainer.keep_last=0"]
PPO = ["algo.advantage=gae", "rollout.n=1", "critic.lr=1e-3", "algo.lam=0.95"]
LR = 1e-3  # helpers.TRAINS' optim.lr, the base runs' learning rate (and critic.lr in PPO)


def cosine(i: int, steps: int = 4, floor: float = 0.1) -> float:
    """The cosine schedule's factor at 0-based step i (no warm-up): the hand-computed values the
    tests expect are these (i = 2: 0.325, i = 3: 0.1 for 4 steps)."""
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * i / (steps - 1)))


def logged(run: Path) -> list[dict]:
    """Every row of the run's metrics.jsonl, as written (layout metrics included)."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def stopped_after_two(out: Path, name: str, *overrides: str) -> Path:
    """A 4-step run stopped by SIGINT after step 2 (checkpoint step_2)."""
    trainer = Trainer(smoke_cfg(out, name, *BASE, *overrides))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    return out / name


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("base")
    return {"grpo": stopped_after_two(out, "grpo"), "ppo": stopped_after_two(out, "ppo", *PPO)}


def record_steps(learner) -> list[dict]:
    """What each optimizer step of `learner` runs with, read when it steps: the first parameter
    group's settings, the norm of the (clipped) gradient it applies, the learner's step."""
    seen: list[dict] = []

    def before_step(optimizer, args, kwargs):
        group = optimizer.param_groups[0]
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads]))
        seen.append({"lr": group["lr"], "betas": tuple(group["betas"]), "eps": group["eps"],
                     "weight_decay": group["weight_decay"], "grad_norm": norm.item(), "step": learner.step})

    learner.optimizer.register_step_pre_hook(before_step)
    return seen


def resume(base_run: Path, tmp_path: Path, key: str, value: str, *overrides: str):
    """A copy of `base_run` resumed to its end with `key=value` (allowed): (the trainer, its
    policy's steps, its critic's steps, the metrics rows of the resumed steps)."""
    run = tmp_path / "r"
    shutil.copytree(base_run, run)
    extra = PPO if base_run.name == "ppo" else []
    trainer = Trainer(smoke_cfg(tmp_path, "r", *BASE, *extra, *overrides, f"trainer.resume={run}",
                                f"trainer.allow_config_change=[{key}]", f"{key}={value}"))
    policy = record_steps(trainer.policy.learner)
    critic = record_steps(trainer.critic.learner) if trainer.critic is not None else []
    trainer.fit()
    rows = [r for r in logged(run) if r["step"] > 2]
    return trainer, policy, critic, rows


# The learning rate of resumed steps 3 and 4 (0-based 2 and 3) for each schedule key, by hand
# from the module docstring's factor: the new base rate times the new schedule's factor there.
SCHEDULES = {
    "optim.lr": ("2e-4", [2e-4 * 0.325, 2e-4 * 0.1]),
    "optim.schedule": ("constant", [LR, LR]),  # factor 1
    # warm-up over ceil(0.5 * 4) = 2 steps, then cosine over the 1 step left: 1 at i = 2, the floor at 3
    "optim.warmup_ratio": ("0.5", [LR, LR * 0.1]),
    # floor 0.5: 0.5 + 0.5 * 0.25 at i = 2, 0.5 at i = 3
    "optim.min_lr_ratio": ("0.5", [LR * 0.625, LR * 0.5]),
    # 5 steps: cos(pi * i / 4): 0.1 + 0.9 * 0.5 at i = 2, 0.1 + 0.9 * (1 - sqrt(2)/2) / 2 at 3, 0.1 at 4
    "trainer.steps": ("5", [LR * 0.55, LR * (0.1 + 0.45 * (1 - math.sqrt(0.5))), LR * 0.1]),
}


@pytest.mark.parametrize("key", list(SCHEDULES))
def test_a_changed_lr_or_schedule_is_the_rate_of_the_resumed_steps(base, tmp_path, key):
    value, expected = SCHEDULES[key]
    assert cosine(2) == pytest.approx(0.325) and cosine(3) == pytest.approx(0.1)  # the docstring's numbers
    _, steps, _, rows = resume(base["grpo"], tmp_path, key, value)
    assert [s["step"] for s in steps] == list(range(2, 2 + len(expected)))  # one update per step
    assert [s["lr"] for s in steps] == pytest.approx(expected, rel=1e-12)  # what AdamW stepped with
    assert [r["train/lr"] for r in rows] == pytest.approx(expected, rel=1e-12)  # and what the log says
    before = [r["train/lr"] for r in logged(base["grpo"]) if r["step"] in (1, 2)]
    assert before == pytest.approx([LR * cosine(0), LR * cosine(1)], rel=1e-12)  # the base run's own


ADAMW = {"optim.weight_decay": ("0.1", "weight_decay", 0.1),
         "optim.betas": ("[0.5, 0.9]", "betas", (0.5, 0.9)),
         "optim.eps": ("1e-6", "eps", 1e-6)}


@pytest.mark.parametrize("key", list(ADAMW))
def test_changed_adamw_settings_are_the_optimizers_on_the_resumed_steps(base, tmp_path, key):
    value, name, expected = ADAMW[key]
    _, steps, _, _ = resume(base["grpo"], tmp_path, key, value)
    assert len(steps) == 2 and all(s[name] == expected for s in steps)
    assert [s["lr"] for s in steps] == pytest.approx([LR * 0.325, LR * 0.1], rel=1e-12)  # unchanged


def test_a_changed_gradient_clip_clips_the_resumed_steps(base, tmp_path):
    _, steps, _, rows = resume(base["grpo"], tmp_path, "optim.max_grad_norm", "1e-4")
    # the gradient before clipping (train/grad_norm) is far above the new clip, so AdamW gets it
    # scaled to max_norm * norm / (norm + 1e-6) (torch's clip_grad_norm_): 1e-4 to rel 1e-5
    assert all(r["train/grad_norm"] > 1e-2 for r in rows)
    assert [s["grad_norm"] for s in steps] == pytest.approx([1e-4, 1e-4], rel=1e-5)


def test_changed_micro_batches_are_the_layout_of_the_resumed_steps(base, tmp_path):
    """8 rows a step (two prompts' groups of 4) in one micro-batch before; at most 2 rows each
    after: 4 micro-batches."""
    assert [r["train/micro_batches"] for r in logged(base["grpo"]) if r["step"] > 0] == [1.0, 1.0]
    _, _, _, rows = resume(base["grpo"], tmp_path, "optim.micro_batch_size", "2")
    assert [r["train/micro_batches"] for r in rows] == [4.0, 4.0]


def test_a_changed_token_budget_bounds_the_resumed_steps_micro_batches(base, tmp_path):
    before = [r for r in logged(base["grpo"]) if r["step"] > 0]
    assert all(r["train/micro_batches"] == 1 and r["train/micro_batch_tokens_max"] > 120 for r in before)
    _, _, _, rows = resume(base["grpo"], tmp_path, "optim.max_tokens_per_micro_batch", "120")
    assert all(r["train/micro_batch_tokens_max"] <= 120 and r["train/micro_batches"] > 1 for r in rows)


CRITIC = {"critic.lr": ("2e-4", "lr", 2e-4), "critic.weight_decay": ("0.1", "weight_decay", 0.1)}


@pytest.mark.parametrize("key", list(CRITIC))
def test_changed_critic_settings_are_its_optimizers_on_the_resumed_steps(base, tmp_path, key):
    """PPO's critic has its own AdamW (constant rate): a changed critic.lr is its rate (and
    critic/lr); a changed weight decay is its; the policy's optimizer keeps its own."""
    value, name, expected = CRITIC[key]
    _, policy, critic, rows = resume(base["ppo"], tmp_path, key, value)
    assert len(critic) == 2 and all(s[name] == expected for s in critic)
    assert [r["critic/lr"] for r in rows] == ([expected] * 2 if name == "lr" else [LR] * 2)
    assert [s["lr"] for s in policy] == pytest.approx([LR * 0.325, LR * 0.1], rel=1e-12)
    assert all(s["weight_decay"] == 0.0 for s in policy)


def test_a_changed_critic_clip_clips_the_critics_resumed_steps(base, tmp_path):
    _, _, critic, rows = resume(base["ppo"], tmp_path, "critic.max_grad_norm", "1e-4")
    assert all(r["critic/grad_norm"] > 1e-2 for r in rows)
    assert [s["grad_norm"] for s in critic] == pytest.approx([1e-4, 1e-4], rel=1e-5)


def test_a_run_resumed_in_ray_mode_runs_there_and_computes_the_same(ray_session, base, tmp_path):
    """placement.mode local -> ray: the resumed steps run in Ray actors (the policy is a proxy)
    and end where the same 4 steps run straight in this process end (rel 1e-6: another process's
    float sums)."""
    straight = tmp_path / "straight"
    Trainer(smoke_cfg(tmp_path, "straight", *BASE)).fit()
    run = tmp_path / "r"
    shutil.copytree(base["grpo"], run)
    trainer = Trainer(smoke_cfg(tmp_path, "r", *BASE, f"trainer.resume={run}",
                                "trainer.allow_config_change=[placement.mode]", "placement.mode=ray"))
    try:
        assert type(trainer.policy).__module__ == "reasonrl.placement.proxies"  # a Ray actor's proxy
        trainer.fit()
    finally:
        trainer.workers.close()
    assert_metrics_close(metrics(run), metrics(straight), rel=1e-6)


def test_every_changeable_key_is_tested_here():
    """Each key of RESUME_CHANGEABLE has its test above (a new key needs one)."""
    tested = {*SCHEDULES, *ADAMW, *CRITIC, "optim.max_grad_norm", "optim.micro_batch_size",
              "optim.max_tokens_per_micro_batch", "critic.max_grad_norm", "placement.mode"}
    assert tested == set(RESUME_CHANGEABLE)


@pytest.mark.parametrize("change", ["trainer.seed=1", "model.precision=bf16-mixed", "rollout.n=2",
                                    "trainer.max_staleness=1", "data.arithmetic.max_operand=5"])
def test_a_key_a_resume_cannot_change_is_refused_at_start_up_even_when_allowed(base, tmp_path, capsys,
                                                                             change):
    key = change.split("=")[0]
    run = tmp_path / "r"
    shutil.copytree(base["grpo"], run)
    with pytest.raises(ConfigError, match=rf"resuming {run}/checkpoints/step_2: {key}: .* -> .*: this key "
                                          r"cannot change on resume, even with --allow-config-change"):
        Trainer(smoke_cfg(tmp_path, "r", *BASE, f"trainer.resume={run}", change,
                          f"trainer.allow_config_change=[{key}]"))
    # the command line: one line, exit code 2, nothing written
    size = (run / "metrics.jsonl").stat().st_size
    capsys.readouterr()
    assert main(["train", "--resume", str(run), change, "--allow-config-change", key,
                 "trainer.progress=false"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"reasonrl: config error: resuming {run}/checkpoints/step_2: {key}")
    assert "A resume can change: optim.lr, " in err[0]
    assert (run / "metrics.jsonl").stat().st_size == size
    assert logged(run)[-1]["step"] == 2
