"""`param`: a config field with the check the loader applies to it (range, registry choices,
mapping keys). Its own module so that the schema's sections can live in more than one file."""

from __future__ import annotations

import copy
from dataclasses import field
from typing import Any

from reasonrl.registry import Registry


def param(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
          lt: float | None = None, choices: Registry | None = None, also: tuple[str, ...] = (),
          keys: Registry | tuple[str, ...] | None = None, noun: str = "key", zero: str | None = None,
          also_keys: str | None = None) -> Any:
    """A config field with its own check: a range (`ge`/`gt`/`le`/`lt`; a list's applies to each
    item), a value from a registry (`choices`, plus the fixed values `also`), or mapping keys from
    a registry or a tuple (`keys`; an unknown one is called an unknown `noun`), or the keys of
    the mapping in the sibling field `also_keys` (reward.weights may name a reward.fns entry).
    `zero` says what 0 means where it switches the option off ("no clipping"); the range's
    message says it too."""
    meta = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices, keys=keys, zero=zero,
                                  also_keys=also_keys).items() if v is not None}
    meta.update(also=also, noun=noun)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)
