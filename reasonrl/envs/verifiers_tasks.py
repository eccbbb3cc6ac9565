"""`data.task=verifiers`: a `verifiers` v1 taskset's tasks as a run's examples (docs/env-verifiers.md),
scored by the taskset's own rewards in reasonrl's reward workers (`reward.task=verifiers`:
`reasonrl.rewards.verifiers_taskset`).

Who plays a task is `data.verifiers.rollout`:

- `reply` (the default): reasonrl, as verifiers' null harness plays a task without tools
  (`verifiers/v1/harnesses/null`, its chat loop `harnesses/utils/core.py:run_chat_loop`: it
  ends at the first reply without a tool call): the task's system prompt and prompt, one model
  reply, the task's `@vf.reward` functions of (task, trace). A taskset that uses what only a
  verifiers rollout gives is refused at start-up, in one line naming what it uses and, when
  verifiers' own rollout can play it, that route.
- `verifiers`: verifiers' own rollout (`verifiers.v1.Agent.run`) as an agent episode
  (`env.format=agent`, `env.fn=reasonrl.envs.verifiers_agent:agent`) against the episode's
  route of reasonrl's endpoint: the task's `setup` / `finalize` / `stage_verifier` on a
  subprocess runtime, its MCP tools, `@vf.intercept` hooks, a `State` of its own, rewards that
  read the runtime. Refused at start-up still, in either mode (`REFUSED`):

  - an Env class of its own (a custom episode loop: several agents, a simulated user, turns the
    environment answers) or a Harness of its own (a program verifiers launches): reasonrl plays
    one agent per episode with its in-process chat harness;
  - a container (`NEEDS_CONTAINER`, an `image` or a `workdir`, tool servers in a container
    runtime): reasonrl runs verifiers' rollout on the subprocess runtime only;
  - tool servers defined in a file given by its path: verifiers starts each as
    `python -m <its module>`;
  - judges (`task.judges`): they call a model endpoint of their own configuration, not the
    policy;
  - no reward, a task without a prompt (the user opens: a simulated user), or a prompt that is
    not text (images, tool calls, tool messages).

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
from reasonrl.rewards.verifiers import FILE_MODULE
from reasonrl.rewards.verifiers_taskset import import_v1, load_taskset, rebuild_task, task_reference

ROUTE = ("data.verifiers.rollout=verifiers env.format=agent env.fn=reasonrl.envs.verifiers_agent:agent "
         "(docs/env-verifiers.md)")
NULL = ("reasonrl plays a taskset as verifiers' null harness plays a task without tools: its prompt, one "
        "model reply, its @vf.reward functions of (task, trace)")
NEITHER = ("Neither reasonrl's reply (verifiers' null harness) nor verifiers' own rollout as reasonrl runs "
           "it (reasonrl.envs.verifiers_agent: one agent, its in-process chat harness, the subprocess "
           "runtime, the policy's endpoint) plays that")
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
                                "user, turns the environment answers; reasonrl plays one agent per episode)"),
                       (vf.Harness, "a Harness of its own, {} (a program verifiers launches; reasonrl plays "
                                    "verifiers' rollout with its own in-process chat harness)")):
        found += [what.format(c.__name__) for c in offered
                  if isinstance(c, type) and issubclass(c, base) and c not in (base, vf.SingleAgentEnv)]
    return found


def task_uses(task: Any, taskset: Any) -> tuple[list[str], list[str]]:
    """What a task (its class, config and data) uses that needs a verifiers rollout: (what
    verifiers' own rollout plays here, `data.verifiers.rollout=verifiers`; what nothing here
    plays, with why)."""
    vf = import_v1()
    from verifiers.v1.state import state_cls
    from verifiers.v1.utils.decorators import discover_decorated

    cls, playable, refused = type(task), [], []
    hooks = [h for h in RUNTIME_HOOKS if getattr(cls, h) is not getattr(vf.Task, h)]
    if hooks:
        playable.append(f"{cls.__name__}.{', '.join(hooks)} (a runtime prepared or read)")
    toolsets = [*type(taskset).toolsets(taskset.config), *cls.toolsets(task.config)]
    local = (vf.SubprocessConfig, type(None))
    boxed = [type(t).__name__ for t in toolsets if (c := getattr(t, "config", None)) is not None
             and not getattr(c, "url", None) and not isinstance(getattr(c, "runtime", None), local)]
    by_path = [type(t).__name__ for t in toolsets if type(t).__module__.startswith(FILE_MODULE)]
    if by_path:
        refused.append(f"tool servers defined in a file loaded by its path ({', '.join(by_path)}: verifiers "
                       "starts each as `python -m <its module>`; give the taskset as module:Class, "
                       "importable)")
    if cls.NEEDS_CONTAINER or task.data.image or task.data.workdir or boxed:
        refused.append("a container (NEEDS_CONTAINER, an image or a workdir, or tool servers in a container "
                       f"runtime{': ' + ', '.join(boxed) if boxed else ''}; reasonrl runs verifiers' rollout "
                       "on the subprocess runtime only)")
    tools = [type(t).__name__ for t in toolsets]
    if tools:
        playable.append(f"tools ({', '.join(tools)}: MCP servers whose calls have side effects)")
    intercepts = [f.__name__ for f in discover_decorated(task, "intercept")]
    if intercepts:
        playable.append(f"@vf.intercept hooks ({', '.join(intercepts)})")
    if state_cls(cls) is not vf.State:
        playable.append(f"a State of its own, {state_cls(cls).__name__} (state a rollout's tools fill)")
    if task.config.judges:
        judges = ", ".join(type(j).__name__ for j in task.config.judges)
        refused.append(f"judges ({judges}: they call a model endpoint of their own configuration, not the "
                       "policy)")
    rewards = task.hooks("reward")
    needy = [f"{f.__name__}({', '.join(p)})" for f in rewards
             if (p := [n for n, q in inspect.signature(f).parameters.items()
                       if n not in TRACE_ONLY and q.default is q.empty and q.kind not in (q.VAR_POSITIONAL,
                                                                                            q.VAR_KEYWORD)])]
    if needy:
        playable.append(f"rewards that read more than the transcript: {', '.join(needy)} (runtime state from "
                        "a custom rollout)")
    if not rewards:
        refused.append("no @vf.reward function (nothing to train on)")
    return playable, refused


def prompt_of(task: Any, where: str) -> str | list[dict[str, str]]:
    """The example's prompt: the task's system prompt and prompt as chat messages (a text
    prompt alone without a system prompt stays text); ConfigError for what reasonrl cannot
    send as text: no prompt, content parts that are not text, tool calls, tool messages."""
    data = task.data
    if data.prompt is None:
        raise ConfigError(f"{where}: refused: the task has no prompt (the user opens the conversation: a "
                          "simulated user, which only an Env of its own plays)")
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        if not messages:
            return data.prompt
        return [*messages, {"role": "user", "content": data.prompt}]
    for m in data.prompt:
        if m.role not in ("system", "user", "assistant") or getattr(m, "tool_calls", None) \
                or not isinstance(m.content, str):
            raise ConfigError(f"{where}: refused: its prompt holds a {m.role} message that is not plain text "
                              "(tool calls, tool results, images: reasonrl's endpoint takes text)")
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


def refusal(where: str, rollout: str, playable: list[str], refused: list[str]) -> str | None:
    """The start-up refusal of a taskset that uses `playable` (what verifiers' own rollout plays
    here) and `refused` (what nothing here plays) under `data.verifiers.rollout=rollout`, or None."""
    if refused:
        also = ""
        if playable and rollout == "reply":
            also = f"; it also uses {'; '.join(playable)}, which {ROUTE} plays"
        return f"{where}: refused: it uses {'; '.join(refused)}{also}. {NEITHER}"
    if playable and rollout == "reply":
        return (f"{where}: refused: it uses {'; '.join(playable)}, which need verifiers' own rollout: run it "
                f"as an agent episode, {ROUTE}. {NULL}")
    return None


def examples_of(target: str, args: dict, limit: int, where: str, rollout: str = "reply") -> list[Example]:
    """The taskset's tasks as examples (at most `limit`; 0 = all), each refused or kept."""
    try:
        taskset = load_taskset(target, args)
    except Exception as err:
        raise ConfigError(f"{where}: cannot load it: {type(err).__name__}: {err}") from None
    if taskset.INFINITE and not limit:
        raise ConfigError(f"{where}: an INFINITE taskset: set data.verifiers.limit")
    name = target.rpartition(":")[2] if ":" in target else target
    playable: list[str] = []
    refused = episode_loop(target, taskset)
    examples: list[Example] = []
    checked: set[type] = set()
    for task in taskset:
        if type(task) not in checked:  # what a task class uses is the same for its every task
            more, never = task_uses(task, taskset)
            playable, refused = playable + more, refused + never
            checked.add(type(task))
        refuse = refusal(where, rollout, playable, refused)
        if refuse:
            raise ConfigError(refuse)
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
    train = examples_of(v.taskset, dict(v.args), v.limit, where, v.rollout)
    held_out = []
    if v.val_args:
        held_out = examples_of(v.taskset, {**v.args, **v.val_args}, v.limit,
                               f"{where} (data.verifiers.val_args)", v.rollout)
    return train, held_out
