"""Weight sync in ray mode: policy ranks -> rollout replicas, timed, with the peak memory it adds.

Builds the run's workers in ray mode (`reasonrl.placement.build_workers`: the policy as
`--ranks` FSDP2 ranks over gloo, `--replicas` rollout actors with the HF engine) on the
embedded SmolLM2-135M-Instruct (or `--model`), then performs `--syncs` weight syncs exactly
as the trainer does (`Trainer.sync_weights`: `workers.sync.push(version)`, the policy's
weights streamed into every rollout replica, each verified by checksum) and prints, per sync
and as the median:

- seconds of the whole sync (`push`: checksum, probe when due, the buckets);
- for each actor process (every policy rank, every rollout replica): the peak RSS during
  the sync (the kernel's VmHWM, reset before each sync by writing 5 to /proc/PID/clear_refs)
  minus the process's RSS once the workers were built, before any sync, in MiB: the memory
  syncing costs that process, including what its allocator keeps from earlier syncs and the
  object-store pages it maps while writing or reading the weights;
- for each actor process, sampled every 5 ms during the syncs: the peak of its private
  memory (RssAnon: gathered tensors, buckets being built or copied, and what the allocator
  keeps of them) and of the object-store pages it maps (RssShmem: shared memory, counted once
  for the machine however many processes map it), each minus its value once the workers
  were built. (A rollout replica's first sync also turns its model's memory-mapped weights
  into private copies as it writes them: that is the model's memory, not the sync's.)
- the machine's peak extra memory (MemAvailable sampled every 5 ms, its drop during the
  sync): every process plus Ray's object store, and whatever else runs on the machine;
- seconds and bytes per parameter (the cost the projections in docs/scaling.md use).

Usage: `python bench/weight_sync.py [--ranks 2] [--replicas 1] [--bucket-mb 64] [--syncs 5]
[--lora 0] [--model PATH]`. `--bucket-mb` sets `placement.sync_bucket_mb` (leave it out on a
version without that key). The load average is printed with the figures: the machine is
shared, run it when it is quiet.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


class LowWater:
    """While running, sampled every 5 ms: the lowest MemAvailable, and each process's highest
    RssAnon and RssShmem."""

    def __init__(self, pids: list[int] = (), start: dict | None = None):
        self.low, self._stop = mem_available_kib(), threading.Event()
        self.pids = list(pids)
        self.start = start or {p: (status_kib(p, "RssAnon"), status_kib(p, "RssShmem")) for p in self.pids}
        self.high = dict(self.start)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.low = min(self.low, mem_available_kib())
            for p in self.pids:
                anon, shm = status_kib(p, "RssAnon"), status_kib(p, "RssShmem")
                self.high[p] = (max(self.high[p][0], anon), max(self.high[p][1], shm))
            time.sleep(0.005)

    def extra_mib(self, pid: int) -> tuple[float, float]:
        """(private, shared) peak MiB over the values at the start."""
        return tuple((h - s) / 1024 for h, s in zip(self.high[pid], self.start[pid], strict=True))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="model.path ('' = the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=None)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--lora", type=int, default=0, help="model.lora.rank")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed", "bf16"],
                    help="model.precision (bf16-mixed and bf16 push bf16 weights)")
    args = ap.parse_args()

    import ray

    from reasonrl.config import load_config
    from reasonrl.placement import build_workers

    overrides = [f"model.path={args.model}", f"model.precision={args.precision}", "placement.mode=ray",
                 f"placement.policy.ranks={args.ranks}", f"placement.num_cpus={args.ranks + args.replicas}",
                 "trainer.threads=1", f"model.lora.rank={args.lora}"]
    if args.replicas > 1:
        overrides.append(f"placement.rollout.replicas={args.replicas}")
    if args.bucket_mb is not None:
        overrides.append(f"placement.sync_bucket_mb={args.bucket_mb}")
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs" / "default.yaml", overrides)
    t = time.perf_counter()
    workers = build_workers(cfg)
    print(f"workers built in {time.perf_counter() - t:.1f} s", flush=True)
    try:
        pids = [ray.get(a.__ray_call__.remote(lambda host: os.getpid())) for a in workers.actors]
        names = ["rollout" if i < args.replicas else f"rank{i - args.replicas}" for i in range(len(pids))]
        from transformers import AutoConfig

        params = sum(p.numel() for p in _count_model(cfg, AutoConfig))
        times, extra = [], {n: [] for n in names}
        machine, private, shared = [], {n: [] for n in names}, {n: [] for n in names}
        base = {n: status_kib(p, "VmRSS") for n, p in zip(names, pids, strict=True)}
        built = {p: (status_kib(p, "RssAnon"), status_kib(p, "RssShmem")) for p in pids}
        print("RSS once built, MiB: " + ", ".join(f"{n} {base[n] / 1024:.0f}" for n in names))
        for k in range(args.syncs):
            for pid in pids:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            with LowWater(pids, built) as water:
                start = water.low
                t = time.perf_counter()
                workers.sync.push(k)
                times.append(time.perf_counter() - t)
            machine.append((start - water.low) / 1024)
            for n, p in zip(names, pids, strict=True):
                extra[n].append((status_kib(p, "VmHWM") - base[n]) / 1024)
                anon, shm = water.extra_mib(p)
                private[n].append(anon)
                shared[n].append(shm)
            print(f"sync {k + 1}: {times[-1]:.3f} s; peak over the built workers': RSS / private / object "
                  "store, MiB: "
                  + ", ".join(f"{n} {extra[n][-1]:.0f} / {private[n][-1]:.0f} / {shared[n][-1]:.0f}"
                              for n in names) + f"; machine {machine[-1]:.0f}", flush=True)
        median = statistics.median(times)
        dtype_bytes = 4 if args.precision == "fp32" else 2  # what a push carries
        bucket = "(none: old code)" if args.bucket_mb is None else f"{args.bucket_mb:g} MB"
        size_mib = params * dtype_bytes / 2**20
        print(f"\nmodel: {params / 1e6:.1f}M parameters ({size_mib:.0f} MiB pushed, {args.precision}); ranks "
              f"{args.ranks}, replicas {args.replicas}, bucket {bucket}, lora {args.lora}")
        print(f"sync: median {median:.3f} s over {args.syncs} (min {min(times):.3f}); "
              f"{median / params * 1e9:.2f} ns per parameter, {size_mib / median:.0f} MiB/s")
        for n in names:
            print(f"{n}: over the built workers' memory, peak RSS {max(extra[n]):.0f} MiB, private "
                  f"{max(private[n][1:] or private[n]):.0f} MiB (syncs 2-{args.syncs}; sync 1: "
                  f"{private[n][0]:.0f}), object-store pages {max(shared[n]):.0f} MiB")
        print(f"machine extra peak (MemAvailable drop): median {statistics.median(machine):.0f} MiB, "
              f"max {max(machine):.0f} MiB")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    finally:
        workers.close()
        ray.shutdown()


def _count_model(cfg, AutoConfig):
    """The parameters of model.path's architecture (meta tensors: nothing allocated)."""
    import torch
    from transformers import AutoModelForCausalLM

    from reasonrl.model.load import TINY, build_tiny_model, resolve_model_dir

    if cfg.model.path == TINY:  # built, not read from a folder
        return list(build_tiny_model()[0].parameters())
    config = AutoConfig.from_pretrained(resolve_model_dir(cfg.model.path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return list(model.parameters())


if __name__ == "__main__":
    main()
