"""Checkpoints and exact resume: a run stopped and resumed ends bitwise where an
uninterrupted run ends (tiny model, CPU), whatever stopped it (Ctrl-C, SIGTERM, kill -9
while a checkpoint was being written); a changed config is refused; non-finite steps abort."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import interrupt_after
from safetensors.torch import load_file

from reasonrl.checkpoint import list_checkpoints
from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.errors import ConfigError, TrainingAborted, TrainingInterrupted
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parent.parent
STEPS = 4
# a reward that varies within groups, so that every step changes weights and optimizer state
TRAINS = [f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:length",
          "reward.isolate_fn=false", "optim.lr=1e-4"]


def smoke_cfg(out: Path, name: str, *overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={out}", f"trainer.run_name={name}", "trainer.progress=false",
        f"trainer.steps={STEPS}", "trainer.threads=1", *TRAINS, *overrides])


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{STEPS}" / "huggingface" / "model.safetensors")


def metrics(run: Path) -> list[dict]:
    """metrics.jsonl without wall-clock timings and GPU memory peaks (allowed to differ)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()
             if not k.startswith(("time/", "mem/")) and k != "rollout/tokens_per_s"} for r in rows]


def assert_same_run(run: Path, reference: Path) -> None:
    a, b = weights(run), weights(reference)
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff == 0.0, f"final weights differ by up to {diff}"
    assert metrics(run) == metrics(reference)
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples == [json.loads(x) for x in (reference / "samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 4-step run."""
    out = tmp_path_factory.mktemp("ref")
    Trainer(smoke_cfg(out, "straight")).fit()
    return out / "straight"


def test_ctrl_c_then_resume_is_exact(tmp_path, reference, capsys):
    cfg = smoke_cfg(tmp_path, "r", "trainer.keep_last=0")
    trainer = Trainer(cfg)
    interrupt_after(trainer, 2)  # the handler lets step 2 finish and save
    with pytest.raises(TrainingInterrupted) as stop:
        trainer.fit()
    run = tmp_path / "r"
    assert stop.value.exit_code == 130 and stop.value.checkpoint == run / "checkpoints" / "step_2"
    assert f"reasonrl train --resume {run}" in str(stop.value)
    assert [p.name for p in list_checkpoints(run)] == ["step_2"]
    assert [r["step"] for r in metrics(run)] == [0, 1, 2]

    # the CLI resumes with the run's own config.yaml
    assert main(["train", "--resume", str(run), "trainer.progress=false"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert_same_run(run, reference)
    state = json.loads((run / "checkpoints" / "step_4" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["sampler"] == {"epoch": 0, "position": 8}


def stop_resume_and_compare(tmp_path, *overrides: str) -> None:
    """4 straight steps in runs/straight; in runs/r, SIGINT after step 2 (a checkpoint is
    saved), then a resume to step 4: the two runs must end bitwise alike (`assert_same_run`)."""
    Trainer(smoke_cfg(tmp_path, "straight", *overrides)).fit()
    trainer = Trainer(smoke_cfg(tmp_path, "r", *overrides, "trainer.save_every=2", "trainer.keep_last=0"))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    Trainer(smoke_cfg(tmp_path, "r", *overrides, "trainer.resume=auto", "trainer.save_every=2",
                      "trainer.keep_last=0")).fit()
    assert_same_run(tmp_path / "r", tmp_path / "straight")


PPO = ["algo.advantage=gae", "rollout.n=1", "critic.warmup_steps=1", "critic.lr=1e-3", "algo.lam=0.95"]


def test_ppo_run_stopped_and_resumed_is_exact(tmp_path):
    """PPO with a critic: 2 steps, stop, resume, 2 more end bitwise where 4 straight steps end:
    the policy and the critic (weights and optimizer state) and every metric."""
    stop_resume_and_compare(tmp_path, *PPO)
    assert (tmp_path / "r" / "checkpoints" / "step_2" / "critic" / "value_model.safetensors").is_file()
    rows = metrics(tmp_path / "r")
    assert "train/loss" not in rows[1] and "train/loss" in rows[2]  # one warm-up step: critic only
    assert all(r["critic/updates"] == 1 for r in rows[1:])
    critic = [load_file(tmp_path / name / "checkpoints" / f"step_{STEPS}" / "critic" /
                        "value_model.safetensors") for name in ("r", "straight")]
    assert critic[0].keys() == critic[1].keys()
    assert all(torch.equal(critic[0][k], critic[1][k]) for k in critic[0])
    assert critic[0]["value_head.weight"].abs().max() > 0  # the head learned something


MULTI_TURN = [f"env.fn={REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Echo", "env.max_turns=3",
              "env.max_turn_tokens=6"]


def test_multi_turn_run_stopped_and_resumed_is_exact(tmp_path):
    """Multi-turn episodes (model turns, environment observations, per-episode turn seeds):
    2 steps, stop, resume, 2 more end bitwise where 4 straight steps end, samples (with their
    turns) and every metric included."""
    stop_resume_and_compare(tmp_path, *MULTI_TURN)
    rows = metrics(tmp_path / "r")
    assert all(r["env/turns_mean"] > 1 and r["env/env_tokens_mean"] > 0 for r in rows[1:])
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert all(len(s["turns"]) >= 1 and "observation" in s["turns"][0] for s in samples)


def test_changed_config_is_refused_unless_allowed(tmp_path, reference):
    out, name = reference.parent, reference.name  # only read: nothing here writes to it
    with pytest.raises(ConfigError, match=r"optim.lr: 0.0001 -> 0.001.*--allow-config-change optim.lr"):
        Trainer(smoke_cfg(out, name, "optim.lr=1e-3", f"trainer.resume={reference}"))
    assert main(["train", "--resume", str(reference), "optim.lr=1e-3"]) == 2  # clean CLI error
    # listed keys are accepted; keys that change nothing computed need no listing
    trainer = Trainer(smoke_cfg(out, name, "optim.lr=1e-3", "trainer.steps=6", "trainer.save_every=5",
                                "trainer.resume=auto",
                                "trainer.allow_config_change=[optim.lr, trainer.steps]"))
    assert trainer.step_count == STEPS and trainer.policy.learner.step == STEPS
    with pytest.raises(ConfigError, match="holds no complete checkpoint"):
        Trainer(smoke_cfg(tmp_path, "r", f"trainer.resume={tmp_path / 'nothing'}"))
    fresh = Trainer(smoke_cfg(tmp_path, "new", "trainer.resume=auto"))  # nothing to resume: a new run
    assert fresh.step_count == 0 and fresh.resumed is None


def test_non_finite_steps_abort_after_max_bad_steps(tmp_path):
    trainer = Trainer(smoke_cfg(tmp_path, "r", "trainer.max_bad_steps=2"))
    # NaN hidden states (so logits) whenever the policy trains (generation runs in eval mode and stays finite)
    trainer.policy.model.get_decoder().norm.register_forward_hook(
        lambda module, args, out: out * float("nan") if module.training else None)
    with pytest.raises(TrainingAborted, match="2 bad steps in a row"):
        trainer.fit()
    rows = metrics(tmp_path / "r")
    assert [r.get("train/bad_steps") for r in rows[1:]] == [1.0, 2.0]
    assert all(r["train/skipped_update"] == 1.0 for r in rows[1:])


# ---- real signals in a child process ----------------------------------------------------

CHILD = """
import sys, time
from pathlib import Path
from reasonrl.train import trainer as T
from reasonrl.cli import main

mode, marker = sys.argv[1], Path(sys.argv[2])
step, save = T.Trainer.step, T.Trainer.save_checkpoint

def slow_step(self):
    out = step(self)
    if mode == "term" and self.step_count == 2:  # wait here for the parent's SIGTERM
        marker.write_text("step 2")
        deadline = time.time() + 120
        while self.stop.requested is None and time.time() < deadline:
            time.sleep(0.05)
    return out

def slow_save(self, run_dir, *args, **kwargs):
    if mode == "kill" and self.step_count == 2:  # hang half-way through writing step_2
        write = self.policy.save_pretrained
        def hang(path, tokenizer=None):
            write(path, tokenizer)
            marker.write_text("writing step_2")
            time.sleep(120)
        self.policy.save_pretrained = hang
    return save(self, run_dir, *args, **kwargs)

T.Trainer.step, T.Trainer.save_checkpoint = slow_step, slow_save
sys.exit(main(["train", *sys.argv[3:]]))
"""


def run_child(tmp_path: Path, mode: str, sig: int, *overrides: str,
              during=None) -> subprocess.CompletedProcess:
    """A training child stopped by `sig` where `mode` makes it wait (after step 2 for "term",
    half-way through writing step_2 for "kill"); `during(pid)` runs while it waits."""
    marker = tmp_path / "marker"
    args = ["configs/smoke.yaml", f"trainer.output_dir={tmp_path}", "trainer.run_name=r",
            "trainer.progress=false", f"trainer.steps={STEPS}", "trainer.threads=1", *TRAINS, *overrides]
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(marker), *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=5)
    try:
        if during is not None:
            during(proc.pid)
    finally:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


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
    assert [r["step"] for r in metrics(run)] == [0, 1, 2]  # step 2 was logged before dying

    # step 2 is redone, its first log line dropped; the temp folder and old checkpoints go
    assert main(["train", "--resume", str(run), "trainer.progress=false"]) == 0
    assert_same_run(run, reference)
    assert [p.name for p in list_checkpoints(run)] == ["step_3", "step_4"]  # keep_last=2
    assert not list((run / "checkpoints").glob(".*"))


def test_the_reference_run_really_trains(reference):
    """Guards the exact-resume tests against passing vacuously (no update, nothing to lose)."""
    rows = metrics(reference)
    assert all(r["train/grad_norm"] > 0 and r["train/skipped_update"] == 0 for r in rows[1:])
    start = load_file(reference / "checkpoints" / "step_4" / "huggingface" / "model.safetensors")
    from reasonrl.policy.model import build_tiny_model
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
