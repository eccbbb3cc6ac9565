"""Agent episodes in training: an agent program's calls through the endpoint become `Rollouts`.

`AgentEpisodes` is the episode runner of `env.format=agent` (`EPISODE_RUNNERS["agent"]`; the
rollout worker hands it a rollout call instead of the turn loop). Per call:

1. the worker's engine is served by an `AgentEndpoint` over loopback HTTP (one per worker, kept
   between calls; `reasonrl.serve.app.Server`), whose only routes that answer are the live
   episodes' `/episodes/{key}/v1`: a call on `/v1`, or from an episode that is over (a program
   that outlived its timeout), is refused;
2. each prompt's `rollout.n` episodes run the program (`reasonrl.envs.agent.AgentProgram`),
   `env.agent.concurrency` at once, in order, each with `env.agent.timeout`
   (`reasonrl.envs.run_calls`); an episode is live from its start to its end, and concurrent
   episodes' requests are batched into the engine's calls in rounds over the live episodes
   (`reasonrl.serve.batcher.Lockstep`); a request without a seed is sampled from `call_seed`, a
   function of its episode: the same seeds give the same episodes, whatever the threads' timing
   (a resumed run repeats bitwise);
3. every call is recorded by its token ids (`CallRecord`, filed under its episode); with
   `env.agent.pin_version` each is pinned to the policy version the rollout started with (the
   batcher refuses it if another is loaded), else tagged with the version that served it (each
   record carries it either way: `agent/staleness_mean` and `_max` against the trained version);
4. `join_calls`: a call whose prompt ids extend an earlier call's prompt + completion ids
   continues that sequence: the ids between (the environment's: tool output, the next user
   message, the chat template's markup) go in with mask 0, its sampled ids with mask 1 and
   their sampler log-probs; a call that extends none (a harness that rewrote or cut its
   history, or `n` > 1 choices) starts another sequence. Nothing is re-rendered: every id is
   one the endpoint was given or sampled.

Every sequence is trained, each as a row: a row per sequence, all of an episode's rows in its
prompt's group, marked with the episode (`Rollouts.episode`, which of its group's `rollout.n`
episodes) so that they share one reward and one advantage (`reasonrl.source.collect.split_rows`,
`reasonrl.train.advantage_stage.episode_advantages`, which says how the loss weighs them). An
episode's first row is the sequence holding its last call (its final answer: what is scored, and
what stands for the episode in metrics and samples), the others follow in the order they started;
an episode of more than one sequence counts in `agent/split`. Its reward: the program's
return value, or, when it returns None, the reward functions over its final answer (the last
call's completion); a failure (`reasonrl.envs.agent.FAILURES`) scores 0 or, with
`env.agent.on_failure=drop`, leaves the episode unscored (`reasonrl.envs.base.with_env_reward`).
An episode with no call trains nothing (its row's one id is masked).

Weight loads never overlap a generate call, by construction rather than by `Endpoint.paused`:
the endpoint generates only for live episodes, and `run` returns only once every episode has
ended (a late request of a timed-out one is refused) and the round being served, if any, is done
(`Lockstep.drain`). Weights change only between rollout calls: in asynchronous training the
rollout process runs `LoadWeights` and `Produce` in order on its one command thread
(`reasonrl.source.channel.run_commands`), and on-policy the trainer pushes (or, sharing the
model, updates it) between steps. So every call of a batch is served by the version the batch was
started with (in asynchronous training max(0, t - K)), which the pin guards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from reasonrl.batch import EpisodeStats, Example, Rollouts, Turn
from reasonrl.envs import run_calls
from reasonrl.envs.agent import COUNTS, FAILURES, failure_of, task_of
from reasonrl.registry import EPISODE_RUNNERS
from reasonrl.rollout.base import SEED_BOUND, SamplingParams
from reasonrl.rollout.episodes import turn_seed
from reasonrl.serve.app import Server
from reasonrl.serve.batcher import Lockstep
from reasonrl.serve.calls import CallRecord
from reasonrl.serve.endpoint import Endpoint
from reasonrl.serve.protocol import RequestError


@dataclass
class EpisodeCalls:
    """What the endpoint files under one live episode."""

    pinned: int | None  # the policy version its calls must be served by (None: any, tagged)
    seed: int = 0  # the base of the seeds of its calls that give none (`call_seed`)
    sample: int = 0  # which of its prompt's rollout.n episodes it is
    requests: int = 0  # requests so far (numbered from 1 by arrival: `call_seed`)
    records: list[CallRecord] = field(default_factory=list)
    refused: list[RequestError] = field(default_factory=list)


def call_seed(seed: int, sample: int, call: int) -> int:
    """The sampling seed of an episode's `call`-th request (1, 2, ... by arrival) when it gives
    none: `turn_seed` of the prompt's seed (`seed`), the episode's `sample` and `call`, a
    function of the episode alone, so that its tokens do not depend on the batch or on which
    other episodes ran (the batcher's own draws, in arrival order across episodes, would)."""
    return turn_seed(seed, sample, call)


def prompt_seed(prompt: list[int]) -> int:
    """A greedy rollout's episodes have no prompt seed (`task["seed"]` is None); their calls that
    sample anyway (an agent's own temperature) are seeded from the prompt's ids: the first 8
    bytes of BLAKE2b over them, mod SEED_BOUND."""
    digest = hashlib.blake2b(",".join(map(str, prompt)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_BOUND


class AgentEndpoint(Endpoint):
    """The endpoint over a rollout worker's engine for its agent episodes: the served version is
    the worker's `policy_version` (read at generation time); only live episodes' routes answer;
    requests are batched in rounds over the live episodes (`Lockstep`), and a request that gives
    no seed is sampled from `call_seed`, so that a run repeats bitwise."""

    batcher: Lockstep

    def __init__(self, worker, max_model_len: int, **options):
        self._worker = weakref.ref(worker)  # not kept alive by its endpoint: its end stops the server
        self.live: dict[str, EpisodeCalls] = {}
        self._lock = threading.Lock()
        super().__init__(worker.engine, worker.tokenizer, "policy", max_model_len, **options)
        self.on_call.append(self._record)

    def make_batcher(self, window_s: float, max_rows: int, seed: int) -> Lockstep:
        return Lockstep(self.engine, lambda: self.policy_version, max_rows, seed)

    def start(self, key: str, calls: EpisodeCalls) -> None:
        """Episode `key` is live: its route answers, and rounds wait for it."""
        self.live[key] = calls
        self.batcher.start(key)

    def end(self, key: str) -> None:
        """Episode `key` is over: its later requests (and any still waiting) are refused."""
        self.live.pop(key, None)
        self.batcher.end(key)

    @property
    def policy_version(self) -> int:
        worker = self._worker()
        return worker.policy_version if worker is not None else -1

    @policy_version.setter
    def policy_version(self, value: int) -> None:  # Endpoint.__init__ sets it: the worker's is read
        pass

    def chat(self, body: dict, episode: str | None = None) -> dict:
        return self._episode_call(super().chat, body, episode)

    def completions(self, body: dict, episode: str | None = None) -> dict:
        return self._episode_call(super().completions, body, episode)

    def _episode_call(self, method, body: Any, episode: str | None) -> dict:
        calls = self.live.get(episode) if episode is not None else None
        if calls is None:
            raise RequestError(f"episode {episode!r} is not running: call the base URL the episode was given "
                               "(/episodes/{key}/v1), while it runs", 404, code="episode_not_running")
        if isinstance(body, dict):
            with self._lock:
                calls.requests += 1
                number = calls.requests
            if body.get("seed") is None:
                body = {**body, "seed": call_seed(calls.seed, calls.sample, number)}
            if calls.pinned is not None:
                body = {**body, "policy_version": calls.pinned}
        try:
            return method(body, episode)
        except RequestError as err:
            calls.refused.append(err)
            raise

    def _record(self, record: CallRecord) -> None:
        calls = self.live.get(record.episode)
        if calls is not None:
            calls.records.append(record)


@dataclass
class Chain:
    """One trained sequence: a first call's prompt, then completions and what came between."""

    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    between: list[list[int]] = field(default_factory=list)  # per call after the first: the ids before it

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)

    def add(self, record: CallRecord, context: list[int]) -> None:
        if self.calls:
            self.between.append(context)
        self.ids += context + record.completion_ids
        self.mask += [0] * len(context) + [1] * len(record.completion_ids)
        if self.logprobs is not None and record.logprobs is not None:
            self.logprobs += [0.0] * len(context) + list(record.logprobs)
        else:
            self.logprobs = None
        self.calls.append(record)


def join_calls(records: list[CallRecord]) -> list[Chain]:
    """An episode's calls (in the order they were served) as sequences: a call whose prompt ids
    begin with a sequence's prompt + ids so far continues the longest such sequence (the ids
    past them are context, mask 0), else it starts a sequence of its own."""
    chains: list[Chain] = []
    for record in records:
        best, at = None, -1
        for chain in chains:
            full = chain.prompt + chain.ids
            if len(full) > at and record.prompt_ids[: len(full)] == full:
                best, at = chain, len(full)
        if best is None:
            chain = Chain(list(record.prompt_ids))
            chain.add(record, [])
            chains.append(chain)
        else:
            best.add(record, list(record.prompt_ids[at:]))
    return chains


def episode_chains(chains: list[Chain], last: CallRecord | None) -> list[Chain]:
    """An episode's sequences as its rows: the one holding its `last` call (its final answer)
    first, then the others in the order they started."""
    first = [c for c in chains if any(r is last for r in c.calls)]
    return first + [c for c in chains if not any(c is f for f in first)]


def other_sampling(record: CallRecord, params: SamplingParams) -> bool:
    """Whether a call was sampled otherwise than the rollout samples (its log-probs then are not
    the policy's at the rollout's temperature)."""
    p = record.params
    return (p.greedy, p.top_p, p.top_k) != (params.greedy, params.top_p, params.top_k) or \
        (not p.greedy and p.temperature != params.temperature)


def model_context(engine, tokenizer) -> int:
    """The served model's context (positions), for the endpoint's length check."""
    config = getattr(getattr(engine, "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        return positions
    length = getattr(tokenizer, "model_max_length", None)
    return length if isinstance(length, int) and 0 < length < 10**7 else 2048


CALLS_AT_ONCE = 16  # an episode's calls in flight at once the agent server has threads for
_SERVING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # rollout worker -> (endpoint, server)
_SERVING_LOCK = threading.Lock()


def serving(worker) -> tuple[AgentEndpoint, Server]:
    """The worker's endpoint and its loopback server, started on first use and kept."""
    with _SERVING_LOCK:
        if worker not in _SERVING:
            endpoint = AgentEndpoint(worker, model_context(worker.engine, worker.tokenizer))
            # a round waits for every live episode's request: each must get a thread (an episode
            # may have several calls at once, up to CALLS_AT_ONCE before they would wait)
            threads = max(40, CALLS_AT_ONCE * worker.env.config.agent.concurrency)
            server = Server(endpoint, "127.0.0.1", 0, threads=threads).start()
            _SERVING[worker] = (endpoint, server)
            weakref.finalize(worker, _stop, endpoint, server)
        return _SERVING[worker]


def _stop(endpoint: Endpoint, server: Server) -> None:
    server.stop()
    endpoint.close()


@EPISODE_RUNNERS.register("agent", doc="an agent program's episodes through the OpenAI-compatible endpoint")
class AgentEpisodes:
    """Plays a rollout call's episodes as agent programs (see the module docstring)."""

    def __init__(self, worker):
        self.worker, self.env, self.tokenizer = worker, worker.env, worker.tokenizer

    def run(self, examples: list[Example], prompts: list[list[int]], params: SamplingParams,
            seeds: list[int] | None, version: int) -> Rollouts:
        cfg = self.env.config.agent
        endpoint, server = serving(self.worker)
        endpoint.limits = dataclasses.replace(endpoint.limits, default_max_tokens=params.max_new_tokens)
        program, nonce, n = self.env.make(), uuid.uuid4().hex[:12], params.n
        sampling = {"temperature": 0.0 if params.greedy else params.temperature, "top_p": params.top_p,
                    "top_k": params.top_k, "max_tokens": params.max_new_tokens}
        base = server.url.removesuffix("/v1")
        keys, calls, tasks = [], {}, []
        for k, (example, prompt) in enumerate(zip(examples, prompts, strict=True)):
            for s in range(n):
                key = f"{nonce}-{k}-{s}"
                keys.append(key)
                seed = None if seeds is None or params.greedy else seeds[k]
                calls[key] = EpisodeCalls(version if cfg.pin_version else None,
                                          prompt_seed(prompt) if seed is None else seed, s)
                tasks.append(task_of(example, prompt, seed, s, sampling))
        t = time.perf_counter()
        try:  # each episode is live from its start to its end (rounds wait for the live ones)
            outcomes = run_calls([program.episode(f"{base}/episodes/{key}/v1", task, cfg.timeout)
                                  for key, task in zip(keys, tasks, strict=True)],
                                 program.wall_timeout(cfg.timeout), cfg.concurrency,
                                 on_start=lambda i: endpoint.start(keys[i], calls[keys[i]]),
                                 on_end=lambda i: endpoint.end(keys[i]))
        finally:
            for key in keys:  # over: later calls (a program past its timeout) are refused
                endpoint.end(key)
            endpoint.batcher.drain()  # no generation runs past the rollout (see the module docstring)
        seconds = time.perf_counter() - t
        rows = [self._row(calls[key], outcome, prompts[i // n], params, cfg.on_failure)
                for i, (key, outcome) in enumerate(zip(keys, outcomes, strict=True))]
        return self._rollouts(rows, examples, n, version, seconds)

    def _row(self, calls: EpisodeCalls, outcome, prompt: list[int], params: SamplingParams,
             on_failure: str) -> dict:
        records = list(calls.records)
        chains = episode_chains(join_calls(records), records[-1] if records else None)
        failure, message = failure_of(outcome.error, outcome.timed_out), outcome.error
        refused = [e for e in calls.refused if e.code == "policy_version_mismatch"]
        if refused:  # what the program did after a refusal is its own: the refusal is why
            failure, message = "stale_version", refused[0].message
        elif calls.refused:
            failure, message = "malformed", calls.refused[0].message
        elif failure is None and not records:
            failure, message = "no_call", "the agent called no model"
        reward = None if failure is not None else outcome.value
        counts = dict.fromkeys(COUNTS, 0)
        counts.update({f"failed_{r}": int(failure == r) for r in FAILURES})
        counts["calls"], counts["chains"] = len(records), len(chains)
        counts["untrained_calls"] = 0  # every sequence is a row now
        counts["other_sampling"] = sum(other_sampling(r, params) for r in records)
        counts["dropped"] = int(failure is not None and on_failure == "drop")
        counts["given"] = int(reward is not None or (failure is not None and on_failure == "zero"))
        if not chains:  # nothing sampled: one masked id, so that the row exists and trains nothing
            eos = self.tokenizer.eos_token_id
            chains = [Chain(list(prompt), [eos if eos is not None else 0], [0], [0.0])]
        decode = self.tokenizer.decode
        sequences = []
        for chain in chains:
            turns = [Turn(decode(r.completion_ids, skip_special_tokens=True)) for r in chain.calls]
            turns = turns or [Turn("")]
            for j, ids in enumerate(chain.between):
                turns[j] = dataclasses.replace(turns[j], observation=decode(ids))
            text = decode(chain.calls[-1].completion_ids, skip_special_tokens=True) if chain.calls else ""
            truncated = bool(chain.calls) and chain.calls[-1].finish_reason == "length"
            sequences.append({"chain": chain, "turns": turns, "text": text, "truncated": truncated})
        if failure is not None:
            turns = sequences[0]["turns"]
            turns[-1] = dataclasses.replace(turns[-1], error=f"agent failed ({failure}): {message}")
        versions = [r.policy_version for r in records]
        counts["version_sum"], counts["version_min"] = sum(versions), min(versions, default=0)
        return {"sequences": sequences, "counts": counts, "reward": float(reward or 0.0), "failure": failure,
                "timed_out": failure == "timeout", "versions": versions}

    def _rollouts(self, episodes: list[dict], examples: list[Example], n: int, version: int,
                  seconds: float) -> Rollouts:
        """A row per sequence: an episode's first (its final call's) carries its counts, the others
        zeros (metrics read first rows: `reasonrl.train.step_metrics.batch_metrics`)."""
        rows = [(i, j, seq) for i, e in enumerate(episodes) for j, seq in enumerate(e["sequences"])]
        chains = [seq["chain"] for _, _, seq in rows]
        logprobs = None
        if all(c.logprobs is not None for c in chains):
            logprobs = [torch.tensor(c.logprobs, dtype=torch.float32) for c in chains]
        names = (*COUNTS, *(f"failed_{f}" for f in FAILURES))
        long = {name: torch.tensor([episodes[i]["counts"][name] if j == 0 else 0 for i, j, _ in rows],
                                   dtype=torch.long) for name in names}
        zeros = torch.zeros(len(rows), dtype=torch.long)

        def first_only(key: str) -> torch.Tensor:
            return torch.tensor([bool(episodes[i][key]) and j == 0 for i, j, _ in rows], dtype=torch.long)

        stats = EpisodeStats(environment=self.env.name, turns=[seq["turns"] for _, _, seq in rows],
                             tool_calls=zeros, tool_errors=zeros.clone(), tool_timeouts=zeros.clone(),
                             step_errors=first_only("failure"), step_timeouts=first_only("timed_out"),
                             reward=torch.tensor([episodes[i]["reward"] for i, _, _ in rows]),
                             seconds=seconds, agent=long)
        served = [v for e in episodes for v in e["versions"]]
        return Rollouts(
            prompt_ids=[c.prompt for c in chains],
            completion_ids=[c.ids for c in chains],
            texts=[seq["text"] for _, _, seq in rows],
            group=torch.tensor([i // n for i, _, _ in rows], dtype=torch.long),
            truncated=torch.tensor([seq["truncated"] for _, _, seq in rows], dtype=torch.bool),
            examples=[examples[i // n] for i, _, _ in rows],
            sampler_logprobs=logprobs,
            policy_version=min([version, *served]),
            token_mask=[c.mask for c in chains],
            episodes=stats,
            episode=torch.tensor([i % n for i, _, _ in rows], dtype=torch.long),
        )
