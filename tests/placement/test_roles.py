"""The role table: a new frozen-model role is one row, one worker class and one protocol (a
process reward model stub, tests/fixtures/prm_stub.py), built, placed in a process of its own,
called through its protocol and closed with the run's other workers."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from reasonrl.config import load_config
from reasonrl.placement import build_workers, roles
from reasonrl.worker_protocols import missing_methods

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from helpers import needs_peft  # noqa: E402
from prm_stub import PRMStub, PRMWorkerAPI  # noqa: E402

REPO = Path(__file__).parents[2]


@pytest.fixture
def prm_role(monkeypatch):
    """The whole cost of the new role: this row (its protocol, count, placement section and
    from_config; isolated: its own process, a deadline per call)."""
    row = roles.Role("prm", PRMWorkerAPI, PRMStub.from_config, lambda cfg: 1, section="judge", isolated=True,
                     load_timeout=lambda cfg: 120.0, call_timeout=lambda cfg: 30.0)
    monkeypatch.setattr(roles, "ROLES", (*roles.ROLES, row))
    return row


def test_a_new_frozen_role_is_one_row_of_the_table(prm_role, tmp_path):
    cfg = load_config(REPO / "configs" / "smoke.yaml", ["model.path=tiny", "rollout.max_new_tokens=4",
                                                       f"trainer.output_dir={tmp_path}"])
    workers = build_workers(cfg, roles=("prm",))
    try:
        prm = workers.prm
        assert missing_methods(prm, PRMWorkerAPI) == []
        assert prm.step_scores(["ab\nc", "abcd"]) == [[0.5, 0.25], [1.0]]
        assert prm.pid() != os.getpid()  # isolated: a process of its own
        assert workers.policy is None and workers.judge is None  # roles not asked for
    finally:
        workers.close()
    assert prm.proc is None  # closed with the others


def test_every_role_says_how_it_is_built_and_placed():
    """Every row's protocol is declared, its section exists in `placement`, and its builder is
    the worker module's own (placement builds nothing itself)."""
    cfg = load_config(None, [])
    for role in roles.ROLES:
        assert dataclasses.is_dataclass(role.placement(cfg)), role.name
        assert not role.build.__module__.startswith("reasonrl.placement"), role.name
        assert role.isolated == (role.load_timeout is not None and role.call_timeout is not None), role.name


@pytest.mark.parametrize("lora", [0, pytest.param(4, marks=needs_peft)])
def test_the_reference_is_a_role_served_within_the_policy(tmp_path, lora):
    """algo.beta > 0: the `reference` row starts no worker of its own; `Workers.reference` is its
    view of the policy's worker, whose `FrozenModel` lays out rows with the learner's own
    `micro_batches` (a row asked alone is bitwise its forward alone), a copy of the model, or with
    LoRA the policy's base with the adapter off (no copy). algo.beta = 0: no reference role."""
    import torch

    from reasonrl.workers.frozen import ReferenceOf

    overrides = ["model.path=tiny", "model.precision=fp32", "rollout.max_new_tokens=4",
                 f"trainer.output_dir={tmp_path}", f"model.lora.rank={lora}"]
    cfg = load_config(REPO / "configs" / "smoke.yaml", [*overrides, "algo.beta=0.01"])
    assert [r.name for r, _ in roles.active(cfg, ("policy", "reference"))] == ["policy", "reference"]
    workers = build_workers(cfg, roles=("policy", "reference"))
    try:
        policy, reference = workers.policy, workers.reference
        assert isinstance(reference, ReferenceOf) and reference.policy is policy
        assert policy.reference.layout == policy.micro_batches and policy.reference.device == policy.device
        assert (policy.ref_model.__class__.__name__ == "AdapterDisabled") == (lora > 0)
        assert (policy.ref_model is not policy.model) and all(not p.requires_grad for p in (
            policy.ref_model.parameters() if lora == 0 else ()))
        prompts, completions = [[1, 5, 9], [1, 7]], [[20, 21], [30, 31, 32]]
        found = reference.logprobs(prompts, completions, torch.tensor([False, True]))
        alone = policy.row_logprobs(policy.ref_model, prompts[1:], completions[1:])[0]
        assert found[0].numel() == 0 and torch.equal(found[1], alone.float().cpu())
    finally:
        workers.close()
    off = load_config(REPO / "configs" / "smoke.yaml", [*overrides, "algo.beta=0.0", "algo.log_kl=false"])
    assert roles.active(off, ("reference",)) == []
