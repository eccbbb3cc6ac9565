"""A reward worker process: `python -m reasonrl.rewards.worker` (started by `pool.WorkerPool`).

Reads one JSON request per line on stdin, answers one JSON line on its own copy of stdout:
  {"load": "module:fn"[, "warmup": {...}]}               -> {"value": null} or {"error": "..."}
      (fn.warmup(**warmup) runs if fn has one: reward.model's function loads its model there)
  {"target", "completion", "ground_truth", "extra_info", "options", "timeout"}
                                                         -> {"value": ...} | {"timeout": true}
                                                            | {"error": "..."} | {"ground_truth_error": "..."}
                                                            | {"error": "MemoryError...", "memory": true}
  the same with "batch": {"completions", "ground_truths", "groups", "extra_infos"}: one call
  fn(completions, ground_truths, groups, extra_infos, **options) -> {"value": [...]} | ...
  the same with "style" (and "batch" holding `styles.COLUMNS`): fn called as that style calls it,
  `styles.invoke(style, fn, batch, options)` -> {"value": {"values": [...], "logged": [...]}} | ...
Anything the reward function prints goes to stderr, so it cannot corrupt the replies. Its memory
is bounded by `--max-memory-mb N` (reward.max_memory_mb; 0: no bound, a model's worker), see
`bound_memory`.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from reasonrl import console

_BOUND_MB = 0  # this worker's memory bound (MB, 0: none), for the messages


class _SoftTimeout(BaseException):
    """Raised by SIGALRM; a BaseException so `except Exception` in reward code cannot eat it."""


def _on_alarm(signum, frame):
    raise _SoftTimeout()


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "tolist"):  # numpy arrays and torch tensors (a batch reward's scores)
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return float(value)  # numpy / torch scalars, Fractions


def _answer(out, reply: dict) -> None:
    try:
        text = json.dumps(reply, allow_nan=True)
    except (TypeError, ValueError) as err:
        text = json.dumps({"error": f"reward returned a value that is not a number or dict: {err}"})
    except MemoryError:
        text = json.dumps({"error": "MemoryError: the reward's value is too large to send back",
                           "memory": True})
    out.write(text + "\n")
    out.flush()


def _failure(err: BaseException) -> str:
    """What the user's code raised, as one line: any BaseException, KeyboardInterrupt and
    SystemExit included. In this process they can only come from the user's code (SIGINT is
    ignored here, `main`; the parent decides whether a Ctrl-C stops the run), and one left to
    escape would end the worker with a traceback on the console, once per worker and call (~40
    in a 3-step run), and cost a fresh worker each time. Caught, it is a failure like any other:
    scored 0, counted, printed once by the trainer."""
    from reasonrl.rewards.failures import describe_exception

    return describe_exception(err)[:2000]


def load_reply(request: dict) -> dict:
    """The reply to {"load": target}: import it (the parent's sys.path added, in the parent's
    working directory: a pooled worker outlives the one it was started in) and run its `warmup`,
    with the request's "warmup" keywords if it has them."""
    from reasonrl.rewards.verifiers import load_target

    for entry in request.get("sys_path", []):  # the parent's, as it is now
        if entry not in sys.path:
            sys.path.append(entry)
    cwd = request.get("cwd")  # the parent's working directory as it is now (where ./my_rewards.py is)
    if cwd and os.path.isdir(cwd):  # not on another Ray node, where it need not exist
        os.chdir(cwd)
    try:
        warmup = getattr(load_target(request["load"]), "warmup", None)
        if warmup is not None:
            warmup(**request.get("warmup") or {})
        return {"value": None}
    except BaseException as err:  # noqa: BLE001 - as a call's (`_failure`)
        bound = (f" (the worker's memory bound, reward.max_memory_mb={_BOUND_MB}, is too small to load it)"
                 if isinstance(err, MemoryError) and _BOUND_MB else "")
        return {"error": f"cannot load {request['load']}: {_failure(err)}{bound}"}


def call_reply(request: dict, timer: bool = True) -> dict:
    """The reply to one call: its value, or what went wrong. `timer`: interrupt it at its
    "timeout" by SIGALRM (the main thread of a worker process only; a Ray actor's caller kills
    the actor at its deadline instead)."""
    from reasonrl.errors import GroundTruthError
    from reasonrl.rewards.styles import invoke
    from reasonrl.rewards.verifiers import load_target

    fn = load_target(request["target"])
    try:
        try:
            if timer:
                signal.setitimer(signal.ITIMER_REAL, max(float(request["timeout"]), 1e-3))
            if "style" in request:  # another framework's form, or reasonrl's own by name
                value = invoke(request["style"], fn, request["batch"], request["options"])
            elif "batch" in request:
                b = request["batch"]
                value = fn(b["completions"], b["ground_truths"], b["groups"], b["extra_infos"],
                           **request["options"])
            else:
                value = fn(request["completion"], request["ground_truth"], request["extra_info"],
                           **request["options"])
        finally:
            if timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
        return {"value": _jsonable(value)}
    except _SoftTimeout:
        return {"timeout": True}
    except GroundTruthError as err:
        return {"ground_truth_error": str(err)}
    except MemoryError as err:  # past the bound (`bound_memory`): answered once the block is left
        try:
            memory = f"MemoryError: {err}" if str(err) else "MemoryError"
        except MemoryError:
            memory = "MemoryError"
    except BaseException as err:  # noqa: BLE001 - KeyboardInterrupt and SystemExit too (`_failure`)
        return {"error": _failure(err)}
    # here the exception is gone, and with it the frames that held what filled the memory
    return {"error": memory[:2000], "memory": True}


def bound_memory(megabytes: int) -> None:
    """Bound this process's memory to `megabytes` (0: no bound), the interpreter and its imports
    included (~0.3 GB here: the worker imports torch), so that a reward function that grows (a
    huge integer, a cache, a leak) gets a MemoryError, which scores 0 as "out of memory" and
    leaves the worker alive, instead of taking the machine's memory from the run (each worker
    could take 4 GiB before). RLIMIT_DATA rather than the tool sandbox's RLIMIT_AS: it counts what the
    process allocates (heap, anonymous mappings, thread stacks) and not the shared libraries it
    maps nor address space reserved and unused (torch's imports map ~0.4 GB more, glibc reserves
    64 MiB per thread's arena), so the number reads as memory and a threaded library does not
    fail by its reservations alone. Soft and hard limit both: the function cannot lift it. Where
    it cannot be set (another OS, a lower hard limit already) the worker says so on stderr."""
    global _BOUND_MB
    if megabytes <= 0:
        return
    try:
        import resource

        limit = megabytes << 20
        hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
        if hard != resource.RLIM_INFINITY and hard < limit:  # already bounded lower: kept
            console.warning(f"reward worker {os.getpid()}: memory bounded at {hard >> 20} MB, the hard "
                            f"RLIMIT_DATA it was started with, below reward.max_memory_mb={megabytes}",
                            label="")
            limit = hard
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        _BOUND_MB = limit >> 20
    except (ImportError, AttributeError, ValueError, OSError) as err:
        console.warning(f"reward worker {os.getpid()}: its memory is not bounded (reward.max_memory_mb="
                        f"{megabytes}): {type(err).__name__}: {err}", label="")


def main() -> None:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the function's prints go to stderr
    args = sys.argv[1:]
    bound_memory(int(args[args.index("--max-memory-mb") + 1]) if "--max-memory-mb" in args else 0)
    signal.signal(signal.SIGALRM, _on_alarm)
    # Ctrl-C in a terminal reaches the whole process group: the trainer finishes its step
    # (scoring included) and saves, so the worker must not die of it. It exits on stdin EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for line in sys.stdin:
        request = json.loads(line)
        # NaN and inf go as JSON NaN / Infinity: the trainer refuses them (scoring.py)
        _answer(out, load_reply(request) if "load" in request else call_reply(request))


if __name__ == "__main__":
    main()
