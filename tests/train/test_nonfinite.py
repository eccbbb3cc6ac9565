"""Non-finite values never travel silently: a learning rate above 1 is refused at start-up; an
update that makes a weight NaN or inf stops the run at that step, before the weight sync, naming
the learning rate, keeping the last good checkpoint and printing the command that resumes from
it; a non-finite loss or gradient is a skipped, counted bad step that names its likely causes,
and enough of them in a row stop the run."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch
from helpers import keep_torch_threads, smoke_cfg  # noqa: F401 - an autouse fixture

from reasonrl.checkpoint import list_checkpoints, read_checkpoint
from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.errors import ConfigError, TrainingAborted
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parents[2]
SMOKE = REPO / "configs" / "smoke.yaml"


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("change, message", [
    (["optim.lr=1e39"], "optim.lr: must be in [0, 1], got 1e+39"),
    (["algo.advantage=gae", "critic.lr=2"], "critic.lr: must be in (0, 1], got 2.0"),
    (["optim.lr=1", "optim.weight_decay=1e39"], "optim.weight_decay: 1e+39 x optim.lr=1 = 1e+39, must be "
     "below 1 (AdamW scales each weight by 1 - lr x weight_decay a step; weight decay is usually 0 to 0.1)"),
    (["algo.advantage=gae", "critic.lr=0.5", "critic.weight_decay=2"],
     "critic.weight_decay: 2 x critic.lr=0.5 = 1, must be below 1"),
], ids=["lr", "critic_lr", "decay", "critic_decay"])
def test_a_learning_rate_past_what_adamw_survives_is_refused_at_start_up(tmp_path, capsys, change, message):
    """AdamW moves each weight by up to about the learning rate a step and scales it by
    1 - lr x weight_decay: a rate above 1, or a product of 1 or more, can only diverge (1e39 made
    every weight inf at the first step), so it is the user's input, exit 2."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(SMOKE, change)
    assert main(["train", str(SMOKE), *change, f"trainer.output_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"reasonrl: config error: {message}")
    assert not list(tmp_path.iterdir())  # nothing started
    cfg = load_config(SMOKE, ["optim.lr=1", "optim.weight_decay=0.99", "algo.advantage=gae", "critic.lr=1",
                              "critic.weight_decay=0.5"])  # up to the bounds: allowed
    assert cfg.optim.lr == cfg.critic.lr == 1.0


def with_lr(cfg, lr: float):
    """`cfg` with optim.lr set past the config's own check: what a value that passes it and
    still overflows the weights does (the check cannot know every model's scale)."""
    return dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=lr))


@pytest.fixture
def two_good_steps(tmp_path) -> Path:
    """2 steps with a sane rate, a checkpoint after each."""
    Trainer(smoke_cfg(tmp_path, "r", "trainer.steps=2", "trainer.save_every=1", "trainer.keep_last=0")).fit()
    return tmp_path / "r"


def resumed_at(run: Path, lr: float, *overrides: str):
    cfg = smoke_cfg(run.parent, run.name, "trainer.steps=4", "trainer.save_every=1", "trainer.keep_last=0",
                    f"trainer.resume={run}", "trainer.allow_config_change=[optim.lr, trainer.steps]",
                    *overrides)
    return with_lr(cfg, lr)


def test_weights_made_non_finite_stop_the_run_before_the_sync(two_good_steps):
    """Resumed at optim.lr=1e39 (in force from the first resumed step): step 3's update makes the
    weights inf/NaN from a finite gradient. The run stops there: no sync of them (the engine still
    serves version 2), no checkpoint or log line of step 3, step_2 intact and named with the
    command that resumes from it; that command then trains to the end."""
    run = two_good_steps
    trainer = Trainer(resumed_at(run, 1e39))
    pushed = []
    push = trainer.workers.sync.push
    trainer.workers.sync.push = lambda version: pushed.append(version) or push(version)
    good = run / "checkpoints" / "step_2"
    with pytest.raises(TrainingAborted) as stop:
        trainer.fit()
    message = str(stop.value)
    assert message.startswith("step 3: the policy update made weights non-finite (NaN or inf) from a finite "
                              "loss and gradient (train/grad_norm=")
    assert message.endswith(
        "): optim.lr=1e+39 is far too high (AdamW moves each weight by up to about the learning rate per "
        f"step); nothing of this step was synced or saved; resume with: reasonrl train --resume {good} "
        f"--allow-config-change optim.lr optim.lr=1e-05; the last good checkpoint is {good}")
    assert pushed == []  # resumed at version 2 (loaded before this spy), version 3 never pushed
    assert not all(bool(torch.isfinite(p).all()) for p in trainer.policy.model.parameters())
    assert [p.name for p in list_checkpoints(run)] == ["step_1", "step_2"]
    assert [r["step"] for r in logged(run)] == [0, 1, 2]
    read_checkpoint(good)  # intact, finite weights (a non-finite one is refused by the reader)
    # the printed way on: resume from step_2 with the lower rate
    cfg = smoke_cfg(run.parent, run.name, "trainer.steps=4", "trainer.save_every=1", "trainer.keep_last=0",
                    f"trainer.resume={good}", "trainer.allow_config_change=[optim.lr, trainer.steps]",
                    "optim.lr=1e-05")
    Trainer(cfg).fit()
    assert [r["step"] for r in logged(run)] == [0, 1, 2, 3, 4]
    assert all(r["train/lr"] == 1e-5 for r in logged(run)[3:])


def test_the_command_line_says_it_in_one_line_with_exit_code_1(two_good_steps, monkeypatch, capsys):
    """The run's own failure: `reasonrl: error: ...` alone on stderr, exit code 1 (the config
    refuses 1e39 itself, so the resolved config is swapped for one past that check)."""
    run = two_good_steps
    bad = resumed_at(run, 1e39, "trainer.progress=false")
    monkeypatch.setattr("reasonrl.commands.train.load_config", lambda *args, **kwargs: bad)
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "WeightSyncError" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("reasonrl: error: step 3: the policy update made weights non-finite")
    assert last.endswith(f"the last good checkpoint is {run / 'checkpoints' / 'step_2'}")


def test_a_non_finite_loss_is_a_skipped_bad_step_that_names_its_likely_causes(tmp_path, capsys):
    """The policy's logits turn NaN whenever it trains (a forward hook; generation runs in eval
    mode and stays finite): every update's loss and gradient are NaN, so it is skipped (not one
    weight moves, nothing non-finite is synced), and each such step says so with its likely
    causes, the learning rate and the reward scale; two in a row stop the run, naming what to
    lower and that no good checkpoint exists yet."""
    trainer = Trainer(smoke_cfg(tmp_path, "r", "trainer.steps=4", "trainer.max_bad_steps=2"))
    trainer.policy.model.get_decoder().norm.register_forward_hook(
        lambda module, args, out: out * float("nan") if module.training else None)
    before = {k: v.clone() for k, v in trainer.policy.model.state_dict().items()}
    with pytest.raises(TrainingAborted) as stop:
        trainer.fit()
    rows = logged(tmp_path / "r")[1:]
    assert [r["train/skipped_update"] for r in rows] == [1.0, 1.0]
    after = trainer.policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # skipped: not one weight moved
    reason = ("non-finite loss or gradient in the policy update (train/grad_norm=nan), update skipped: "
              "likely optim.lr=0.001 too high (the weights diverged) or rewards too large (reward/mean=")
    err = capsys.readouterr().err
    for step, r in enumerate(rows, 1):
        assert f"[reasonrl] step {step}: {reason}{r['reward/mean']:g}) ({step} in a row; abort at 2)" in err
    assert str(stop.value).startswith(f"2 bad steps in a row (to step 2), the last: {reason}")
    assert str(stop.value).endswith(
        "; stopping. Lower optim.lr or scale the rewards down; no good checkpoint was written yet: lower "
        "optim.lr and start the run again; the last good checkpoint is none")
