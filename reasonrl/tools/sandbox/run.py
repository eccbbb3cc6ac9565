"""One call under a plan: `execute(plan, code, limits)` writes the code to main.py in a fresh
temporary directory, spawns the plan's command (in the call's cgroup, or under the watchdog),
collects its output up to the limit, ends it at the wall-clock timeout, the output limit, the
call's memory limit or its disk limit (what its directory takes), kills every process of the
call, reaps it, removes its directories and returns the `Observation`. It never raises.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

from reasonrl.tools.sandbox.bounds import (
    _GATE,
    WATCHDOG_TICK,
    _CallCgroup,
    _DiskWatch,
    _kill_checked,
    _parent_of,
    _read,
    _remove_stale_cgroups,
    _Watchdog,
)
from reasonrl.tools.sandbox.limits import CALL_OVERHEAD_MB, Limits, Observation
from reasonrl.tools.sandbox.plan import SandboxPlan

_READ_CHUNK = 65536


def execute(plan: SandboxPlan, code: str, limits: Limits) -> Observation:
    """Run `code` under `plan` and `limits` (module docstring). Never raises."""
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
        return _supervise(argv, env, extra, plan, limits, start, workdir)
    except (OSError, subprocess.SubprocessError, ValueError) as err:  # ValueError: UnicodeError too
        return Observation(error=f"could not start the sandbox: {type(err).__name__}: {err}",
                           seconds=time.monotonic() - start)
    finally:
        for path in made:
            _remove_tree(path)


def _supervise(argv: list[str], env: dict[str, str], extra: dict[str, Any], plan: SandboxPlan,
               limits: Limits, start: float, workdir: str) -> Observation:
    """Run the sandbox process under the call's cgroup (or watchdog) and the watch on its
    directory `workdir`, collect its output under the limits, kill its processes, reap it."""
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
    memory_out = disk_out = False
    disk = _DiskWatch(workdir, limits.disk_bytes)
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
        output, timed_out, truncated, memory_out, disk_out = _collect(proc, limits, cgroup, watchdog, disk)
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
    # what it wrote between the last look and its end counts too (the directory goes after this)
    over_disk = disk_out or (not memory_out and disk.over())
    by = plan.bounds.kind if cgroup is not None else "watchdog"
    disk_how = "killed" if disk_out else "at its end" if over_disk else ""
    error = _error(proc.returncode, output, plan, limits, timed_out, truncated, by if memory_out else "",
                   disk_how)
    # ended by this process (timeout, output, memory, disk): SIGKILL, whatever unshare or bwrap exited with
    stopped = timed_out or truncated or memory_out or disk_out
    return Observation(output=output, error=error, timed_out=timed_out and not (memory_out or over_disk),
                       seconds=time.monotonic() - start, truncated=truncated,
                       exit_code=-signal.SIGKILL if stopped else proc.returncode)


def _collect(proc: subprocess.Popen, limits: Limits, cgroup: _CallCgroup | None,
             watchdog: _Watchdog | None, disk: _DiskWatch) -> tuple[str, bool, bool, bool, bool]:
    """(output, timed out, truncated, past the memory limit, past the disk limit): read the
    output until the program exits, the timeout, the output limit or the per-call memory or disk
    limit, whichever comes first."""
    deadline = time.monotonic() + limits.timeout
    out = proc.stdout
    assert out is not None
    fd = out.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size, timed_out, truncated, exited, memory_out, disk_out = 0, False, False, False, False, False
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
            if disk.due(now) and disk.over():  # the call's directory, all its files together
                disk_out = True
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
    return output, timed_out, truncated, memory_out, disk_out


def _error(code: int | None, output: str, plan: SandboxPlan, limits: Limits, timed_out: bool,
           truncated: bool, memory_by: str = "", disk: str = "") -> str | None:
    if memory_by:  # the per-call memory limit, by the call's cgroup or the watchdog
        return (f"memory limit passed: the call's processes together held more than {limits.memory_mb} MB "
                f"(+ {CALL_OVERHEAD_MB} MB for the sandbox's own; {memory_by}); its processes were killed")
    if disk:  # "killed": seen while it ran; "at its end": written within the last look, seen once it ended
        what = ("its processes were killed and its files deleted" if disk == "killed" else
                "seen when it ended; its files were deleted")
        return (f"disk limit passed: the call's files took more than {limits.disk_mb} MB in its directory; "
                f"{what}")
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
