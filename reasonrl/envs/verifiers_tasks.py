"""`data.task=verifiers`: a `verifiers` v1 taskset's tasks as a run's examples (docs/env-verifiers.md),
scored by the taskset's own rewards in reasonrl's reward workers (`reward.task=verifiers`:
`reasonrl.rewards.verifiers_taskset`).

What reasonrl plays is what verifiers' null harness plays for a task without tools
(`verifiers/v1/harnesses/null`, its chat loop `harnesses/utils/core.py:run_chat_loop`: it
ends at the first reply without a tool call): the task's system prompt and prompt, one model
reply, the task's `@vf.reward` functions of (task, trace). Everything else a verifiers
rollout offers runs through a model endpoint that a harness program calls (verifiers'
interception server), which reasonrl does not have yet, so a taskset that uses any of it is
refused at start-up, in one line naming what it uses, "until an OpenAI-compatible endpoint
exists (issue #44)":

- an Env class of its own (a custom episode loop: several agents, a simulated user, turns the
  environment answers), or a Harness of its own (a custom agent program);
- a task that prepares or reads a runtime (`setup`, `finalize`, `stage_verifier` overridden;
  `NEEDS_CONTAINER`; an `image` or `workdir`), tools (toolsets: MCP servers whose calls have
  side effects), `@vf.intercept` hooks, a `State` class of its own (state a rollout's tools
  fill), judges (they call a model);
- rewards that name the `runtime` or anything but `task` and `trace` (runtime state from a
  custom rollout), or no reward at all;
- a task without a prompt (the user opens: a simulated user), or a prompt that is not text
  (images, tool calls, tool messages).

Metrics (`@vf.metric`) are computed by `Task.score` too and not logged; one that needs the
runtime is skipped, as verifiers' own offline scoring skips it.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from reasonrl.batch import Example
from reasonrl.config import DataConfig
from reasonrl.errors import ConfigError
from reasonrl.registry import DATA_TASKS
from reasonrl.rewards.verifiers_taskset import import_v1, load_taskset, rebuild_task, task_reference

UNTIL = "until an OpenAI-compatible endpoint exists (issue #44)"
RUNTIME_HOOKS = ("setup", "finalize", "stage_verifier")  # Task methods that run against a runtime
TRACE_ONLY = {"self", "task", "trace"}  # what a reward may name: invoke() gives task, trace (and runtime)


def exported(module: Any) -> list[Any]:
    """What a taskset's module offers: its `__all__`, else what it defines itself."""
    names = getattr(module, "__all__", None)
    if names is None:
        return [v for v in vars(module).values() if getattr(v, "__module__", None) == module.__name__]
    return [getattr(module, n, None) for n in names]


def episode_loop(target: str, taskset: Any) -> list[str]:
    """What the taskset brings besides tasks: an Env or a Harness class of its own."""
    vf = import_v1()
    if ":" not in target:
        from verifiers.v1.utils.loaders import import_taskset

        offered = exported(import_taskset(target))
    else:
        offered = exported(inspect.getmodule(type(taskset)))
    found = []
    for base, what in ((vf.Env, "an Env of its own, {} (a custom episode loop: several agents, a simulated "
                                "user, turns the environment answers)"),
                       (vf.Harness, "a Harness of its own, {} (a custom agent program)")):
        found += [what.format(c.__name__) for c in offered
                  if isinstance(c, type) and issubclass(c, base) and c not in (base, vf.SingleAgentEnv)]
    return found


def task_uses(task: Any, taskset: Any) -> list[str]:
    """What a task (its class, config and data) uses that needs a verifiers rollout."""
    vf = import_v1()
    from verifiers.v1.state import state_cls
    from verifiers.v1.utils.decorators import discover_decorated

    cls, uses = type(task), []
    hooks = [h for h in RUNTIME_HOOKS if getattr(cls, h) is not getattr(vf.Task, h)]
    if hooks:
        uses.append(f"{cls.__name__}.{', '.join(hooks)} (a runtime prepared or read)")
    if cls.NEEDS_CONTAINER or task.data.image or task.data.workdir:
        uses.append("a container (NEEDS_CONTAINER, an image or a workdir)")
    tools = [type(t).__name__ for t in (*type(taskset).toolsets(taskset.config), *cls.toolsets(task.config))]
    if tools:
        uses.append(f"tools ({', '.join(tools)}: MCP servers whose calls have side effects)")
    intercepts = [f.__name__ for f in discover_decorated(task, "intercept")]
    if intercepts:
        uses.append(f"@vf.intercept hooks ({', '.join(intercepts)})")
    if state_cls(cls) is not vf.State:
        uses.append(f"a State of its own, {state_cls(cls).__name__} (state a rollout's tools fill)")
    if task.config.judges:
        uses.append(f"judges ({', '.join(type(j).__name__ for j in task.config.judges)}: they call a model)")
    rewards = task.hooks("reward")
    needy = [f"{f.__name__}({', '.join(p)})" for f in rewards
             if (p := [n for n, q in inspect.signature(f).parameters.items()
                       if n not in TRACE_ONLY and q.default is q.empty and q.kind not in (q.VAR_POSITIONAL,
                                                                                            q.VAR_KEYWORD)])]
    if needy:
        uses.append(f"rewards that read more than the transcript: {', '.join(needy)} (runtime state from a "
                    "custom rollout)")
    if not rewards:
        uses.append("no @vf.reward function (nothing to train on)")
    return uses


def prompt_of(task: Any, where: str) -> str | list[dict[str, str]]:
    """The example's prompt: the task's system prompt and prompt as chat messages (a text
    prompt alone without a system prompt stays text); ConfigError for what reasonrl cannot
    send as text: no prompt, content parts that are not text, tool calls, tool messages."""
    data = task.data
    if data.prompt is None:
        raise ConfigError(f"{where}: refused {UNTIL}: the task has no prompt (the user opens the "
                          "conversation: a simulated user)")
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        if not messages:
            return data.prompt
        return [*messages, {"role": "user", "content": data.prompt}]
    for m in data.prompt:
        if m.role not in ("system", "user", "assistant") or getattr(m, "tool_calls", None) \
                or not isinstance(m.content, str):
            raise ConfigError(f"{where}: refused {UNTIL}: its prompt holds a {m.role} message that is not "
                              "plain text (tool calls, tool results, images)")
        messages.append({"role": m.role, "content": m.content})
    return messages


def ground_truth_of(task: Any) -> str:
    """What the samples show as the ground truth: the task's `answer` field, else its own data
    fields (those TaskData does not have) as JSON."""
    vf = import_v1()
    data = task.data
    answer = getattr(data, "answer", None)
    if isinstance(answer, (str, int, float)) and not isinstance(answer, bool):
        return str(answer)
    own = {k: v for k, v in data.model_dump(mode="json").items() if k not in vf.TaskData.model_fields}
    return json.dumps(own, sort_keys=True, default=str)


def examples_of(target: str, args: dict, limit: int, where: str) -> list[Example]:
    """The taskset's tasks as examples (at most `limit`; 0 = all), each refused or kept."""
    try:
        taskset = load_taskset(target, args)
    except Exception as err:
        raise ConfigError(f"{where}: cannot load it: {type(err).__name__}: {err}") from None
    if taskset.INFINITE and not limit:
        raise ConfigError(f"{where}: an INFINITE taskset: set data.verifiers.limit")
    name = target.rpartition(":")[2] if ":" in target else target
    uses = episode_loop(target, taskset)
    examples: list[Example] = []
    checked: set[type] = set()
    for task in taskset:
        if type(task) not in checked:  # what a task class uses is the same for its every task
            uses += task_uses(task, taskset)
            checked.add(type(task))
        if uses:
            raise ConfigError(f"{where}: refused {UNTIL}: it uses {'; '.join(uses)}. reasonrl plays a "
                              "taskset as verifiers' null harness plays a task without tools: its prompt, "
                              "one model reply, its @vf.reward functions of (task, trace)")
        idx = task.data.idx
        info = {"taskset": target, "args": args, **task_reference(task, taskset),
                "data": task.data.model_dump(mode="json")}
        examples.append(Example(prompt_of(task, f"{where}: task {idx}"), ground_truth_of(task),
                                f"verifiers/{name}", {"origin": f"{name}:{idx}", "verifiers": info}))
        if len(examples) == limit:
            break
    if examples:  # what a reward worker will do with each: rebuilt from its data, here once
        try:
            rebuild_task(examples[0].meta["verifiers"])
        except Exception as err:
            raise ConfigError(f"{where}: a task cannot be rebuilt from its data, as a reward worker must: "
                              f"{type(err).__name__}: {err}") from None
    return examples


@DATA_TASKS.register("verifiers", generated=True)
def verifiers_tasks(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """a verifiers v1 taskset's tasks (data.verifiers), scored by its rewards (reward.task=verifiers)"""
    v = cfg.verifiers
    where = f"data.verifiers.taskset={v.taskset}"
    try:
        import_v1()
    except ImportError as err:
        raise ConfigError(f"{where}: {err}") from None
    train = examples_of(v.taskset, dict(v.args), v.limit, where)
    held_out = []
    if v.val_args:
        held_out = examples_of(v.taskset, {**v.args, **v.val_args}, v.limit,
                               f"{where} (data.verifiers.val_args)")
    return train, held_out
