"""The settings the objective and its losses read: a config section's values, read-only, by the
config's own names.

`algo/` takes plain values and never imports the config, and it keeps no copy of the config's
keys either: a mirror (a dataclass repeating a section's fields) has to be edited beside the
schema each time a key is added, and a key it misses reaches no loss. `SectionValues.of(section)`
copies every field of a section's dataclass, whatever they are, into a frozen namespace, so a key
added to the schema is `ctx.<key>` in every loss with nothing else to edit. Reading a key the
section does not have is an `AttributeError` naming `<section>.<key>`.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any


class SectionValues:
    """A config section's values by name, read-only (`ctx.clip_low`). `of(section)` takes them from
    the section's dataclass (every field); `SectionValues(**values)` takes exactly `values`."""

    __slots__ = ("_values",)
    section = "section"  # the config section's name, for messages (`algo`, `critic`)

    def __init__(self, **values: Any):
        object.__setattr__(self, "_values", MappingProxyType(dict(values)))

    @classmethod
    def of(cls, section: Any, **changes: Any):
        """Every field of the dataclass instance `section`, with `changes` over them (each must be
        one of its fields: a `TypeError` otherwise)."""
        values = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}
        return cls(**values).replace(**changes)

    def replace(self, **changes: Any):
        """A copy with `changes` over these values; each must be a key already held."""
        unknown = sorted(set(changes) - set(self._values))
        if unknown:
            raise TypeError(f"{type(self).__name__}: {', '.join(unknown)} not in the {self.section} "
                            f"section (its keys: {', '.join(self._values)})")
        return type(self)(**{**self._values, **changes})

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_values":  # copy/pickle probing a bare instance
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no {self.section}.{name}: it is not a key of "
                                 f"the {self.section} section") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only: use replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and dict(self._values) == dict(other._values)

    __hash__ = None  # some values are lists or mappings

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._values.items())})"

    def __reduce__(self):
        return _rebuild, (type(self), dict(self._values))


def _rebuild(cls: type[SectionValues], values: dict[str, Any]) -> SectionValues:
    return cls(**values)
