"""Per-call bounds: memory and tasks of all a call's processes together, the disk its
directory takes (`_DiskWatch`), and killing them.

`find_call_bounds()` decides once per machine how (`CallBounds`): a cgroup made for each call
(`_CallCgroup`: cgroup v2, or v1 memory + pids; the call's first process is put in before it
runs anything, held by `_GATE`), else a watchdog (`_Watchdog`) that sums the resident memory of
the call's process tree every `WATCHDOG_TICK` seconds, else (no /proc) neither. Both kill what
is left of a call at its end; `_kill_checked` signals a process only once it is pinned by a
pidfd and still the call's, so a reused pid is never signalled.

The disk a call uses is its directory's (the only writable place in modes bwrap and unshare
besides a /dev/shm capped at `file_mb`): `_DiskWatch` sums what its files take on disk every
`WATCHDOG_TICK` seconds (less often when a walk is slow), and the call is killed past
`disk_mb`, as past the memory limit. A cgroup has no disk limit and RLIMIT_FSIZE bounds one
file, not how many.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

from reasonrl.tools.sandbox.limits import CALL_OVERHEAD_TASKS, Limits

WATCHDOG_TICK = 0.05  # seconds between two looks at a call's memory (watchdog) or its cgroup's OOM count
_CGROUP_PREFIX = "reasonrl-tool-"

# Between Popen and the sandbox when the call has a cgroup: waits until this process has put
# it in the cgroup (a line on stdin), so every process of the call starts inside.
_GATE = ["/bin/sh", "-c", 'read -r go && exec "$@" </dev/null', "reasonrl-gate"]


@dataclass(frozen=True)
class CallBounds:
    """How memory and tasks are bounded per call (all its processes together), decided once."""

    kind: str  # "cgroup v2" | "cgroup v1" | "watchdog" | "none" (no /proc: per process only)
    reason: str  # why (what was found, or why no cgroup can be made here)
    memory: str = ""  # the directory each call's memory cgroup is made in (v2: its only cgroup)
    pids: str = ""  # v1: the directory each call's pids cgroup is made in ("" none; v2: = memory or "")

    def describe(self) -> str:
        """A few words for the sandbox's self-description."""
        if self.kind == "none":
            return f"per call: NOT bounded, memory per process only (RLIMIT_AS) ({self.reason})"
        if self.kind == "watchdog":
            return (f"per call: memory by a watchdog summing its processes' resident memory every "
                    f"{WATCHDOG_TICK:g} s, tasks by RLIMIT_NPROC only ({self.reason})")
        what = "memory + pids" if self.pids else "memory (tasks by RLIMIT_NPROC only)"
        return f"per call: {what} by a {self.kind} made for it ({self.reason})"


def _cgroup_dirs() -> dict[str, str]:
    """{"v2" or a v1 controller: the directory of this process's own cgroup there} for the
    cgroup hierarchies mounted and visible here."""
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            for name in (controllers.split(",") if controllers else ["v2"] if number == "0" else []):
                own[name] = path
    found: dict[str, str] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, after = left.split(), right.split()
            if len(fields) < 5 or len(after) < 3 or after[0] not in ("cgroup", "cgroup2"):
                continue
            root, point = fields[3], fields[4].replace("\\040", " ")
            options = after[2].split(",")
            names = ["v2"] if after[0] == "cgroup2" else [o for o in options if o in ("memory", "pids")]
            for name in names:
                path = own.get(name)
                if name in found or path is None:
                    continue
                if path == root or path.startswith(root.rstrip("/") + "/"):
                    found[name] = os.path.join(point, path[len(root):].lstrip("/")).rstrip("/")
    return found


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _try_cgroup(parent: str, v2: bool) -> str | None:
    """None if a child cgroup with a memory limit (v2: and an OOM counter) can be made and removed
    under `parent`, else why not."""
    probe = os.path.join(parent, f"{_CGROUP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except OSError as err:
        return f"cannot make a cgroup in {parent}: {err.strerror}"
    try:
        if v2:
            _write(os.path.join(probe, "memory.max"), str(64 << 20))
            events = os.path.join(probe, "memory.events")
        else:
            _write(os.path.join(probe, "memory.limit_in_bytes"), str(64 << 20))
            events = os.path.join(probe, "memory.oom_control")
        with open(events) as f:
            if "oom_kill " not in f.read():
                return f"{events} has no oom_kill count (kernel older than 4.13)"
        return None
    except OSError as err:
        return f"cannot set a memory limit in {parent}: {err.strerror}"
    finally:
        try:
            os.rmdir(probe)
        except OSError:
            pass


def find_call_bounds() -> CallBounds:
    """Per-call cgroups where this process may make them (v2 with the memory controller given to
    its children, else v1 memory + pids), else the watchdog; probed, with the reason. Without
    /proc (not Linux) neither can work: "none"."""
    if not os.path.isdir("/proc/self/task"):
        return CallBounds("none", "no /proc here: neither a cgroup nor the watchdog can see its processes")
    try:
        dirs = _cgroup_dirs()
    except (OSError, ValueError) as err:
        return CallBounds("watchdog", f"no cgroup: /proc unreadable: {err}")
    why: list[str] = []
    if "v2" in dirs:
        parent = dirs["v2"]
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                controllers = f.read().split()
            if "memory" not in controllers:
                why.append(f"cgroup v2 {parent}: no memory controller")
            else:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    given = f.read().split()
                wanted = [c for c in ("memory", "pids") if c in controllers and c not in given]
                if wanted:  # refused (EBUSY) when this cgroup holds processes and is not the root
                    _write(os.path.join(parent, "cgroup.subtree_control"), " ".join("+" + c for c in wanted))
                failure = _try_cgroup(parent, v2=True)
                if failure is None:
                    pids = parent if "pids" in controllers else ""
                    return CallBounds("cgroup v2", f"in {parent}", parent, pids)
                why.append(f"cgroup v2: {failure}")
        except OSError as err:
            why.append(f"cgroup v2 {parent}: cannot give the memory controller to child cgroups "
                       f"({err.strerror}; a cgroup holding processes cannot, unless it is the root)")
    if "memory" in dirs:
        failure = _try_cgroup(dirs["memory"], v2=False)
        if failure is None:
            pids = dirs.get("pids", "")
            if pids:
                probe = os.path.join(pids, f"{_CGROUP_PREFIX}probe-{os.getpid()}-{threading.get_ident()}")
                try:
                    os.mkdir(probe)
                    os.rmdir(probe)
                except OSError:
                    pids = ""
            return CallBounds("cgroup v1", f"in {dirs['memory']}" + (f" and {pids}" if pids else ""),
                              dirs["memory"], pids)
        why.append(f"cgroup v1: {failure}")
    _remove_stale_cgroups(CallBounds("watchdog", "", dirs.get("memory", ""), dirs.get("pids", "")))
    return CallBounds("watchdog", "no cgroup: " + ("; ".join(why) or "no memory controller mounted"))


_CALLS = itertools.count()
_STALE: list[str] = []  # cgroups that still had processes when their call ended; retried later
_STALE_LOCK = threading.Lock()


def _remove_stale_cgroups(bounds: CallBounds) -> None:
    """Remove the empty call cgroups of processes that are gone (a trainer killed mid-call) and
    those earlier calls could not remove yet."""
    for parent in (bounds.memory, bounds.pids):
        if not parent:
            continue
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if name.startswith(_CGROUP_PREFIX) and not name.startswith(_CGROUP_PREFIX + "probe"):
                owner = name[len(_CGROUP_PREFIX):].split("-")[0]
                if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                    try:
                        os.rmdir(os.path.join(parent, name))
                    except OSError:
                        pass
    with _STALE_LOCK:
        for path in list(_STALE):
            try:
                os.rmdir(path)
                _STALE.remove(path)
            except FileNotFoundError:
                _STALE.remove(path)
            except OSError:
                pass


class _CallCgroup:
    """The cgroup(s) of one call: made with its limits, the call's first process put in before
    it runs anything, its processes killed and the cgroups removed at the end."""

    def __init__(self, bounds: CallBounds, limits: Limits) -> None:
        self.v2 = bounds.kind == "cgroup v2"
        self.name = f"{_CGROUP_PREFIX}{os.getpid()}-{next(_CALLS)}"
        self.dirs: list[str] = []
        tasks = str(limits.processes + CALL_OVERHEAD_TASKS)
        memory = str(limits.call_memory_bytes)
        try:
            self.memory = self._make(bounds.memory)
            if self.v2:
                self._set("memory.max", memory)
                self._set("memory.swap.max", "0", optional=True)
                self._set("memory.oom.group", "1", optional=True)
                if bounds.pids:
                    self._set("pids.max", tasks)
            else:
                self._set("memory.limit_in_bytes", memory)
                self._set("memory.memsw.limit_in_bytes", memory, optional=True)  # no swapping past it
                if bounds.pids:
                    self._set("pids.max", tasks, self._make(bounds.pids))
        except OSError:
            self.remove()
            raise

    def _make(self, parent: str) -> str:
        path = os.path.join(parent, self.name)
        os.mkdir(path)
        self.dirs.append(path)
        return path

    def _set(self, name: str, value: str, folder: str = "", optional: bool = False) -> None:
        path = os.path.join(folder or self.memory, name)
        if optional and not os.path.exists(path):
            return
        try:
            _write(path, value)
        except OSError:
            if not optional:
                raise

    def add(self, pid: int) -> None:
        """Put process `pid` (not yet running the sandbox) in every cgroup of the call."""
        for path in self.dirs:
            _write(os.path.join(path, "cgroup.procs"), str(pid))

    def oom_kills(self) -> int:
        """How many processes the kernel killed for passing the call's memory limit."""
        try:
            with open(os.path.join(self.memory, "memory.events" if self.v2 else "memory.oom_control")) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def kill(self) -> bool:
        """SIGKILL every process in the call's cgroups; True when none is left."""
        left = False
        for path in self.dirs:
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                continue
            for pid in pids:
                left = True
                _kill_checked(pid, lambda p: self.name in _read(f"/proc/{p}/cgroup"))
        return not left

    def remove(self) -> None:
        """Kill what is left and remove the cgroups (retried by later calls if processes linger)."""
        deadline = time.monotonic() + 2
        while not self.kill() and time.monotonic() < deadline:
            time.sleep(0.01)
        for path in reversed(self.dirs):
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        with _STALE_LOCK:
                            _STALE.append(path)
                        break
                    self.kill()
                    time.sleep(0.01)
        self.dirs = []


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _kill_checked(pid: int, still_ours: Any) -> None:
    """SIGKILL `pid` if `still_ours(pid)` holds once the process is pinned by a pidfd (so a pid
    reused by another process is never signalled)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        if not still_ours(pid):
            return
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    finally:
        if fd is not None:
            os.close(fd)


def _tree(root: int) -> list[int]:
    """`root` and its descendants (by /proc/PID/task/TID/children, else a scan of /proc)."""
    found = [root]
    if os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"):
        queue = [root]
        while queue:
            pid = queue.pop()
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                for child in _read(f"/proc/{pid}/task/{tid}/children").split():
                    if int(child) not in found:
                        found.append(int(child))
                        queue.append(int(child))
        return found
    parents: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    for name in names:
        if name.isdigit():
            stat = _read(f"/proc/{name}/stat")
            if stat:
                parents.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
    queue = [root]
    while queue:
        for child in parents.get(queue.pop(), []):
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def _resident(pid: int) -> int:
    """Bytes of anonymous and shared memory `pid` holds in RAM (0 if it is gone)."""
    total = 0
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(("RssAnon:", "RssShmem:")):
            total += int(line.split()[1]) << 10
    return total


def _parent_of(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat")
    return int(stat.rsplit(")", 1)[1].split()[1]) if stat else -1


class _Watchdog:
    """Without a cgroup: the call's memory is the sum over its process tree; past the limit the
    tree is killed."""

    def __init__(self, root: int, limit: int) -> None:
        self.root, self.limit = root, limit

    def over(self) -> bool:
        """True when the call's processes hold more than the limit together."""
        return sum(_resident(pid) for pid in _tree(self.root)) > self.limit

    def kill(self) -> None:
        """SIGKILL the tree, leaves first (each checked to still be a child of the tree)."""
        tree = _tree(self.root)
        known = set(tree)
        for pid in reversed(tree[1:]):
            _kill_checked(pid, lambda p: _parent_of(p) in known)


ENTRY_BYTES = 4096  # what a file or directory counts at least (one block; an inode has a cost too)


class _DiskWatch:
    """The bytes a call's directory takes on disk: each entry's allocated blocks or its size,
    whichever is larger, and at least `ENTRY_BYTES` (so a million empty files count too). Looked
    at every `WATCHDOG_TICK` seconds, or every 4 walks' time when a walk takes longer (the
    trainer's CPU); a directory the code made unreadable is opened again (the call's files are
    this process's to open: root, or the same user), else counts as over the limit."""

    def __init__(self, root: str, limit: int) -> None:
        self.root, self.limit = root, limit
        self.next_look = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_look

    def over(self) -> bool:
        """True when the directory holds more than the limit (stops counting once past it)."""
        start = time.monotonic()
        try:
            return self._used() > self.limit
        finally:
            spent = time.monotonic() - start
            self.next_look = time.monotonic() + max(WATCHDOG_TICK, 4 * spent)

    def _used(self) -> int:
        total, folders = 0, [self.root]
        while folders:
            folder = folders.pop()
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            except OSError:
                try:
                    os.chmod(folder, 0o700)
                    entries = list(os.scandir(folder))
                except OSError:
                    return self.limit + 1  # a folder it cannot measure: not an escape from the bound
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                total += max(st.st_blocks * 512, st.st_size, ENTRY_BYTES)
                if total > self.limit:
                    return total
                if entry.is_dir(follow_symlinks=False):
                    folders.append(entry.path)
        return total
