"""A worker in a process of its own (local placement of a role marked `isolated`: the judge).

`ProcessWorker` starts a spawned process that builds the worker (its role's `from_config`) and
answers its protocol's calls one at a time over a pipe. Each call has the role's deadline: inside
the process a SIGALRM at the deadline interrupts a call that runs Python (the process lives on);
the caller's kill at `hard_deadline` ends anything else (C code, a blocked signal), and the next
call starts a fresh process, which builds the worker again within the role's load timeout. A
call past its deadline raises `WorkerTimeout`, one that raised there `WorkerCallError` with what
it raised: the caller decides what a failed call means (a judge's rows score 0, counted). The
process ignores SIGINT, as the reward workers do: a Ctrl-C stops the trainer's step, not it.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch.multiprocessing as mp

from reasonrl.errors import ModelLoadError, WorkerCallError, WorkerTimeout
from reasonrl.worker_protocols import api_methods


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


def _serve(conn, build, cfg, host) -> None:
    """The worker's process: build it, say so (or why not), then answer calls until the pipe
    closes or `close` is called."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        worker = build(cfg, host)
    except BaseException as err:  # noqa: BLE001 - sent back: the caller raises it
        try:
            conn.send(("failed", err))
        except Exception:  # an exception that does not pickle: its text
            conn.send(("failed", ModelLoadError(_describe(err))))
        return
    conn.send(("ready", None))
    while True:
        try:
            method, args, kwargs, timeout = conn.recv()
        except EOFError:
            return
        try:
            signal.setitimer(signal.ITIMER_REAL, max(timeout, 1e-3))
            try:
                value = getattr(worker, method)(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = ("value", value)
        except _SoftTimeout:
            reply = ("timeout", None)
        except BaseException as err:  # noqa: BLE001 - the caller's to judge
            reply = ("error", _describe(err))
        conn.send(reply)
        if method == "close":
            return


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

    def __reduce__(self):  # a copy for another process (asynchronous training's rollout process): unstarted
        return (ProcessWorker, (self.name, self.build, self.api, self.cfg, self.host, self.load_timeout,
                                self.call_timeout, False))

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
            kind, value = self.conn.recv()
        except EOFError:
            code = self._kill()
            raise ModelLoadError(f"the {self.name} worker's process exited while building it (exit code "
                                 f"{code})") from None
        if kind == "failed":
            self._kill()
            raise value

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
        self.conn.send((method, args, kwargs, timeout))
        if not self.conn.poll(hard_deadline(timeout)):
            self._kill()
            self.killed += 1
            raise WorkerTimeout(f"the {self.name} worker did not answer {method}() within {timeout:g} s")
        try:
            kind, value = self.conn.recv()
        except EOFError:
            code = self._kill()
            raise WorkerCallError(f"the {self.name} worker's process exited (exit code {code})") from None
        if kind == "timeout":
            raise WorkerTimeout(f"the {self.name} worker did not finish {method}() within {timeout:g} s")
        if kind == "error":
            raise WorkerCallError(value)
        return value

    def close(self) -> None:
        """Stop the process (asked, then killed); safe to call twice."""
        if self.proc is not None and self.proc.is_alive():
            try:
                self.conn.send(("close", (), {}, 5.0))
                self.conn.poll(5.0)
            except (OSError, EOFError, ValueError):
                pass
        self._kill()
