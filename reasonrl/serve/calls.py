"""What the endpoint records of every call it serves: the exact token ids, never text.

One `CallRecord` per choice of a response (a request with `n` = 4 makes four), made with the
response, and carrying the policy version the batcher read under the lock it generated under:
a weight push cannot fall between the two. A training
episode runner (#44's second half) joins an episode's calls by `episode` (the
`/episodes/{key}/v1` route its agent was given) and by token-id prefixes, never by re-rendering
the agent's messages.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from reasonrl.rollout.base import SamplingParams


@dataclass(frozen=True)
class CallRecord:
    """One sampled sequence the endpoint returned."""

    request_id: str  # the response's `id`; the choices of one request share it
    route: str  # "chat" | "completions"
    index: int  # the choice's index in its response
    prompt_ids: list[int]  # exactly what the engine was given
    completion_ids: list[int]  # exactly what it sampled, EOS or the stop string's last token included
    logprobs: list[float] | None  # the sampler's per-token log-probs (None: greedy decoding)
    finish_reason: str  # "stop" (EOS or a stop string), "length", "tool_calls"
    policy_version: int  # the version of the weights that generated it
    params: SamplingParams  # the engine call's sampling parameters
    seed: int | None  # the prompt's sampling seed (None: greedy)
    episode: str | None = None  # the route's episode key (/episodes/{key}/v1/...), None on /v1
    time: float = 0.0  # time.time() when the generation returned


class CallLog:
    """A hook for `Endpoint.on_call` that keeps every record in a list (thread-safe).
    `episode(key)`: the records of one episode, in the order they were served."""

    def __init__(self) -> None:
        self.records: list[CallRecord] = []
        self._lock = threading.Lock()

    def __call__(self, record: CallRecord) -> None:
        with self._lock:
            self.records.append(record)

    def episode(self, key: str | None) -> list[CallRecord]:
        with self._lock:
            return [r for r in self.records if r.episode == key]

    def take(self) -> list[CallRecord]:
        """Every record so far, and the log emptied."""
        with self._lock:
            taken, self.records = self.records, []
        return taken


CallHook = Callable[[CallRecord], None]
