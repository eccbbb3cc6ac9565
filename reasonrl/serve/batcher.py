"""The batching queue between the endpoint's requests and the engine's `generate` calls.

Policy: one thread owns the engine. It takes the first waiting request, then keeps taking
requests for at most `window_s` seconds after it (or until the batch holds `max_rows`
sampled rows, a request of `n` samples counting `n`), groups them by their `SamplingParams`
(temperature, top_p, top_k, n, max_tokens, stop: one engine call samples with one set) and
calls `generate` once per group, groups in arrival order. Requests that arrive while the
engine is busy queue up and form the next batch without waiting for a window (the queue
already holds them). A lone request waits `window_s` at most (5 ms by default; 0 turns
batching off).

Each prompt is sampled from its own seed (the request's `seed`, else one drawn from the
batcher's generator in arrival order): the engines sample prompt i from seeds[i] alone
(`reasonrl.rollout.base.prompt_seeds`), so which requests share a call changes nothing but
float rounding of the batched forward.

`lock` is held around each `generate` and the policy version read with it, so a weight push
that takes the lock (`Endpoint.paused`) never overlaps a generation, and each result carries
the version that produced it. A job that names another version than the served one is
refused at that moment (`VersionMismatch`), never generated.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from reasonrl.rollout.base import RolloutEngine, SamplingParams, prompt_seeds


class VersionMismatch(Exception):
    """A request named a policy version other than the one being served."""

    def __init__(self, wanted: int, served: int):
        super().__init__(f"policy_version={wanted} was asked, but the endpoint serves policy version "
                         f"{served}")
        self.wanted, self.served = wanted, served


@dataclass
class Served:
    """One prompt's `n` samples, as the engine returned them."""

    completion_ids: list[list[int]]
    truncated: list[bool]
    logprobs: list[list[float]] | None  # None: greedy decoding
    seed: int | None
    policy_version: int
    time: float


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int | None = None  # None: drawn by the batcher (ignored when greedy)
    version: int | None = None  # the policy version the request requires, if any
    future: Future = field(default_factory=Future)

    @property
    def rows(self) -> int:
        return self.params.n


class Batcher:
    """Owns `engine` in one thread; `submit` from any thread (see the module docstring)."""

    def __init__(self, engine: RolloutEngine, version: Callable[[], int], window_s: float = 0.005,
                 max_rows: int = 64, seed: int = 0):
        self.engine, self.version = engine, version
        self.window_s, self.max_rows = window_s, max_rows
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()
        self.generate_calls = 0  # engine calls so far (tests, metrics)
        self.jobs_served = 0
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="reasonrl-serve-batcher", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> Future:
        if self._closed:
            raise RuntimeError("the endpoint is closed")
        self._queue.put(job)
        return job.future

    def close(self) -> None:
        """Stop the thread after the batch in progress; jobs still queued fail."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=60)

    def _collect(self, first: Job) -> tuple[list[Job], bool]:
        """(the batch that starts with `first`, whether the queue was closed meanwhile)."""
        jobs, rows = [first], first.rows
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            try:
                job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            rows += job.rows
        return jobs, False

    def _loop(self) -> None:
        closed = False
        while not closed:
            first = self._queue.get()
            if first is None:
                break
            jobs, closed = self._collect(first)
            groups: dict[SamplingParams, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.params, []).append(job)
            for params, group in groups.items():
                self._generate(params, group)
        while True:  # closed: whatever is still queued fails
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.future.set_exception(RuntimeError("the endpoint closed before this request was served"))

    def _generate(self, params: SamplingParams, group: list[Job]) -> None:
        with self.lock:
            served = self.version()
            jobs = []
            for job in group:
                if job.version is not None and job.version != served:
                    job.future.set_exception(VersionMismatch(job.version, served))
                elif job.future.set_running_or_notify_cancel():
                    jobs.append(job)
            if not jobs:
                return
            seeds = None
            if not params.greedy:
                drawn = iter(prompt_seeds(sum(j.seed is None for j in jobs), self.generator))
                seeds = [j.seed if j.seed is not None else next(drawn) for j in jobs]
            try:
                out = self.engine.generate([j.prompt_ids for j in jobs], params, seeds)
            except Exception as err:  # the engine's failure is each request's
                for job in jobs:
                    job.future.set_exception(err)
                return
            self.generate_calls += 1
        now, n = time.time(), params.n
        for i, job in enumerate(jobs):
            rows = slice(i * n, (i + 1) * n)
            logprobs = None if out.logprobs is None else [lp.tolist() for lp in out.logprobs[rows]]
            self.jobs_served += 1
            job.future.set_result(Served(out.completion_ids[rows], out.truncated[rows], logprobs,
                                         None if seeds is None else seeds[i], served, now))
