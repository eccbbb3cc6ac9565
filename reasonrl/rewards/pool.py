"""Run reward functions in worker processes, each call with a hard time limit.

math-verify (sympy) can spin for minutes on adversarial answers such as `9^{9^{9}}`, inside C
code that no signal interrupts, and a user's reward function can hang on anything. Such calls
run in `python -m reasonrl.rewards.worker` processes: the parent writes one JSON line per call
and waits with a deadline; a worker still busy at its deadline is killed and replaced, and the
call scores 0 as a timeout. The parent never uses signals, so scoring works from any thread.

Inside the worker a SIGALRM at `timeout` interrupts pure-Python hangs cheaply (the worker then
lives on); the parent's kill at `timeout * 1.2 + 0.5` s is the backstop for everything else.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

LOAD_TIMEOUT = 120.0  # seconds to import a target in a fresh worker (sympy is slow on a busy box)
MAX_MEMORY_MB = 2048  # a worker's memory bound by default (reward.max_memory_mb; worker.bound_memory)


@dataclass
class Call:
    """One reward call: `target` is "module:function" (or "file.py:function"). With `batch`
    ({"completions", "ground_truths", "groups", "extra_infos"}: lists) it is one call of a
    batch reward (`reward.batch_fn`) over all of them; `completion` and `ground_truth` are
    then unused. With `style` (a `styles.STYLES` name) the function is called as that style
    calls it (`styles.invoke`) on `batch`, which then holds every one of `styles.COLUMNS`."""

    target: str
    completion: str
    ground_truth: str
    extra_info: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    batch: dict | None = None
    # keyword arguments of the target's `warmup` (reward.model: the model to load), called when a
    # worker loads the target, within the pool's load timeout, not the call's
    warmup: dict | None = None
    style: str = ""  # how the function is called: a `styles.STYLES` name, "" for the forms above


@dataclass
class Outcome:
    """What came back: a value, or a timeout, or an error message (the call raised)."""

    value: Any = None
    timed_out: bool = False
    error: str | None = None
    ground_truth_error: bool = False  # the function raised GroundTruthError: a data bug
    out_of_memory: bool = False  # `error` is a MemoryError: the worker's memory bound was reached
    not_applied: bool = False  # a TRL function returned None: it does not apply to this completion
    logged: dict[str, float] | None = None  # what the function asked to log for this completion


def hard_deadline(timeout: float) -> float:
    """Seconds after which the parent kills a worker that has not answered."""
    return timeout * 1.2 + 0.5


def _child_env() -> dict[str, str]:
    # The worker must import what the parent can: the same sys.path ("" = the working directory).
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Worker:
    def __init__(self, max_memory_mb: int = MAX_MEMORY_MB) -> None:
        flags = ["--max-memory-mb", str(max_memory_mb)]
        self.proc = subprocess.Popen([sys.executable, "-m", "reasonrl.rewards.worker", *flags],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env())
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = b""
        self.loaded: set[str] = set()

    def send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def poll_line(self) -> tuple[bytes | None, bool]:
        """(a complete reply line or None, whether the worker has exited). Never blocks."""
        if b"\n" not in self.buffer:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                chunk = None
            if chunk == b"":
                return None, True
            if chunk:
                self.buffer += chunk
        if b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            return line, False
        return None, False

    def wait_line(self, deadline: float) -> bytes | None:
        """Block until a reply line or `deadline` (monotonic); None on timeout or exit."""
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while True:
                line, dead = self.poll_line()
                if line is not None:
                    return line
                left = deadline - time.monotonic()
                if dead or left <= 0:
                    return None
                sel.select(left)

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
        except Exception:  # already gone
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass


def exit_text(proc: subprocess.Popen) -> str:
    """A dead worker's exit status in words: "code 3", or "code -9, SIGKILL: ..." for a signal
    (SIGKILL is what the system's out-of-memory killer sends: a worker past the machine's memory,
    where reward.max_memory_mb does not bound it first)."""
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # its stdout closed, the process not yet reaped
        return "code unknown"
    if code >= 0:
        return f"code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"code {code}"
    why = ": the out-of-memory killer, or another process" if name == "SIGKILL" else ""
    return f"code {code}, {name}{why}"


def request_of(call: Call, timeout: float) -> dict:
    """The worker's request for `call` (`reasonrl.rewards.worker`), its soft timer at `timeout`."""
    message = {"target": call.target, "completion": call.completion, "ground_truth": call.ground_truth,
               "extra_info": call.extra_info, "options": call.options, "timeout": timeout}
    if call.batch is not None:
        message["batch"] = call.batch
    if call.style:
        message["style"] = call.style
    return message


def load_request(target: str, warmup: dict | None) -> dict:
    """The worker's request to import `target` (and run its warmup, with `warmup` if given)."""
    cwd = os.getcwd()  # now: the worker may have been started in another (since removed) directory
    message = {"load": target, "sys_path": [p or cwd for p in sys.path], "cwd": cwd}
    if warmup is not None:
        message["warmup"] = warmup
    return message


def _outcome(line: bytes) -> Outcome:
    try:
        reply = json.loads(line)
    except ValueError:
        return Outcome(error=f"worker sent an unreadable reply: {line[:200]!r}")
    return outcome_of(reply)


def outcome_of(reply: dict) -> Outcome:
    """A worker's reply as an Outcome."""
    if reply.get("timeout"):
        return Outcome(timed_out=True)
    if "ground_truth_error" in reply:
        return Outcome(error=reply["ground_truth_error"], ground_truth_error=True)
    if "error" in reply:
        return Outcome(error=reply["error"], out_of_memory=bool(reply.get("memory")))
    return Outcome(value=reply.get("value"))


class WorkerPool:
    """Up to `size` worker processes, started on first use and restarted after a kill or a
    death. `max_memory_mb`: each worker's memory bound (`worker.bound_memory`; 0: none, for a
    model's worker, whose weights and CUDA mappings need more); `load_timeout`: seconds to import
    a target and run its warmup."""

    def __init__(self, size: int = 2, max_memory_mb: int = MAX_MEMORY_MB, load_timeout: float = LOAD_TIMEOUT):
        self.size = max(1, size)
        self.max_memory_mb, self.load_timeout = max_memory_mb, load_timeout
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self.killed = 0  # workers killed at their deadline (for tests and curiosity)

    def run(self, calls: list[Call], timeout: float) -> list[Outcome]:
        """Run every call, in parallel over the workers; outcomes are in the order of `calls`."""
        with self._lock:
            return self._run(calls, timeout)

    def load(self, target: str, warmup: dict | None = None) -> str | None:
        """Load `target` (with its `warmup`) in a worker now, kept for the calls to come; the
        error text if that fails."""
        with self._lock:
            worker = self._idle.pop() if self._idle else _Worker(self.max_memory_mb)
            try:
                error = self._load(worker, target, warmup)
            except OSError as err:  # a broken pipe: the worker is gone
                error = f"reward worker failed: {err}"
            if error is None:
                self._idle.append(worker)
            else:
                self._retire(worker)
            return error

    def _load(self, worker: _Worker, target: str, warmup: dict | None = None) -> str | None:
        """Import `target` in the worker (and run its warmup); the error text if that fails."""
        key = target if warmup is None else f"{target} {json.dumps(warmup, sort_keys=True)}"
        if key in worker.loaded:
            return None
        worker.send(load_request(target, warmup))
        line = worker.wait_line(time.monotonic() + self.load_timeout)
        outcome = (_outcome(line) if line is not None else
                   Outcome(error=f"worker did not load {target} within {self.load_timeout:g} s"))
        if outcome.error is None:
            worker.loaded.add(key)
        return outcome.error

    def _run(self, calls: list[Call], timeout: float) -> list[Outcome]:
        results: list[Outcome | None] = [None] * len(calls)
        pending = deque(range(len(calls)))
        busy: dict[_Worker, tuple[int, float]] = {}
        with selectors.DefaultSelector() as sel:
            while pending or busy:
                while pending and len(busy) < self.size:
                    i = pending.popleft()
                    worker, error = self._start(calls[i], timeout)
                    if worker is None:
                        results[i] = Outcome(error=error)
                        continue
                    busy[worker] = (i, time.monotonic() + hard_deadline(timeout))
                    sel.register(worker.fd, selectors.EVENT_READ, worker)
                if not busy:
                    continue
                wait = min(deadline for _, deadline in busy.values()) - time.monotonic()
                sel.select(max(wait, 0.0))
                for worker, (i, deadline) in list(busy.items()):
                    line, dead = worker.poll_line()
                    if line is None and not dead and time.monotonic() < deadline:
                        continue
                    sel.unregister(worker.fd)
                    del busy[worker]
                    if line is not None:
                        results[i] = _outcome(line)
                        self._idle.append(worker)
                    elif dead:
                        results[i] = Outcome(error=f"reward worker exited ({exit_text(worker.proc)})")
                        self._retire(worker)  # the next call starts a new one
                    else:
                        results[i] = Outcome(timed_out=True)
                        self.killed += 1
                        self._retire(worker)
        return results  # type: ignore[return-value]

    def _start(self, call: Call, timeout: float) -> tuple[_Worker | None, str | None]:
        """Hand `call` to an idle (or new) worker; a worker that died while idle is replaced once."""
        message = request_of(call, timeout)
        error = None
        for _ in range(2):
            worker = self._idle.pop() if self._idle else _Worker(self.max_memory_mb)
            try:
                error = self._load(worker, call.target, call.warmup)
                if error is None:
                    worker.send(message)
                    return worker, None
            except OSError as err:  # a broken pipe: the worker is gone
                error = f"reward worker failed: {err}"
            self._retire(worker)
        return None, error

    def _retire(self, worker: _Worker) -> None:
        worker.kill()

    def close(self) -> None:
        with self._lock:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()


_POOLS: dict[tuple[int, int], WorkerPool] = {}


def get_pool(size: int, max_memory_mb: int = MAX_MEMORY_MB) -> WorkerPool:
    """The process-wide pool of `size` workers with that memory bound: start-up is paid once per
    process."""
    key = (size, max_memory_mb)
    if key not in _POOLS:
        _POOLS[key] = WorkerPool(size, max_memory_mb)
    return _POOLS[key]


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
