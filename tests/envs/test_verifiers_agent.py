"""verifiers' own rollout as an agent episode (`data.verifiers.rollout=verifiers`, `env.format=agent`,
`env.fn=reasonrl.envs.verifiers_agent:agent`; docs/env-verifiers.md) on the tiny model: a taskset
that reasonrl's reply refuses (a runtime its setup prepares, an MCP tool, rewards that read the
runtime: tests/fixtures/verifiers_agent_tasks.py) trains two steps; every episode's call is
recorded and trained (a row each, its sampled ids in the mask), the tool is offered to the model
in the recorded prompt, and each reward is verifiers' own (`Trace.reward`: 0.25 for the runtime
`setup` prepared, plus 1 when the reply holds the answer the runtime holds). The tool called by
hand through the chat harness (the tiny model calls none). The rules and what is refused still."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reasonrl.config import load_config
from reasonrl.data.tasks import load_examples
from reasonrl.errors import ConfigError

REPO = Path(__file__).parents[2]
NOTES = "tests.fixtures.verifiers_agent_tasks:Notes"  # importable: verifiers starts its tool server by module
AGENT = "reasonrl.envs.verifiers_agent:agent"
AGENT_KEYS = ["data.verifiers.rollout=verifiers", "env.format=agent", f"env.fn={AGENT}"]


def config(*overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", ["data.task=verifiers", "reward.task=verifiers",
                                                         *overrides])


def needs_all():
    for module, extra in (("verifiers.v1", "verifiers"), ("fastapi", "serve"), ("uvicorn", "serve"),
                          ("openai", "serve")):
        pytest.importorskip(module, reason=f"{module} is not installed (pip install 'reasonrl[{extra}]')")


@pytest.mark.parametrize("overrides, message", [
    (["data.verifiers.taskset=x.py:T", "data.verifiers.rollout=verifiers"],
     r"data.verifiers.rollout=verifiers: verifiers' own rollout runs as an agent episode: set "
     r"env.format=agent and env.fn=reasonrl.envs.verifiers_agent:agent \(got env.format=auto, env.fn=''\)"),
    (["data.verifiers.taskset=x.py:T", "env.format=agent", f"env.fn={AGENT}"],
     r"env.fn=reasonrl.envs.verifiers_agent:agent: it plays verifiers' own rollout of a verifiers taskset's "
     r"tasks: set data.task=verifiers and data.verifiers.rollout=verifiers"),
])
def test_config_rules(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(*overrides)


def test_the_reply_refuses_it_and_names_the_route():
    pytest.importorskip("verifiers.v1")
    with pytest.raises(ConfigError) as err:
        load_examples(config(f"data.verifiers.taskset={NOTES}").data, seed=0)
    assert str(err.value) == (
        f"data.verifiers.taskset={NOTES}: refused: it uses NoteTask.setup (a runtime prepared or read); "
        "tools (NotesTools: MCP servers whose calls have side effects); rewards that read more than the "
        "transcript: found(runtime), prepared(runtime) (runtime state from a custom rollout), which need "
        "verifiers' own rollout: run it as an agent episode, data.verifiers.rollout=verifiers "
        "env.format=agent env.fn=reasonrl.envs.verifiers_agent:agent (docs/env-verifiers.md). reasonrl plays "
        "a taskset as "
        "verifiers' null harness plays a task without tools: its prompt, one model reply, its @vf.reward "
        "functions of (task, trace)")
    train, _ = load_examples(config(f"data.verifiers.taskset={NOTES}", *AGENT_KEYS).data, seed=0)
    assert [e.ground_truth for e in train] == ["ab", "xyz"]


def test_what_its_rollout_here_does_not_play_is_still_refused():
    pytest.importorskip("verifiers.v1")
    target = f"{REPO / 'tests' / 'fixtures' / 'verifiers_custom_env.py'}:Interview"
    with pytest.raises(ConfigError, match=r"refused: it uses an Env of its own, InterviewEnv .*Neither "
                                          r"reasonrl's reply \(verifiers' null harness\) nor verifiers' own "
                                          r"rollout as reasonrl runs it \(reasonrl.envs.verifiers_agent: "):
        load_examples(config(f"data.verifiers.taskset={target}", *AGENT_KEYS).data, seed=0)


def test_verifiers_rollout_trains_two_steps_on_the_calls_it_made(tmp_path, monkeypatch):
    needs_all()
    from reasonrl.train.trainer import Trainer

    # the tool server is `python -m tests.fixtures.verifiers_agent_tasks`, run in a directory of its own
    paths = (str(REPO), os.environ.get("PYTHONPATH"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    trainer = Trainer(config(f"data.verifiers.taskset={NOTES}", *AGENT_KEYS, "trainer.batch_size=4",
                             "rollout.n=2", "rollout.max_new_tokens=8", "trainer.threads=1",
                             "trainer.progress=false", "tracking.report=false", "trainer.eval_every=0",
                             f"trainer.output_dir={tmp_path}", "trainer.run_name=r"))
    tokenizer = trainer.workers.tokenizer
    try:
        steps = [trainer.step() for _ in range(2)]
    finally:
        trainer.workers.close()
    for metrics, batch, _ in steps:
        r = batch.rollouts
        assert len(r) == 4 and batch.trainable.all()
        counts = ("agent/episodes", "agent/failed", "agent/calls_per_episode")
        assert [metrics[k] for k in counts] == [4, 0, 1]
        assert metrics["agent/rewards_given"] == 4 and metrics["agent/joined"] == 4
        for i in range(4):
            sampled, mask = r.completion_ids[i], r.token_mask[i]
            assert len(sampled) > 0 and sum(mask) == len(sampled)  # one call: all its ids sampled and trained
            prompt = tokenizer.decode(r.prompt_ids[i])
            assert "Read the note called" in prompt  # the MCP tool's schema, offered to the model
            assert r.examples[i].prompt in prompt
            expected = 0.25 + float(r.examples[i].ground_truth in r.texts[i])  # verifiers' own Trace.reward
            assert batch.rewards[i].item() == pytest.approx(expected)
        assert metrics["reward/errors"] == 0


def test_the_chat_harness_calls_a_tool_through_its_mcp_server(monkeypatch):
    """What the tiny model never does (call a tool), by hand: NotesTools served as verifiers serves a
    task's tools (the subprocess runtime), listed and called as `ChatHarness` does each tool call."""
    needs_all()
    import asyncio
    import json
    from contextlib import AsyncExitStack
    from types import SimpleNamespace

    from verifiers.v1.harnesses.utils.mcp import connect_mcp
    from verifiers.v1.mcp.launch import serve
    from verifiers.v1.runtimes import SubprocessConfig, provision_runtime

    from reasonrl.envs.verifiers_agent import ChatHarness
    from tests.fixtures.verifiers_agent_tasks import NotesConfig, NotesTools

    paths = (str(REPO), os.environ.get("PYTHONPATH"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))

    def call(name: str, arguments: str):
        return SimpleNamespace(id="c", function=SimpleNamespace(name=name, arguments=arguments))

    async def play():
        async with provision_runtime(SubprocessConfig()) as runtime, \
                serve(NotesTools(NotesConfig()), runtime) as url, AsyncExitStack() as stack:
            tools, dispatch, servers = await connect_mcp({"mcpServers": {"notes": {"url": url}}}, stack)
            name = tools[0]["function"]["name"]
            return name, [await ChatHarness._tool_result(call(name, a), dispatch, servers)
                          for a in (json.dumps({"name": "word"}), "{oops", "[]")] + [
                await ChatHarness._tool_result(call("nope", "{}"), dispatch, servers)]

    name, results = asyncio.run(play())
    assert name == "notes_read"
    assert results[0] in ("ab", [{"type": "text", "text": "ab"}])
    assert results[1].startswith("error: invalid JSON in tool arguments")
    assert results[2] == "error: tool arguments must be a JSON object, got list"
    assert results[3] == "error: unknown tool 'nope'"
