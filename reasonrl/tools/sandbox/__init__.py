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
  already has, zombies included; the kernel does not apply it to root, which is why the code
  never runs as root). It counts per user, not per call: tasks of that user that end during a
  call (another call's, or a zombie the host's init reaps) give the call that much more room,
  which the call's cgroup (`processes` + `CALL_OVERHEAD_TASKS`) bounds where there is one;
- is bounded PER CALL, all its processes together (`CallBounds`, chosen once per machine):
  memory (`memory_mb` + `CALL_OVERHEAD_MB` for the sandbox's own processes) and tasks
  (`processes` + `CALL_OVERHEAD_TASKS`) by a cgroup made for the call and removed after it
  (cgroup v2, or v1 memory + pids), where this process may make one; else by a watchdog that
  sums the resident memory (anonymous + shared memory) of the call's process tree every
  `WATCHDOG_TICK` seconds and kills it past the limit (tasks then bounded by `RLIMIT_NPROC`
  only); without /proc (not Linux), by neither: per process only, and the plan says so. Past
  the memory limit the whole call is killed and its error says "memory limit";
- has its disk bounded PER CALL: what its directory takes (`disk_mb`, its files together,
  each at least 4 KiB), summed every `WATCHDOG_TICK` seconds (`bounds._DiskWatch`); past it
  the whole call is killed and its error says "disk limit";
- starts a new session (`start_new_session=True`): at the end of the call, or at the
  wall-clock timeout, when the output passes `output_bytes` or the call's memory or disk its limit,
  every process of the call gets SIGKILL before the child is reaped: the PID namespace's init
  first (so that unshare or bwrap reaps it; bubblewrap exits when its program does, without
  waiting for its own init, which is left a zombie of the uid for the host's init to reap: ~2 s
  here),
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
  limits stop it; disk space past `disk_mb` by what the code writes within one look
  (`WATCHDOG_TICK`) before the watch kills the call.

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
  /dev/shm; not bounded by `disk_mb`, which watches the call's directory); concurrent calls
  of the same uid reading and changing each other's directories
  (and, without `unshare`, signalling each other's processes); kernel vulnerabilities.
  Without `unshare`: the network is NOT blocked (loopback included: the code can reach
  services on 127.0.0.1), and a process that calls setsid() leaves the process group and
  outlives the kill unless the call has a cgroup (its CPU-time limit still ends it if it
  computes; one that sleeps stays). When this process is not root, the code runs as your own
  user: it can read and write what you can and signal your processes.

The package, along its jobs (a module imports only those listed before it):
- `limits.py`: `Limits` (a call's limits and mode), `Observation` (what it gives back), the modes'
  names and the per-call overheads;
- `bootstrap.py`: the script the child runs before the code (private root, privilege drop,
  limits, exec) and the layout of the read-only root it builds;
- `bounds.py`: `CallBounds` and `find_call_bounds` (a cgroup per call, or the watchdog), and the
  checked kills of a call's processes;
- `plan.py`: `SandboxPlan`, the command that runs a call in the mode chosen;
- `run.py`: one call under a plan: spawn, output capture, timeout, kill, the `Observation`;
- `modes.py`: `sandbox_plan` (which mode runs here and why, probed once) and `run_python`.
"""

from reasonrl.tools.sandbox.bounds import WATCHDOG_TICK, CallBounds, find_call_bounds
from reasonrl.tools.sandbox.limits import (
    CALL_OVERHEAD_MB,
    CALL_OVERHEAD_TASKS,
    DEFAULT_UID,
    SANDBOX_MODES,
    Limits,
    Observation,
)
from reasonrl.tools.sandbox.modes import run_python, sandbox_plan
from reasonrl.tools.sandbox.plan import SandboxPlan

__all__ = ["CALL_OVERHEAD_MB", "CALL_OVERHEAD_TASKS", "DEFAULT_UID", "SANDBOX_MODES", "WATCHDOG_TICK",
           "CallBounds", "Limits", "Observation", "SandboxPlan", "find_call_bounds", "run_python",
           "sandbox_plan"]
