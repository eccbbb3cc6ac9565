"""verifiers' own rollout of a task as an agent episode (`data.verifiers.rollout=verifiers`,
`env.format=agent`, `env.fn=reasonrl.envs.verifiers_agent:agent`; docs/env-verifiers.md).

`agent(client, task)` rebuilds the episode's verifiers v1 task from the example
(`task["meta"]["verifiers"]`, as a reward worker does) and runs verifiers' own rollout of it:
`verifiers.v1.Agent.run(task)`, which opens a `Rollout` (`verifiers/v1/rollout.py`): a
subprocess runtime (`SubprocessConfig`: a temporary working directory on this machine), the
task's `setup`, its MCP tool servers (`Task.toolsets`, `Taskset.toolsets`; served by verifiers
on the subprocess runtime with this Python), verifiers' interception server (its `@vf.intercept`
hooks, `@vf.stop` conditions, `State`, turn and token limits), then the harness, then
`finalize` and `Task.score(trace, runtime)`. The reward returned is the trace's own
(`Trace.reward`: the weighted sum of the task's `@vf.reward` functions, runtime rewards
included); a trace that is not ok (a hook, a tool server or the harness failed) raises, so the
episode fails `raised` with verifiers' error.

The model: verifiers' interception server relays every model call of the harness to the
episode's route of reasonrl's endpoint (`EvalClientConfig(base_url=...)`: its
`/v1/chat/completions`, non-streaming), with the run's sampling imposed (`SamplingConfig`:
temperature, top_p, top_k, max_tokens: verifiers' `apply_overrides`) and no seed, so each call
is seeded by its episode (`reasonrl.serve.agent_episodes.call_seed`). reasonrl records the calls
by their ids and trains them as any agent's.

The harness is `ChatHarness`, verifiers' null harness's chat loop run in this process: the
task's system prompt and prompt, the task's MCP tools offered to the model, each tool call
dispatched to its server (`verifiers.v1.harnesses.utils.mcp.connect_mcp` / `call_mcp`), until a
reply without a tool call. verifiers' own `null` and `bash` harnesses cannot be used here: they
are PEP 723 programs that `uv` installs from PyPI when a rollout starts
(`Runtime.prepare_uv_script`), and they stream (`stream=True`), which reasonrl's endpoint
refuses. What this module does not play is refused at start-up by
`reasonrl.envs.verifiers_tasks` (an Env or Harness of the taskset's own, containers, judges,
a task without a prompt).
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AsyncExitStack
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

from reasonrl.rewards.verifiers_taskset import rebuild_task

__all__ = ["ChatHarness", "ChatHarnessConfig", "agent"]

# verifiers loads a harness by an id naming the module that exports it (`__all__`), tried first under
# `verifiers.v1.harnesses.<id>`, which a dotted id breaks: this module is registered under a plain name
HARNESS_ID = "reasonrl_verifiers_chat"
MODEL = "policy"  # the name reasonrl's training endpoint serves
KEY_VAR = "REASONRL_VERIFIERS_KEY"  # the API key's variable: unset, so "EMPTY" (the endpoint checks none)


class ChatHarnessConfig(vf.HarnessConfig):
    pass


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """verifiers' null harness's loop (`harnesses/utils/core.py:run_chat_loop`) in process: chat
    completions (not streamed) through the rollout's interception endpoint, the task's MCP tools
    offered and called, until a reply without a tool call, a `@vf.stop` or a limit."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any) -> Any:
        import openai
        from verifiers.v1.dialects.chat import message_to_wire

        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt is not None:
            messages.extend(message_to_wire(m) for m in prompt)
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        async with AsyncExitStack() as stack:
            stack.push_async_callback(client.close)
            servers_config = {"mcpServers": {name: {"url": url, "timeout": self.config.tool_timeout}
                                             for name, url in mcp_urls.items()}}
            tools, dispatch, servers = await connect_mcp(servers_config, stack) if mcp_urls else ([], {}, {})
            while True:
                try:
                    completion = await client.chat.completions.create(
                        model=ctx.model, messages=messages, **({"tools": tools} if tools else {}))
                except openai.APIStatusError:
                    if trace.stop_condition is not None:  # a @vf.stop or a limit refused the turn
                        break
                    raise
                message = completion.choices[0].message
                messages.append(message.model_dump(exclude_none=True, include={"role", "content",
                                                                               "tool_calls"}))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    content = await self._tool_result(call, dispatch, servers)
                    messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                     "content": content})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")

    @staticmethod
    async def _tool_result(call: Any, dispatch: dict, servers: dict) -> Any:
        """The tool's output, or the error the null harness's loop gives the model instead."""
        try:
            arguments = json.loads(call.function.arguments or "{}")
        except json.JSONDecodeError as err:
            return f"error: invalid JSON in tool arguments ({err}); resend the call with valid JSON"
        if not isinstance(arguments, dict):
            return f"error: tool arguments must be a JSON object, got {type(arguments).__name__}"
        if call.function.name not in dispatch:
            return f"error: unknown tool {call.function.name!r}"
        return await call_mcp(servers, dispatch, call.function.name, arguments)


sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])


def agent_config(base_url: str, sampling: dict, timeout: float | None) -> Any:
    """The verifiers agent of one episode: `ChatHarness` on a subprocess runtime, the model
    behind the episode's route, the run's sampling, the episode's timeout as the rollout's."""
    from verifiers.v1.configs.agent import TimeoutConfig

    fields = {"temperature": sampling.get("temperature"), "top_p": sampling.get("top_p"),
              "max_tokens": sampling.get("max_tokens")}
    if sampling.get("top_k"):
        fields["top_k"] = sampling["top_k"]
    return vf.AgentConfig(harness=ChatHarnessConfig(id=HARNESS_ID), runtime=vf.SubprocessConfig(),
                          model=MODEL, client=vf.EvalClientConfig(base_url=base_url, api_key_var=KEY_VAR),
                          sampling=vf.SamplingConfig(**{k: v for k, v in fields.items() if v is not None}),
                          timeout=TimeoutConfig(rollout=timeout))


async def play(task: Any, config: Any) -> Any:
    """verifiers' rollout of `task` by the agent of `config`: its trace."""
    async with vf.Agent(config) as runner:
        return await runner.run(task)


def agent(client: Any, task: dict) -> float:
    """An episode of `env.format=agent`: verifiers' rollout of the example's task against the
    episode's route; its trace's reward (RuntimeError with verifiers' errors when it failed)."""
    info = (task.get("meta") or {}).get("verifiers")
    if not isinstance(info, dict):
        raise ValueError("reasonrl.envs.verifiers_agent:agent plays examples of data.task=verifiers "
                         "(the task's meta.verifiers is missing)")
    timeout = client.timeout if isinstance(client.timeout, (int, float)) else None
    config = agent_config(str(client.base_url), task["sampling"], timeout)
    trace = asyncio.run(play(rebuild_task(info), config))
    if not trace.ok or trace.reward is None:
        errors = "; ".join(f"{e.type}: {e.message}" for e in trace.errors) or "no reward"
        raise RuntimeError(f"verifiers' rollout failed: {errors}"[:2000])
    return float(trace.reward)
