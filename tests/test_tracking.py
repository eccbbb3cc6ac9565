"""Tracking backends: JSONL always, console bar, TensorBoard event files, WandB offline, and a
clear message when an extra is missing."""

from __future__ import annotations

import importlib.util
import json
import math
import time

import pytest

from reasonrl.config import TrackingConfig, WandbConfig, load_config
from reasonrl.errors import ConfigError, MissingExtraError
from reasonrl.placement import preflight
from reasonrl.tracking import Tracker, missing_extra

METRICS = {"reward/mean": 0.5, "train/loss": -0.25, "rollout/response_length_mean": 12.0,
           "time/step": 1.5, "train/grad_norm": math.nan}
ROWS = [{"prompt": "What is 2 + 2?", "ground_truth": "4", "completion": "<b>4</b>", "reward": 1.0}]


def run_tracker(run_dir, backends, **kwargs):
    tracker = Tracker(run_dir, total_steps=2, progress=False,
                      tracking=TrackingConfig(backends=backends, **kwargs), config={"a": {"b": 1}})
    tracker.log(0, {"eval/accuracy": 0.25})
    tracker.log(1, METRICS)
    tracker.samples(1, ROWS)
    tracker.close()
    return tracker


def test_jsonl_is_always_written_with_the_same_names(tmp_path):
    run_tracker(tmp_path, ["console"])  # jsonl not listed: written all the same
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"step": 0, "eval/accuracy": 0.25}
    assert lines[1]["reward/mean"] == 0.5 and lines[1]["train/grad_norm"] is None  # NaN -> null
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples == [{"step": 1, **ROWS[0]}]


def test_default_tracker_keeps_the_old_signature(tmp_path):
    tracker = Tracker(tmp_path, 3, True, start_step=1)  # as trainer.py called it before #7
    assert tracker.bar is not None and tracker.bar.n == 1
    tracker.progress(METRICS)
    tracker.write("a line")
    tracker.close()
    quiet = Tracker(tmp_path, 3, True, tracking=TrackingConfig(backends=["jsonl"]))
    assert quiet.bar is None  # console not selected: no progress bar
    quiet.close()


def test_config_keys_and_bad_backend():
    cfg = load_config(overrides=["tracking.backends=[console,jsonl]", "tracking.wandb.project=p",
                                 "tracking.report=false"])
    assert cfg.tracking.backends == ["console", "jsonl"] and cfg.tracking.wandb.project == "p"
    assert cfg.tracking.wandb.mode == "offline" and not cfg.tracking.report
    with pytest.raises(ConfigError, match=r"tracking.backends\[1\]: 'mlflow' is not allowed; "
                                          r"allowed values: console, jsonl, tensorboard, wandb"):
        load_config(overrides=["tracking.backends=[jsonl,mlflow]"])
    with pytest.raises(ConfigError, match="tracking.wandb.mode"):
        load_config(overrides=["tracking.wandb.mode=sometimes"])


def test_missing_extra_names_the_extra(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("tensorboard", "wandb") else real(name, *a))
    for backend in ("tensorboard", "wandb"):
        assert f"pip install 'reasonrl[{backend}]'" in missing_extra(backend)
        with pytest.raises(ConfigError, match=rf"tracking.backends: the {backend} backend needs the "
                                              rf"optional extra: pip install 'reasonrl\[{backend}\]'"):
            preflight(load_config(overrides=[f"tracking.backends=[jsonl,{backend}]"]))
        with pytest.raises(MissingExtraError, match=rf"reasonrl\[{backend}\]"):
            Tracker(tmp_path, 1, False, tracking=TrackingConfig(backends=[backend]))
    assert missing_extra("console") is None and missing_extra("jsonl") is None


@pytest.mark.skipif(missing_extra("tensorboard") is not None,
                    reason="tensorboard extra not installed (pip install 'reasonrl[tensorboard]')")
def test_tensorboard_writes_event_files_with_the_metric_names(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_tracker(tmp_path, ["jsonl", "tensorboard"])
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert tags == {"eval/accuracy", "reward/mean", "train/loss", "rollout/response_length_mean",
                    "time/step"}  # NaN grad norm is not written
    (event,) = acc.Scalars("reward/mean")
    assert event.step == 1 and event.value == pytest.approx(0.5)
    assert acc.Scalars("eval/accuracy")[0].step == 0
    assert "samples" in "".join(acc.Tags()["tensors"])  # completions as text


@pytest.mark.skipif(missing_extra("wandb") is not None,
                    reason="wandb extra not installed (pip install 'reasonrl[wandb]')")
def test_wandb_offline_needs_no_network(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = Tracker(tmp_path, 2, False, config={"algo": {"beta": 0.0}}, tracking=TrackingConfig(
        backends=["jsonl", "wandb"], wandb=WandbConfig(project="test", mode="offline")))
    tracker.log(0, {"eval/accuracy": 0.25})
    tracker.log(1, METRICS)
    tracker.samples(1, ROWS)
    assert tracker.backends[1].run.config["algo"] == {"beta": 0.0}
    tracker.close()
    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    log = offline / f"run-{run_id}.wandb"  # what `wandb sync` uploads
    deadline = time.monotonic() + 20  # the wandb-core service may still be flushing it
    while b"time/step" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.2)
    records = log.read_bytes()
    for name in ("eval/accuracy", "reward/mean", "train/loss", "time/step"):
        assert name.encode() in records, name
    assert b"train/grad_norm" not in records  # NaN is not sent
    (table,) = (offline / "files" / "media" / "table").glob("samples_*.table.json")
    assert json.loads(table.read_text())["data"] == [[1, "What is 2 + 2?", "4", "<b>4</b>", 1.0]]


def test_gpu_memory_metrics_only_when_this_process_uses_a_gpu(monkeypatch):
    """`mem/` metrics are logged by a process whose CUDA is initialised (local mode on a GPU);
    a CPU run logs none (and touches no CUDA call)."""
    import torch

    from reasonrl.train.trainer import gpu_memory_metrics, reset_gpu_peak

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reset_gpu_peak()
    assert gpu_memory_metrics() == {}
