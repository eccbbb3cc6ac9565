"""Which reasoning-gym tasks can SmolLM2-135M-Instruct learn with GRPO? `reasonrl probe` over
every task, one verdict per task: the table of docs/reasoning-gym.md.

    python bench/reasoning_gym_probe.py                          # every task (~40 min, 2 busy cores)
    python bench/reasoning_gym_probe.py --tasks leg_counting,gcd  # some of them
    python bench/reasoning_gym_probe.py --from-json probe.json    # the table again, from a run's output
    python bench/reasoning_gym_probe.py --tasks leg_counting --prompts 8 \
        'data.reasoning_gym.options={max_animals: 1}'               # with a task's options

One `reasonrl probe` command (printed before it runs) with configs/reasoning_gym.yaml, the
embedded default model (model.path unset): `--prompts` held-out problems of each task (seed
1,000,000 on), each sampled rollout.n = 8 times at T = 1 with 32 new tokens, the answer in
\\boxed{} after one worked exchange, as that config trains. The command's held-out set lists the
tasks (data.train_path=reasoning_gym:<a>,reasoning_gym:<b>,...; data.reasoning_gym.size=1: the
training set is not used), so the model loads once and each generate call is one task's
prompts x samples. Light on purpose: no entropy pass (it decides no verdict), and prompts cut
from the left at 2,048 tokens (data.truncate_prompts=left; the probe says how many and which
task). Per task, the probe's own metrics (`reasonrl.evaluate.probe_metrics` per data_source, in
the JSON) and verdict (`probe_verdict`, default thresholds: accuracy 0.10-0.80, reward variance
> 0.05), plus the share of samples that put an answer in \\boxed{} at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reasonrl.evaluate import ProbeThresholds, probe_verdict  # noqa: E402

ORDER = {"fine": 0, "too_easy": 1, "low_variance": 2, "too_hard": 3}


def all_tasks() -> list[str]:
    from reasonrl.data.reasoning_gym import task_names

    return task_names()


def probe_command(tasks: list[str], prompts: int, n: int, max_new_tokens: int, output: str,
                  overrides: list[str]) -> list[str]:
    return ["reasonrl", "probe", "--config", "configs/reasoning_gym.yaml", "--no-entropy", "--no-progress",
            "--n", str(n), "--max-new-tokens", str(max_new_tokens), "--batch-size", str(prompts * n),
            "--output", output,
            "data.train_path=" + ",".join(f"reasoning_gym:{t}" for t in tasks),
            "data.reasoning_gym.size=1", f"data.reasoning_gym.val_size={prompts}",
            "data.max_prompt_tokens=2048", "data.truncate_prompts=left", *overrides]


def table(report: dict) -> tuple[list[dict], str]:
    """One row per task, best verdict first, then by accuracy; and the Markdown table."""
    th = ProbeThresholds(**{k: v for k, v in report["verdict"]["thresholds"].items()})
    boxed: dict[str, list[int]] = {}
    for prompt in report["prompts"]:
        counts = boxed.setdefault(prompt["data_source"], [0, 0])
        counts[0] += sum(s["answer"] is not None for s in prompt["samples"])
        counts[1] += len(prompt["samples"])
    rows = []
    for source, m in report["sources"].items():
        verdict = probe_verdict(m["accuracy"], m["reward_variance"], None, th)
        rows.append({"task": source.removeprefix("reasoning_gym/"), "accuracy": m["accuracy"],
                     "reward_mean": m["reward_mean"], "reward_variance": m["reward_variance"],
                     "all_wrong": m["all_wrong_frac"], "answered": boxed[source][0] / boxed[source][1],
                     "verdict": verdict.status})
    rows.sort(key=lambda r: (ORDER[r["verdict"]], -r["accuracy"], -r["reward_mean"], r["task"]))
    lines = ["| task | accuracy | reward mean | reward variance | prompts all wrong | answered in \\boxed{} "
             "| verdict |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['task']} | {r['accuracy']:.3f} | {r['reward_mean']:.3f} | {r['reward_variance']:.3f} | "
              f"{r['all_wrong']:.2f} | {r['answered']:.2f} | {r['verdict']} |" for r in rows]
    return rows, "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("overrides", nargs="*", help="config overrides for the probe, e.g. the tasks' options: "
                   "'data.reasoning_gym.options={leg_counting: {max_animals: 2}}'")
    p.add_argument("--tasks", help="comma-separated task names (default: every reasoning-gym task)")
    p.add_argument("--prompts", type=int, default=3, help="held-out problems per task (3)")
    p.add_argument("--n", type=int, default=8, help="samples per problem (8: the config's rollout.n)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per sample (32, as it trains)")
    p.add_argument("--output", default="reasoning_gym_probe.json", help="the probe's JSON (every completion)")
    p.add_argument("--from-json", help="print the table of an earlier run's JSON instead of running")
    args = p.parse_args()
    wall = None
    if not args.from_json:
        tasks = args.tasks.split(",") if args.tasks else all_tasks()
        command = probe_command(tasks, args.prompts, args.n, args.max_new_tokens, args.output, args.overrides)
        long = len(tasks) > 4  # the path of every task: said by its count
        shown = [f"data.train_path=<{len(tasks)} tasks>" if c.startswith("data.train_path=") and long
                 else shlex.quote(c) for c in command]
        print(" ".join(shown), flush=True)
        start = time.perf_counter()
        env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, check=True)
        wall = time.perf_counter() - start
    report = json.loads(Path(args.from_json or args.output).read_text())
    rows, text = table(report)
    print(text)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ORDER}
    t, prompts = report["times"], len(report["prompts"]) // max(len(rows), 1)
    print(f"\n{len(rows)} tasks: " + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
          + f"; {prompts} prompts x {int(report['settings']['n'])} samples per task, "
          f"{report['settings']['max_new_tokens']} new tokens; probe wall {t['wall_s']:.0f} s (generate "
          f"{t['generate_s']:.0f} s, {t['generated_tokens_per_s']:.0f} tokens/s)"
          + (f"; the whole command {wall:.0f} s" if wall is not None else "")
          + f"; load now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
