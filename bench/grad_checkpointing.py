"""Gradient checkpointing (`optim.gradient_checkpointing`) on the default model: peak memory and
seconds per update with and without it, the same update otherwise.

    .venv/bin/python bench/grad_checkpointing.py                      # SmolLM2-135M-Instruct
    .venv/bin/python bench/grad_checkpointing.py --rows 8 --prompt 64 --completion 256 --updates 3

Each setting runs in its own process (peak RSS is a process's high-water mark): load the model,
build the policy worker with the run's defaults (lean kernels on, fp32, AdamW) and the setting,
then time `train_step` on one fixed random batch (`--rows` completions of `--completion` tokens
after a `--prompt`-token prompt, one micro-batch of all rows unless `--micro-batch-size`), after
one warm-up update. Three settings: the run's default (shared-prompt micro-batches), the plain
layout that checkpointing uses, and checkpointing. Prints the CPU, the load average before and
after each setting, and a table: peak RSS, RSS after loading (so the update's own growth shows),
seconds per update, and the last update's loss and gradient norm (equal: the same update).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported


def _rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def child(args: argparse.Namespace) -> dict:
    import random

    import torch

    from reasonrl.batch import TrainBatch
    from reasonrl.config import AlgoConfig, OptimConfig
    from reasonrl.model.load import load_model_and_tokenizer
    from reasonrl.workers.policy import PolicySettings, PolicyWorker

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    model, tokenizer = load_model_and_tokenizer(args.model, torch.float32, seed=0)
    optim = OptimConfig(lr=1e-6, micro_batch_size=args.micro_batch_size or args.rows,
                        lean_kernels=not args.no_kernels, gradient_checkpointing=args.checkpointing,
                        share_prompt=not args.plain)
    worker = PolicyWorker(model, tokenizer.pad_token_id,
                          PolicySettings(AlgoConfig(), optim, total_steps=args.updates + 1,
                                         max_response_length=args.completion))
    loaded = _rss_gib()
    rng = random.Random(0)
    groups = max(1, args.rows // 4)  # GRPO groups of 4 completions sharing a prompt
    prompts = [[rng.randrange(100, 40000) for _ in range(args.prompt)] for _ in range(groups)]
    prompt_ids = [prompts[i % groups] for i in range(args.rows)]
    completion_ids = [[rng.randrange(100, 40000) for _ in range(args.completion)] for _ in range(args.rows)]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(args.rows)])
    batch = TrainBatch(prompt_ids, completion_ids, advantages)
    worker.train_step(batch)  # warm-up: allocator, kernels, optimizer state
    seconds = []
    for _ in range(args.updates):
        t = time.perf_counter()
        metrics = worker.train_step(batch)
        seconds.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return {"checkpointing": args.checkpointing, "kernels": not args.no_kernels,
            "share_prompt": worker.optim.share_prompt, "peak_rss_gib": peak, "rss_after_load_gib": loaded,
            "update_s": sum(seconds) / len(seconds), "update_s_all": seconds,
            "loss": metrics["train/loss"], "grad_norm": metrics["train/grad_norm"]}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="", help="model.path ('' = SmolLM2-135M-Instruct)")
    p.add_argument("--rows", type=int, default=8, help="completions in the batch")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    p.add_argument("--completion", type=int, default=256, help="completion tokens per row")
    p.add_argument("--micro-batch-size", type=int, default=0, help="rows per forward/backward (0 = all)")
    p.add_argument("--updates", type=int, default=3, help="timed updates after one warm-up")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = one per core)")
    p.add_argument("--no-kernels", action="store_true", help="optim.lean_kernels=false")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return 0
    print(f"{cpu_model()}, {os.cpu_count()} cores; batch {args.rows} x ({args.prompt} + {args.completion}) "
          f"tokens, micro-batch {args.micro_batch_size or args.rows}, lean kernels "
          f"{'off' if args.no_kernels else 'on'}", flush=True)
    rows = []
    # the run's default (shared-prompt micro-batches), the same layout checkpointing uses, checkpointing
    for extra in ([], ["--plain"], ["--checkpointing"]):
        cmd = [sys.executable, __file__, "--child", *sys.argv[1:], *extra]
        load_before = os.getloadavg()[0]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        result["load"] = (load_before, os.getloadavg()[0])
        rows.append(result)
    print(f"{'checkpointing, layout':<24}{'peak RSS GiB':>14}{'after load':>12}{'s / update':>12}"
          f"{'loss':>12}{'grad norm':>12}{'load (1 min)':>16}")
    for r in rows:
        name = f"{'on' if r['checkpointing'] else 'off'}, {'shared prompt' if r['share_prompt'] else 'plain'}"
        print(f"{name:<24}{r['peak_rss_gib']:>14.2f}"
              f"{r['rss_after_load_gib']:>12.2f}{r['update_s']:>12.1f}{r['loss']:>12.6f}{r['grad_norm']:>12.6f}"
              f"{r['load'][0]:>8.1f}->{r['load'][1]:<6.1f}")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
