"""The log-probs stage across placements: the policy's log-probs without gradient, computed once
per step by the policy's actor (or its data-parallel ranks), cross to the trainer and back to the
consumers (the KL in the reward, the teacher stage, the old log-probs of a two-epoch update) and
give the metrics of local mode."""

from __future__ import annotations

import json

from helpers import (
    assert_metrics_close,
    keep_torch_threads,  # noqa: F401 (autouse)
    metrics,
    smoke_cfg,
)

from reasonrl.model.load import build_tiny_model
from reasonrl.train.trainer import train

# the three consumers in one step
ALL_THREE = ["algo.beta=0.05", "algo.kl_in=reward", "optim.ppo_epochs=2", "trainer.steps=2"]


def test_the_stage_in_ray_actors_and_on_two_ranks_gives_the_metrics_of_local_mode(ray_session, tmp_path):
    """Policy, teacher (a tiny model of another seed) and rollout in their own actors: the same
    metrics as one process (rel 1e-6, as test_placement's ray runs). The policy as two FSDP2 ranks
    (gloo): every rank computes the stage's forward for the whole batch, rank 0's answer is read;
    rel 1e-3, since train/kl is a difference of two nearly equal log-probs, whose float32 sums in
    another order (test_placement's ranks: rel 1e-4) differ by up to 1.3e-4 of it (measured)."""
    teacher = tmp_path / "teacher"
    model, tokenizer = build_tiny_model(seed=1)
    model.save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    three = [*ALL_THREE, f"teacher.path={teacher}"]
    train(smoke_cfg(tmp_path, "local", *three))
    rows = [json.loads(x) for x in (tmp_path / "local" / "metrics.jsonl").read_text().splitlines()]
    assert all(row["time/logprobs"] > 0 for row in rows if "train/loss" in row)
    local = metrics(tmp_path / "local")
    train(smoke_cfg(tmp_path, "ray", *three, "placement.mode=ray"))
    assert_metrics_close(metrics(tmp_path / "ray"), local, rel=1e-6)
    train(smoke_cfg(tmp_path, "ranks", *three, "placement.mode=ray", "placement.policy.ranks=2"))
    assert_metrics_close(metrics(tmp_path / "ranks"), local, rel=1e-3)
