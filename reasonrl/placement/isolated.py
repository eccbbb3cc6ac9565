"""A worker in a process of its own (local placement of a role marked `isolated`: the judge).

`ProcessWorker` starts a spawned process that builds the worker (its role's `from_config`) and
answers its protocol's calls one at a time over a pipe. Each call has the role's deadline: inside
the process a SIGALRM at the deadline interrupts a call that runs Python (the process lives on);
the caller's kill at `hard_deadline` ends anything else (C code, a blocked signal), and the next
call starts a fresh process, which builds the worker again within the role's load timeout. A
call past its deadline raises `WorkerTimeout`, one that raised there `WorkerCallError` with what
it raised: the caller decides what a failed call means (a judge's rows score 0, counted). The
process ignores SIGINT, as the reward workers do: a Ctrl-C stops the trainer's step, not it.

The pipe carries the messages of this module, each a frozen dataclass (picklable), dispatched by
its type as the rollout side's channel is (`reasonrl.source.channel`): the caller sends `Call`
(a method, its arguments, its deadline) or `Close`; the process answers `Ready` or `NotBuilt`
once, after building the worker, then each call with its `Reply` or its `Failure` (what it
raised, or that it ran past its deadline). A message of another type is an error naming it:
answered by a `Failure` in the process (which goes on serving), raised as `WorkerCallError` by
the caller (whose process is then killed: a process that answers nonsense is not trusted).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch.multiprocessing as mp

from reasonrl.errors import ModelLoadError, WorkerCallError, WorkerTimeout
from reasonrl.worker_protocols import api_methods

# ---- the caller's messages -------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """`method(*args, **kwargs)` on the worker, interrupted at `timeout` seconds; answered by
    `Reply` or `Failure`."""

    method: str
    args: tuple
    kwargs: dict
    timeout: float


@dataclass(frozen=True)
class Close:
    """Close the worker (within `timeout` seconds) and end the process; answered by `Reply` or
    `Failure`."""

    timeout: float


# ---- the process's answers -------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """The worker is built: calls may come."""


@dataclass(frozen=True)
class NotBuilt:
    """Building the worker raised `error` (the caller raises it); the process ends."""

    error: BaseException


@dataclass(frozen=True)
class Reply:
    """A call's return value."""

    value: Any


@dataclass(frozen=True)
class Failure:
    """A call failed: what it raised (`error`, its type and text), or `timed_out` (interrupted
    at its deadline)."""

    error: str = ""
    timed_out: bool = False


MESSAGES = (Call, Close)  # the caller's
ANSWERS = (Ready, NotBuilt, Reply, Failure)  # the process's


def unknown(message, kinds: tuple[type, ...]) -> str:
    """The error text of a message of none of `kinds`, naming it."""
    return (f"unknown message {message!r} (a {type(message).__name__}; the messages: "
            f"{', '.join(k.__name__ for k in kinds)})")[:2000]


def hard_deadline(timeout: float) -> float:
    """Seconds after which the caller kills a worker that has not answered (the reward pool's)."""
    return timeout * 1.2 + 0.5


class _SoftTimeout(BaseException):
    """Raised by SIGALRM in the worker's process; a BaseException so `except Exception` in the
    worker's code cannot eat it."""


def _on_alarm(signum, frame):
    raise _SoftTimeout()


def _describe(err: BaseException) -> str:
    text = str(err)
    return f"{type(err).__name__}: {text}"[:2000] if text else type(err).__name__


def _run(worker, method: str, args: tuple, kwargs: dict, timeout: float) -> Reply | Failure:
    """`method` of the worker run within `timeout` seconds (SIGALRM), as its answer."""
    try:
        signal.setitimer(signal.ITIMER_REAL, max(timeout, 1e-3))
        try:
            value = getattr(worker, method)(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return Reply(value)
    except _SoftTimeout:
        return Failure(timed_out=True)
    except BaseException as err:  # noqa: BLE001 - the caller's to judge
        return Failure(_describe(err))


def _serve(conn, build, cfg, host) -> None:
    """The worker's process: build it, say so (or why not), then answer messages until the pipe
    closes or `Close` comes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        worker = build(cfg, host)
    except BaseException as err:  # noqa: BLE001 - sent back: the caller raises it
        try:
            conn.send(NotBuilt(err))
        except Exception:  # an exception that does not pickle: its text
            conn.send(NotBuilt(ModelLoadError(_describe(err))))
        return
    conn.send(Ready())
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        match message:
            case Call(method, args, kwargs, timeout):
                conn.send(_run(worker, method, args, kwargs, timeout))
            case Close(timeout):
                conn.send(_run(worker, "close", (), {}, timeout))
                return
            case _:
                conn.send(Failure(f"TypeError: the worker's process got an {unknown(message, MESSAGES)}"))


def read_answer(answer, name: str, method: str, timeout: float):
    """A call's answer from the process of the `name` worker: the value of a `Reply`; a `Failure`
    raised (`WorkerTimeout` past the deadline, else `WorkerCallError` with what the call raised);
    an answer of another type `WorkerCallError` naming it."""
    match answer:
        case Reply(value):
            return value
        case Failure(_, True):
            raise WorkerTimeout(f"the {name} worker did not finish {method}() within {timeout:g} s")
        case Failure(error, False):
            raise WorkerCallError(error)
        case _:
            raise WorkerCallError(f"the {name} worker answered {method}() with an {unknown(answer, ANSWERS)}")


@dataclass
class ProcessWorker:
    """A worker of protocol `api` in a process of its own (see the module docstring): its
    protocol's methods are calls into that process; `killed` counts the processes killed at a
    deadline. `start`: the process started (and the worker built) now, so that a model that
    cannot load stops the run at start-up; else at the first call."""

    name: str
    build: Any
    api: type
    cfg: Any
    host: Any
    load_timeout: float
    call_timeout: float
    start: bool = True

    def __post_init__(self):
        self.proc = self.conn = None
        self.killed = 0
        self._methods = set(api_methods(self.api)) - {"close"}
        if self.start:
            self._start()

    def __getattr__(self, method: str):
        if method.startswith("_") or method not in self.__dict__.get("_methods", ()):
            raise AttributeError(method)
        return partial(self.call, method)

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, self.build, self.cfg, self.host),
                                name=f"reasonrl-{self.name}", daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(self.load_timeout):
            self._kill()
            raise ModelLoadError(f"the {self.name} worker was not built within {self.load_timeout:g} s")
        try:
            answer = self.conn.recv()
        except EOFError:
            code = self._kill()
            raise ModelLoadError(f"the {self.name} worker's process exited while building it (exit code "
                                 f"{code})") from None
        match answer:
            case Ready():
                return
            case NotBuilt(error):
                self._kill()
                raise error
            case _:
                self._kill()
                raise ModelLoadError(f"the {self.name} worker's process answered its build with an "
                                     f"{unknown(answer, ANSWERS)}")

    def _kill(self) -> int | None:
        proc, self.proc = self.proc, None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if proc is None:
            return None
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        return proc.exitcode

    def call(self, method: str, *args, **kwargs):
        """`method(*args, **kwargs)` in the worker's process, within the role's deadline."""
        if self.proc is None:
            self._start()
        timeout = self.call_timeout
        self.conn.send(Call(method, args, kwargs, timeout))
        if not self.conn.poll(hard_deadline(timeout)):
            self._kill()
            self.killed += 1
            raise WorkerTimeout(f"the {self.name} worker did not answer {method}() within {timeout:g} s")
        try:
            answer = self.conn.recv()
        except EOFError:
            code = self._kill()
            raise WorkerCallError(f"the {self.name} worker's process exited (exit code {code})") from None
        if not isinstance(answer, (Reply, Failure)):
            self._kill()
        return read_answer(answer, self.name, method, timeout)

    def close(self) -> None:
        """Stop the process (asked, then killed); safe to call twice."""
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(Close(5.0))
                self.conn.poll(5.0)
            except (OSError, EOFError, ValueError):
                pass
        self._kill()
