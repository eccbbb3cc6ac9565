"""`reward.task=verifiers`: the `@vf.reward` functions of a `verifiers` v1 taskset's task
(PrimeIntellect's verifiers 0.4.0, `verifiers.v1`) score a completion, in reasonrl's reward
workers (a hard `reward.timeout` per completion; a reward that raises or hangs scores 0 and is
counted). Not reasonrl's own answer checkers (`reasonrl.rewards.verifiers`).

In verifiers v1 a taskset yields tasks (`Taskset.load()`: `verifiers/v1/taskset.py`); a task is
its data (`TaskData`: prompt, system_prompt and the taskset's own fields, such as `answer`)
and its behaviour: `@vf.reward` methods (`verifiers/v1/utils/decorators.py`), plugged reward
functions (`TaskConfig.rewards`) and judges, each called by `Task.score(trace, runtime)` with
what it names among `task`, `trace` and `runtime` (`task.py`), the rewards' weighted sum
being the trace's `reward` (`trace.py`: `Trace.reward`). A reward that reads only the
transcript (`trace.last_reply`, `trace.messages`, `self.data`) needs nothing but the trace, so
it runs here on one built from the prompt and reasonrl's completion: the system prompt, the
prompt's messages, and one assistant message, the model's (`sampled`): what verifiers' null
harness (`harnesses/null`: a chat program that ends at the first reply without a tool call)
records for a task without tools. Which tasksets qualify is decided at start-up by
`reasonrl.envs.verifiers_tasks`.

Each example carries what rebuilds its task in a worker (`extra_info["verifiers"]`: the
taskset, its config fields, the task class and the task's data): the taskset class is loaded
(not its `load()`: no dataset is read), the task built from its data, the trace scored with
`asyncio.run(task.score(trace))`. The score is the trace's reward; each reward's own score is
a named part. verifiers.v1 takes seconds to import: the worker imports it when it loads this
function (`score.warmup`, within the pool's load timeout), not within a call's.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from typing import Any

from reasonrl.registry import VERIFIERS
from reasonrl.rewards.numeric import any_answer

INSTALL = "pip install 'reasonrl[verifiers]'"


def import_v1():
    """`verifiers.v1`, or ImportError naming what to install."""
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise ImportError(f"data.task=verifiers needs the verifiers package (0.4.0, its v1 API): {INSTALL} "
                          f"({err})") from None
    return vf


def taskset_class(target: str) -> type:
    """The Taskset class of `data.verifiers.taskset`: an installed taskset's id (verifiers'
    own loader: the package exporting it in `__all__`), or module:Class / path/file.py:Class."""
    vf = import_v1()
    if ":" not in target:
        from verifiers.v1.utils.loaders import taskset_class as installed

        return installed(target)
    from reasonrl.rewards.verifiers import load_target

    cls = load_target(target)
    if not (isinstance(cls, type) and issubclass(cls, vf.Taskset)):
        raise TypeError(f"{target} is {getattr(cls, '__name__', cls)!r}, not a verifiers.v1 Taskset subclass")
    return cls


_TASKSETS: dict[str, Any] = {}  # (target, config fields) -> the taskset: built once per process


def load_taskset(target: str, args: dict) -> Any:
    """The taskset of `target` with its config fields `args` (its TasksetConfig subclass, as
    verifiers resolves it: `concrete_type(cls, TasksetConfig, origin=Taskset)`), cached."""
    key = json.dumps([target, args], sort_keys=True, default=str)
    if key not in _TASKSETS:
        vf = import_v1()
        from verifiers.v1.utils.generic import concrete_type

        cls = taskset_class(target)
        config_type = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
        fields = dict(args) if ":" in target else {**args, "id": target}
        _TASKSETS[key] = cls(config_type.model_validate(fields))
    return _TASKSETS[key]


def task_reference(task: Any, taskset: Any) -> dict[str, str]:
    """Where a worker finds `task`'s class: in the taskset's module (a path/file.py target is
    loaded there under a name of its own), else its importable module."""
    cls, home = type(task), sys.modules.get(type(taskset).__module__)
    if cls.__module__ == type(taskset).__module__ or getattr(home, cls.__name__, None) is cls:
        return {"task_class": cls.__qualname__}
    return {"task_module": cls.__module__, "task_class": cls.__qualname__}


def rebuild_task(info: dict) -> Any:
    """The task an example's `extra_info["verifiers"]` describes, built from its data."""
    taskset = load_taskset(info["taskset"], info.get("args", {}))
    module = sys.modules[type(taskset).__module__] if "task_module" not in info else \
        importlib.import_module(info["task_module"])
    cls: Any = module
    for part in info["task_class"].split("."):
        cls = getattr(cls, part)
    return cls(cls.data_type().model_validate(info["data"]), taskset.config.task)


def transcript(task: Any, completion: str) -> Any:
    """The trace of `task` answered by `completion`: its system prompt, its prompt (text, or
    its messages), and the model's reply, as one branch of message nodes."""
    vf = import_v1()
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.state import state_cls
    from verifiers.v1.trace import AgentInfo, TraceTask

    data = task.data
    messages: list[Any] = []
    if data.system_prompt:
        messages.append(vf.SystemMessage(content=data.system_prompt))
    if isinstance(data.prompt, str):
        messages.append(vf.UserMessage(content=data.prompt))
    else:
        messages.extend(data.prompt or [])
    nodes = [MessageNode(message=m, parent=i - 1 if i else None) for i, m in enumerate(messages)]
    nodes.append(MessageNode(message=vf.AssistantMessage(content=completion), parent=len(nodes) - 1 if nodes
                             else None, sampled=True))
    trace = vf.Trace(task=TraceTask(type=type(task).__name__, data=data, key=task.key, hash=task.hash),
                     agent=AgentInfo(config=vf.AgentConfig(), name="reasonrl"), state=state_cls(type(task))(),
                     nodes=nodes)
    trace.is_completed = trace.ok = True
    return trace


@VERIFIERS.register("verifiers", doc="a verifiers v1 taskset's own @vf.reward functions "
                                 "(data.task=verifiers)", isolated=True, options={}, answer=any_answer)
def score(completion: str, ground_truth: str, extra_info: dict | None = None) -> dict[str, float]:
    """{"score": the trace's reward (the weighted sum of the task's rewards), each reward's own
    score by name}: the task of `extra_info["verifiers"]` scoring `completion`. A reward that
    raises fails the call (verifiers wraps it in a TaskError): scored 0 and counted."""
    info = (extra_info or {}).get("verifiers")
    if not isinstance(info, dict):
        raise ValueError("reward.task=verifiers scores examples of data.task=verifiers (extra_info.verifiers "
                         "is missing)")
    task = rebuild_task(info)
    trace = transcript(task, completion)
    asyncio.run(task.score(trace))
    parts = {("score_" if name == "score" else name): reward.score
             for name, reward in trace.rewards.items() if reward is not None}
    return {"score": trace.reward, **parts}


def _warmup() -> None:
    """Import verifiers.v1 when a worker loads `score` (seconds), not within a call's timeout."""
    import_v1()


score.warmup = _warmup  # type: ignore[attr-defined]
