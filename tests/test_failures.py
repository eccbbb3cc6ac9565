"""Failures a user can see: a reward function that fails on every call is printed (once per
kind, naming the function), recorded with the samples, and ends the run after
`trainer.max_bad_steps` steps in a row quoting the error -- not a silent `reward=0.000`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reasonrl.config import load_config
from reasonrl.errors import TrainingAborted
from reasonrl.trainer import Trainer

REPO = Path(__file__).parent.parent
FAILING = f"{REPO / 'tests' / 'fixtures' / 'custom_reward.py'}:always_fails"


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_a_reward_that_always_fails_is_seen_and_stops_the_run(tmp_path, capsys, isolate):
    cfg = load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "trainer.progress=false", "trainer.steps=5",
        "trainer.threads=1", "trainer.max_bad_steps=3", f"reward.fn={FAILING}",
        f"reward.isolate_fn={isolate}"])
    with pytest.raises(TrainingAborted, match=rf"3 bad steps in a row \(to step 3\), the last: every reward "
                                              rf"call failed, e.g. reward.fn {FAILING}: KeyError: "):
        Trainer(cfg).fit()
    err = capsys.readouterr().err
    first = f"a reward failed and scored 0: reward.fn {FAILING}: KeyError"
    assert err.count(first) == 1  # the first of its kind, once; the rest are counted
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/errors"] for r in rows if "reward/errors" in r] == [8.0, 8.0, 8.0]
    assert [r["train/bad_steps"] for r in rows if "train/bad_steps" in r] == [1.0, 2.0, 3.0]
    samples = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["reward_error"].startswith(f"reward.fn {FAILING}: KeyError") for s in samples)
    # the report shows why those samples scored 0
    from reasonrl.report import _samples_html, load_run

    assert f"(reward failed: reward.fn {FAILING}: KeyError" in _samples_html(load_run(tmp_path / "r"))
