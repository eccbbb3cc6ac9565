"""End to end: configs/judge.yaml trains with the judge's verdict beside `correct` (the tiny random
judge: the judge role, in a process of its own), asynchronously with the judge built by the
rollout process alone, and in ray placement with the judge role in a Ray actor, where a judge
that hangs is killed and replaced as its process is in local placement."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
from helpers import keep_torch_threads  # noqa: F401  (autouse: the runs set torch's threads)

from reasonrl.config import load_config
from reasonrl.placement import build_workers, local, roles, side_workers
from reasonrl.rewards import score
from reasonrl.train.trainer import train
from reasonrl.workers.judge import RewardModelWorker

REPO = Path(__file__).parents[2]
SMALL = ["model.path=tiny", "reward.model.path=tiny", "trainer.steps=2", "trainer.batch_size=8",
         "rollout.n=4", "rollout.max_new_tokens=8", "eval.max_new_tokens=8", "data.arithmetic.train_size=64",
         "data.arithmetic.val_size=4", "trainer.progress=false", "tracking.report=false", "trainer.threads=1",
         "reward.model.batch_size=4"]


def judge_run(out: Path, name: str, *overrides: str) -> list[dict]:
    where = [f"trainer.output_dir={out}", f"trainer.run_name={name}"]
    train(load_config(REPO / "configs" / "judge.yaml", [*where, *SMALL, *overrides]))
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]


def test_the_judge_config_trains_with_the_verdict_in_the_reward(tmp_path):
    """Two steps: every step logs reward/judge (a probability, not a constant), no failure, and
    reward/mean = reward/correct + 0.5 reward/judge (float32 sums: 1e-6)."""
    rows = judge_run(tmp_path, "local")
    steps = [r for r in rows if "reward/judge" in r and "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 < r["reward/judge"] < 1.0 and r["reward/errors"] == 0 and r["reward/timeouts"] == 0
        assert r["reward/mean"] == pytest.approx(r["reward/correct"] + 0.5 * r["reward/judge"], abs=1e-6)
    assert steps[0]["reward/judge"] != steps[1]["reward/judge"]


def test_an_asynchronous_local_run_builds_its_judge_in_the_rollout_process_alone(tmp_path, monkeypatch):
    """trainer.max_staleness=1, local placement: the rollout process collects and scores the
    batches, so it builds the judge role (`placement.side_workers`: a process of its own) and the
    trainer's process builds none. Counted here, in the trainer's process: no judge built during
    the run; the same config's `side_workers`, as the rollout process calls it, builds one, which
    scores. Every step's reward/judge is a probability, scored in the rollout process."""
    built = []
    real = local.isolated_worker

    def counted(role, cfg, host):
        built.append(role.name)
        return real(role, cfg, host)

    monkeypatch.setattr(local, "isolated_worker", counted)
    rows = judge_run(tmp_path, "async", "trainer.max_staleness=1")
    assert built == []
    steps = [r for r in rows if "reward/judge" in r and "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 < r["reward/judge"] < 1.0 and r["reward/errors"] == 0 and r["reward/timeouts"] == 0
    cfg = load_config(REPO / "configs" / "judge.yaml", [*SMALL, "trainer.max_staleness=1"])
    own = side_workers(cfg)
    try:
        assert built == ["judge"] and own.policy is None and own.rollout is None
        result = score(["5", "7"], ["5", "5"], {"judge": 1.0}, prompts=["What is 2 + 3?"] * 2,
                       model=cfg.reward.model, judge=own.judge)
    finally:
        own.close()
    assert result.errors == 0 and all(0.0 < v < 1.0 for v in result.components["judge"].tolist())


def test_ray_placement_runs_the_judge_in_an_actor(ray_session, tmp_path):
    """placement.mode=ray: the same run's judge scores from the judge role's Ray actor equal its
    process's in local placement (rel 1e-5: the same model and rows; the actor's thread count
    rounds its sums otherwise). Then a judge that hangs in the actor is killed at its deadline
    (the call times out) and the next call starts a fresh actor and scores."""
    local = judge_run(tmp_path, "local")
    remote = judge_run(tmp_path, "ray", "placement.mode=ray")
    for a, b in zip(local, remote, strict=True):
        assert ("reward/judge" in a) == ("reward/judge" in b)
        if "reward/judge" in a:
            assert b["reward/judge"] == pytest.approx(a["reward/judge"], rel=1e-5)
            assert b["reward/correct"] == a["reward/correct"] and b["reward/errors"] == 0

    scripted = str(REPO / "tests" / "fixtures" / "scripted_judge.py") + ":judge"
    row = dataclasses.replace(roles.role("judge"), build=functools.partial(RewardModelWorker.from_config,
                                                                          target=scripted))
    rows = tuple(row if r.name == "judge" else r for r in roles.ROLES)
    cfg = load_config(REPO / "configs" / "judge.yaml", ["placement.mode=ray", "reward.model.timeout=1",
                                                        "reward.model.batch_size=1",
                                                        "reward.model.path=tiny"])
    original, roles.ROLES = roles.ROLES, rows
    try:
        workers = build_workers(cfg, roles=("judge",))
    finally:
        roles.ROLES = original
    try:
        result = score(["HANG", "5"], ["5", "5"], {"judge": 1.0}, prompts=["What is 2 + 3?"] * 2,
                       model=cfg.reward.model, judge=workers.judge)
        killed = workers.judge.killed
    finally:
        workers.close()
    assert result.timed_out == [True, False] and result.components["judge"].tolist() == [0.0, 0.75]
    assert killed == 1
