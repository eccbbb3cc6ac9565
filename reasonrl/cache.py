"""Where reasonrl keeps what it computes once per machine: converted models, tokenizers,
decoder calibrations. `$REASONRL_HOME`, default `~/.cache/reasonrl`."""

from __future__ import annotations

import os
from pathlib import Path


def reasonrl_home() -> Path:
    return Path(os.environ.get("REASONRL_HOME", Path.home() / ".cache" / "reasonrl"))
