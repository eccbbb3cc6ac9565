"""A run's or an evaluation's good answers as SFT records (`reasonrl data traces`): rejection
sampling / expert iteration (STaR, Zelikman et al. 2022; RAFT, Dong et al. 2023; ReST, Gulcehre
et al. 2023): keep the sampled completions whose reward is at least R, train on them with
`reasonrl sft`. With a teacher's or a bigger model's samples it distils that model's good answers.

Two sources, each read as it was written:

- a run directory (`train`): its `samples.jsonl`, which holds `trainer.log_samples` completions
  a step (one per group of the step's first groups), not every completion of the run: a sample
  of what the policy wrote, step by step;
- a `reasonrl eval` (or `probe`) `--output` JSON: every completion of every prompt, with its
  reward; `reasonrl eval --model TEACHER --data PROBLEMS --n 8 --temperature 1 --output F.json`
  samples as many as wanted.

Each record keeps what `sft` needs to show the model the prompt `train` showed it: the prompt
(text, or its messages), the system prompt the run resolved (as a system message, which `sft`
keeps over its own `data.system_prompt`), and the completion. A multi-turn episode is written as
`messages` (the model's turns as assistant messages, each observation as a tool message after a
tool call, else a user message) when the run rendered observations as chat messages; with
`env.observation_format=tagged` an observation sits inside the model's turn, which a record of
messages cannot mask, so such samples are refused. Completions cut at the token limit are left
out: they never ended, and `sft` would teach the model to stop there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from reasonrl.config import DataConfig
from reasonrl.data import system_prompt_for
from reasonrl.errors import DataError


@dataclass
class Source:
    """One source's samples and the settings that rendered them."""

    path: Path
    samples: list[dict]  # {prompt, ground_truth, data_source, completion, reward, truncated, turns?, where}
    system_prompt: str = ""
    apply_chat_template: bool = True
    observation_format: str = "tagged"
    kind: str = "run"  # run | eval
    notes: list[str] = field(default_factory=list)


def _system_prompt(data: dict) -> str:
    """The system prompt a config's `data` section resolves to (`system_prompt_for`)."""
    task, system_prompt = data.get("task", "arithmetic"), data.get("system_prompt", "auto")
    return system_prompt_for(DataConfig(task=task, system_prompt=system_prompt))


def read_run(run: Path) -> Source:
    """A run directory's samples.jsonl (every line a step's sample), with its config's settings."""
    samples_file, config_file = run / "samples.jsonl", run / "config.yaml"
    if not samples_file.is_file():
        raise DataError(f"{run}: no samples.jsonl (not a run directory, or a run that logged no samples)")
    try:
        config = yaml.safe_load(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    except yaml.YAMLError as err:
        raise DataError(f"{config_file}: not readable YAML ({err})") from None
    config = config if isinstance(config, dict) else {}
    data, env = config.get("data") or {}, config.get("env") or {}
    samples = []
    for lineno, line in enumerate(samples_file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{samples_file}:{lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict) or "reward" not in row or "completion" not in row:
            what = "an SFT run's record (it has no reward)" if isinstance(row, dict) and "trained" in row \
                else "not a sample of `reasonrl train`"
            raise DataError(f"{samples_file}:{lineno}: {what}; give a `train` run or a `reasonrl eval "
                            "--output` file")
        samples.append({**row, "where": f"{samples_file}:{lineno}"})
    return Source(run, samples, _system_prompt(data), data.get("apply_chat_template", True),
                  env.get("observation_format", "tagged"), "run",
                  ["its samples.jsonl holds trainer.log_samples completions a step (one per group), not "
                   "every completion: `reasonrl eval --n K --output F.json` writes them all"])


def read_eval(path: Path) -> Source:
    """A `reasonrl eval` / `probe` `--output` file: every prompt's samples."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(report, dict) or not isinstance(report.get("prompts"), list):
        raise DataError(f"{path}: not a `reasonrl eval --output` file (no 'prompts' list)")
    settings = report.get("settings") or {}
    samples = []
    for i, prompt in enumerate(report["prompts"], start=1):
        for k, sample in enumerate(prompt.get("samples") or [], start=1):
            samples.append({"prompt": prompt.get("prompt"), "ground_truth": prompt.get("ground_truth"),
                            "data_source": prompt.get("data_source"), **sample,
                            "where": f"{path}: prompt {i} sample {k}"})
    return Source(path, samples, settings.get("system_prompt", ""), settings.get("apply_chat_template", True),
                  settings.get("observation_format", "tagged"), "eval")


def read_source(path: str | Path) -> Source:
    path = Path(path)
    if path.is_dir():
        return read_run(path)
    if path.suffix == ".json" and path.is_file():
        return read_eval(path)
    raise DataError(f"{path}: give a run directory (runs/NAME) or a `reasonrl eval --output` JSON file")


def prompt_messages(prompt: str | list, source: Source) -> list[dict] | str:
    """The prompt as `train` rendered it: its messages with the run's system prompt first (unless
    they open with their own), or a text prompt as it is when that is all it needs."""
    if isinstance(prompt, str) and (not source.apply_chat_template or not source.system_prompt):
        return prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if source.system_prompt and source.apply_chat_template and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": source.system_prompt}, *messages]
    return messages


def to_sft_record(sample: dict, source: Source) -> dict:
    """One sample as an SFT record: {prompt, completion} (or {messages} for a multi-turn episode),
    with its ground truth, data source, reward and where it came from."""
    prompt = prompt_messages(sample["prompt"], source)
    keep = {"ground_truth": sample.get("ground_truth"), "data_source": sample.get("data_source"),
            "reward": sample.get("reward"), "origin": sample["where"]}
    turns = sample.get("turns")
    if not turns:
        return {"prompt": prompt, "completion": sample["completion"], **keep}
    if source.observation_format != "chat":
        raise DataError(f"{sample['where']}: a multi-turn episode whose observations were written inside "
                        "the model's turn (env.observation_format=tagged): a record of messages cannot keep "
                        "them out of the loss; trace a run or eval with env.observation_format=chat")
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    for turn in turns:
        messages.append({"role": "assistant", "content": turn.get("model", "")})
        if turn.get("observation") is not None:
            messages.append({"role": "tool" if turn.get("call") else "user", "content": turn["observation"]})
    while messages[-1]["role"] != "assistant":  # a last observation the model never answered
        messages.pop()
    return {"messages": messages, **keep}


@dataclass
class Traces:
    records: list[dict]
    samples: int  # every sample read
    passed: int  # at or above the reward, not truncated
    truncated: int  # at or above the reward but cut at the token limit: left out
    duplicates: int  # dropped by --dedupe


def collect_traces(paths: list[str | Path], min_reward: float, dedupe: bool) -> tuple[Traces, list[Source]]:
    """The SFT records of every sample of `paths` whose reward is at least `min_reward` and that
    was not cut at the token limit; with `dedupe`, each (prompt, completion) once."""
    sources = [read_source(p) for p in paths]
    records, seen = [], set()
    samples = passed = truncated = duplicates = 0
    for source in sources:
        for sample in source.samples:
            samples += 1
            reward = sample.get("reward")
            if not isinstance(reward, (int, float)) or not math.isfinite(reward) or reward < min_reward:
                continue
            if sample.get("truncated"):
                truncated += 1
                continue
            passed += 1
            record = to_sft_record(sample, source)
            key = json.dumps([record.get("prompt"), record.get("completion"), record.get("messages")],
                             sort_keys=True)
            if dedupe and key in seen:
                duplicates += 1
                continue
            seen.add(key)
            records.append(record)
    return Traces(records, samples, passed, truncated, duplicates), sources
