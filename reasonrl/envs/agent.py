"""An agent program as the environment (`env.format=agent`, docs/agents.md).

The episode is the user's program, not a class stepped by reasonrl's turn loop: either a
Python callable `agent(client, task) -> reward | None` (`env.fn=module:function` or
`path/file.py:function`; `client` is an `openai.OpenAI` whose base URL is the episode's route of
the endpoint), or a command run once per episode (`env.agent.command`) with `OPENAI_BASE_URL`,
`OPENAI_API_KEY` and `REASONRL_TASK` (the task as JSON, also on its stdin) in its environment,
whose last line of stdout is its reward (a number, or `null`/nothing). Either way the program
talks to the policy through the OpenAI-compatible endpoint, which records every call by its
token ids; `reasonrl.serve.agent_episodes` plays the episodes and turns the records into rows.

This module holds what needs no server: loading and checking the program (at start-up), the
task it is given, running one episode with a timeout (the command's process group is killed
past it), reading its reward, the failure reasons, and the `agent/` metrics.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from reasonrl.batch import Example
from reasonrl.config import EnvConfig
from reasonrl.envs.base import EnvSpec
from reasonrl.errors import ConfigError
from reasonrl.registry import ENV_FORMATS
from reasonrl.rewards.scoring import MAX_ABS_REWARD

API_KEY = "reasonrl"  # what OPENAI_API_KEY says: the endpoint checks none
# why an episode failed (each counted as agent/failed_<reason>): it raised (a command: a non-zero exit),
# ran past env.agent.timeout, called no model, sent a request the endpoint refused, had a call refused
# for another policy version (env.agent.pin_version), or returned what is not a reward
FAILURES = ("raised", "timeout", "no_call", "malformed", "stale_version", "bad_reward")
# per-row counts an agent's episodes carry (`EpisodeStats.agent`), besides failed_<reason>; version_sum and
# version_min: the sum and the least of the policy versions that served its calls (0 without a call)
COUNTS = ("calls", "chains", "untrained_calls", "other_sampling", "given", "dropped", "version_sum",
          "version_min")


class AgentTimeout(Exception):
    """A command ran past env.agent.timeout (its process group was killed)."""


class AgentExit(Exception):
    """A command exited with a non-zero status."""


class BadReward(ValueError):
    """A program's reward that is not a finite number (or None)."""


def check_reward(value: Any) -> float | None:
    """A program's return value as a reward: None, or a finite number within the float32 bound
    reward functions have (`MAX_ABS_REWARD`); `BadReward` naming it otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or abs(value) > MAX_ABS_REWARD:
        raise BadReward(f"the agent returned {value!r}; expected a finite number (at most {MAX_ABS_REWARD:g} "
                        "in size) or None")
    return float(value)


def jsonable(value: Any) -> Any:
    """`value` with what JSON cannot hold dropped (an example's meta may carry anything)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items() if jsonable(v) is not None}
        if isinstance(value, (list, tuple)):
            return [jsonable(v) for v in value]
        return None


def task_of(example: Example, prompt_ids: list[int], seed: int | None, sample: int, sampling: dict) -> dict:
    """What an agent is given for one episode (JSON): the example's `prompt` as it is and as chat
    `messages`, its `ground_truth` and `data_source` (for an agent that scores itself; never show
    them to the model), `prompt_token_ids` (the prompt as the turn loop renders it: the chat
    template, data.system_prompt), the prompt's sampling `seed` and this episode's `sample` index
    (None when greedy), the rollout's `sampling` (temperature, top_p, top_k, max_tokens), and
    the example's `meta`."""
    prompt = example.prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return {"prompt": prompt, "messages": messages, "ground_truth": example.ground_truth,
            "data_source": example.data_source, "prompt_token_ids": list(prompt_ids), "seed": seed,
            "sample": sample, "sampling": sampling, "meta": jsonable(dict(example.meta))}


@dataclass(frozen=True)
class AgentProgram:
    """The run's agent: a callable (`fn`) or a command line (`argv`)."""

    name: str
    fn: Callable[..., Any] | None = None
    argv: tuple[str, ...] = ()

    def wall_timeout(self, timeout: float) -> float:
        """The episode's timeout as `run_calls` enforces it: a command enforces its own (and kills
        its processes), so the thread's is a backstop a little later."""
        return timeout if self.fn is not None else timeout + 10.0

    def episode(self, base_url: str, task: dict, timeout: float) -> Callable[[], float | None]:
        """One episode as a zero-argument call (for `reasonrl.envs.run_calls`): the program's
        reward, checked (`check_reward`), or an exception saying why there is none."""
        if self.fn is not None:
            return lambda: check_reward(self._call(base_url, task, timeout))
        return lambda: self._run(base_url, task, timeout)

    def _call(self, base_url: str, task: dict, timeout: float) -> Any:
        import openai

        client = openai.OpenAI(base_url=base_url, api_key=API_KEY, max_retries=0, timeout=timeout)
        try:
            return self.fn(client, task)
        finally:
            client.close()

    def _run(self, base_url: str, task: dict, timeout: float) -> float | None:
        text = json.dumps(task)
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": API_KEY, "REASONRL_TASK": text}
        pipe = subprocess.PIPE
        proc = subprocess.Popen(self.argv, stdin=pipe, stdout=pipe, stderr=pipe, text=True, env=env,
                                start_new_session=True)
        try:
            out, err = proc.communicate(text, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the command and whatever it started
            proc.communicate()
            raise AgentTimeout(f"the command ran past env.agent.timeout={timeout:g} s") from None
        if proc.returncode != 0:
            tail = (err.strip().splitlines() or [""])[-1][:300]
            raise AgentExit(f"the command exited with status {proc.returncode}: {tail}")
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        if not lines or lines[-1] in ("null", "None"):
            return None
        try:
            value = json.loads(lines[-1])
        except ValueError:
            raise BadReward(f"the command's last line of output is {lines[-1][:80]!r}; expected a number or "
                            "null") from None
        return check_reward(value)


def failure_of(error: str | None, timed_out: bool) -> str | None:
    """The failure reason (`FAILURES`) of a `run_calls` outcome, None when it returned."""
    if timed_out or (error or "").startswith(AgentTimeout.__name__):
        return "timeout"
    if error is None:
        return None
    if error.startswith(BadReward.__name__):
        return "bad_reward"
    return "raised"


def load_program(cfg: EnvConfig) -> AgentProgram:
    """The program `env.fn` (a callable of (client, task)) or `env.agent.command` names, checked:
    ConfigError naming the key and what is wrong."""
    if cfg.agent.command.strip():
        try:
            argv = tuple(shlex.split(cfg.agent.command))
        except ValueError as err:
            raise ConfigError(f"env.agent.command: cannot split {cfg.agent.command!r}: {err}") from None
        if shutil.which(argv[0]) is None and not os.path.isfile(argv[0]):
            raise ConfigError(f"env.agent.command: {argv[0]!r} is not a program found on PATH or a file")
        return AgentProgram(cfg.agent.command, argv=argv)
    from reasonrl.rewards.verifiers import load_target

    try:
        fn = load_target(cfg.fn)
    except Exception as err:
        raise ConfigError(f"env.fn: cannot load {cfg.fn!r}: {type(err).__name__}: {err}") from None
    if inspect.isclass(fn) or not callable(fn):
        raise ConfigError(f"env.fn={cfg.fn}: env.format=agent needs a function agent(client, task), got "
                          f"{'the class ' + fn.__name__ if inspect.isclass(fn) else type(fn).__name__}")
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError as err:
        raise ConfigError(f"env.fn={cfg.fn}: an agent is called as agent(client, task): {err}") from None
    except ValueError:  # no signature to read
        pass
    import importlib.util

    if importlib.util.find_spec("openai") is None:
        raise ConfigError(f"env.fn={cfg.fn}: an agent function is given an `openai` client, which is not "
                          "installed: pip install openai (or run the agent as env.agent.command)")
    return AgentProgram(cfg.fn, fn=fn)


@ENV_FORMATS.register("agent", doc="an agent program: agent(client, task) -> reward | None, or a command",
                      needs=None, detect=None)
def agent_environment(cfg: EnvConfig) -> EnvSpec:
    """`env.format=agent`: the program (`load_program`), played by the `agent` episode runner
    (`reasonrl.serve.agent_episodes`), which needs the `serve` extra (fastapi, uvicorn)."""
    import importlib.util

    program = load_program(cfg)
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"env.format=agent: the endpoint its episodes call needs {' and '.join(missing)}: "
                          "pip install 'reasonrl[serve]'")
    return EnvSpec(f"agent:{program.name}", lambda: program, (), cfg, runner="agent")


def agent_metrics(agent: dict[str, torch.Tensor], trained_version: int | None = None) -> dict[str, float]:
    """agent/ metrics of a batch of agent episodes (`EpisodeStats.agent`): episodes; joined (all
    their calls in one sequence) and split (more than one: a call that did not extend the
    ones before); calls per episode; calls in no trained sequence (0: every sequence trains, a row
    each); calls sampled otherwise than the rollout (temperature, top_p, top_k); rewards the
    program gave; episodes dropped; failures, in all and by reason. Read from each episode's
    first row (`Rollouts.episode_rows`): its other rows' counts are 0.

    With `trained_version` (the policy version the step's update starts from), each call's
    staleness, that version minus the one that served it: `agent/staleness_mean` over the calls
    and `agent/staleness_max` (both absent when no episode made a call)."""
    chains, calls = agent["chains"], agent["calls"]
    out = {"agent/episodes": float(len(calls)), "agent/joined": float((chains == 1).sum().item()),
           "agent/split": float((chains > 1).sum().item()),
           "agent/calls_per_episode": calls.float().mean().item() if len(calls) else 0.0,
           "agent/untrained_calls": float(agent["untrained_calls"].sum().item()),
           "agent/other_sampling": float(agent["other_sampling"].sum().item()),
           "agent/rewards_given": float(agent["given"].sum().item()),
           "agent/dropped": float(agent["dropped"].sum().item())}
    failed = torch.zeros(len(calls), dtype=torch.long)
    for reason in FAILURES:
        failed = failed + agent[f"failed_{reason}"]
        out[f"agent/failed_{reason}"] = float(agent[f"failed_{reason}"].sum().item())
    out["agent/failed"] = float((failed > 0).sum().item())
    called = calls > 0
    if trained_version is not None and bool(called.any()):
        total = calls.sum().item()
        out["agent/staleness_mean"] = trained_version - agent["version_sum"].sum().item() / total
        out["agent/staleness_max"] = float(trained_version - agent["version_min"][called].min().item())
    return out
