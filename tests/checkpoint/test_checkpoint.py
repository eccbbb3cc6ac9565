"""Checkpoints and exact resume: a run stopped and resumed ends bitwise where an
uninterrupted run ends (tiny model, CPU), whatever stopped it (Ctrl-C, SIGTERM, kill -9
while a checkpoint was being written); a changed config is refused; non-finite steps abort."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from helpers import (
    RESUME_STEPS,
    assert_same_run,
    interrupt_after,
    resume_cfg,
    run_child,
    run_metrics,
    stop_resume_and_compare,
)
from safetensors.torch import load_file

from reasonrl.checkpoint import list_checkpoints
from reasonrl.cli import main
from reasonrl.errors import ConfigError, TrainingAborted, TrainingInterrupted
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parents[2]
@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 4-step run."""
    out = tmp_path_factory.mktemp("ref")
    Trainer(resume_cfg(out, "straight")).fit()
    return out / "straight"


def test_ctrl_c_then_resume_is_exact(tmp_path, reference, capsys):
    cfg = resume_cfg(tmp_path, "r", "trainer.keep_last=0")
    trainer = Trainer(cfg)
    interrupt_after(trainer, 2)  # the handler lets step 2 finish and save
    with pytest.raises(TrainingInterrupted) as stop:
        trainer.fit()
    run = tmp_path / "r"
    assert stop.value.exit_code == 130 and stop.value.checkpoint == run / "checkpoints" / "step_2"
    assert f"reasonrl train --resume {run}" in str(stop.value)
    assert [p.name for p in list_checkpoints(run)] == ["step_2"]
    assert [r["step"] for r in run_metrics(run)] == [0, 1, 2]

    # the CLI resumes with the run's own config.yaml
    assert main(["train", "--resume", str(run), "trainer.progress=false"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert_same_run(run, reference)
    state = json.loads((run / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["sampler"] == {"epoch": 0, "position": 8}


PPO = ["algo.advantage=gae", "rollout.n=1", "critic.warmup_steps=1", "critic.lr=1e-3", "algo.lam=0.95"]


def test_ppo_run_stopped_and_resumed_is_exact(tmp_path):
    """PPO with a critic: 2 steps, stop, resume, 2 more end bitwise where 4 straight steps end:
    the policy and the critic (weights and optimizer state) and every metric."""
    stop_resume_and_compare(tmp_path, *PPO)
    assert (tmp_path / "r" / "checkpoints" / "step_2" / "critic" / "value_model.safetensors").is_file()
    rows = run_metrics(tmp_path / "r")
    assert "train/loss" not in rows[1] and "train/loss" in rows[2]  # one warm-up step: critic only
    assert all(r["critic/updates"] == 1 for r in rows[1:])
    critic = [load_file(tmp_path / name / "checkpoints" / f"step_{RESUME_STEPS}" / "critic" /
                        "value_model.safetensors") for name in ("r", "straight")]
    assert critic[0].keys() == critic[1].keys()
    assert all(torch.equal(critic[0][k], critic[1][k]) for k in critic[0])
    assert critic[0]["value_head.weight"].abs().max() > 0  # the head learned something


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_a_run_in_bf16_stops_and_resumes_exactly_in_its_precision(tmp_path, precision):
    """bf16-mixed (with a critic: both learners keep fp32 masters) and pure bf16: 2 steps, stop,
    resume, 2 more end bitwise where 4 straight steps end. The checkpoint's weights are what the
    optimizer steps (bf16-mixed: the fp32 masters, so the resume rebuilds the bf16 compute copy
    exactly); the resumed run keeps the precision its config.yaml holds."""
    stop_resume_and_compare(tmp_path, f"model.precision={precision}", *PPO)
    weights = load_file(tmp_path / "r" / "checkpoints" / f"step_{RESUME_STEPS}" / "huggingface" /
                        "model.safetensors")
    critic = load_file(tmp_path / "r" / "checkpoints" / f"step_{RESUME_STEPS}" / "critic" /
                       "value_model.safetensors")
    dtype = torch.float32 if precision == "bf16-mixed" else torch.bfloat16
    assert {t.dtype for t in weights.values()} == {t.dtype for t in critic.values()} == {dtype}
    assert f"precision: {precision}" in (tmp_path / "r" / "config.yaml").read_text()
    rows = run_metrics(tmp_path / "r")
    assert ("train/params_unchanged" in rows[-1]) == (precision == "bf16")


def test_auto_precision_is_decided_once_and_a_resume_keeps_it(tmp_path, monkeypatch, capsys):
    """model.precision=auto is resolved before any model loads and saved resolved in
    config.yaml: a resume keeps the run's precision even when this machine's calibration would
    now pick another (here: the cache's answer changed from bf16-mixed to fp32)."""
    from reasonrl.accel import calibrate

    answer = {"now": "bf16-mixed"}
    monkeypatch.setattr(calibrate, "precision_choice",
                        lambda hidden, intermediate, tokens, device="cpu": (answer["now"], "from the test"))
    trainer = Trainer(resume_cfg(tmp_path, "r", "model.precision=auto", "trainer.save_every=2",
                                 "trainer.keep_last=0"))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    run = tmp_path / "r"
    assert "model.precision=bf16-mixed (from the test)" in capsys.readouterr().out  # the choices' line
    assert "precision: bf16-mixed" in (run / "config.yaml").read_text()
    answer["now"] = "fp32"
    assert main(["train", "--resume", str(run), "trainer.progress=false"]) == 0
    out = capsys.readouterr().out
    assert "model.precision=" not in out and "from the test" not in out  # the run's config.yaml: decided
    assert "precision: bf16-mixed" in (run / "config.yaml").read_text()
    assert [r["step"] for r in run_metrics(run)] == list(range(RESUME_STEPS + 1))


MULTI_TURN = [f"env.fn={REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Echo", "env.max_turns=3",
              "env.max_turn_tokens=6"]


def test_multi_turn_run_stopped_and_resumed_is_exact(tmp_path):
    """Multi-turn episodes (model turns, environment observations, per-episode turn seeds):
    2 steps, stop, resume, 2 more end bitwise where 4 straight steps end, samples (with their
    turns) and every metric included."""
    stop_resume_and_compare(tmp_path, *MULTI_TURN)
    rows = run_metrics(tmp_path / "r")
    assert all(r["env/turns_mean"] > 1 and r["env/env_tokens_mean"] > 0 for r in rows[1:])
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert all(len(s["turns"]) >= 1 and "observation" in s["turns"][0] for s in samples)


def test_changed_config_is_refused_unless_allowed(tmp_path, reference):
    out, name = reference.parent, reference.name  # only read: nothing here writes to it
    with pytest.raises(ConfigError, match=r"optim.lr: 0.0001 -> 0.001.*--allow-config-change optim.lr"):
        Trainer(resume_cfg(out, name, "optim.lr=1e-3", f"trainer.resume={reference}"))
    assert main(["train", "--resume", str(reference), "optim.lr=1e-3"]) == 2  # clean CLI error
    # listed keys are accepted; keys that change nothing computed need no listing
    trainer = Trainer(resume_cfg(out, name, "optim.lr=1e-3", "trainer.steps=6", "trainer.save_every=5",
                                "trainer.resume=auto",
                                "trainer.allow_config_change=[optim.lr, trainer.steps]"))
    assert trainer.step_count == RESUME_STEPS and trainer.policy.learner.step == RESUME_STEPS
    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        Trainer(resume_cfg(tmp_path, "r", f"trainer.resume={tmp_path / 'nothing'}"))
    fresh = Trainer(resume_cfg(tmp_path, "new", "trainer.resume=auto"))  # nothing to resume: a new run
    assert fresh.step_count == 0 and fresh.resumed is None


def test_non_finite_steps_abort_after_max_bad_steps(tmp_path):
    trainer = Trainer(resume_cfg(tmp_path, "r", "trainer.max_bad_steps=2"))
    # NaN hidden states (so logits) whenever the policy trains (generation runs in eval mode and stays finite)
    trainer.policy.model.get_decoder().norm.register_forward_hook(
        lambda module, args, out: out * float("nan") if module.training else None)
    with pytest.raises(TrainingAborted, match="2 bad steps in a row"):
        trainer.fit()
    rows = run_metrics(tmp_path / "r")
    assert [r.get("train/bad_steps") for r in rows[1:]] == [1.0, 2.0]
    assert all(r["train/skipped_update"] == 1.0 for r in rows[1:])


# ---- real signals in a child process ----------------------------------------------------

def test_sigterm_saves_exits_non_zero_and_resumes_exactly(tmp_path, reference):
    result = run_child(tmp_path, "term", signal.SIGTERM)
    run = tmp_path / "r"
    assert result.returncode == 143, result.stderr
    assert "stopped by SIGTERM after step 2" in result.stderr
    assert f"resume with: reasonrl train --resume {run}" in result.stderr
    assert [p.name for p in list_checkpoints(run)] == ["step_2"]
    assert main(["train", "--resume", str(run)]) == 0
    assert_same_run(run, reference)


def test_kill_9_while_writing_keeps_the_previous_checkpoint(tmp_path, reference):
    result = run_child(tmp_path, "kill", signal.SIGKILL, "trainer.save_every=1")
    run = tmp_path / "r"
    assert result.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(run)] == ["step_1"]  # step_2 is not half there
    assert list((run / "checkpoints").glob(".step_2.*"))  # the abandoned temporary folder
    assert [r["step"] for r in run_metrics(run)] == [0, 1, 2]  # step 2 was logged before dying

    # step 2 is redone, its first log line dropped; the temp folder and old checkpoints go
    assert main(["train", "--resume", str(run), "trainer.progress=false"]) == 0
    assert_same_run(run, reference)
    assert [p.name for p in list_checkpoints(run)] == ["step_3", "step_4"]  # keep_last=2
    assert not list((run / "checkpoints").glob(".*"))


def test_the_reference_run_really_trains(reference):
    """Guards the exact-resume tests against passing vacuously (no update, nothing to lose)."""
    rows = run_metrics(reference)
    assert all(r["train/grad_norm"] > 0 and r["train/skipped_update"] == 0 for r in rows[1:])
    start = load_file(reference / "checkpoints" / "step_4" / "huggingface" / "model.safetensors")
    from reasonrl.model.load import build_tiny_model
    initial = build_tiny_model(seed=0)[0].state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in start.items())


def test_a_checkpoint_of_an_older_version_is_not_a_config_change():
    """Keys added since (at their defaults) and removed since (at the value the new default
    means: tis_cap 0 was off) do not block a resume; a real change on either side does."""
    import copy

    from reasonrl.checkpoint import config_changes
    from reasonrl.config import Config, to_dict

    current = to_dict(Config())
    saved = copy.deepcopy(current)
    del saved["trainer"]["max_staleness"]
    saved["algo"]["tis_cap"] = 0.0
    assert config_changes(saved, current) == {}
    saved["algo"]["tis_cap"] = 2.0  # was on: the run trained otherwise
    current["reward"]["weights"]["format"] = 0.5  # a component added to a dict is a change
    current["trainer"]["max_staleness"] = 1  # a new key away from its default
    assert config_changes(saved, current) == {"algo.tis_cap": (2.0, None),
                                              "reward.weights.format": (None, 0.5),
                                              "trainer.max_staleness": (None, 1)}
