"""Run untrusted Python code (a model's tool call) in a separate, limited process.

`run_python(code, limits)` writes the code to `main.py` in a fresh temporary directory, runs
it there with a second interpreter and returns an `Observation` (output, error, timed_out,
seconds, exit code, truncated). It never raises: a program that fails, hangs, floods its
output or attacks the machine comes back as an observation with `error` set. The training
process never evaluates the code; only the sandboxed child does.

Every call, in every mode:
- runs as an unprivileged user: when this process is root, the code runs as `limits.uid`
  (default 65534, "nobody"), switched to before anything of the code runs; otherwise as this
  user (inside a user namespace in modes bwrap and unshare, with no capabilities);
- gets resource limits, set by a short bootstrap in the child before it execs the code's
  interpreter: CPU time (`RLIMIT_CPU`), address space (`RLIMIT_AS`, `memory_mb` per process,
  the interpreter's own ~30 MB included), file size (`RLIMIT_FSIZE`), open files, no core
  dumps, and a process/thread count (`RLIMIT_NPROC`, counted above the tasks the sandbox user
  already has; the kernel does not apply it to root, which is why the code never runs as root);
- is bounded PER CALL, all its processes together (`CallBounds`, chosen once per machine):
  memory (`memory_mb` + `CALL_OVERHEAD_MB` for the sandbox's own processes) and tasks
  (`processes` + `CALL_OVERHEAD_TASKS`) by a cgroup made for the call and removed after it
  (cgroup v2, or v1 memory + pids), where this process may make one; else by a watchdog that
  sums the resident memory (anonymous + shared memory) of the call's process tree every
  `WATCHDOG_TICK` seconds and kills it past the limit (tasks then bounded by `RLIMIT_NPROC`
  only); without /proc (not Linux), by neither: per process only, and the plan says so. Past
  the memory limit the whole call is killed and its error says "memory limit";
- starts a new session (`start_new_session=True`): at the end of the call, or at the
  wall-clock timeout, when the output passes `output_bytes` or the call's memory its limit,
  every process of the call gets SIGKILL before the child is reaped: the PID namespace's init
  first (so that unshare or bwrap reaps it: no zombie of the uid is left to the host's init),
  then the process group (`os.killpg`), then whatever is left in the call's cgroup (or,
  without one, in its process tree);
- has an environment of its own (PATH, HOME and TMPDIR = its directory, LANG): none of the
  trainer's variables (tokens, keys) reach it; stdin is /dev/null; no descriptor is inherited;
- sees the standard library only (`python -I -S`: no site-packages, no user site, no
  PYTHON* variables) of an interpreter the sandbox user can run (this Python if it can,
  else /usr/bin/python3; `limits.python` picks one).

The modes (`limits.sandbox`). "auto" picks bwrap when it works here, else unshare, else
REFUSES (SandboxError naming the fix: install bubblewrap, or allow unprivileged user
namespaces); rlimit, which does not hide the host's files, runs only when chosen explicitly,
and then says so in a warning. The choice and its reason are printed once.

bwrap -- bubblewrap (Debian/Ubuntu package `bubblewrap`), when `bwrap --unshare-all` works
  here (a probe runs it once). On top of the above: new user, PID, network, IPC, UTS and
  cgroup namespaces; a filesystem of read-only binds of /usr, /bin, /lib* and the
  interpreter's directories, plus /proc, a minimal /dev and a 'sandbox' directory (the temporary
  directory, the only writable place besides a /dev/shm capped at `file_mb`); the root and
  /dev remounted read-only; `--die-with-parent`, `--new-session`. bwrap itself runs as the
  unprivileged uid when this process is root: with `--uid` alone, bubblewrap run by root
  keeps the real uid 0 (it only maps it), and the kernel would exempt the code from the
  process limit.

unshare -- the same filesystem without bubblewrap, from util-linux `unshare` (`--mount --net
  --pid --ipc --uts --fork --kill-child`; not root: also `--user --map-root-user`). The
  bootstrap, root of those namespaces, builds a private root in a tmpfs: read-only, nosuid
  binds of /usr, /bin, /lib* and the interpreter's directories (and /etc/ld.so.cache), a new
  /proc of its PID namespace, a /dev of null, zero, full, random, urandom and a /dev/shm
  capped at `file_mb`, and /sandbox (the temporary directory, writable); it pivots into it,
  detaches the old root (nothing of the host's tree is left in the namespace) and remounts
  the root read-only. Then it drops privileges for good: as root, to `limits.uid` (real,
  effective and saved ids; the process limit binds); in a user namespace (uid 0 inside, this
  user outside) it empties the capability bounding, ambient, permitted and inheritable sets
  and locks SECBIT_NOROOT, so the code has no capability, in this namespace or any it makes
  (mounts inherited from a more privileged namespace stay locked read-only there). Both set
  no_new_privs. It stays as the PID namespace's init and runs the code as its child.

  bwrap and unshare protect against: reading any file outside those binds (/etc/passwd, the
  repository, home directories, keys, the host's /tmp: they do not exist inside); writing
  anywhere but its directory; any network, loopback included (the namespace has only a downed
  `lo`); signalling or seeing the trainer's or any other process (PID namespace: the code's
  parent is the sandbox's own init); processes escaping the kill (when the namespace's init
  dies, every process inside gets SIGKILL); fork bombs, memory bombs (one process, or many
  each under the per-process limit), CPU loops, output floods, huge files (the limits above).
  They do not protect against: kernel vulnerabilities (namespaces share the host kernel; no
  seccomp filter is installed); reading the world-readable system files under /usr and the
  interpreter's directories; the CPU share and memory bandwidth the code uses until its
  limits stop it; disk space: each file is capped at `file_mb` but the number of files is
  not, the timeout alone bounds how much it writes before the directory is deleted.

rlimit -- the floor, ONLY when chosen explicitly (a warning says what it leaves open): the
  common part above, plus, when `unshare --net --pid --fork --kill-child` (util-linux) works
  here (as root it needs no user namespace), a network namespace and a PID namespace.
  Protects against: fork bombs, memory bombs, CPU loops, output floods, huge files (the
  limits); reading or writing files the unprivileged uid may not (root's 0600/0700 files,
  e.g. /root, tokens under ~/.cache, the repository when it is not world-writable), and
  signalling the trainer (another uid) -- when this process is root; the network, loopback
  included, and processes escaping the kill -- only when `unshare` works.
  Does not protect against: reading world-readable files (/etc/passwd, the repository's
  sources, other users' 0644 files); writing world-writable places (/tmp, /var/tmp,
  /dev/shm); concurrent calls of the same uid reading and changing each other's directories
  (and, without `unshare`, signalling each other's processes); kernel vulnerabilities.
  Without `unshare`: the network is NOT blocked (loopback included: the code can reach
  services on 127.0.0.1), and a process that calls setsid() leaves the process group and
  outlives the kill unless the call has a cgroup (its CPU-time limit still ends it if it
  computes; one that sleeps stays). When this process is not root, the code runs as your own
  user: it can read and write what you can and signal your processes.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from reasonrl.errors import ConfigError, SandboxError

SANDBOX_MODES = ("auto", "bwrap", "unshare", "rlimit")
DEFAULT_UID = 65534  # "nobody" (and gid 65534, "nogroup") on Debian and most distributions
CALL_OVERHEAD_MB = 32  # per-call memory above `memory_mb`: the sandbox's own processes (init, bwrap, unshare)
CALL_OVERHEAD_TASKS = 4  # per-call tasks above `processes`: the same
WATCHDOG_TICK = 0.05  # seconds between two looks at a call's memory (watchdog) or its cgroup's OOM count
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PROBE_TIMEOUT = 20.0  # seconds for one probe (an interpreter start on a busy machine)
_READ_CHUNK = 65536
_INSIDE_DIR = "/sandbox"  # the temporary directory's path inside bubblewrap and unshare's private root
_CGROUP_PREFIX = "reasonrl-tool-"
_NAMESPACE_FIX = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) where user namespaces "
                  "are allowed, or allow unprivileged user namespaces (sysctl "
                  "kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, a "
                  "seccomp/AppArmor profile that permits unshare(CLONE_NEWUSER)), or run as root where "
                  "util-linux unshare can make mount namespaces")

# Runs in the child before any of the code: in mode unshare, first the private root and the
# privilege drop (as root of the new namespaces); in every mode the limits, then exec of a fresh
# interpreter on main.py (so the limits bind the whole program, interpreter included).
# In a PID namespace of `unshare` it is the namespace's init and runs the program as its child,
# as bubblewrap's init does: the program is not PID 1 (whose signals the kernel filters).
# RLIMIT_NPROC counts the tasks of the real uid (in its user namespace and those below), zombies
# included; the limit is set that far above the tasks the uid already has, counted in /proc
# before the private root hides them.
_BOOTSTRAP = r"""
import json, os, resource, sys
lim = json.loads(sys.argv[1])
def tasks_of(uid, own_ns):
    ns, tasks = (os.readlink("/proc/self/ns/user") if own_ns else None), 0
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open("/proc/" + name + "/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[0]) == uid and (ns is None or
                                                             os.readlink("/proc/" + name + "/ns/user") == ns):
                    tasks += int(fields.get("Threads", "1"))
            except (OSError, ValueError, KeyError):
                pass
    return tasks + 1  # this process, as that uid once it has dropped
def private_root(spec, drop_to):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4
    def check(result, what):
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))
    def mount(source, target, fstype, flags, data=None):
        enc = lambda s: None if s is None else os.fsencode(s)
        check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)),
              "mount %s on %s" % (source or fstype, target))
    RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC = 1, 2, 4, 8, 32, 4096, 16384
    NOATIME, NODIRATIME, RELATIME, STRICTATIME, PRIVATE = 1024, 2048, 1 << 21, 1 << 24, 1 << 18
    def remount(target, flags):  # keep the flags a user namespace may not change (atime, noexec)
        have = os.statvfs(target).f_flag
        flags |= REMOUNT | BIND
        for st, ms in ((os.ST_NOEXEC, NOEXEC), (os.ST_NOATIME, NOATIME), (os.ST_NODIRATIME, NODIRATIME),
                       (os.ST_RELATIME, RELATIME), (os.ST_NOSUID, NOSUID), (os.ST_NODEV, NODEV)):
            if have & st:
                flags |= ms
        if not have & (os.ST_NOATIME | os.ST_RELATIME):
            flags |= STRICTATIME
        mount(None, target, None, flags)
    def mounts_under(top):
        found = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = line.split()[4]
                for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
                    point = point.replace(code, char)
                if point == top or point.startswith(top.rstrip("/") + "/"):
                    found.append(point)
        return found
    new = spec["root"]
    os.umask(0o022)
    mount(None, "/", None, REC | PRIVATE)
    mount("tmpfs", new, "tmpfs", NOSUID | NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for kind, path, target in spec["layout"]:
        inside = new + path
        if kind == "symlink":
            os.symlink(target, inside)
            continue
        os.makedirs(os.path.dirname(inside), 0o755, exist_ok=True)
        if kind == "file":
            open(inside, "w").close()
        else:
            os.mkdir(inside, 0o755)
        mount(path, inside, None, BIND | REC)
        for point in mounts_under(inside):  # the bind and every mount below it: read-only, nosuid, nodev
            remount(point, RDONLY | NOSUID | NODEV)
    os.mkdir(new + "/dev", 0o755)
    mount("tmpfs", new + "/dev", "tmpfs", NOSUID | NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for name in ("null", "zero", "full", "random", "urandom"):
        open(new + "/dev/" + name, "w").close()
        mount("/dev/" + name, new + "/dev/" + name, None, BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, new + "/dev/" + name)
    os.mkdir(new + "/dev/shm", 0o755)
    mount("tmpfs", new + "/dev/shm", "tmpfs", NOSUID | NODEV, "size=%d,mode=1777" % spec["shm"])
    remount(new + "/dev", RDONLY | NOSUID | NOEXEC)
    os.mkdir(new + "/proc", 0o555)
    try:  # a new /proc of this PID namespace (refused where the host's /proc is partly masked)
        mount("proc", new + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    except OSError:
        pass
    os.mkdir(new + spec["inside"], 0o755)
    mount(spec["work"], new + spec["inside"], None, BIND)
    remount(new + spec["inside"], NOSUID | NODEV)
    numbers = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "ppc64": 203,
               "s390x": 217, "i686": 217, "i386": 217, "armv7l": 218, "armv8l": 218}
    machine = os.uname().machine
    if machine not in numbers:
        raise OSError("pivot_root: no system call number known for %s" % machine)
    os.chdir(new)
    check(libc.syscall(numbers[machine], b".", b"."), "pivot_root")  # the old root is now under the new
    check(libc.umount2(b".", 2), "detach the old root")  # MNT_DETACH: nothing of the host's tree is left
    os.chdir("/")
    remount("/", RDONLY | NOSUID | NODEV)
    os.chdir(spec["inside"])
    for cap in range(spec["cap_last"] + 1):  # no capability, now or after exec, in any namespace
        check(libc.prctl(24, cap, 0, 0, 0), "drop capability %d" % cap)  # PR_CAPBSET_DROP
    check(libc.prctl(47, 4, 0, 0, 0), "clear the ambient capabilities")  # PR_CAP_AMBIENT, CLEAR_ALL
    # PR_SET_SECUREBITS: NOROOT and NO_CAP_AMBIENT_RAISE, both locked (uid 0 gets no capability at exec)
    check(libc.prctl(28, 0xC3, 0, 0, 0), "lock SECBIT_NOROOT")
    if drop_to is not None:
        os.setgroups([])
        os.setgid(drop_to)
        os.setuid(drop_to)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    check(libc.capset(header, (ctypes.c_uint32 * 6)()), "clear the capability sets")
    check(libc.prctl(38, 1, 0, 0, 0), "set no_new_privs")  # PR_SET_NO_NEW_PRIVS
try:
    drop_to = lim.get("drop_to")
    tasks = tasks_of(os.getuid() if drop_to is None else drop_to, lim.get("userns", False))
    if lim.get("root"):
        with open("/proc/sys/kernel/cap_last_cap") as f:
            lim["root"]["cap_last"] = int(f.read())
        private_root(lim["root"], drop_to)
    def cap(what, soft, hard=None):
        hard = soft if hard is None else hard
        now = resource.getrlimit(what)[1]
        if now != resource.RLIM_INFINITY:
            soft, hard = min(soft, now), min(hard, now)
        resource.setrlimit(what, (soft, hard))
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_CPU, lim["cpu"], lim["cpu"] + 1)
    cap(resource.RLIMIT_FSIZE, lim["fsize"])
    cap(resource.RLIMIT_NOFILE, lim["nofile"])
    cap(resource.RLIMIT_AS, lim["as"])
    cap(resource.RLIMIT_NPROC, tasks + lim["nproc"])
except Exception as err:
    print("sandbox setup failed: %s: %s" % (type(err).__name__, err), flush=True)
    os._exit(125)
program = [sys.executable, "-I", "-S", "-X", "utf8", "-u", sys.argv[2]]
if not lim["init"]:
    os.execv(sys.executable, program)
child = os.fork()  # PID 1 of a new namespace: stay as its init (reap orphans, ignore the code's signals)
if child == 0:
    os.execv(sys.executable, program)
import signal
signal.signal(signal.SIGINT, signal.SIG_DFL)  # unhandled: the kernel drops it when sent from inside
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        os._exit(125)
    if pid == child:  # the program is done: exit as bubblewrap does (a signal N as 128 + N)
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""

# What the interpreter probe prints: the directories the interpreter needs (bwrap binds them).
_PROBE_CODE = (
    "import json, os, resource, sys; print(json.dumps(sorted({os.path.realpath(p) for p in ("
    "sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "
    "os.path.dirname(os.path.realpath(sys.executable)))})))")

# Between Popen and the sandbox when the call has a cgroup: waits until this process has put
# it in the cgroup (a line on stdin), so every process of the call starts inside.
_GATE = ["/bin/sh", "-c", 'read -r go && exec "$@" </dev/null', "reasonrl-gate"]


@dataclass(frozen=True)
class Limits:
    """The limits of one tool call, and which sandbox runs it."""

    timeout: float = 10.0  # wall-clock seconds; then the whole process group is killed
    cpu_seconds: int = 0  # CPU seconds per process (RLIMIT_CPU); 0: the timeout rounded up, + 1 s
    # address space per process (RLIMIT_AS), the interpreter included; and the resident memory of
    # all the call's processes together (+ CALL_OVERHEAD_MB): a cgroup, else the watchdog
    memory_mb: int = 512
    file_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE)
    # processes and threads the code may add (RLIMIT_NPROC; per call, + CALL_OVERHEAD_TASKS, by a
    # pids cgroup where the call has one)
    processes: int = 32
    open_files: int = 64  # file descriptors per process (RLIMIT_NOFILE)
    output_bytes: int = 16_384  # stdout + stderr kept; past it the program is stopped
    code_chars: int = 100_000  # longer code is refused without running it
    sandbox: str = "auto"  # auto | bwrap | unshare | rlimit (module docstring)
    uid: int = DEFAULT_UID  # the unprivileged uid (= gid) the code runs as when this process is root
    python: str = ""  # the interpreter to run the code with; "": found automatically

    def __post_init__(self) -> None:
        timeout = self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
            raise ConfigError(f"tool limits: timeout must be a number > 0 (seconds), got {timeout!r}")
        counts = {"memory_mb": self.memory_mb, "file_mb": self.file_mb, "processes": self.processes,
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


# ----------------------------------------------------------------------------- per-call bounds

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


# ----------------------------------------------------------------------------- the plan

def _root_layout(python_dirs: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """What the private root holds from the host, read-only: ("symlink", path, target) for the
    system directories that are links (merged /usr), ("dir", path, "") for those bound, and the
    interpreter's directories not below them; ("file", "/etc/ld.so.cache", "")."""
    layout: list[tuple[str, str, str]] = []
    bound: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            layout.append(("symlink", path, os.readlink(path)))
        elif os.path.isdir(path):
            layout.append(("dir", path, ""))
            bound.append(path)
    for path in python_dirs:
        if not any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound):
            layout.append(("dir", path, ""))
            bound.append(path)
    if os.path.isfile("/etc/ld.so.cache"):
        layout.append(("file", "/etc/ld.so.cache", ""))
    return layout


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


_PLANS: dict[tuple[str, int, str], SandboxPlan | SandboxError] = {}
_PLANS_LOCK = threading.Lock()


def sandbox_plan(mode: str = "auto", uid: int = DEFAULT_UID, python: str = "") -> SandboxPlan:
    """How tool code runs here for `mode` (auto | bwrap | unshare | rlimit), probed once and
    cached; the choice is printed once (a warning for rlimit). SandboxError (saying what to
    install or set) when `mode` cannot be had: bwrap or unshare asked for where it does not
    work, auto where no mode hides the host's files, or no interpreter the sandbox user can run."""
    if mode not in SANDBOX_MODES:
        raise ConfigError(f"tool sandbox: mode must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}")
    key = (mode, uid, python)
    with _PLANS_LOCK:
        if key not in _PLANS:
            try:
                plan: SandboxPlan | SandboxError = _probe_plan(mode, uid, python)
                warn = "WARNING: " if not plan.files_hidden else ""
                print(f"[reasonrl] {warn}tool sandbox: {plan.summary()}", file=sys.stderr, flush=True)
            except SandboxError as err:
                plan = err
            _PLANS[key] = plan
        found = _PLANS[key]
    if isinstance(found, SandboxError):
        raise found
    return found


def _probe_plan(mode: str, uid: int, python: str) -> SandboxPlan:
    run_as = uid if os.geteuid() == 0 else None
    interpreter, dirs = _find_python(run_as, python)
    bounds = find_call_bounds()
    why_not: list[str] = []
    if mode in ("auto", "bwrap"):
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            why = "bwrap not found (Debian/Ubuntu: apt-get install bubblewrap)"
        else:
            candidate = SandboxPlan("bwrap", "bwrap --unshare-all works here", interpreter, dirs, run_as,
                                    bwrap=bwrap, bounds=bounds)
            failure = _probe(candidate)
            if failure is None:
                return candidate
            why = f"bwrap cannot create its namespaces here: {failure}"
        if mode == "bwrap":
            raise SandboxError(f"tool sandbox 'bwrap' asked for, but {why}; install bubblewrap "
                               f"where user namespaces are allowed, or set the sandbox to auto or unshare")
        why_not.append(why)
    unshare = shutil.which("unshare")
    if mode in ("auto", "unshare"):
        how = "unshare --mount --net --pid" + (" (as root)" if run_as is not None else " --user")
        if unshare is None:
            why = "unshare (util-linux) not found"
        else:
            candidate = SandboxPlan("unshare", "; ".join([*why_not, f"{how} and a private root work here"]),
                                    interpreter, dirs, run_as, unshare=unshare, bounds=bounds)
            failure = _probe(candidate)
            if failure is None:
                return candidate
            why = f"{how} with a private root failed: {failure}"
        if mode == "unshare":
            raise SandboxError(f"tool sandbox 'unshare' asked for, but {why}; {_NAMESPACE_FIX}; or set "
                               f"the sandbox to auto")
        why_not.append(why)
        raise SandboxError(f"tool sandbox 'auto': no mode that hides the host's files works here ("
                           f"{'; '.join(why_not)}). To fix: {_NAMESPACE_FIX}. Or set the sandbox to rlimit "
                           f"(config env.sandbox=rlimit) to run the code with resource limits only: it can "
                           f"then read the host's world-readable files and write /tmp")
    why_not.append("sandbox=rlimit chosen")
    if unshare is not None:
        candidate = SandboxPlan("rlimit", "; ".join([*why_not, "unshare --net --pid works"]), interpreter,
                                dirs, run_as, unshare=unshare, bounds=bounds)
        failure = _probe(candidate)
        if failure is None:
            return candidate
        return SandboxPlan("rlimit", "; ".join([*why_not, f"unshare --net --pid failed: {failure}"]),
                           interpreter, dirs, run_as, bounds=bounds)
    return SandboxPlan("rlimit", "; ".join([*why_not, "unshare (util-linux) not found"]), interpreter, dirs,
                       run_as, bounds=bounds)


def _probe(plan: SandboxPlan) -> str | None:
    """None if `plan` runs a trivial program to completion here, else why not."""
    obs = _execute(plan, "print('sandbox ok')", Limits(timeout=_PROBE_TIMEOUT))
    if obs.ok and obs.output.strip() == "sandbox ok":
        return None
    last = obs.output.strip().splitlines()[-1] if obs.output.strip() else ""
    error = obs.error or "no output"
    return error if last in error else f"{error}: {last}"


def _find_python(run_as: int | None, python: str) -> tuple[str, tuple[str, ...]]:
    if python:
        candidates = [python]
    else:
        found = [getattr(sys, "_base_executable", ""), sys.executable, "/usr/bin/python3",
                 shutil.which("python3")]
        candidates = list(dict.fromkeys(os.path.realpath(p) for p in found if p and os.path.isfile(p)))
    drop = {} if run_as is None else {"user": run_as, "group": run_as, "extra_groups": []}
    tried = []
    for path in candidates:
        try:
            done = subprocess.run([path, "-I", "-S", "-c", _PROBE_CODE], capture_output=True, text=True,
                                  timeout=_PROBE_TIMEOUT, cwd="/", env={"PATH": "/usr/bin:/bin"}, **drop)
            if done.returncode == 0:
                return path, tuple(json.loads(done.stdout))
            tried.append(f"{path}: exit {done.returncode} {done.stderr.strip().splitlines()[-1:]}")
        except (OSError, subprocess.SubprocessError, ValueError) as err:
            tried.append(f"{path}: {type(err).__name__}: {err}")
    who = f"uid {run_as}" if run_as is not None else "this user"
    raise SandboxError(f"no Python interpreter that {who} can run was found (tried: {'; '.join(tried)}); "
                       f"install python3 (e.g. apt-get install python3) or set the tool limits' python "
                       f"to an interpreter outside directories only root can enter")


# ----------------------------------------------------------------------------- one call

def run_python(code: str, limits: Limits | None = None) -> Observation:
    """Run `code` as a Python program in the sandbox (module docstring) and return what it
    printed, or why it failed. Never raises."""
    limits = limits or Limits()
    start = time.monotonic()
    if not isinstance(code, str):
        return Observation(error=f"code must be a string, got {type(code).__name__}")
    if len(code) > limits.code_chars:
        return Observation(error=f"code too long: {len(code)} characters (at most {limits.code_chars})")
    try:
        plan = sandbox_plan(limits.sandbox, limits.uid, limits.python)
    except SandboxError as err:
        return Observation(error=f"sandbox unavailable: {err}", seconds=time.monotonic() - start)
    return _execute(plan, code, limits)


def _execute(plan: SandboxPlan, code: str, limits: Limits) -> Observation:
    start = time.monotonic()
    made: list[str] = []
    try:
        workdir = tempfile.mkdtemp(prefix="reasonrl-tool-")
        made.append(workdir)
        root = ""
        if plan.mode == "unshare":  # where the private root is mounted, in the call's own mount namespace
            root = tempfile.mkdtemp(prefix="reasonrl-root-")
            made.append(root)
        script = os.path.join(workdir, "main.py")
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        if plan.run_as is not None:
            os.chown(workdir, plan.run_as, plan.run_as)
        argv, env, extra = plan.command(workdir, limits, root)
        return _supervise(argv, env, extra, plan, limits, start)
    except (OSError, subprocess.SubprocessError, ValueError) as err:  # ValueError: UnicodeError too
        return Observation(error=f"could not start the sandbox: {type(err).__name__}: {err}",
                           seconds=time.monotonic() - start)
    finally:
        for path in made:
            _remove_tree(path)


def _supervise(argv: list[str], env: dict[str, str], extra: dict[str, Any], plan: SandboxPlan,
               limits: Limits, start: float) -> Observation:
    """Run the sandbox process under the call's cgroup (or watchdog), collect its output under
    the limits, kill its processes, reap it."""
    cgroup: _CallCgroup | None = None
    if plan.bounds.kind.startswith("cgroup"):
        try:
            cgroup = _CallCgroup(plan.bounds, limits)
        except OSError:  # this call cannot have one (e.g. a parent's limit on cgroups): the watchdog
            cgroup = None
    try:
        proc = subprocess.Popen([*_GATE, *argv] if cgroup else argv, stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE if cgroup else subprocess.DEVNULL,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True,
                                **extra)
    except BaseException:
        if cgroup is not None:
            cgroup.remove()
        raise
    memory_out = False
    try:
        if cgroup is not None:
            assert proc.stdin is not None
            try:
                cgroup.add(proc.pid)  # before the gate lets it start the sandbox
                proc.stdin.write(b"go\n")
            finally:
                try:
                    proc.stdin.close()  # without "go", the gate exits: nothing runs outside the cgroup
                except OSError:
                    pass
        watchdog = None  # without a cgroup (none here, or this call's could not be made): the watchdog
        if cgroup is None and plan.bounds.kind != "none":
            watchdog = _Watchdog(proc.pid, limits.call_memory_bytes)
        output, timed_out, truncated, memory_out = _collect(proc, limits, cgroup, watchdog)
    finally:
        if proc.stdout is not None:  # read to the end or no longer wanted: a writer now gets SIGPIPE
            proc.stdout.close()
        if plan.network_blocked:  # a PID namespace: kill its init first, so that unshare or bwrap reaps it
            _end_namespace(proc)  # (killed at once, it would be left to the host's init, a zombie of the uid)
        if cgroup is None and plan.bounds.kind != "none":
            _Watchdog(proc.pid, 0).kill()  # the tree, before its root's group
        _kill_group(proc.pid)  # before reaping: the group's id cannot be reused until then
        if cgroup is not None:
            cgroup.kill()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if cgroup is not None:
            memory_out = memory_out or cgroup.oom_kills() > 0
            cgroup.remove()
            _remove_stale_cgroups(plan.bounds)
    by = plan.bounds.kind if cgroup is not None else "watchdog"
    error = _error(proc.returncode, output, plan, limits, timed_out, truncated, by if memory_out else "")
    # ended by this process (timeout, output, memory): SIGKILL, whatever unshare or bwrap exited with
    stopped = timed_out or truncated or memory_out
    return Observation(output=output, error=error, timed_out=timed_out and not memory_out,
                       seconds=time.monotonic() - start, truncated=truncated,
                       exit_code=-signal.SIGKILL if stopped else proc.returncode)


def _collect(proc: subprocess.Popen, limits: Limits, cgroup: _CallCgroup | None,
             watchdog: _Watchdog | None) -> tuple[str, bool, bool, bool]:
    """(output, timed out, truncated, past the memory limit): read the output until the program
    exits, the timeout, the output limit or the per-call memory limit, whichever comes first."""
    deadline = time.monotonic() + limits.timeout
    out = proc.stdout
    assert out is not None
    fd = out.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size, timed_out, truncated, exited, memory_out = 0, False, False, False, False
    selector = selectors.DefaultSelector()
    pidfd = _pidfd(proc.pid)
    try:
        selector.register(fd, selectors.EVENT_READ, "output")
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ, "exit")
        reading = True

        def drain() -> bool:
            """Read what the pipe holds now; False at end of file."""
            nonlocal size, truncated
            while size <= limits.output_bytes:
                try:
                    data = os.read(fd, _READ_CHUNK)
                except BlockingIOError:
                    return True
                if not data:
                    return False
                chunks.append(data)
                size += len(data)
            truncated = True
            return True

        next_look = time.monotonic() + WATCHDOG_TICK
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if now >= next_look:  # the call's memory, all its processes together
                next_look = now + WATCHDOG_TICK
                if cgroup is not None and cgroup.oom_kills() > 0 or watchdog is not None and watchdog.over():
                    memory_out = True
                    break
            wait = min(deadline, next_look) - now
            if pidfd is None:
                wait = min(wait, 0.02)
            for key, _ in selector.select(max(wait, 0)):
                if key.data == "exit":
                    exited = True
                elif reading and not drain():
                    reading = False
                    selector.unregister(fd)
            if truncated:
                break
            if exited or (pidfd is None and _has_exited(proc.pid)):
                if reading:
                    drain()
                break
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)
    output = b"".join(chunks)[:limits.output_bytes].decode("utf-8", errors="replace")
    return output, timed_out, truncated, memory_out


def _error(code: int | None, output: str, plan: SandboxPlan, limits: Limits, timed_out: bool,
           truncated: bool, memory_by: str = "") -> str | None:
    if memory_by:  # the per-call memory limit, by the call's cgroup or the watchdog
        return (f"memory limit passed: the call's processes together held more than {limits.memory_mb} MB "
                f"(+ {CALL_OVERHEAD_MB} MB for the sandbox's own; {memory_by}); its processes were killed")
    if timed_out:
        return f"timed out after {limits.timeout:g} s (wall clock); its processes were killed"
    if truncated:
        return f"output passed {limits.output_bytes} bytes; the program was stopped"
    if code is None or code == 0:
        return None
    number = -code if code < 0 else None
    if (plan.mode in ("bwrap", "unshare") or plan.unshare) and 128 < code < 128 + signal.NSIG:
        number = code - 128  # the namespace's init (bubblewrap's or ours) reports signal N as 128 + N
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = {"SIGKILL": f" (the CPU-time limit of {limits.cpu_limit} s, or a kill)",
                "SIGXCPU": f" (the CPU-time limit of {limits.cpu_limit} s)",
                "SIGSEGV": " (the interpreter crashed)"}.get(name, "")
        return f"killed by {name}{hint}"
    last = next((line.strip() for line in reversed(output.splitlines()) if line.strip()), "")
    return f"exit code {code}" + (f": {last[:200]}" if last else "")


def _end_namespace(proc: subprocess.Popen) -> None:
    """SIGKILL the init of the call's PID namespace (the child of unshare or bwrap): the kernel
    kills and reaps everything inside, then unshare or bwrap reaps the init and exits, so no
    process of the call is left for the host's init to reap later (a zombie still counts
    against the uid's RLIMIT_NPROC until then)."""
    if proc.poll() is not None:
        return
    for init in _read(f"/proc/{proc.pid}/task/{proc.pid}/children").split():
        _kill_checked(int(init), lambda p: _parent_of(p) == proc.pid)
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux >= 5.3: poll instead
        return None


def _has_exited(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: str) -> None:
    def unlock(function: Any, failed: str, _exc: Any) -> None:  # the code may have chmod'ed its files
        try:
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)
