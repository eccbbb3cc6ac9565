"""FSDP2's memory options on data-parallel policy ranks: peak memory and time of a training step.

Builds the policy as `--ranks` FSDP2 ranks in Ray actors (gloo on CPU, NCCL with
`--gpus`), on the embedded SmolLM2-135M-Instruct (or `--model`), once per option:

- `zero3`: placement.policy.reshard_after_forward=true (the default): each decoder layer's
  full weights are gathered for its forward, freed, gathered again for its backward;
- `zero2`: reshard_after_forward=false: gathered once per micro-batch, kept to the backward;
- `offload`: zero3 with placement.policy.cpu_offload=true (FSDP2's CPUOffloadPolicy): the
  shards and AdamW state live in CPU memory, the optimizer steps there;
- `lora`: zero3 with model.lora.rank=16 (only the adapter trains).

and runs `--steps` training steps on the same synthetic batch (B sequences of P prompt + C
completion tokens, random ids, advantages +-1, `--micro` rows per micro-batch). Prints per
option: seconds per step (median of the steps after the first), each rank's peak RSS over
the step minus its RSS before the first step (VmHWM, reset before each step), and, with
GPUs, each rank's peak GPU memory (torch.cuda.max_memory_allocated in the actor); also the
memory each rank holds after the steps over its RSS before them (after returning the C
heap's free pages): the AdamW state.

`--activations [--lora R]`: in this process, one plain policy worker (no ranks; torch's own
kernels, `optim.lean_kernels=false`, as the sharded ranks of this bench run) on the same model: the
peak RSS of a training step with micro-batches of 2 and of 8 rows (after a warm-up step at
each size, so the AdamW state exists): the difference / the tokens' difference is the memory
a micro-batch token costs (activations, kept for the backward).

Usage: `python bench/sharding.py [--ranks 2] [--options zero3,zero2,offload,lora] [--steps 4]
[--batch 8 --prompt 48 --completion 64 --micro 4] [--gpus 0]`. On a CPU machine everything is
in CPU memory anyway: offload shows its cost in time, not a saving. The load average is
printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OPTIONS = {
    "zero3": [],
    "zero2": ["placement.policy.reshard_after_forward=false"],
    "offload": ["placement.policy.cpu_offload=true"],
    "lora": ["model.lora.rank=16"],
}


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def gpu_peak(host) -> float:
    """Runs in the actor (`WorkerHost`): its peak GPU memory since the last call, GiB."""
    import torch

    if not torch.cuda.is_available():
        return 0.0
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return peak


def measure(option: str, args) -> dict:
    import ray
    import torch

    from reasonrl.batch import TrainBatch
    from reasonrl.config import load_config
    from reasonrl.placement import build_workers

    overrides = [f"model.path={args.model}", "placement.mode=ray", f"placement.policy.ranks={args.ranks}",
                 f"placement.num_cpus={args.ranks + 1}", "trainer.threads=1",
                 f"optim.micro_batch_size={args.micro}", "optim.lean_kernels=false",
                 f"placement.policy.num_gpus={args.gpus}", *OPTIONS[option]]
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "default.yaml", overrides)
    workers = build_workers(cfg)
    try:
        ranks = workers.actors[1:]  # [rollout, policy ranks...]
        pids = [ray.get(a.__ray_call__.remote(lambda host: os.getpid())) for a in ranks]
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(100, 40000, (args.batch, args.prompt), generator=gen).tolist()
        completions = torch.randint(100, 40000, (args.batch, args.completion), generator=gen).tolist()
        advantages = torch.tensor([1.0, -1.0] * (args.batch // 2))
        base = [status_kib(p, "VmRSS") for p in pids]
        times, peaks, gpu, norms = [], [[] for _ in pids], [[] for _ in pids], []
        for _ in range(args.steps):
            for p in pids:
                Path(f"/proc/{p}/clear_refs").write_text("5")
            t = time.perf_counter()
            out = workers.policy.train_step(TrainBatch(prompts, completions, advantages))
            times.append(time.perf_counter() - t)
            norms.append(out["train/grad_norm"])
            for i, p in enumerate(pids):
                peaks[i].append((status_kib(p, "VmHWM") - base[i]) / 1024)
            for i, g in enumerate(ray.get([a.__ray_call__.remote(gpu_peak) for a in ranks])):
                gpu[i].append(g)
        assert out["train/updates"] == 1.0
        from reasonrl.accel import release_free_memory

        ray.get([a.__ray_call__.remote(lambda host: release_free_memory()) for a in ranks])
        held = [(status_kib(p, "VmRSS") - b) / 1024 for p, b in zip(pids, base, strict=True)]
        return {"option": option, "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
                "first_s": times[0], "rss_before_mib": [b / 1024 for b in base],
                "peak_over_start_mib": [max(p) for p in peaks], "gpu_peak_gib": [max(g) for g in gpu],
                "grad_norm": norms[0], "held_mib": held}
    finally:
        workers.close()
        ray.shutdown()


def activations(args) -> None:
    import torch

    from reasonrl.accel import release_free_memory
    from reasonrl.batch import TrainBatch
    from reasonrl.config import load_config
    from reasonrl.placement import Host
    from reasonrl.workers.policy import policy_from_config

    torch.set_num_threads(os.cpu_count() or 1)
    peaks = {}
    for rows in (2, 8):
        cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "default.yaml",
                          [f"model.path={args.model}", f"optim.micro_batch_size={rows}",
                           "optim.lean_kernels=false", f"model.lora.rank={args.lora}"])
        policy = policy_from_config(cfg, Host(device="cpu"))
        gen = torch.Generator().manual_seed(0)
        batch = TrainBatch(torch.randint(100, 40000, (rows, args.prompt), generator=gen).tolist(),
                           torch.randint(100, 40000, (rows, args.completion), generator=gen).tolist(),
                           torch.tensor([1.0, -1.0] * (rows // 2)))
        policy.train_step(batch)  # the AdamW state exists from here on
        release_free_memory()
        Path("/proc/self/clear_refs").write_text("5")
        before = status_kib(os.getpid(), "VmRSS")
        policy.train_step(batch)
        peaks[rows] = (status_kib(os.getpid(), "VmHWM") - before) * 1024
        print(f"micro-batch of {rows} x {args.prompt + args.completion} tokens: step peak over the RSS "
              f"before it {peaks[rows] / 2**20:.0f} MiB", flush=True)
        del policy
        release_free_memory()
    per_token = (peaks[8] - peaks[2]) / (6 * (args.prompt + args.completion))
    layers, hidden = model_shape(args.model)
    print(f"activations (LoRA rank {args.lora}, torch's kernels as on the ranks): "
          f"{per_token / 2**10:.1f} KiB per micro-batch token = "
          f"{per_token / (layers * hidden):.1f} bytes per token per layer per hidden unit ({layers} layers "
          f"x {hidden}, float32)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


def model_shape(path: str) -> tuple[int, int]:
    from transformers import AutoConfig

    from reasonrl.model.load import resolve_model_dir

    config = AutoConfig.from_pretrained(resolve_model_dir(path))
    return config.num_hidden_layers, config.hidden_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--options", default="zero3,zero2,offload,lora")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=48)
    ap.add_argument("--completion", type=int, default=64)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--gpus", type=float, default=0)
    ap.add_argument("--activations", action="store_true")
    ap.add_argument("--lora", type=int, default=0, help="--activations: model.lora.rank")
    args = ap.parse_args()
    if args.activations:
        activations(args)
        return
    for option in args.options.split(","):
        r = measure(option, args)
        print(f"{option:8s} step {r['step_s']:.2f} s (first {r['first_s']:.2f} s); RSS before "
              + ", ".join(f"{m:.0f}" for m in r["rss_before_mib"]) + " MiB; step peak over that "
              + ", ".join(f"{m:.0f}" for m in r["peak_over_start_mib"]) + " MiB; held after "
              + ", ".join(f"{m:.0f}" for m in r["held_mib"]) + " MiB"
              + (f"; GPU peak {', '.join(f'{g:.2f}' for g in r['gpu_peak_gib'])} GiB" if args.gpus else "")
              + f"; grad norm of the first step {r['grad_norm']:.4f}", flush=True)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
