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

`Lockstep` is the policy of training's agent episodes (`reasonrl.serve.agent_episodes`), where a
run must repeat bitwise: a batched forward's float rounding depends on which rows share it
(the lean decoder on 2 threads: 1e-6 in a log-prob), so the batches must not depend on when
requests arrive. It batches in rounds: a round starts once every live episode (`start` ..
`end`, which the episode runner calls as it admits and finishes them) has a request waiting
or has ended, and serves every waiting request, ordered by the episode's admission and then
its arrival within the episode. An agent that makes one call at a time and is a function of
its responses then gets the same batches, whatever the threads' timing (the in-process turn
loop steps its episodes the same way: every episode's turn, then the next).
"""

from __future__ import annotations

import itertools
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
    episode: str | None = None  # the episode it came from (`Lockstep` batches by episode)
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

    def submit_all(self, jobs: list[Job]) -> list[Future]:
        """`submit` each of one request's jobs (its prompts), in order."""
        return [self.submit(job) for job in jobs]

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
            for params, group in by_params(jobs).items():
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
            self._serve(params, group)

    def _serve(self, params: SamplingParams, group: list[Job]) -> None:
        """One `generate` call for `group`, its results into the jobs' futures; `lock` held."""
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


def by_params(jobs: list[Job]) -> dict[SamplingParams, list[Job]]:
    """`jobs` grouped by their sampling parameters (one generate call takes one set), each group
    in the jobs' order."""
    groups: dict[SamplingParams, list[Job]] = {}
    for job in jobs:
        groups.setdefault(job.params, []).append(job)
    return groups


class EpisodeOver(Exception):
    """A request of an episode that is not live (over, or not started)."""


class Lockstep(Batcher):
    """Rounds over the live episodes, for runs that must repeat (see the module docstring).
    `start(key)` / `end(key)`: an episode becomes live / is over (its waiting requests fail
    with `EpisodeOver`, as does any later one); `drain()` returns once no round is being served."""

    def __init__(self, engine: RolloutEngine, version: Callable[[], int], max_rows: int = 64, seed: int = 0):
        self.cond = threading.Condition()
        self.live: dict[str, int] = {}  # episode -> its admission number (a round's order)
        self.pending: dict[str, list[Job]] = {}
        self.admitted = itertools.count()
        self.rounds = 0  # rounds served so far (tests)
        super().__init__(engine, version, 0.0, max_rows, seed)

    def start(self, episode: str) -> None:
        with self.cond:
            self.live[episode] = next(self.admitted)
            self.cond.notify_all()

    def end(self, episode: str) -> None:
        with self.cond:
            self.live.pop(episode, None)
            for job in self.pending.pop(episode, []):
                job.future.set_exception(EpisodeOver(f"episode {episode!r} is over"))
            self.cond.notify_all()

    def submit(self, job: Job) -> Future:
        return self.submit_all([job])[0]

    def submit_all(self, jobs: list[Job]) -> list[Future]:
        """One request's jobs, waiting together (a round takes all of them or none)."""
        with self.cond:
            if self._closed:
                raise RuntimeError("the endpoint is closed")
            for job in jobs:
                if job.episode in self.live:
                    self.pending.setdefault(job.episode, []).append(job)
                else:
                    job.future.set_exception(EpisodeOver(f"episode {job.episode!r} is not running"))
            self.cond.notify_all()
        return [job.future for job in jobs]

    def close(self) -> None:
        with self.cond:
            if self._closed:
                return
            self._closed = True
            self.cond.notify_all()
        self._thread.join(timeout=60)

    def drain(self) -> None:
        """Wait for the round being served, if any. Called once every episode has ended, no
        round can start after it: no generation runs until an episode starts again."""
        with self.cond, self.lock:
            pass

    def _ready(self) -> bool:
        return bool(self.live) and all(self.pending.get(k) for k in self.live)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not (self._closed or self._ready()):
                    self.cond.wait()
                if self._closed:
                    break
                order = sorted(self.live, key=self.live.__getitem__)
                jobs = [job for k in order for job in self.pending.pop(k)]
                self.lock.acquire()  # before the round leaves the condition: `drain` waits for it
            try:
                self.rounds += 1
                for params, group in by_params(jobs).items():
                    per_call = max(1, self.max_rows // params.n)
                    for i in range(0, len(group), per_call):
                        self._serve(params, group[i:i + per_call])
            finally:
                self.lock.release()
        with self.cond:  # closed: whatever still waits fails
            for jobs in self.pending.values():
                for job in jobs:
                    job.future.set_exception(RuntimeError("the endpoint closed before this request was "
                                                          "served"))
            self.pending.clear()
