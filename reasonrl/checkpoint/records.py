"""Step records as tensors and plain data, and back: what a checkpoint keeps of the batches in
flight (asynchronous training, `trainer.max_staleness` > 0), and what the rollout process sends.

`state.pt` is read with torch's weights-only unpickler (a checkpoint cannot run code), which
knows tensors, dicts, lists, tuples, strings and numbers but no dataclass. `to_plain` writes a
record of `batch` (and the records inside it) as a dict tagged with its class name;
`from_plain` rebuilds only the classes listed in `RECORDS`, so a file cannot make it build
anything else. Tuples come back as tuples (an `Example`'s metadata may hold them).
"""

from __future__ import annotations

import dataclasses

import torch

from reasonrl.batch import EpisodeStats, Example, Rollouts, Scores, StepBatch, Turn
from reasonrl.errors import CheckpointError

RECORDS = {cls.__name__: cls for cls in (Example, Turn, EpisodeStats, Rollouts, Scores, StepBatch)}
TAG, TUPLE = "__record__", "__tuple__"


def to_plain(value):
    """`value` with every record of `RECORDS` as {TAG: class name, field: value, ...}."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if RECORDS.get(name) is not type(value):
            raise TypeError(f"to_plain: {name} is not a step record ({', '.join(RECORDS)})")
        return {TAG: name, **{f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return {TUPLE: [to_plain(v) for v in value]}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool, torch.Tensor)):
        return value
    raise TypeError(f"to_plain: cannot keep a {type(value).__name__} in a checkpoint")


def from_plain(value, where: str = "state.pt"):
    """The inverse of `to_plain`; an unknown record name is a `CheckpointError` naming `where`."""
    if isinstance(value, dict):
        if TAG in value:
            cls = RECORDS.get(value[TAG])
            if cls is None:
                raise CheckpointError(f"{where}: unknown record {value[TAG]!r} (known: {', '.join(RECORDS)})")
            return cls(**{k: from_plain(v, where) for k, v in value.items() if k != TAG})
        if TUPLE in value and len(value) == 1:
            return tuple(from_plain(v, where) for v in value[TUPLE])
        return {k: from_plain(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [from_plain(v, where) for v in value]
    return value
