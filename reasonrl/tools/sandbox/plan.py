"""`SandboxPlan`: how a call runs in the mode chosen here (modes.py): its one-line summary, and
the command, environment and Popen arguments that run a call's main.py in that mode (bwrap's
options, util-linux unshare's namespaces, or the rlimit floor), all through the bootstrap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from reasonrl.tools.sandbox.bootstrap import _BOOTSTRAP, _INSIDE_DIR, _root_layout
from reasonrl.tools.sandbox.bounds import CallBounds
from reasonrl.tools.sandbox.limits import DEFAULT_UID, Limits


@dataclass(frozen=True)
class SandboxPlan:
    """How code runs on this machine: decided once per (mode asked, uid, interpreter)."""

    mode: str  # "bwrap", "unshare" or "rlimit"
    reason: str  # why this mode (what was probed)
    python: str  # the interpreter that runs the code
    python_dirs: tuple[str, ...]  # the directories it needs (bound read-only by bwrap and unshare)
    run_as: int | None  # the uid (= gid) the code runs as; None: this process's own user
    bwrap: str = ""  # bubblewrap's path (mode bwrap)
    unshare: str = ""  # util-linux unshare's path (mode unshare; rlimit: network + PID namespaces)
    bounds: CallBounds = CallBounds("watchdog", "not probed")  # per-call memory and tasks

    @property
    def network_blocked(self) -> bool:
        """Whether the code has no network at all (loopback included)."""
        return self.mode in ("bwrap", "unshare") or bool(self.unshare)

    @property
    def files_hidden(self) -> bool:
        """Whether the code sees only its directory and a read-only system (modes bwrap, unshare)."""
        return self.mode in ("bwrap", "unshare")

    def summary(self) -> str:
        """One line: the mode, what it blocks, how a call's memory is bounded, why."""
        user = f"uid {self.run_as}" if self.run_as is not None else f"this user (uid {os.getuid()})"
        if self.mode == "bwrap":
            blocks = "namespaces (filesystem, network, processes) + resource limits"
        elif self.mode == "unshare":
            blocks = ("namespaces (a private read-only root with only its directory writable; network, "
                      "processes) + resource limits")
        elif self.unshare:
            blocks = ("resource limits + network and PID namespaces (unshare); WARNING: the host's files are "
                      "visible (world-readable ones readable, /tmp writable)")
        else:
            blocks = ("resource limits only; WARNING: the network (loopback included) is NOT blocked and the "
                      "host's files are visible (world-readable ones readable, /tmp writable)")
        return f"{self.mode} as {user}, {self.python}: {blocks}; {self.bounds.describe()} ({self.reason})"

    def command(self, workdir: str, limits: Limits, root: str = "") -> tuple[list[str], dict[str, str],
                                                                              dict[str, Any]]:
        """(argv, environment, extra Popen arguments) that run `workdir`/main.py under `limits`;
        `root`: an empty directory for mode unshare's private root to be mounted on."""
        # userns: unshare made a user namespace (not root); the bootstrap counts the tasks of its uid
        # there only, as the kernel does for RLIMIT_NPROC (outside, this user's other processes)
        settings: dict[str, Any] = {"cpu": limits.cpu_limit, "as": limits.memory_mb << 20,
                                    "fsize": limits.file_mb << 20, "nofile": limits.open_files,
                                    "nproc": limits.processes, "init": bool(self.unshare),
                                    "userns": bool(self.unshare) and self.run_as is None}
        inside = _INSIDE_DIR if self.files_hidden else workdir
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8"}
        drop = {} if self.run_as is None else {"user": self.run_as, "group": self.run_as, "extra_groups": []}
        if self.mode == "unshare":
            settings.update(drop_to=self.run_as, root={
                "root": root, "work": workdir, "inside": _INSIDE_DIR, "shm": limits.file_mb << 20,
                "layout": _root_layout(self.python_dirs)})
        python = [self.python, "-I", "-S", "-c", _BOOTSTRAP, json.dumps(settings), "main.py"]
        if self.mode == "bwrap":
            return [*self.bwrap_argv(workdir, limits), *python], env, {**drop, "cwd": "/"}
        if self.mode == "unshare":  # the bootstrap builds the root, then drops to run_as or all capabilities
            userns = ["--user", "--map-root-user"] if self.run_as is None else []
            namespaces = ["--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
            return [self.unshare, *userns, *namespaces, "--", *python], env, {"cwd": "/"}
        if self.unshare:
            if self.run_as is None:  # not root: a user namespace makes the other namespaces possible
                prefix = [self.unshare, "--user", "--net", "--pid", "--fork", "--kill-child", "--"]
            else:  # root: unshare drops to the uid itself, after creating the namespaces
                prefix = [self.unshare, "--net", "--pid", "--fork", "--kill-child",
                          "--setgid", str(self.run_as), "--setuid", str(self.run_as), "--"]
            return [*prefix, *python], env, {"cwd": workdir}
        return python, env, {**drop, "cwd": workdir}

    def bwrap_argv(self, workdir: str, limits: Limits) -> list[str]:
        """bubblewrap's options: namespaces, read-only system and interpreter, `workdir` writable."""
        argv = [self.bwrap, "--unshare-all", "--uid", str(DEFAULT_UID), "--gid", str(DEFAULT_UID),
                "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        for kind, path, target in _root_layout(self.python_dirs):
            if kind == "symlink":
                argv += ["--symlink", target, path]
            elif kind == "dir":
                argv += ["--ro-bind", path, path]
        return argv + ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
                       "--proc", "/proc", "--dev", "/dev",
                       "--size", str(limits.file_mb << 20), "--tmpfs", "/dev/shm",
                       "--bind", workdir, _INSIDE_DIR, "--chdir", _INSIDE_DIR,
                       "--remount-ro", "/dev", "--remount-ro", "/"]
