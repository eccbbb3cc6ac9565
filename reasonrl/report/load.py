"""A run directory read back for the report: its metrics by step, samples, config and summary.

The report reads nothing but these files, so a report can be built from any run, finished,
killed or copied from another machine: a line a killed run left half-written is skipped and
counted, never fatal. Every other module of the package works on the `Run` this returns.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from reasonrl.errors import ReportError


@dataclass
class Run:
    path: Path
    name: str
    metrics: dict[int, dict]  # step -> metrics (a step logged twice, e.g. after a resume: last wins)
    samples: list[dict]
    config_text: str
    config: dict
    summary: dict | None
    skipped_lines: int = 0  # unreadable lines (a run killed mid-write)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps at which `key` was logged as a finite number, and its values."""
        steps, values = [], []
        for step in sorted(self.metrics):
            value = self.metrics[step].get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(step)
                values.append(float(value))
        return steps, values

    def has(self, key: str) -> bool:
        return bool(self.series(key)[0])

    def keys(self) -> set[str]:
        return {k for m in self.metrics.values() for k in m}


def eval_description(config: dict) -> str:
    """The held-out evaluation's settings in words, from a run's resolved config (the `eval`
    section the trainer's eval reads; keys a config lacks take the schema's defaults):
    "greedy, 1 sample per prompt, up to 16 new tokens" or "4 samples per prompt at T=0.6,
    top-p 0.95, top-k 20, up to 1024 new tokens". A record's own `extra_info.n` is not in the
    config and is not described."""
    from reasonrl.config import EvalConfig, RolloutConfig

    def section(name: str) -> dict:
        value = config.get(name) if isinstance(config, dict) else None
        return value if isinstance(value, dict) else {}

    ev, defaults = section("eval"), EvalConfig()
    n, temperature = ev.get("n", defaults.n), ev.get("temperature", defaults.temperature)
    top_p, top_k = ev.get("top_p", defaults.top_p), ev.get("top_k", defaults.top_k)
    tokens = ev.get("max_new_tokens", defaults.max_new_tokens) or section("rollout").get(
        "max_new_tokens", RolloutConfig().max_new_tokens)
    samples = f"{n} sample{'s' if n != 1 else ''} per prompt"
    if not temperature:
        return f"greedy, {samples}, up to {tokens} new tokens"
    parts = [f"{samples} at T={temperature:g}"]
    parts += [f"top-p {top_p:g}"] if top_p < 1 else []
    parts += [f"top-k {top_k}"] if top_k else []
    return ", ".join([*parts, f"up to {tokens} new tokens"])


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    rows, bad = [], 0
    if not path.exists():
        return rows, bad
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not (path / "metrics.jsonl").is_file():
        raise ReportError(f"{path}: not a run directory (no metrics.jsonl)")
    records, bad = _read_jsonl(path / "metrics.jsonl")
    metrics: dict[int, dict] = {}
    for record in records:
        step = record.pop("step")
        metrics.setdefault(step, {}).update(record)
    samples, bad_samples = _read_jsonl(path / "samples.jsonl")
    config_text, config = "", {}
    if (path / "config.yaml").is_file():
        config_text = (path / "config.yaml").read_text(encoding="utf-8", errors="replace")
        try:
            config = yaml.safe_load(config_text) or {}
        except yaml.YAMLError:
            config = {}
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            summary = None
    name = path.resolve().name
    return Run(path, name, metrics, samples, config_text, config if isinstance(config, dict) else {},
               summary, bad + bad_samples)
