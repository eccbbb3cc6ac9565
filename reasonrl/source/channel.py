"""The ordered channel between the trainer and the rollout side of `Ahead`, and the rollout
side's command loop.

The trainer drives the rollout side by one ordered stream of commands: `state` (a resumed
side's sampler and RNGs), `weights` (a policy version's snapshot), `produce` (one batch), `eval`
(the held-out eval of the version loaded last), `stop`. The side runs them in order, so which
weights generated which batch, the prompt seeds it draws and the prompts its sampler deals do
not depend on timing: two runs with the same seed and staleness give the same batches.

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
    """The trainer's commands, in order, until `stop` or the channel closes (the trainer is
    gone): `state`, `weights` (answered `loaded`), `produce` (answered with the batch, the
    side's state after it and its stats), `eval` (answered with the held-out metrics)."""
    idle_since, pause, busy = time.perf_counter(), 0.0, 0.0
    while True:
        try:
            command, *args = conn.recv()
        except EOFError:
            return
        if command == "stop":
            return
        if command == "state":
            side.set_state(args[0])
        elif command == "weights":
            version, payload, checks = args
            t = time.perf_counter()
            side.load(payload, checks)
            pause += time.perf_counter() - t
            del payload
            conn.send(("loaded", version))
        elif command == "eval":
            t = time.perf_counter()
            conn.send(("eval", args[0], side.evaluate()))
            busy += time.perf_counter() - t
        elif command == "produce":
            (b,) = args
            started = time.perf_counter()
            idle = started - idle_since - pause - busy
            batch = collect_batch(side.rollout, side.sampler, sampling, cfg, side.parts.judge)
            stats = {"async/producer_idle": max(idle, 0.0), "async/sync_pause": pause}
            conn.send(("batch", b, side.pack({"batch": batch, "state": side.state(), "stats": stats})))
            idle_since, pause, busy = time.perf_counter(), 0.0, 0.0
        else:
            raise ValueError(f"rollout side: unknown command {command!r}")


def serve(conn, side, cfg: Config, sampling: SamplingParams) -> None:
    """The rollout side's life: `side()` builds it (the rollout process's side, with its engine;
    or the ray side, in a thread), then it runs the commands. Any failure goes back as its
    traceback."""
    try:
        run_commands(conn, side(), cfg, sampling)
    except BaseException:  # noqa: BLE001 - everything goes back to the trainer, which raises it
        try:
            conn.send(("error", traceback.format_exc()))
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
