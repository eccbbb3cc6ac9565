"""What runs in the sandbox's child before any of the code, and the private root it builds.

- `_BOOTSTRAP`, the script the child's interpreter runs (`python -I -S -c _BOOTSTRAP SETTINGS
  main.py`): in mode unshare it builds the private root and drops privileges for good; in every
  mode it sets the resource limits, then execs a fresh interpreter on main.py (staying as the
  PID namespace's init where there is one).
- `_root_layout`, what that root holds from the host, read-only (bubblewrap is given the same
  binds, plan.py); `_INSIDE_DIR`, where the call's directory appears inside.
- `_PROBE_CODE`, what the interpreter probe runs (modes.py): the directories the interpreter
  needs.

This module only holds text and paths; it starts nothing.
"""

from __future__ import annotations

import os

_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_INSIDE_DIR = "/sandbox"  # the temporary directory's path inside bubblewrap and unshare's private root

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

