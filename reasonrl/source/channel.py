"""The ordered channel between the trainer and the rollout side of `Ahead`, and the rollout
side's command loop.

The trainer drives the rollout side by one ordered stream of commands: `SetState` (a resumed
side's sampler and RNGs), `LoadWeights` (a policy version's snapshot), `Produce` (one batch),
`Evaluate` (the held-out eval of the version loaded last), `Stop`. The side runs them in order,
so which weights generated which batch, the prompt seeds it draws and the prompts its sampler
deals do not depend on timing: two runs with the same seed and staleness give the same batches.
The side answers `Loaded`, `BatchReady`, `EvalReady`, or `Failed` with its traceback. Each
message is a frozen dataclass of this module (picklable: it crosses the pipe), dispatched by its
type; one of another type is an error naming it.

The channel is a `torch.multiprocessing` pipe to the rollout process (local placement), or a
pair of queues to a thread of the trainer's process (`queue_pipe`, ray placement): one pipe
and a receiving thread, not a cluster runtime, for a process on the same machine.
"""

from __future__ import annotations

import io
import queue
import time
import traceback
from dataclasses import dataclass, field

import torch

from reasonrl.batch import StepBatch
from reasonrl.checkpoint import from_plain, to_plain
from reasonrl.config import Config
from reasonrl.rollout import SamplingParams
from reasonrl.source.collect import collect_batch

# ---- the trainer's commands ------------------------------------------------------------------

@dataclass(frozen=True)
class SetState:
    """Continue from a resumed run's side state (the sampler's, the RNGs')."""

    state: dict


@dataclass(frozen=True)
class LoadWeights:
    """Load policy version `version`'s snapshot (`WeightSync.snapshot`), checked by `checks`;
    answered `Loaded`."""

    version: int
    payload: object
    checks: dict


@dataclass(frozen=True)
class Produce:
    """Collect batch `index` with the weights loaded last; answered `BatchReady`."""

    index: int


@dataclass(frozen=True)
class Evaluate:
    """The held-out eval of version `version` (loaded last); answered `EvalReady`."""

    version: int


@dataclass(frozen=True)
class Stop:
    """End the command loop."""


# ---- the side's answers ----------------------------------------------------------------------

@dataclass(frozen=True)
class Loaded:
    """Version `version`'s weights are loaded: the trainer may drop its snapshot."""

    version: int


@dataclass(frozen=True)
class BatchReady:
    """Batch `index`: {batch, state, stats} as the side packs it (`Side.pack`: bytes from the
    rollout process, the dict itself from a thread)."""

    index: int
    packed: bytes | dict


@dataclass(frozen=True)
class EvalReady:
    """The held-out metrics of version `version`."""

    version: int
    metrics: dict


@dataclass(frozen=True)
class Failed:
    """The side failed: its traceback."""

    traceback: str


COMMANDS = (SetState, LoadWeights, Produce, Evaluate, Stop)  # the trainer's, in `run_commands`' order
ANSWERS = (Loaded, BatchReady, EvalReady, Failed)  # the side's


@dataclass
class Produced:
    """A batch as it came back: the batch, the side's state after it, its `async/` stats."""

    batch: StepBatch
    state: dict
    stats: dict[str, float] = field(default_factory=dict)


def to_bytes(value) -> bytes:
    """`value` as plain data (`reasonrl.checkpoint.records`), saved by torch: what crosses the
    pipe from the rollout process, loaded weights-only."""
    buf = io.BytesIO()
    torch.save(to_plain(value), buf)
    return buf.getvalue()


def from_bytes(data: bytes, where: str):
    return from_plain(torch.load(io.BytesIO(data), weights_only=True), where)


def run_commands(conn, side, cfg: Config, sampling: SamplingParams) -> None:
    """The trainer's commands, in order, until `Stop` or the channel closes (the trainer is
    gone): `SetState`, `LoadWeights` (answered `Loaded`), `Produce` (answered `BatchReady`: the
    batch, the side's state after it and its stats), `Evaluate` (answered `EvalReady`: the
    held-out metrics)."""
    idle_since, pause, busy = time.perf_counter(), 0.0, 0.0
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        match command:
            case Stop():
                return
            case SetState(state):
                side.set_state(state)
            case LoadWeights(version, payload, checks):
                del command  # the snapshot is dropped once loaded
                t = time.perf_counter()
                side.load(payload, checks)
                pause += time.perf_counter() - t
                del payload
                conn.send(Loaded(version))
            case Evaluate(version):
                t = time.perf_counter()
                conn.send(EvalReady(version, side.evaluate()))
                busy += time.perf_counter() - t
            case Produce(b):
                started = time.perf_counter()
                idle = started - idle_since - pause - busy
                batch = collect_batch(side.rollout, side.sampler, sampling, cfg, side.parts.judge)
                stats = {"async/producer_idle": max(idle, 0.0), "async/sync_pause": pause}
                conn.send(BatchReady(b, side.pack({"batch": batch, "state": side.state(), "stats": stats})))
                idle_since, pause, busy = time.perf_counter(), 0.0, 0.0
            case _:
                raise TypeError(f"rollout side: unknown command {command!r} (a {type(command).__name__}; "
                                f"the commands: {', '.join(c.__name__ for c in COMMANDS)})")


def serve(conn, side, cfg: Config, sampling: SamplingParams) -> None:
    """The rollout side's life: `side()` builds it (the rollout process's side, with its engine;
    or the ray side, in a thread), then it runs the commands, then it is closed. Any failure
    goes back as its traceback."""
    try:
        built = side()
        try:
            run_commands(conn, built, cfg, sampling)
        finally:
            built.close()
    except BaseException:  # noqa: BLE001 - everything goes back to the trainer, which raises it
        try:
            conn.send(Failed(traceback.format_exc()))
        except (OSError, EOFError):
            pass
    finally:
        conn.close()


class _Closed:
    """The end-of-channel marker of `QueueEnd`."""


class QueueEnd:
    """One end of an in-process duplex channel with a `multiprocessing.Pipe` end's methods
    (`send`, `recv`: EOFError once the other end closed, `close`), for the ray side's thread."""

    def __init__(self, inbox: queue.Queue, outbox: queue.Queue):
        self.inbox, self.outbox, self.closed = inbox, outbox, False

    def send(self, obj) -> None:
        if self.closed:
            raise OSError("the channel is closed")
        self.outbox.put(obj)

    def recv(self):
        obj = self.inbox.get()
        if obj is _Closed:
            self.inbox.put(_Closed)  # every later recv sees the end too
            raise EOFError
        return obj

    def drop_unread(self) -> None:
        """Forget what was sent and not yet received by the other end."""
        while True:
            try:
                self.outbox.get_nowait()
            except queue.Empty:
                return

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.outbox.put(_Closed)


def queue_pipe() -> tuple[QueueEnd, QueueEnd]:
    a, b = queue.Queue(), queue.Queue()
    return QueueEnd(a, b), QueueEnd(b, a)
