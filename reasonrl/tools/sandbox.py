"""Run untrusted Python code (a model's tool call) in a separate, limited process.

`run_python(code, limits)` writes the code to `main.py` in a fresh temporary directory, runs
it there with a second interpreter and returns an `Observation` (output, error, timed_out,
seconds, exit code, truncated). It never raises: a program that fails, hangs, floods its
output or attacks the machine comes back as an observation with `error` set. The training
process never evaluates the code; only the sandboxed child does.

Every call, in every mode:
- runs as an unprivileged user: when this process is root, the child switches to `limits.uid`
  (default 65534, "nobody") before anything of the code runs; otherwise it runs as this user;
- gets resource limits, set by a short bootstrap in the child before it execs the code's
  interpreter: CPU time (`RLIMIT_CPU`), address space (`RLIMIT_AS`, `memory_mb` includes the
  interpreter's own ~30 MB), file size (`RLIMIT_FSIZE`), open files, no core dumps, and a
  process/thread count (`RLIMIT_NPROC`, counted above the tasks the sandbox user already has;
  the kernel does not apply it to root, which is why the code never runs as root);
- starts a new session (`start_new_session=True`): at the end of the call, or at the
  wall-clock timeout, or when the output passes `output_bytes`, the whole process group gets
  SIGKILL (`os.killpg`), before the child is reaped;
- has an environment of its own (PATH, HOME and TMPDIR = its directory, LANG): none of the
  trainer's variables (tokens, keys) reach it; stdin is /dev/null; no descriptor is inherited;
- sees the standard library only (`python -I -S`: no site-packages, no user site, no
  PYTHON* variables) of an interpreter the sandbox user can run (this Python if it can,
  else /usr/bin/python3; `limits.python` picks one).

The two modes (`limits.sandbox`: "auto" picks bwrap when it works here, else rlimit; the
choice and its reason are printed once):

bwrap -- bubblewrap (Debian/Ubuntu package `bubblewrap`), when `bwrap --unshare-all` works
  here (a probe runs it once). On top of the above: new user, PID, network, IPC, UTS and
  cgroup namespaces; a filesystem of read-only binds of /usr, /bin, /lib* and the
  interpreter's directories, plus /proc, a minimal /dev and a 'sandbox' directory (the temporary
  directory, the only writable place besides a /dev/shm capped at `file_mb`); the root and
  /dev remounted read-only; `--die-with-parent`, `--new-session`. bwrap itself runs as the
  unprivileged uid when this process is root: with `--uid` alone, bubblewrap run by root
  keeps the real uid 0 (it only maps it), and the kernel would exempt the code from the
  process limit.
  Protects against: reading any file outside those binds (/etc/passwd, the repository, home
  directories, keys: they do not exist inside); writing anywhere but its directory; any
  network, loopback included (the namespace has only a downed `lo`); signalling or seeing
  the trainer's or any other process (PID namespace: the code's parent is the sandbox's own
  init, which ignores its signals); processes escaping the kill (when bwrap's monitor dies,
  the namespace's init gets SIGKILL and with it every process inside); fork bombs, memory
  bombs, CPU loops, output floods, huge files (the limits above; the process limit is
  counted per sandbox, inside its own user namespace).
  Does not protect against: kernel vulnerabilities (namespaces share the host kernel; no
  seccomp filter is installed); reading the world-readable system files under /usr; the
  CPU share and memory bandwidth the code uses until its limits stop it; disk space: each
  file is capped at `file_mb` but the number of files is not, the timeout alone bounds how
  much it writes before the directory is deleted.

rlimit -- the floor, when bubblewrap is missing or cannot create namespaces here (a pip-only
  install, a container without user namespaces). The common part above, plus, when
  `unshare --net --pid --fork --kill-child` (util-linux) works here (as root it needs no user
  namespace), a network namespace and a PID namespace.
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
  outlives the kill (its CPU-time limit still ends it if it computes; one that sleeps stays).
  When this process is not root, the code runs as your own user: it can read and write what
  you can and signal your processes -- install bubblewrap.
"""

from __future__ import annotations

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

SANDBOX_MODES = ("auto", "bwrap", "rlimit")
DEFAULT_UID = 65534  # "nobody" (and gid 65534, "nogroup") on Debian and most distributions
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PROBE_TIMEOUT = 20.0  # seconds for one probe (an interpreter start on a busy machine)
_READ_CHUNK = 65536
_INSIDE_DIR = "/sandbox"  # the temporary directory's path inside bubblewrap

# Runs in the child, as the sandbox user, before any of the code: the limits, then exec of a
# fresh interpreter on main.py (so the limits bind the whole program, interpreter included).
# In a PID namespace of `unshare` it is the namespace's init and runs the program as its child,
# as bubblewrap's init does: the program is not PID 1 (whose signals the kernel filters).
# RLIMIT_NPROC counts every task of the real uid; the limit is set that far above the tasks
# the uid already has (visible in /proc: inside bubblewrap, only the sandbox's own).
_BOOTSTRAP = r"""
import json, os, resource, sys
try:
    lim = json.loads(sys.argv[1])
    uid, tasks = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/" + name + "/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    tasks += int(fields.get("Threads", "1"))
            except (OSError, ValueError, KeyError):
                pass
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


@dataclass(frozen=True)
class Limits:
    """The limits of one tool call, and which sandbox runs it."""

    timeout: float = 10.0  # wall-clock seconds; then the whole process group is killed
    cpu_seconds: int = 0  # CPU seconds per process (RLIMIT_CPU); 0: the timeout rounded up, + 1 s
    memory_mb: int = 512  # address space per process (RLIMIT_AS), the interpreter included
    file_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE)
    processes: int = 32  # processes and threads the code may add (RLIMIT_NPROC)
    open_files: int = 64  # file descriptors per process (RLIMIT_NOFILE)
    output_bytes: int = 16_384  # stdout + stderr kept; past it the program is stopped
    code_chars: int = 100_000  # longer code is refused without running it
    sandbox: str = "auto"  # auto | bwrap | rlimit (module docstring)
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


@dataclass(frozen=True)
class SandboxPlan:
    """How code runs on this machine: decided once per (mode asked, uid, interpreter)."""

    mode: str  # "bwrap" or "rlimit"
    reason: str  # why this mode (what was probed)
    python: str  # the interpreter that runs the code
    python_dirs: tuple[str, ...]  # the directories it needs (bound read-only by bwrap)
    run_as: int | None  # the uid (= gid) the code runs as; None: this process's own user
    bwrap: str = ""  # bubblewrap's path (mode bwrap)
    unshare: str = ""  # util-linux unshare's path, when rlimit mode gets network + PID namespaces

    @property
    def network_blocked(self) -> bool:
        """Whether the code has no network at all (loopback included)."""
        return self.mode == "bwrap" or bool(self.unshare)

    def summary(self) -> str:
        """One line: the mode, what it blocks, why."""
        user = f"uid {self.run_as}" if self.run_as is not None else f"this user (uid {os.getuid()})"
        if self.mode == "bwrap":
            blocks = "namespaces (filesystem, network, processes) + resource limits"
        elif self.unshare:
            blocks = "resource limits + network and PID namespaces (unshare); the filesystem is visible"
        else:
            blocks = ("resource limits only; the network (loopback included) is NOT blocked and the "
                      "filesystem is visible")
        return f"{self.mode} as {user}, {self.python}: {blocks} ({self.reason})"

    def command(self, workdir: str, limits: Limits) -> tuple[list[str], dict[str, str], dict[str, Any]]:
        """(argv, environment, extra Popen arguments) that run `workdir`/main.py under `limits`."""
        settings = json.dumps({"cpu": limits.cpu_limit, "as": limits.memory_mb << 20,
                               "fsize": limits.file_mb << 20, "nofile": limits.open_files,
                               "nproc": limits.processes, "init": bool(self.unshare)})
        inside = _INSIDE_DIR if self.mode == "bwrap" else workdir
        python = [self.python, "-I", "-S", "-c", _BOOTSTRAP, settings, "main.py"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": inside, "TMPDIR": inside, "LANG": "C.UTF-8"}
        drop = {} if self.run_as is None else {"user": self.run_as, "group": self.run_as, "extra_groups": []}
        if self.mode == "bwrap":
            return [*self.bwrap_argv(workdir, limits), *python], env, {**drop, "cwd": "/"}
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
        bound: list[str] = []
        for path in _SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
                bound.append(path)
        for path in self.python_dirs:
            if not any(path == b or path.startswith(b.rstrip("/") + "/") for b in bound):
                argv += ["--ro-bind", path, path]
                bound.append(path)
        return argv + ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
                       "--proc", "/proc", "--dev", "/dev",
                       "--size", str(limits.file_mb << 20), "--tmpfs", "/dev/shm",
                       "--bind", workdir, _INSIDE_DIR, "--chdir", _INSIDE_DIR,
                       "--remount-ro", "/dev", "--remount-ro", "/"]


_PLANS: dict[tuple[str, int, str], SandboxPlan | SandboxError] = {}
_PLANS_LOCK = threading.Lock()


def sandbox_plan(mode: str = "auto", uid: int = DEFAULT_UID, python: str = "") -> SandboxPlan:
    """How tool code runs here for `mode` (auto | bwrap | rlimit), probed once and cached; the
    choice is printed once. SandboxError (saying what to install or set) when `mode` cannot be
    had: bwrap asked for where it does not work, or no interpreter the sandbox user can run."""
    if mode not in SANDBOX_MODES:
        raise ConfigError(f"tool sandbox: mode must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}")
    key = (mode, uid, python)
    with _PLANS_LOCK:
        if key not in _PLANS:
            try:
                plan: SandboxPlan | SandboxError = _probe_plan(mode, uid, python)
                print(f"[reasonrl] tool sandbox: {plan.summary()}", file=sys.stderr, flush=True)
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
    why_not_bwrap = "sandbox=rlimit asked for"
    if mode in ("auto", "bwrap"):
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            why_not_bwrap = "bwrap not found (Debian/Ubuntu: apt-get install bubblewrap)"
        else:
            candidate = SandboxPlan("bwrap", "bwrap --unshare-all works here", interpreter, dirs, run_as,
                                    bwrap=bwrap)
            failure = _probe(candidate)
            if failure is None:
                return candidate
            why_not_bwrap = f"bwrap cannot create its namespaces here: {failure}"
        if mode == "bwrap":
            raise SandboxError(f"tool sandbox 'bwrap' asked for, but {why_not_bwrap}; install bubblewrap "
                               f"where user namespaces are allowed, or set the sandbox to auto or rlimit")
    unshare = shutil.which("unshare")
    if unshare is not None:
        candidate = SandboxPlan("rlimit", f"{why_not_bwrap}; unshare --net --pid works", interpreter, dirs,
                                run_as, unshare=unshare)
        failure = _probe(candidate)
        if failure is None:
            return candidate
        return SandboxPlan("rlimit", f"{why_not_bwrap}; unshare --net --pid failed: {failure}",
                           interpreter, dirs, run_as)
    return SandboxPlan("rlimit", f"{why_not_bwrap}; unshare (util-linux) not found", interpreter, dirs,
                       run_as)


def _probe(plan: SandboxPlan) -> str | None:
    """None if `plan` runs a trivial program to completion here, else why not."""
    obs = _execute(plan, "print('sandbox ok')", Limits(timeout=_PROBE_TIMEOUT))
    if obs.ok and obs.output.strip() == "sandbox ok":
        return None
    return (obs.error or "") + (": " + obs.output.strip().splitlines()[-1] if obs.output.strip() else "")


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
    workdir = None
    try:
        workdir = tempfile.mkdtemp(prefix="reasonrl-tool-")
        script = os.path.join(workdir, "main.py")
        fd = os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write(code)
        if plan.run_as is not None:
            os.chown(workdir, plan.run_as, plan.run_as)
        argv, env, extra = plan.command(workdir, limits)
        return _supervise(argv, env, extra, plan, limits, start)
    except (OSError, subprocess.SubprocessError, ValueError) as err:  # ValueError: UnicodeError too
        return Observation(error=f"could not start the sandbox: {type(err).__name__}: {err}",
                           seconds=time.monotonic() - start)
    finally:
        if workdir is not None:
            _remove_tree(workdir)


def _supervise(argv: list[str], env: dict[str, str], extra: dict[str, Any], plan: SandboxPlan,
               limits: Limits, start: float) -> Observation:
    """Run the sandbox process, collect its output under the limits, kill its group, reap it."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, close_fds=True, **extra)
    deadline = time.monotonic() + limits.timeout
    out = proc.stdout
    assert out is not None
    fd = out.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size, timed_out, truncated, exited = 0, False, False, False
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

        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            wait = remaining if pidfd is not None else min(remaining, 0.02)
            for key, _ in selector.select(wait):
                if key.data == "exit":
                    exited = True
                elif reading and not drain():
                    reading = False
                    selector.unregister(fd)
            if truncated:
                break
            if exited or (pidfd is None and _has_exited(proc.pid)):
                exited = True
                if reading:
                    drain()
                break
    finally:
        _kill_group(proc.pid)  # before reaping: the group's id cannot be reused until then
        selector.close()
        if pidfd is not None:
            os.close(pidfd)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        out.close()
    output = b"".join(chunks)[:limits.output_bytes].decode("utf-8", errors="replace")
    error = _error(proc.returncode, output, plan, limits, timed_out, truncated)
    return Observation(output=output, error=error, timed_out=timed_out, seconds=time.monotonic() - start,
                       exit_code=proc.returncode, truncated=truncated)


def _error(code: int | None, output: str, plan: SandboxPlan, limits: Limits, timed_out: bool,
           truncated: bool) -> str | None:
    if timed_out:
        return f"timed out after {limits.timeout:g} s (wall clock); its processes were killed"
    if truncated:
        return f"output passed {limits.output_bytes} bytes; the program was stopped"
    if code is None or code == 0:
        return None
    number = -code if code < 0 else None
    if (plan.mode == "bwrap" or plan.unshare) and 128 < code < 128 + signal.NSIG:
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
