"""The console: every `[reasonrl] ...` line of the package goes through this module.

A line has a level (`info`, `warning`, `error`), a message, and optionally fields (the values
it reports, by name, for a program to read). How it is written is the console mode:

| mode | writes |
|---|---|
| `text` (default) | `[reasonrl] <label><message>` on the line's stream (stdout; warnings: stderr) |
| `quiet` | the warnings and errors alone, as `text` writes them |
| `json` | one JSON object per line, `{"level": ..., "message": ..., "fields": {...}}`, on the same stream |

The mode is `trainer.console` for a run (`reasonrl train` / `sft` / `eval` / `probe`: `using`),
else the environment variable `REASONRL_CONSOLE` (any command), else `text`. It is read from
the environment at every line, and `using` sets it there, so a subprocess (the rollout
process, the reward workers) inherits it; a Ray actor is given it by placement
(`inherited_env`).

This module sits at the bottom of the package: it imports nothing from reasonrl.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

ENV = "REASONRL_CONSOLE"
MODES = ("text", "quiet", "json")
PREFIX = "[reasonrl] "


def mode() -> str:
    """The console mode now: `$REASONRL_CONSOLE` when it names one of `MODES`, else `text`."""
    value = os.environ.get(ENV, "").strip().lower()
    return value if value in MODES else "text"


@contextmanager
def using(wanted: str) -> Iterator[None]:
    """The console in mode `wanted` (one of `MODES`; "" leaves the environment's) inside the
    block, for this process and those it starts; the previous mode after it."""
    if not wanted:
        yield
        return
    if wanted not in MODES:
        raise ValueError(f"console mode must be one of {', '.join(MODES)}, got {wanted!r}")
    before = os.environ.get(ENV)
    os.environ[ENV] = wanted
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def inherited_env() -> dict[str, str]:
    """The environment variables a worker started elsewhere (a Ray actor) needs to write its
    lines in this process's mode."""
    return {ENV: os.environ[ENV]} if ENV in os.environ else {}


def text_line(message: str, label: str = "") -> str:
    """`message` as the text mode writes it: `[reasonrl] <label><message>`."""
    return f"{PREFIX}{label}{message}"


def json_line(level: str, message: str, fields: dict[str, Any]) -> str:
    return json.dumps({"level": level, "message": message, "fields": fields}, default=str)


def _say(level: str, message: str, label: str, err: bool, lead: str,
         write: Callable[[str], None] | None, fields: dict[str, Any]) -> None:
    now = mode()
    if now == "quiet" and level == "info":
        return
    line = json_line(level, message, fields) if now == "json" else lead + text_line(message, label)
    if write is not None:
        write(line)
    else:
        print(line, file=sys.stderr if err else sys.stdout, flush=True)


def info(message: str, *, err: bool = False, label: str = "", lead: str = "",
         write: Callable[[str], None] | None = None, **fields: Any) -> None:
    """An information line: on stdout (`err`: stderr); none in quiet mode. `label` goes between
    the prefix and the message in text mode (`note: `), `lead` before the prefix (a newline
    after a progress bar); `write` writes the line instead of print (a progress bar's)."""
    _say("info", message, label, err, lead, write, fields)


def warning(message: str, *, label: str = "warning: ", lead: str = "",
            write: Callable[[str], None] | None = None, **fields: Any) -> None:
    """A warning: on stderr, in every mode. Text mode writes `[reasonrl] warning: <message>`
    (`label=""` for the warnings whose line never carried the word)."""
    _say("warning", message, label, True, lead, write, fields)


def error(message: str, *, label: str = "error: ", write: Callable[[str], None] | None = None,
          **fields: Any) -> None:
    """An error line that does not stop the program (one that does is the command line's
    `reasonrl: error: ...`): on stderr, in every mode."""
    _say("error", message, label, True, "", write, fields)
