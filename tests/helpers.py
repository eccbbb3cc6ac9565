"""Helpers shared by several test modules."""

from __future__ import annotations

import dataclasses

from reasonrl.config import AlgoConfig, OptimConfig
from reasonrl.policy.worker import PolicySettings

_ALGO = {f.name for f in dataclasses.fields(AlgoConfig)}
_OPTIM = {f.name for f in dataclasses.fields(OptimConfig)}


def policy_settings(**values) -> PolicySettings:
    """`PolicySettings` from flat keyword arguments, each routed to the section that has it
    (`lr=0.1` -> optim.lr, `beta=0.1` -> algo.beta, `temperature=0.7` -> the settings)."""
    algo = {k: v for k, v in values.items() if k in _ALGO}
    optim = {k: v for k, v in values.items() if k in _OPTIM}
    rest = {k: v for k, v in values.items() if k not in _ALGO | _OPTIM}
    if "betas" in optim:
        optim["betas"] = list(optim["betas"])
    return PolicySettings(algo=AlgoConfig(**algo), optim=OptimConfig(**optim), **rest)


def patch_entry(monkeypatch, registry, name: str, fn, **info) -> None:
    """Select `fn` by `name` in `registry` for one test (undone by monkeypatch)."""
    from reasonrl.registry import Entry

    registry.names()  # fill it first, so the patch is not overwritten by the first lookup
    monkeypatch.setitem(registry._entries, name, Entry(name, fn, info))
