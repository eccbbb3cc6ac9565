"""Tools: the calculator (parsed, never evaluated) and the python tool's sandbox, attacked.

The hostile suite runs in every sandbox mode (bwrap, unshare, rlimit; a mode that cannot run
here is skipped with the reason). Every case has a short wall-clock limit, is answered with
an error observation, is counted, and leaves no process of the sandbox's user and no cgroup
of the call behind; the test process's own limits are untouched. When the tests run as root,
the sandbox runs as a uid of this test session's own (so leftover processes can be counted
exactly); otherwise as the current user, where the leftover-process checks are skipped. The
per-call memory limit is attacked with both of its mechanisms: the call's cgroup (skipped
with the reason where none can be made) and the watchdog (forced).
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest

from reasonrl.errors import ConfigError, SandboxError
from reasonrl.registry import TOOLS
from reasonrl.rewards.safe_arithmetic import COUNTDOWN_RULES, NotArithmetic, evaluate_arithmetic
from reasonrl.tools import Limits, Observation, ToolStats, call_tool, run_python, sandbox_plan
from reasonrl.tools.calculator import MAX_CHARS, calculate
from reasonrl.tools.sandbox import bounds as bounds_module
from reasonrl.tools.sandbox import modes as sandbox_module

REPO_ROOT = Path(__file__).parents[2]
IS_ROOT = os.geteuid() == 0
TEST_UID = 61000 + os.getpid() % 4000  # this session's sandbox user (root only): leftovers are countable
TIMEOUT = 2.0  # the wall-clock limit of a hostile call


@pytest.fixture(autouse=True)
def _guard():
    """Backstop: no test of this file may run 60 s (the sandbox's own timeouts are seconds)."""
    def expire(signum, frame):
        raise TimeoutError("test_tools: a test ran for 60 s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# ----------------------------------------------------------------------------- calculator

@pytest.mark.parametrize("expression, value", [
    ("347 * 29", "10063"),
    ("1 + 2 * 3", "7"),
    ("(1 + 2) * 3", "9"),
    ("7 / 4", "1.75"),
    ("1 / 3", "0.333333333333"),
    ("2 / 3", "0.666666666667"),
    ("0.1 + 0.2", "0.3"),  # exact decimals, not floats
    ("-5 + 3", "-2"),
    ("-(2 + 3) * 4", "-20"),
    ("2 ** 10", "1024"),
    ("2^10", "1024"),  # ^ is read as a power
    ("-2 ** 2", "-4"),  # as in Python and in mathematics: -(2**2)
    ("2 ** -2", "0.25"),
    ("12 × 3 ÷ 4", "9"),
    ("10 \u2212 4", "6"),
    ("123456789 * 987654321", "121932631112635269"),
    ("1 / 8", "0.125"),
    ("-1 / 3", "-0.333333333333"),
    ("  42  ", "42"),
    ("99 ** 100", str(99 ** 100)),
])
def test_calculator_values(expression, value):
    assert calculate(expression) == value
    obs = call_tool("calculator", expression)
    assert obs == Observation(output=value, exit_code=0, seconds=obs.seconds)


@pytest.mark.parametrize("expression, reason", [
    ("x + 1", "only numbers"),  # names
    ("__import__('os').system('id')", "only numbers"),  # calls
    ("(1).real", "only numbers"),  # attributes
    ("abs(-3)", "only numbers"),
    ("'1' + '2'", "only numbers"),  # strings
    ("1 < 2", "only numbers"),  # comparisons
    ("[1, 2][0]", "only numbers"),  # subscripts
    ("lambda: 1", "only numbers"),
    ("9 ** 9 ** 9", "exponent 387420489 exceeds 100"),  # huge powers
    ("2 ** 1000", "exponent 1000 exceeds 100"),
    ("(10 ** 100) ** 100", "exceeds 1000 digits"),
    ("((9 ** 99) ** 99) ** 99", "exceeds 1000 digits"),
    ("4 ** 0.5", "not an integer"),
    ("1" * (MAX_CHARS + 1), "too long"),  # very long input
    ("+".join(["1"] * 400), "too long"),
    ("(" * 210 + "1" + ")" * 210, "well-formed"),  # nesting the parser refuses, within the size
    ("1 / 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("1 // 2", "FloorDiv is not allowed"),
    ("7 % 3", "only numbers"),
    ("1 2", "well-formed"),
    ("()", "Tuple is not allowed"),
    ("1e5", "only numbers"),
    ("", "empty"),
])
def test_calculator_refusals(expression, reason):
    with pytest.raises(NotArithmetic, match=reason):
        calculate(expression)
    obs = call_tool("calculator", expression)  # as an error observation, never an exception
    assert obs.output == "" and obs.error is not None and reason in obs.error and not obs.timed_out


def test_calculator_arguments_and_counts():
    stats = ToolStats()
    assert call_tool("calculator", {"expression": "6 * 7"}, stats=stats).output == "42"
    bad = [{"expr": "1 + 1"}, {"expression": "1", "extra": 2}, {"expression": 3}, 42, None, ["1 + 1"], "   "]
    for arguments in bad:
        obs = call_tool("calculator", arguments, stats=stats)
        assert obs.error is not None and obs.error.startswith("calculator: ") and obs.output == ""
    assert stats.as_dict() == {"calls": 8, "errors": 7, "timeouts": 0, "seconds": stats.seconds}
    assert stats.by_tool == {"calculator": 8}


def test_countdown_rules_are_the_strict_ones():
    """The Countdown verifier shares the parser with stricter rules: integers, binary + - * /."""
    assert evaluate_arithmetic("(9 - 3) / 4", COUNTDOWN_RULES) == (1.5, [9, 3, 4])
    for refused in ("3 ** 2", "-3 + 5", "1.5 * 2", "f(3)", "1" * 201):
        with pytest.raises(NotArithmetic):
            evaluate_arithmetic(refused, COUNTDOWN_RULES)


def test_call_tool_never_raises(monkeypatch):
    stats = ToolStats()
    obs = call_tool("shell", "ls", stats=stats)
    assert obs.error == "unknown tool 'shell'; tools: calculator, python"

    def broken(arguments, limits):
        raise RuntimeError("bug in a tool")

    monkeypatch.setitem(TOOLS._filled(), "broken", TOOLS.entry("broken", broken))
    obs = call_tool("broken", "x", stats=stats)
    assert obs.error == "tool 'broken' failed: RuntimeError: bug in a tool"
    assert stats.calls == 2 and stats.errors == 2


def test_tools_registry():
    assert TOOLS.names() == ("calculator", "python")
    assert not TOOLS["calculator"].sandboxed and TOOLS["python"].sandboxed


def test_limits_are_checked():
    with pytest.raises(ConfigError, match="timeout must be a number > 0"):
        Limits(timeout=0)
    with pytest.raises(ConfigError, match="memory_mb must be >= 64"):
        Limits(memory_mb=10)
    with pytest.raises(ConfigError, match="memory_mb must be an integer > 0, got 256.5"):
        Limits(memory_mb=256.5)
    with pytest.raises(ConfigError, match="processes must be an integer > 0, got 0"):
        Limits(processes=0)
    with pytest.raises(ConfigError, match="disk_mb must be an integer > 0, got 0"):
        Limits(disk_mb=0)
    with pytest.raises(ConfigError, match="must be one of auto, bwrap, unshare, rlimit, got 'docker'"):
        Limits(sandbox="docker")
    with pytest.raises(ConfigError, match="uid must be an unprivileged user id"):
        Limits(uid=0)
    assert Limits(timeout=2.5).cpu_limit == 4 and Limits(cpu_seconds=7).cpu_limit == 7


# ----------------------------------------------------------------------------- the sandbox

def _unavailable(mode: str) -> str | None:
    """Why `mode` cannot run here (None: it can)."""
    try:
        sandbox_plan(mode, TEST_UID if IS_ROOT else 65534)
    except SandboxError as err:
        return str(err)
    return None


def _bwrap_reason() -> str | None:
    return _unavailable("bwrap")


HIDING_MODES = ("bwrap", "unshare")  # the modes where the code sees only its directory and the system


@pytest.fixture(params=["bwrap", "unshare", "rlimit"])
def mode(request) -> str:
    """Each sandbox mode; bwrap and unshare are skipped (with the reason) where they cannot run."""
    if request.param in HIDING_MODES and (reason := _unavailable(request.param)) is not None:
        pytest.skip(f"{request.param} mode unavailable here: {reason}")
    return request.param


@pytest.fixture(params=["cgroup", "watchdog"])
def bounds(request, monkeypatch) -> str:
    """Each per-call memory mechanism: the machine's cgroup (skipped where none can be made), or
    the watchdog, forced by a fresh plan cache whose probe finds no cgroup."""
    if request.param == "cgroup":
        found = sandbox_module.find_call_bounds()
        if found.kind == "watchdog":
            pytest.skip(f"no per-call cgroup here: {found.reason}")
    else:
        monkeypatch.setattr(sandbox_module, "find_call_bounds",
                            lambda: bounds_module.CallBounds("watchdog", "forced by the test"))
        monkeypatch.setattr(sandbox_module, "_PLANS", {})
    return request.param


def limits(mode: str, **change) -> Limits:
    """The hostile suite's limits: short timeout, small memory and process budgets."""
    settings = dict(timeout=TIMEOUT, memory_mb=256, processes=16, output_bytes=4096, sandbox=mode,
                    uid=TEST_UID if IS_ROOT else 65534)
    return Limits(**{**settings, **change})


def _tasks_of(uid: int, zombies: bool = False) -> int:
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            zombie = fields["State"].strip().startswith("Z")
            if int(fields["Uid"].split()[0]) == uid and (zombies or not zombie):
                count += 1  # a zombie holds no memory, but RLIMIT_NPROC counts it until reaped
    return count


def _call_cgroups() -> list[str]:
    """The cgroups this process's calls made that still exist."""
    bounds = sandbox_module.find_call_bounds()
    prefix = f"reasonrl-tool-{os.getpid()}-"
    return [os.path.join(parent, name) for parent in (bounds.memory, bounds.pids) if parent
            for name in os.listdir(parent) if name.startswith(prefix)]


def assert_no_leftovers(uid: int = TEST_UID) -> None:
    """No process of the sandbox's user `uid` outlives the call (root only: the uid is this
    session's), and no cgroup of a call is left."""
    assert _call_cgroups() == []
    if not IS_ROOT:
        return
    deadline = time.monotonic() + 3
    while _tasks_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _tasks_of(uid) == 0


def hostile(mode: str, code: str, **change) -> tuple[Observation, ToolStats]:
    """Run `code` through the python tool in `mode`; check the call was bounded and counted."""
    stats = ToolStats()
    lim = limits(mode, **change)
    start = time.monotonic()
    obs = call_tool("python", code, lim, stats)
    # bounded by the wall-clock limit: the hostile code runs for 60 s or for ever; its call's
    # start (the plan's probe the first time) and teardown, 0.05-0.5 s here, are seconds at most
    # on a loaded machine 10x slower
    assert time.monotonic() - start < lim.timeout + 20
    assert stats.calls == 1 and stats.errors == (obs.error is not None) and stats.timeouts == obs.timed_out
    assert_no_leftovers(lim.uid)
    return obs, stats


def test_auto_picks_bwrap_then_unshare_never_rlimit():
    uid = TEST_UID if IS_ROOT else 65534
    if _bwrap_reason() is None:
        expected = "bwrap"
    elif _unavailable("unshare") is None:
        expected = "unshare"
    else:  # no mode hides the host's files here: auto refuses, naming the fix
        with pytest.raises(SandboxError, match="install bubblewrap.*unprivileged user namespaces"):
            sandbox_plan("auto", uid)
        return
    plan = sandbox_plan("auto", uid)
    assert plan.mode == expected and plan.files_hidden and plan.network_blocked
    assert plan.run_as == (TEST_UID if IS_ROOT else None)
    assert plan.summary().startswith(plan.mode) and "per call: memory" in plan.summary()
    assert plan.bounds.kind in plan.summary()


def test_auto_refuses_where_no_mode_hides_files(monkeypatch, capsys):
    """Neither bubblewrap nor unshare: auto refuses with the fix; rlimit runs only when chosen,
    with a warning saying what it leaves open."""
    real_which = shutil.which
    monkeypatch.setattr(sandbox_module.shutil, "which",
                        lambda name: None if name in ("bwrap", "unshare") else real_which(name))
    monkeypatch.setattr(sandbox_module, "_PLANS", {})
    uid = limits("auto").uid
    with pytest.raises(SandboxError) as refused:
        sandbox_plan("auto", uid)
    message = str(refused.value)
    assert "no mode that hides the host's files works here" in message
    assert "bwrap not found" in message and "unshare (util-linux) not found" in message
    assert "apt-get install bubblewrap" in message and "allow unprivileged user namespaces" in message
    assert "env.sandbox=rlimit" in message
    obs = run_python("print(1)", limits("auto"))
    assert obs.error.startswith("sandbox unavailable: tool sandbox 'auto': no mode that hides")
    assert not obs.output
    with pytest.raises(SandboxError, match="tool sandbox 'unshare' asked for, but unshare .* not found"):
        sandbox_plan("unshare", uid)
    capsys.readouterr()
    plan = sandbox_plan("rlimit", uid)  # chosen explicitly: it runs, and says what it leaves open
    assert plan.mode == "rlimit" and not plan.files_hidden
    assert "sandbox=rlimit chosen" in plan.reason
    warning = capsys.readouterr().err
    assert warning.startswith("[reasonrl] WARNING: tool sandbox: rlimit")
    assert "host's files are visible" in warning
    assert run_python("print(6 * 7)", limits("rlimit")).output == "42\n"


def test_runs_code_and_reports(mode, monkeypatch):
    monkeypatch.setenv("REASONRL_TEST_SECRET", "hunter2")  # the trainer's environment must not leak
    code = ("import os, sys\nprint(os.getuid(), sys.flags.isolated, os.environ.get('REASONRL_TEST_SECRET'))\n"
            "open('note.txt', 'w').write('x')\nprint(sorted(os.listdir('.')), os.getcwd())")
    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("reasonrl-tool-")}
    obs, _ = hostile(mode, code)
    lines = obs.output.splitlines()
    plan = sandbox_plan(mode, limits(mode).uid)
    if mode == "bwrap" or mode == "rlimit" and not IS_ROOT and plan.unshare:  # the uid in a user namespace
        uid = 65534
    elif mode == "unshare" and not IS_ROOT:  # --map-root-user: 0 inside, with no capability
        uid = 0
    else:
        uid = TEST_UID if IS_ROOT else os.getuid()
    assert lines[0] == f"{uid} 1 None" and lines[1].startswith("['main.py', 'note.txt']")
    if mode in HIDING_MODES:
        assert lines[1].endswith(" /sandbox")
    assert obs.error is None and obs.exit_code == 0 and not obs.truncated and not obs.timed_out
    after = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("reasonrl-tool-")}
    assert after <= before  # the fresh directory is gone
    obs, _ = hostile(mode, "import sys\nprint('partial')\nsys.exit(3)")
    assert obs.output == "partial\n" and obs.error == "exit code 3: partial" and obs.exit_code == 3
    obs, _ = hostile(mode, "def f(:\n")
    assert obs.error.startswith("exit code 1: SyntaxError")


FORK_200 = ("import os, time\nmade = failed = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        failed += 1\n        continue\n    if pid == 0:\n"
            "        time.sleep(0.5)\n        os._exit(0)\n    made += 1\nprint(made, failed)")


# The process-limit checks run as uids of their own (root only), each never used before: RLIMIT_NPROC
# counts per uid, and the bootstrap sets it above the tasks the uid has, so a zombie of an earlier
# call (bubblewrap leaves its init to the host's init, which reaps it ~2 s later here) reaped during
# the check would give the code one process more than `processes` (the cause of a flaky 17 <= 16).
# Waiting for the zombies to go took a deadline, and a skip past it; a fresh uid has no task at all.
# This session's block of 100, away from the TEST_UIDs (61000-64999).
_FRESH_UIDS = itertools.count(100_000 + os.getpid() % 4000 * 100)


def fresh_sandbox_uid(mode: str) -> int:
    """A uid no call ran as, its plan probed (root; else the limits' uid: this user's own, whose
    tasks are not this test's to settle)."""
    if not IS_ROOT:
        return limits(mode).uid
    uid = next(_FRESH_UIDS)
    assert _tasks_of(uid, zombies=True) == 0, f"uid {uid} has tasks: another session's? (TEST_UID {TEST_UID})"
    sandbox_plan(mode, uid)  # probed here, not within the call's wall-clock bound (hostile)
    return uid


def test_process_limit_is_in_force(mode):
    """Before any fork bomb: forking 200 children in the sandbox fails past the process limit."""
    obs, _ = hostile(mode, FORK_200, uid=fresh_sandbox_uid(mode))
    made, failed = map(int, obs.output.split())
    assert made + failed == 200 and made <= 16 and failed >= 184, obs


def test_fork_bomb(mode):
    test_process_limit_is_in_force(mode)  # never a bomb without the limit checked first
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    obs, stats = hostile(mode, code)
    assert obs.timed_out and obs.error.startswith("timed out after 2 s") and stats.timeouts == 1


def test_memory_bomb(mode):
    obs, stats = hostile(mode, "x = []\nwhile True:\n    x.append(bytearray(50 << 20))")
    assert obs.error == "exit code 1: MemoryError" and not obs.timed_out and stats.errors == 1


SPREAD_OUT_BOMB = """import os, time
children = []
for _ in range(8):  # each 100 MB, under the per-process limit (256 MB); together 800 MB, over the call's
    pid = os.fork()
    if pid == 0:
        block = b"x" * (100 << 20)  # written, so resident
        time.sleep(30)
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
print("all children done")
"""


def test_spread_out_memory_bomb(mode, bounds):
    """Many children, each under the per-process limit, together over the per-call one: the call
    is killed and says why, by the call's cgroup or by the watchdog."""
    plan = sandbox_plan(mode, limits(mode).uid)
    assert plan.bounds.kind.startswith("cgroup") == (bounds == "cgroup")
    obs, stats = hostile(mode, SPREAD_OUT_BOMB, timeout=10.0)
    assert obs.error.startswith("memory limit passed: the call's processes together held more than 256 MB")
    assert plan.bounds.kind in obs.error and not obs.timed_out and obs.output == "" and stats.errors == 1
    assert obs.seconds < 10


def test_a_file_past_the_size_limit_is_refused(mode):
    """`Limits.file_mb` (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write fails with EFBIG)."""
    obs, stats = hostile(mode, "open('big', 'wb').write(b'x' * (4 << 20))", file_mb=1)
    assert obs.error.startswith("exit code 1: OSError") and "File too large" in obs.error
    assert not obs.timed_out and stats.errors == 1


DISK_BOMB = """
import time
for i in range(200):  # 200 MB in files of 1 MB (each under file_mb), if nothing stops it
    with open(f"f{i}", "wb") as f:
        f.write(b"x" * (1 << 20))
    print(i, flush=True)
    time.sleep(0.02)  # at most 50 files a second, on any machine: the test's bound is in files
"""


def test_a_call_filling_its_directory_is_stopped_at_its_disk_limit(mode):
    """3 GB in 3 s was possible: each file under file_mb, but no bound on how many. The call's
    directory is bounded (`Limits.disk_mb`, the watch in bounds.py): the call is killed soon
    after passing it, its error says "disk limit", and its files go with it.

    What the watch guarantees: it kills the call at its first look that finds the directory over
    4 MB, and looks every WATCHDOG_TICK (0.05 s; 4 walks' time when a walk is slower). Not how
    many files are written by then: each counts its blocks or its size, whichever is larger (more
    than written on some filesystems: stopped after 3 files on an AMD EPYC's), the file being
    written counts too, and a line printed but not yet read when the kill comes is not in the
    output. So no lower bound; the upper one: the code writes a file per 20 ms at most (its
    sleeps), ~3 files per look, so 150 would need the watch to miss its looks for 3 s with
    150 MB on disk (200: the call's end, which the error would say)."""
    obs, stats = hostile(mode, DISK_BOMB, disk_mb=4, timeout=10.0)
    assert obs.error == ("disk limit passed: the call's files took more than 4 MB in its directory; its "
                         "processes were killed and its files deleted")
    written = obs.output.split()
    assert written == [str(i) for i in range(len(written))] and len(written) < 150, obs.output
    assert not obs.timed_out and obs.exit_code == -signal.SIGKILL and stats.errors == 1


def test_many_empty_files_count_against_the_disk_limit(mode):
    """Each file counts at least a block (4 KiB): a flood of empty files is bounded too."""
    code = "for i in range(20000):\n    open(f'e{i}', 'w').close()\nprint('made them all')"
    obs, _ = hostile(mode, code, disk_mb=1, timeout=10.0)
    assert obs.error.startswith("disk limit passed: the call's files took more than 1 MB")
    assert not obs.timed_out
    assert "made them all" not in obs.output


def test_a_call_past_its_disk_limit_between_two_looks_is_told_so_at_its_end(mode, monkeypatch):
    """Written and exited before the watch looked again: the directory is measured once more at
    the end, and the call's error says so (its exit code is its own: nothing was killed)."""
    monkeypatch.setattr(bounds_module._DiskWatch, "due", lambda self, now: False)  # no look while it runs
    obs, stats = hostile(mode, "open('a', 'wb').write(b'x' * (3 << 20))\nprint('done')", disk_mb=1)
    assert obs.error == ("disk limit passed: the call's files took more than 1 MB in its directory; seen "
                         "when it ended; its files were deleted")
    assert obs.output == "done\n" and obs.exit_code == 0 and stats.errors == 1


def test_a_call_under_its_disk_limit_runs_as_before(mode):
    obs, _ = hostile(mode, "open('a', 'wb').write(b'x' * (2 << 20))\nprint('ok')", disk_mb=4)
    assert obs.ok and obs.output == "ok\n"


def test_infinite_loop(mode):
    obs, _ = hostile(mode, "while True:\n    pass")
    # cut at the timeout (2.02 s here), well before anything else would end it: the CPU limit's
    # SIGXCPU at 3 CPU seconds is no timeout (`timed_out`)
    assert obs.timed_out and obs.exit_code == -signal.SIGKILL and TIMEOUT <= obs.seconds < TIMEOUT + 10


def test_cpu_time_limit(mode):
    obs, _ = hostile(mode, "while True:\n    pass", timeout=8.0, cpu_seconds=1)  # ~1 s here; room for load
    assert not obs.timed_out
    assert obs.error in ("killed by SIGXCPU (the CPU-time limit of 1 s)",
                         "killed by SIGKILL (the CPU-time limit of 1 s, or a kill)")


def test_output_flood(mode):
    flood = "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))"  # 100 MB in all
    obs, _ = hostile(mode, flood)
    assert obs.truncated and obs.output == "x" * 4096 and not obs.timed_out
    assert obs.error == "output passed 4096 bytes; the program was stopped"
    assert obs.seconds < TIMEOUT  # stopped by the output limit, before its timeout (0.05 s here)


def test_a_call_whose_cgroup_cannot_be_made_falls_back_to_the_watchdog(monkeypatch):
    """The machine has cgroups but this call's cannot be made (a parent's limit on cgroups):
    the call runs under the watchdog, which still stops the spread-out bomb."""
    mode = "unshare" if _unavailable("unshare") is None else "rlimit"
    if sandbox_plan(mode, limits(mode).uid).bounds.kind == "watchdog":
        pytest.skip("no per-call cgroup here: the watchdog is in force anyway (test_spread_out_memory_bomb)")

    def refused(self, bounds, limits):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bounds_module._CallCgroup, "__init__", refused)
    assert hostile(mode, "print(6 * 7)")[0].output == "42\n"
    obs, _ = hostile(mode, SPREAD_OUT_BOMB, timeout=10.0)
    assert obs.error.startswith("memory limit passed") and "; watchdog)" in obs.error and not obs.timed_out


def test_no_proc_means_no_per_call_bound(monkeypatch):
    """Without /proc (not Linux) neither a cgroup nor the watchdog can see a call's processes:
    the plan says so, and calls still run under the per-process limits."""
    real_isdir = os.path.isdir
    monkeypatch.setattr(sandbox_module.os.path, "isdir",
                        lambda path: False if path == "/proc/self/task" else real_isdir(path))
    bounds = sandbox_module.find_call_bounds()
    monkeypatch.setattr(sandbox_module.os.path, "isdir", real_isdir)
    assert bounds.kind == "none" and "no /proc here" in bounds.reason
    monkeypatch.setattr(sandbox_module, "find_call_bounds", lambda: bounds)
    monkeypatch.setattr(sandbox_module, "_PLANS", {})
    plan = sandbox_plan("rlimit", limits("rlimit").uid)
    assert "per call: NOT bounded, memory per process only (RLIMIT_AS)" in plan.summary()
    assert hostile("rlimit", "print(6 * 7)")[0].output == "42\n"
    obs, _ = hostile("rlimit", "x = []\nwhile True:\n    x.append(bytearray(50 << 20))")
    assert obs.error == "exit code 1: MemoryError"


def test_reads_etc_passwd(mode):
    obs, _ = hostile(mode, "print(open('/etc/passwd').read())")
    if mode in HIDING_MODES:  # not in the sandbox's filesystem
        assert obs.error.startswith("exit code 1: FileNotFoundError") and "root:" not in obs.output
    else:  # documented: rlimit mode cannot hide world-readable files
        assert obs.error is None and "root:x:0:0" in obs.output


def test_reads_repository_files(mode, tmp_path):
    obs, _ = hostile(mode, "print(open('pyproject.toml').read())")  # relative: its own fresh directory
    assert obs.error.startswith("exit code 1: FileNotFoundError")
    obs, _ = hostile(mode, f"print(open({str(REPO_ROOT / 'pyproject.toml')!r}).read()[:1000])")
    if mode in HIDING_MODES:
        assert obs.error.startswith("exit code 1: FileNotFoundError") and "reasonrl" not in obs.output
    else:  # documented: world-readable files stay readable in rlimit mode
        assert obs.error is None and "[project]" in obs.output
    secret = tmp_path / "token"
    secret.write_text("hf_secret")
    secret.chmod(0o600)
    obs, _ = hostile(mode, f"print(open({str(secret)!r}).read())")
    if IS_ROOT or mode in HIDING_MODES:  # another uid (rlimit) or not in the filesystem
        assert obs.error.startswith(("exit code 1: PermissionError", "exit code 1: FileNotFoundError"))
        assert "hf_secret" not in obs.output


def test_writes_outside_its_directory(mode):
    target = REPO_ROOT / f"sandbox-escape-{os.getpid()}.txt"
    try:
        obs, _ = hostile(mode, f"open({str(target)!r}, 'w').write('pwned')")
        if IS_ROOT or mode in HIDING_MODES:  # another uid (rlimit) or not in the filesystem
            assert not target.exists()
            assert obs.error.startswith(("exit code 1: PermissionError", "exit code 1: FileNotFoundError"))
    finally:  # not root, rlimit: the code runs as the repository's owner (documented)
        target.unlink(missing_ok=True)
    shared = Path(tempfile.gettempdir()) / f"sandbox-escape-{os.getpid()}.txt"
    try:
        obs, _ = hostile(mode, f"open({str(shared)!r}, 'w').write('x')")
        if mode in HIDING_MODES:  # no /tmp of the host inside
            assert obs.error.startswith("exit code 1: FileNotFoundError") and not shared.exists()
        else:  # documented: rlimit mode can write world-writable places
            assert obs.error is None and shared.read_text() == "x"
    finally:
        shared.unlink(missing_ok=True)


LOOK_AROUND = """import json, os
found = {"root": sorted(os.listdir("/")), "repository": os.path.exists(REPO), "written": []}
for path in ("/usr/x", "/x", "/dev/x", "/etc/x", "/proc/x"):
    try:
        open(path, "w").close()
        found["written"].append(path)
    except OSError:
        pass
status = open("/proc/self/status").read().splitlines()
found["status"] = [line.split()[1] for line in status if line.startswith(("CapEff", "CapBnd", "NoNewPrivs"))]
print(json.dumps(found))
"""


def test_sees_only_its_directory_and_a_read_only_system(mode):
    """bwrap and unshare: the root holds the system binds, /dev, /proc and /sandbox only; the
    system is read-only, the repository is nowhere, no capability is left to remount anything."""
    if mode not in HIDING_MODES:
        pytest.skip("rlimit mode shows the host's filesystem (documented; tests above)")
    obs, _ = hostile(mode, f"REPO = {str(REPO_ROOT)!r}\n" + LOOK_AROUND)
    assert obs.error is None, obs
    found = json.loads(obs.output)
    system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sandbox"}
    python_dirs = {p.split("/")[1] for p in sandbox_plan(mode, limits(mode).uid).python_dirs}
    assert {"sandbox", "usr", "dev", "proc"} <= set(found["root"]) <= system | python_dirs
    assert "tmp" not in found["root"] and not found["repository"]
    assert found["written"] == []
    if mode == "unshare":  # the bootstrap emptied every capability set and set no_new_privs
        assert found["status"] == ["0000000000000000", "0000000000000000", "1"]


def _connect_code(port: int) -> str:
    return (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            f"s.sendall(b'hello')\nprint('connected')")


def test_network_to_local_listener(mode):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        port = server.getsockname()[1]
        obs, _ = hostile(mode, _connect_code(port))
        blocked = sandbox_plan(mode, limits(mode).uid).network_blocked
        if blocked:  # bwrap, unshare, or rlimit with unshare: a network namespace with no route out
            assert obs.error.startswith(("exit code 1: ConnectionRefusedError", "exit code 1: OSError"))
            with pytest.raises(TimeoutError):
                server.accept()
        else:  # documented: rlimit mode without unshare does not block loopback
            assert obs.output == "connected\n"


def test_network_without_unshare_is_not_blocked(monkeypatch):
    """The documented gap of the rlimit floor without namespaces: loopback is reachable."""
    real_which = shutil.which
    monkeypatch.setattr(sandbox_module.shutil, "which",
                        lambda name: None if name in ("bwrap", "unshare") else real_which(name))
    monkeypatch.setattr(sandbox_module, "_PLANS", {})
    plan = sandbox_plan("rlimit", limits("rlimit").uid)
    assert plan.mode == "rlimit" and not plan.network_blocked and "NOT blocked" in plan.summary()
    assert "sandbox=rlimit chosen; unshare (util-linux) not found" in plan.reason
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(5)
        obs, _ = hostile("rlimit", _connect_code(server.getsockname()[1]))
        assert obs.output == "connected\n" and obs.error is None
        connection, _ = server.accept()
        with connection:
            assert connection.recv(5) == b"hello"
    obs, _ = hostile("rlimit", "while True:\n    pass")  # the limits still hold
    assert obs.timed_out
    if IS_ROOT:  # another uid: the trainer is out of reach
        obs, _ = hostile("rlimit", "import os\nos.kill(os.getppid(), 9)")
        assert obs.error.startswith("exit code 1: PermissionError")
    if plan.bounds.kind != "watchdog":  # the call's cgroup catches what leaves the process group
        code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n"
                "print('parent done')")
        obs, _ = hostile("rlimit", code)  # hostile() asserts that no process of the sandbox user remains
        assert obs.output == "parent done\n"


def test_kills_its_parent(mode):
    if not IS_ROOT and mode == "rlimit" and not sandbox_plan(mode, limits(mode).uid).unshare:
        pytest.skip("rlimit without namespaces, not root: the code runs as this user and would kill "
                    "this test process (documented: install bubblewrap)")
    obs, _ = hostile(mode, "import os\nos.kill(os.getppid(), 9)\nprint('still here')")
    # The parent it can see is its namespace's init (bwrap's, or itself with unshare: getppid()
    # is 0 and kill(0) reaches only its own group), which ignores signals from inside; the
    # trainer is in no case reachable.
    assert obs.output == "still here\n" and obs.error is None
    assert os.getpid() > 0 and hostile(mode, "print(1)")[0].output == "1\n"


def test_escaped_background_process_is_killed(mode):
    plan = sandbox_plan(mode, limits(mode).uid)
    if mode == "rlimit" and not plan.network_blocked and plan.bounds.kind == "watchdog":
        pytest.skip("rlimit without unshare nor a cgroup: a process that calls setsid() outlives the group "
                    "kill (documented)")
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\n    os._exit(0)\n"
            "print('parent done')")
    obs, _ = hostile(mode, code)  # hostile() asserts that no process of the sandbox user remains
    assert obs.output == "parent done\n" and obs.error is None


def test_sleeps_past_the_timeout(mode):
    obs, _ = hostile(mode, "import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    assert obs.timed_out and obs.output == "sleeping\n"
    assert obs.error == "timed out after 2 s (wall clock); its processes were killed"
    assert TIMEOUT <= obs.seconds < TIMEOUT + 10  # cut at the timeout, well before the 60 s sleep


@pytest.mark.parametrize("arguments, error", [
    ({"source": "print(1)"}, 'python: arguments must be text or {"code": "..."}; got an object with keys'),
    ({"code": "print(1)", "timeout": 99}, "python: arguments must be {\"code\": \"...\"} only"),
    ({"code": ["print(1)"]}, 'python: arguments must be text or {"code": "..."}; got list'),
    (42, 'python: arguments must be text or {"code": "..."}; got int'),
    (None, 'python: arguments must be text or {"code": "..."}; got NoneType'),
    ("  \n", "python: code is empty"),
    ("x" * 200_001, "python: code too long: 200001 characters"),
])
def test_malformed_arguments(arguments, error):
    stats = ToolStats()
    obs = call_tool("python", arguments, limits("auto", code_chars=200_000), stats)
    assert obs.error.startswith(error) and obs.output == "" and obs.exit_code is None
    assert stats.as_dict()["errors"] == 1


def test_test_process_unharmed():
    """The limits are set in the child: this process keeps its own, and is still here."""
    kinds = (resource.RLIMIT_NPROC, resource.RLIMIT_AS, resource.RLIMIT_CPU)
    before = {r: resource.getrlimit(r) for r in kinds}
    obs = run_python("print('ok')", limits("auto"))
    assert obs.output == "ok\n"
    assert {r: resource.getrlimit(r) for r in before} == before


def test_forced_bwrap_where_unavailable_is_an_error_observation(monkeypatch):
    monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox_module, "_PLANS", {})
    with pytest.raises(SandboxError, match="bwrap not found .*apt-get install bubblewrap"):
        sandbox_plan("bwrap", 65534)
    obs = run_python("print(1)", Limits(sandbox="bwrap"))
    assert obs.error.startswith("sandbox unavailable: tool sandbox 'bwrap' asked for, but bwrap not found")
    obs = run_python("print(1)", Limits(sandbox="unshare"))
    assert obs.error.startswith("sandbox unavailable: tool sandbox 'unshare' asked for, but unshare")


def test_unshare_that_cannot_make_namespaces_is_refused(monkeypatch):
    """util-linux unshare refused (no user namespaces, not root): unshare mode says why and what
    to do; auto, with no bubblewrap either, refuses to start."""
    folder = Path(tempfile.mkdtemp(prefix="fake-unshare-"))
    try:
        folder.chmod(0o755)
        fake = folder / "unshare"
        fake.write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
        fake.chmod(0o755)
        real_which = shutil.which
        monkeypatch.setattr(sandbox_module.shutil, "which", lambda name: (
            str(fake) if name == "unshare" else None if name == "bwrap" else real_which(name)))
        monkeypatch.setattr(sandbox_module, "_PLANS", {})
        with pytest.raises(SandboxError, match="unshare --mount --net --pid.* with a private root failed: "
                                               "exit code 1: unshare: unshare failed: Operation not "
                                               "permitted; install bubblewrap"):
            sandbox_plan("unshare", limits("auto").uid)
        with pytest.raises(SandboxError, match="tool sandbox 'auto': no mode that hides the host's files"):
            sandbox_plan("auto", limits("auto").uid)
    finally:
        shutil.rmtree(folder)


def test_concurrent_calls(mode):
    """Environment steps of a turn call tools from threads at once: each gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    stats = ToolStats()
    with ThreadPoolExecutor(6) as pool:
        found = list(pool.map(lambda i: call_tool("python", f"print({i} * {i})", limits(mode), stats),
                              range(12)))
    assert [obs.output for obs in found] == [f"{i * i}\n" for i in range(12)]
    assert all(obs.error is None for obs in found) and stats.as_dict()["calls"] == 12
    assert_no_leftovers()


def test_cli_tool(capsys):
    """`reasonrl tool` prints the observation as JSON, with the sandbox mode."""
    from reasonrl.cli import main

    assert main(["tool", "calculator", "347 * 29"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"tool": "calculator", "output": "10063", "error": None, "timed_out": False,
                       "seconds": printed["seconds"], "exit_code": 0, "truncated": False,
                       "mode": "parse (no code runs)"}
    assert main(["tool", "python", '{"code": "import time\\ntime.sleep(9)"}', "--timeout", "1",
                 "--sandbox", "rlimit"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["timed_out"] and printed["mode"] == "rlimit" and 1 <= printed["seconds"] < 3
    assert main(["tool", "python", "print(6 * 7)"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["output"] == "42\n"
    expected = "bwrap" if _bwrap_reason() is None else "unshare" if _unavailable("unshare") is None else None
    assert printed["mode"] == (expected or "unavailable")
    assert main(["tool", "python", "print(1)", "--memory-mb", "8"]) == 2
    assert "memory_mb must be >= 64" in capsys.readouterr().err


def test_auto_falls_back_when_bwrap_cannot_create_namespaces(monkeypatch):
    """bubblewrap installed but refused (no user namespaces): auto says why and uses unshare
    (or, where that cannot run either, refuses)."""
    folder = Path(tempfile.mkdtemp(prefix="fake-bwrap-"))
    try:
        folder.chmod(0o755)  # the sandbox user must be able to run it, as it would the real one
        fake = folder / "bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
        fake.chmod(0o755)
        real_which = shutil.which
        monkeypatch.setattr(sandbox_module.shutil, "which",
                            lambda name: str(fake) if name == "bwrap" else real_which(name))
        monkeypatch.setattr(sandbox_module, "_PLANS", {})
        with pytest.raises(SandboxError, match="tool sandbox 'bwrap' asked for, but bwrap cannot create"):
            sandbox_plan("bwrap", limits("auto").uid)
        if _unavailable("unshare") is not None:
            with pytest.raises(SandboxError, match="bwrap cannot create its namespaces here: exit code 1"):
                sandbox_plan("auto", limits("auto").uid)
            return
        plan = sandbox_plan("auto", limits("auto").uid)
        assert plan.mode == "unshare"
        assert "bwrap cannot create its namespaces here: exit code 1: bwrap: No permissions" in plan.reason
        assert hostile("auto", "print(7 * 6)")[0].output == "42\n"
    finally:
        shutil.rmtree(folder)
