"""reasonrl.train.choices: every automatic choice is made once per run, saved with it and kept on
resume; an explicit bf16 on a CPU without bf16 units is said at once; the calibrations are
bounded in time.

The decoder's calibration cache is written by the tests themselves (in the test's own
$REASONRL_HOME): which decoder is "fastest" is decided here, not by this machine's speed."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers import assert_same_run, interrupt_after, keep_torch_threads, resume_cfg  # noqa: F401 - autouse

from reasonrl.accel import calibrate
from reasonrl.config import load_config
from reasonrl.errors import TrainingInterrupted
from reasonrl.train import choices
from reasonrl.train.trainer import Trainer


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("REASONRL_HOME", str(tmp_path / "home"))


def prefer(cfg, decoder: str) -> None:
    """Make the calibration cache say that `decoder` is the fastest for `cfg`'s runs (the key
    `decide_decoder` reads), as a quiet machine measured it just now."""
    threads = torch.get_num_threads()
    torch.set_num_threads(choices.rollout_threads(cfg))
    try:
        key = calibrate.decoder_key(choices.model_config(cfg), torch.float32, torch.device("cpu"),
                                    cfg.trainer.batch_size)
    finally:
        torch.set_num_threads(threads)
    calibrate._record(key, "decoder", 0.1, fastest=decoder, seconds={decoder: 0.001})


def saved_decoder(run) -> str:
    return yaml.safe_load((run / "config.yaml").read_text())["rollout"]["hf_decoder"]


def used_decoder(trainer: Trainer) -> str:
    return trainer.workers.rollout.engine.last_path


def no_measuring(*args, **kwargs):
    raise AssertionError("measured or looked up, where the saved choice should have been used")


# ------------------------------------------------------------------ deciding and keeping


def test_undecided_keys_are_decided_and_set_ones_kept(tmp_path, monkeypatch, capsys):
    cfg = resume_cfg(tmp_path, "a", "rollout.hf_decoder=auto", "trainer.threads=0")
    monkeypatch.setattr(choices.os, "cpu_count", lambda: 6)
    monkeypatch.setattr("reasonrl.source.os.cpu_count", lambda: 6)
    prefer(cfg, "modules")
    decided = choices.decide(cfg)
    assert decided.rollout.hf_decoder == "modules"
    assert decided.trainer.threads == 6
    # the auto budget of the tiny model on this CPU: 2,048 positions (its activations are small)
    assert decided.optim.max_tokens_per_micro_batch == 2048
    assert decided.rollout.threads == 0  # read by asynchronous training alone: left as it is
    assert decided.model.precision == "fp32"  # smoke.yaml's, set: kept
    line = capsys.readouterr().out
    assert "automatic choices, saved with the run: rollout.hf_decoder=modules" in line
    assert "trainer.threads=6 (one per core)" in line
    # set values are kept, and nothing is decided (or said) again
    assert choices.decide(decided) == decided
    assert capsys.readouterr().out == ""
    asynchronous = choices.decide(resume_cfg(tmp_path, "b", "trainer.max_staleness=1", "trainer.threads=0",
                                             "rollout.hf_decoder=lean"))
    assert asynchronous.rollout.threads == 3 and asynchronous.trainer.threads == 6
    vllm = resume_cfg(tmp_path, "c", "rollout.engine=vllm", "rollout.hf_decoder=auto")
    assert choices.decide(vllm).rollout.hf_decoder == "auto"  # not the hf engine: nothing to decide


def test_a_resume_takes_the_checkpoints_choices_without_deciding(tmp_path, monkeypatch):
    cfg = resume_cfg(tmp_path, "a", "rollout.hf_decoder=auto", "trainer.threads=0",
                     "optim.max_tokens_per_micro_batch=0")
    monkeypatch.setattr(calibrate, "fastest_for_key", no_measuring)
    saved = {"rollout": {"hf_decoder": "modules"}, "trainer": {"threads": 3},
             "optim": {"max_tokens_per_micro_batch": 768}}
    decided = choices.decide(cfg, saved)
    got = (decided.rollout.hf_decoder, decided.trainer.threads, decided.optim.max_tokens_per_micro_batch)
    assert got == ("modules", 3, 768)
    # a checkpoint of a reasonrl that saved `auto`: decided now, and no config change on resume
    from reasonrl.checkpoint import config_changes
    from reasonrl.config import to_dict

    monkeypatch.setattr(calibrate, "fastest_for_key", lambda key, model, rows: ("lean", "cached"))
    old = to_dict(cfg)
    now = choices.decide(cfg, old)
    assert now.rollout.hf_decoder == "lean"
    assert config_changes(old, to_dict(now)) == {}


def test_a_resume_after_the_cache_flipped_keeps_the_decoder_and_is_bitwise(tmp_path):
    """A run stopped after step 2, the calibration cache then changed to prefer another decoder
    (a re-measurement, `reasonrl calibrate --reset`, another process's entry), resumed: it
    decodes with the decoder it started with and ends bitwise like a straight run."""
    auto = ("rollout.hf_decoder=auto",)
    prefer(resume_cfg(tmp_path, "straight", *auto), "lean")
    straight = Trainer(resume_cfg(tmp_path, "straight", *auto))
    straight.fit()
    assert used_decoder(straight) == "lean" and saved_decoder(tmp_path / "straight") == "lean"
    straight.workers.close()
    trainer = Trainer(resume_cfg(tmp_path, "r", *auto, "trainer.save_every=2", "trainer.keep_last=0"))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    trainer.workers.close()
    prefer(resume_cfg(tmp_path, "r", *auto), "modules")
    resumed = Trainer(resume_cfg(tmp_path, "r", *auto, "trainer.resume=auto", "trainer.save_every=2",
                                 "trainer.keep_last=0"))
    assert resumed.cfg.rollout.hf_decoder == "lean"
    resumed.fit()
    assert used_decoder(resumed) == "lean"
    resumed.workers.close()
    assert_same_run(tmp_path / "r", tmp_path / "straight")


def test_a_run_repeated_from_its_config_or_with_the_cache_flipped_mid_run_is_bitwise(tmp_path):
    """Two runs of one config and seed: the second from the first's saved config.yaml after the
    cache changed to prefer another decoder; a third with `auto` whose cache flips after its first
    step (the choice is made once, not per call). All three are bitwise alike."""
    auto = ("rollout.hf_decoder=auto",)
    prefer(resume_cfg(tmp_path, "first", *auto), "lean")
    first = Trainer(resume_cfg(tmp_path, "first", *auto))
    first.fit()
    first.workers.close()
    prefer(resume_cfg(tmp_path, "first", *auto), "modules")
    again = Trainer(load_config(tmp_path / "first" / "config.yaml", ["trainer.run_name=again"]))
    again.fit()
    assert used_decoder(again) == "lean"
    again.workers.close()
    assert_same_run(tmp_path / "again", tmp_path / "first")

    prefer(resume_cfg(tmp_path, "first", *auto), "lean")
    flipped = Trainer(resume_cfg(tmp_path, "flipped", *auto))
    step = flipped.step

    def stepping():
        out = step()
        if flipped.step_count == 1:
            prefer(resume_cfg(tmp_path, "flipped", *auto), "modules")
        return out

    flipped.step = stepping
    flipped.fit()
    assert used_decoder(flipped) == "lean"
    flipped.workers.close()
    assert_same_run(tmp_path / "flipped", tmp_path / "first")


# ------------------------------------------------------------------ bf16 on a CPU without bf16 units


def test_explicit_bf16_on_a_cpu_without_bf16_units_is_said_before_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(calibrate, "cpu_flags", lambda: ["avx2", "fma"])
    cfg = resume_cfg(tmp_path, "a", "model.precision=bf16-mixed")
    assert choices.warn_slow_precision(cfg)
    err = capsys.readouterr().err
    assert "model.precision=bf16-mixed on a CPU without bf16 units (flags [avx2 fma]" in err
    assert "expected about 30x" in err and "model.precision=auto picks fp32" in err
    # with a measurement of this CPU in the cache, its ratio is said
    key = calibrate.precision_key(576, 1536, 1024)
    calibrate._record(key, "precision", 0.1, choice="fp32", seconds={"fp32": 0.25, "bf16": 7.5})
    assert choices.warn_slow_precision(cfg)
    assert "measured here 30.0x slower than fp32" in capsys.readouterr().err
    # fp32, auto, or a CPU with bf16 units: nothing to say
    assert not choices.warn_slow_precision(resume_cfg(tmp_path, "b", "model.precision=fp32"))
    monkeypatch.setattr(calibrate, "cpu_flags", lambda: ["amx_bf16", "avx512f"])
    assert not choices.warn_slow_precision(cfg)
    assert capsys.readouterr().err == ""


def test_the_trainer_warns_before_the_workers_load(tmp_path, monkeypatch, capsys):
    """The warning comes from the Trainer before any model loads or any calibration runs."""
    import reasonrl.train.trainer as T

    monkeypatch.setattr(calibrate, "cpu_flags", lambda: ["avx2", "fma"])
    monkeypatch.setattr(T, "decide_choices", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop here")))
    with pytest.raises(RuntimeError, match="stop here"):
        Trainer(resume_cfg(tmp_path, "a", "model.precision=bf16-mixed"))
    assert "without bf16 units" in capsys.readouterr().err


def test_auto_precision_on_a_cpu_without_bf16_units_is_fp32_without_measuring(monkeypatch):
    monkeypatch.setattr(calibrate, "cpu_flags", lambda: ["avx2", "fma"])
    monkeypatch.setattr(calibrate, "precision_seconds", no_measuring)
    choice, why = calibrate.precision_choice(576, 1536, 1024)
    assert choice == "fp32" and "no bf16 units" in why and "not measured" in why
    assert calibrate.bf16_units() is False
    monkeypatch.setattr(calibrate, "cpu_flags", lambda: [])
    assert calibrate.bf16_units() is None  # unknown flags: measured, not assumed


# ------------------------------------------------------------------ calibrations bounded in time


def test_a_candidate_many_times_slower_is_not_measured_again():
    calls = {"fast": 0, "slow": 0}

    def run(name, seconds):
        def once():
            calls[name] += 1
            return seconds
        return once

    found = calibrate.interleaved_minimum({"fast": run("fast", 0.1), "slow": run("slow", 3.5)}, rounds=4,
                                          warmup=1, give_up=3.0)
    assert calls == {"fast": 5, "slow": 1}  # dropped after the warm-up round
    assert found == {"fast": 0.1, "slow": 3.5}  # its figure: the least time it took
    calls.update(fast=0, slow=0)
    calibrate.interleaved_minimum({"fast": run("fast", 0.1), "slow": run("slow", 0.25)}, rounds=2,
                                  give_up=3.0)
    assert calls == {"fast": 2, "slow": 2}  # within the margin: measured to the end


def test_a_decoder_block_stops_timing_once_it_has_spent_its_time(tiny, monkeypatch):
    """A block of WARMUP_STEPS + TIMED_STEPS steps stops after the step that reaches
    BLOCK_SECONDS: a decoder whose first step takes that long reports that step alone."""
    import contextlib

    steps = []
    clock = iter(range(0, 1000))  # perf_counter: each call one "second" later

    class Slow:
        def prefill(self, ids, mask):
            return None

        def repeat(self, n):
            return None

        def step(self, tokens):
            steps.append(tokens)

    monkeypatch.setattr(calibrate, "decoder", lambda *a, **k: contextlib.nullcontext(Slow()))
    monkeypatch.setattr(calibrate.time, "perf_counter", lambda: float(next(clock)))
    monkeypatch.setattr(calibrate, "BLOCK_SECONDS", 1.0)
    prompt = torch.zeros((1, 4), dtype=torch.long)
    tokens = torch.zeros((calibrate.WARMUP_STEPS + calibrate.TIMED_STEPS, 2), dtype=torch.long)
    assert calibrate._decode_block(tiny[0], "lean", prompt, tokens) == 1.0
    assert len(steps) == 1
    monkeypatch.setattr(calibrate, "BLOCK_SECONDS", 100.0)
    steps.clear()
    calibrate._decode_block(tiny[0], "lean", prompt, tokens)
    assert len(steps) == calibrate.WARMUP_STEPS + calibrate.TIMED_STEPS


def test_the_saved_config_holds_every_decision(tmp_path):
    """config.yaml and the checkpoint's config hold the decided values, never `auto`/0."""
    overrides = ("rollout.hf_decoder=auto", "trainer.threads=0", "trainer.steps=1", "tracking.report=false")
    prefer(resume_cfg(tmp_path, "a", *overrides), "modules")
    trainer = Trainer(resume_cfg(tmp_path, "a", *overrides))
    trainer.fit()
    trainer.workers.close()
    saved = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    state = json.loads((tmp_path / "a" / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    for config in (saved, state["config"]):
        assert config["rollout"]["hf_decoder"] == "modules"
        assert config["trainer"]["threads"] >= 1
        assert config["optim"]["max_tokens_per_micro_batch"] == 2048
    assert trainer.policy.learner.max_tokens == 2048  # what the learner uses is what was saved
