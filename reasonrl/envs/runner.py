"""Environment steps of one turn, run concurrently, each with its own timeout, never raising.

All episodes of a batch advance turn by turn: after the engine's turn, every episode still
going takes one environment step, at most `workers` at a time, each in a thread of its own
(daemon: a step that never returns cannot hold up the process's exit). A step gets `timeout`
seconds from when it starts; past that it is answered as timed out and its slot goes to the
next step (the thread cannot be stopped: it finishes, or not, unobserved, and the episode that
owned it asks its environment nothing more). A step that raises is answered with the error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """One call's result: its value, or why there is none."""

    value: Any = None
    error: str | None = None  # "ValueError: ..." when it raised, or the timeout
    timed_out: bool = False


def run_calls(calls: Sequence[Callable[[], Any]], timeout: float, workers: int,
              on_start: Callable[[int], None] | None = None,
              on_end: Callable[[int], None] | None = None) -> list[Outcome]:
    """Run the zero-argument `calls` with at most `workers` at once and `timeout` seconds each
    (from its start); their outcomes, in order. Never raises for what a call does.

    Calls start in order: the first `workers`, then call i + 1 when a slot frees. `on_start(i)`
    runs when call i is given its slot (before it runs), `on_end(i)` once it is answered
    (returned, raised, or timed out); both under one lock, a call's end and the next call's start
    together, so an observer (the agent endpoint's `Lockstep`) never sees the slot empty
    between them."""
    n = len(calls)
    if n == 0:
        return []
    results: list[Outcome | None] = [None] * n
    started: list[float | None] = [None] * n
    admitted, released = [False] * n, [False] * n
    slots = {"free": max(1, workers), "next": 0}
    changed = threading.Condition()

    def admit() -> None:  # under `changed`
        while slots["free"] and slots["next"] < n:
            i = slots["next"]
            slots["next"] += 1
            slots["free"] -= 1
            admitted[i] = True
            if on_start is not None:
                on_start(i)
        changed.notify_all()

    def release(i: int) -> None:
        with changed:
            if not released[i]:
                released[i] = True
                if on_end is not None:
                    on_end(i)
                slots["free"] += 1
                admit()
            changed.notify_all()

    def work(i: int) -> None:
        with changed:
            while not admitted[i]:
                changed.wait()
            started[i] = time.monotonic()
            changed.notify_all()
        try:
            outcome = Outcome(value=calls[i]())
        except BaseException as err:  # whatever user code raises (SystemExit too) becomes an answer
            outcome = Outcome(error=f"{type(err).__name__}: {err}")
        with changed:  # answered and released at once: `run_calls` returns after every `on_end`
            if results[i] is None:  # not already answered as timed out
                results[i] = outcome
            release(i)

    with changed:
        admit()
    for i in range(n):
        threading.Thread(target=work, args=(i,), daemon=True, name=f"reasonrl-env-step-{i}").start()
    with changed:
        while True:
            now = time.monotonic()
            waits = []
            for i in range(n):
                if results[i] is None and started[i] is not None:
                    left = started[i] + timeout - now
                    if left <= 0:
                        results[i] = Outcome(error=f"timed out after {timeout:g} s", timed_out=True)
                        release(i)  # its slot goes to the next call (the condition's lock is re-entrant)
                    else:
                        waits.append(left)
            if all(r is not None for r in results):
                return list(results)  # type: ignore[arg-type]
            changed.wait(timeout=min(waits, default=timeout))
