"""reasonrl/registry.py: an entry is a frozen dataclass of its registry's kind, checked when it
is registered."""

from __future__ import annotations

import dataclasses

import pytest

from reasonrl import registry
from reasonrl.registry import ADVANTAGES, ENGINES, POLICY_LOSSES, AdvantageEntry, Entry, Registry


def test_every_registry_s_entries_are_of_its_kind_and_frozen():
    for reg in (value for value in vars(registry).values() if isinstance(value, Registry)):
        assert issubclass(reg.kind, Entry) and dataclasses.is_dataclass(reg.kind), reg.key
        for entry in reg:
            assert type(entry) is reg.kind, (reg.key, entry.name)
            with pytest.raises(dataclasses.FrozenInstanceError):
                entry.name = "other"  # type: ignore[misc]
    assert isinstance(ADVANTAGES["grpo"], AdvantageEntry) and ADVANTAGES["grpo"].needs_groups
    assert ADVANTAGES["gae"].critic and not ADVANTAGES["grpo"].critic  # a default
    assert ENGINES["hf"].logprobs is True and ENGINES["hf"].max_model_len is not None


def test_an_unknown_or_missing_field_fails_at_registration():
    reg = Registry("algo.test", kind=AdvantageEntry)
    with pytest.raises(TypeError, match=r"^algo.test: entry 'x': unknown field 'needs_group' "
                                        r"\(AdvantageEntry has: needs_groups, critic\)$"):
        reg.register("x", needs_group=True, needs_groups=True)(lambda x: x)
    with pytest.raises(TypeError, match=r"^algo.test: entry 'x': unknown fields 'a', 'b'; missing field "
                                        r"'needs_groups' \(AdvantageEntry has: needs_groups, critic\)$"):
        reg.register("x", a=1, b=2)(lambda x: x)
    plain = Registry("algo.plain")  # a registry whose entries have no fields of their own
    with pytest.raises(TypeError, match=r"unknown field 'bounded' \(Entry has: no fields\)"):
        plain.register("x", bounded=True)(lambda x: x)
    assert reg.names() == () and plain.names() == ()  # nothing registered


def test_a_registration_out_of_the_package_selects_its_function(monkeypatch):
    """A user's plugin registers as the package's modules do, with the same keywords."""
    POLICY_LOSSES.names()
    monkeypatch.setattr(POLICY_LOSSES, "_entries", dict(POLICY_LOSSES._entries))

    @POLICY_LOSSES.register("mine")
    def mine(logp, old_logp, advantages, mask, ctx):
        """my loss"""
        return -advantages * logp, {}

    assert POLICY_LOSSES.get("mine") is mine and POLICY_LOSSES["mine"].doc == "my loss"
    entry = ADVANTAGES.entry("mine", mine, needs_groups=True)
    assert dataclasses.replace(entry, critic=True).critic and not entry.critic
