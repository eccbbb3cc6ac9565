"""What a sandboxed call may use (`Limits`) and what it gives back (`Observation`).

`Limits` holds the per-process limits the bootstrap sets in the child (bootstrap.py), the
per-call memory and task bounds (bounds.py) and which mode runs the call (modes.py); the
package docstring says what each mode protects against.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from reasonrl.errors import ConfigError

SANDBOX_MODES = ("auto", "bwrap", "unshare", "rlimit")
DEFAULT_UID = 65534  # "nobody" (and gid 65534, "nogroup") on Debian and most distributions
CALL_OVERHEAD_MB = 32  # per-call memory above `memory_mb`: the sandbox's own processes (init, bwrap, unshare)
CALL_OVERHEAD_TASKS = 4  # per-call tasks above `processes`: the same


@dataclass(frozen=True)
class Limits:
    """The limits of one tool call, and which sandbox runs it."""

    timeout: float = 10.0  # wall-clock seconds; then the whole process group is killed
    cpu_seconds: int = 0  # CPU seconds per process (RLIMIT_CPU); 0: the timeout rounded up, + 1 s
    # address space per process (RLIMIT_AS), the interpreter included; and the resident memory of
    # all the call's processes together (+ CALL_OVERHEAD_MB): a cgroup, else the watchdog
    memory_mb: int = 512
    file_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE)
    disk_mb: int = 64  # what the call's directory may take on disk, all its files together (bounds.py)
    # processes and threads the code may add (RLIMIT_NPROC; per call, + CALL_OVERHEAD_TASKS, by a
    # pids cgroup where the call has one)
    processes: int = 32
    open_files: int = 64  # file descriptors per process (RLIMIT_NOFILE)
    output_bytes: int = 16_384  # stdout + stderr kept; past it the program is stopped
    code_chars: int = 100_000  # longer code is refused without running it
    sandbox: str = "auto"  # auto | bwrap | unshare | rlimit (the package docstring)
    uid: int = DEFAULT_UID  # the unprivileged uid (= gid) the code runs as when this process is root
    python: str = ""  # the interpreter to run the code with; "": found automatically

    def __post_init__(self) -> None:
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ConfigError(f"tool limits: timeout must be a number > 0 (seconds), got {timeout!r}")
        counts = {"memory_mb": self.memory_mb, "file_mb": self.file_mb, "disk_mb": self.disk_mb,
                  "processes": self.processes,
                  "open_files": self.open_files, "output_bytes": self.output_bytes,
                  "code_chars": self.code_chars}
        for name, value in counts.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"tool limits: {name} must be an integer > 0, got {value!r}")
        cpu = self.cpu_seconds
        if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
            raise ConfigError(f"tool limits: cpu_seconds must be an integer >= 0 (0: from the timeout), "
                              f"got {self.cpu_seconds!r}")
        if self.memory_mb < 64:
            raise ConfigError(f"tool limits: memory_mb must be >= 64 (the interpreter alone needs "
                              f"~30 MB of address space), got {self.memory_mb}")
        if self.sandbox not in SANDBOX_MODES:
            raise ConfigError(f"tool limits: sandbox must be one of {', '.join(SANDBOX_MODES)}, "
                              f"got {self.sandbox!r}")
        if isinstance(self.uid, bool) or not isinstance(self.uid, int) or self.uid <= 0:
            raise ConfigError(f"tool limits: uid must be an unprivileged user id > 0 (e.g. 65534), "
                              f"got {self.uid!r}")

    @property
    def cpu_limit(self) -> int:
        """RLIMIT_CPU in seconds: `cpu_seconds`, or the wall-clock timeout rounded up plus one
        second (so that a busy loop meets the wall clock first; the CPU limit is the backstop
        for processes the group kill misses)."""
        return self.cpu_seconds or math.ceil(self.timeout) + 1

    @property
    def disk_bytes(self) -> int:
        """What the call's directory may take on disk (`disk_mb`)."""
        return self.disk_mb << 20

    @property
    def call_memory_bytes(self) -> int:
        """The resident memory of all the call's processes together, the sandbox's own included."""
        return (self.memory_mb + CALL_OVERHEAD_MB) << 20


@dataclass(frozen=True)
class Observation:
    """What a tool call gives back to the model (and to the metrics)."""

    output: str = ""  # stdout and stderr, interleaved as written, cut at the output limit
    error: str | None = None  # why the call failed (None: it succeeded)
    timed_out: bool = False  # the wall-clock timeout ended it
    seconds: float = 0.0  # wall-clock seconds of the call
    exit_code: int | None = None  # the process's exit status (negative: killed by that signal)
    truncated: bool = False  # the output passed the limit and was cut

    @property
    def ok(self) -> bool:
        """True when the call succeeded."""
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)

