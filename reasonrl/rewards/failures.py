"""Reward failures a user can see: one line per failure naming the reward function, and each
kind of failure printed the first time it happens (later ones are only counted).

A reward function that raises, times out or returns a bad value scores 0 and is counted in
`reward/errors` / `reward/timeouts` (one odd completion must not end a run). Counted is not
seen: a function that fails on every call would otherwise train on zeros with nothing on
the console but `reward=0.000`. `Scores.failures` keeps each row's message (logged with the
samples), and `FailureLog` prints the first of each kind.
"""

from __future__ import annotations

from reasonrl.rewards.verifiers import Verifier


def describe_exception(err: BaseException) -> str:
    """An in-process reward's failure as one line. SystemExit is caught with the others: a
    reward function that calls sys.exit() must not end the trainer (with exit code 2, which
    is also that of a config error) without a word. An exception without a message is its
    type's name alone (`KeyboardInterrupt`, not `KeyboardInterrupt: `)."""
    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r})"
    text = str(err)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def describe_verifier(verifier: Verifier) -> str:
    """The reward function a user would look for: `reward.fn m:f`, `reward.batch_fn m:f`,
    `reward.fns.<name> m:f`, or the built-in task verifier."""
    if verifier.name:
        return f"{verifier.name} {verifier.target}"
    if verifier.batch:
        return f"reward.batch_fn {verifier.target}"
    if verifier.task == "custom":
        return f"reward.fn {verifier.target}"
    return f"the {verifier.task} verifier ({verifier.target})"


def failure_kind(message: str) -> str:
    """What makes two failures "the same kind": the function and the exception's type (or
    'timed out', 'called sys.exit(...)'), not the message's varying details. Messages are
    `<function>: <what>`, where <what> starts with the exception's type name."""
    function, _, what = message.partition(": ")
    return f"{function}: {what.split(':', 1)[0].split(' (', 1)[0]}"


class FailureLog:
    """Prints each kind of reward failure once, with its first message (the run's log
    keeps the count in `reward/errors`, `reward/timeouts`)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def new(self, failures: list[str | None] | None) -> list[str]:
        """The messages of kinds not seen before, in row order (each kind once)."""
        lines = []
        for message in failures or ():
            if message is not None and failure_kind(message) not in self.seen:
                self.seen.add(failure_kind(message))
                lines.append(message)
        return lines
