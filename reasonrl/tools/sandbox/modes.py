"""Which sandbox mode runs here, and why: `sandbox_plan(mode, uid, python)` probes once per
(mode, uid, interpreter) -- bubblewrap, then util-linux unshare with a private root, each by
running a trivial program -- and caches the `SandboxPlan` or the refusal; auto is bwrap > unshare
> refuse (rlimit only when chosen). `run_python`, the sandbox's entry point, is a call under that
plan (run.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time

from reasonrl import console
from reasonrl.errors import ConfigError, SandboxError
from reasonrl.tools.sandbox.bootstrap import _PROBE_CODE
from reasonrl.tools.sandbox.bounds import find_call_bounds
from reasonrl.tools.sandbox.limits import DEFAULT_UID, SANDBOX_MODES, Limits, Observation
from reasonrl.tools.sandbox.plan import SandboxPlan
from reasonrl.tools.sandbox.run import execute

_PROBE_TIMEOUT = 20.0  # seconds for one probe (an interpreter start on a busy machine)
_NAMESPACE_FIX = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) where user namespaces "
                  "are allowed, or allow unprivileged user namespaces (sysctl "
                  "kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container, a "
                  "seccomp/AppArmor profile that permits unshare(CLONE_NEWUSER)), or run as root where "
                  "util-linux unshare can make mount namespaces")


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
                if plan.files_hidden:
                    console.info(f"tool sandbox: {plan.summary()}", err=True)
                else:
                    console.warning(f"tool sandbox: {plan.summary()}", label="WARNING: ")
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
    obs = execute(plan, "print('sandbox ok')", Limits(timeout=_PROBE_TIMEOUT))
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


# ----------------------------------------------------------------------------- a call

def run_python(code: str, limits: Limits | None = None) -> Observation:
    """Run `code` as a Python program in the sandbox (the package docstring) and return what it
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
    return execute(plan, code, limits)

