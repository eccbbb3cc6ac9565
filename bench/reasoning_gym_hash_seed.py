"""Which reasoning-gym tasks generate other problems under another string hash seed? The list of
docs/reasoning-gym.md ("The same problems in every process").

    python bench/reasoning_gym_hash_seed.py                    # all 105 tasks, 20 problems each
    python bench/reasoning_gym_hash_seed.py --tasks ransom_note,gcd --size 50
    python bench/reasoning_gym_hash_seed.py --json hash_seed.json

Generator children (`reasonrl.rewards.reasoning_gym.Generator`, the one the data source and the
verifier use), one started with PYTHONHASHSEED=0 and one with PYTHONHASHSEED=1, each generate
problems 0..size-1 of every task from seed 0 (default options) as reasoning-gym alone does (the
generator's "raw" request), and the entries are compared: the question and answer first, then
the metadata (which many tasks' scores read). A task whose
entries differ draws its problems from the order of a set of strings, which follows the hash
seed: without a fixed one, every Python process saw other problems. Then both children score
the PYTHONHASHSEED=0 entries' reference answers with their own dataset objects: the verifier
builds its dataset in the reward worker (any hash seed) and scores the entry from the generator,
which is only right if `score_answer` itself does not depend on the hash seed. A third child,
PYTHONHASHSEED=0 again, finds the tasks whose problems differ between two processes even under one
hash seed (list_functions draws from the global `random`, seeded from the OS in every process);
the generator seeds it per problem, and a task whose problems, generated as reasonrl generates
them, still differ between the two PYTHONHASHSEED=0 children is `unfixed`. Last, the cost of
one generator start (an interpreter and `import reasoning_gym`, until its first problem comes
back), which each process that generates pays once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from reasonrl.data.reasoning_gym import task_names  # noqa: E402
from reasonrl.rewards.reasoning_gym import Generator  # noqa: E402


def start_cost(times: int) -> list[float]:
    """Seconds from starting a generator child to its first problem, `times` times."""
    costs = []
    for _ in range(times):
        gen = Generator("0")
        began = time.perf_counter()
        gen.ask(("entries", "leg_counting", 0, 1, "{}", None, [0]))
        costs.append(time.perf_counter() - began)
        gen.close()
    return costs


def same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a bool (numpy arrays)
        return repr(a) == repr(b)


def differ(first: list[dict], second: list[dict]) -> tuple[int, int]:
    """(problems whose question or answer differ, problems whose metadata differ)."""
    pairs = list(zip(first, second, strict=True))
    return (sum(not same((a["question"], a["answer"]), (b["question"], b["answer"])) for a, b in pairs),
            sum(not same(a.get("metadata"), b.get("metadata")) for a, b in pairs))


def compare(task: str, size: int, gens: tuple[Generator, ...], pool: ThreadPoolExecutor) -> dict:
    """gens: PYTHONHASHSEED 0, 1, and 0 again (another process)."""
    def ask(op: str, some: tuple[Generator, ...], items: list) -> list:
        replies = list(pool.map(lambda g: g.ask((op, task, 0, size, "{}", None, items)), some))
        bad = [r for r in replies if r[0] != "ok"]
        if bad:
            raise RuntimeError(" ".join(map(str, bad[0])))
        return [r[1] for r in replies]

    try:
        raw = ask("raw", gens, list(range(size)))  # reasoning-gym alone
        fixed = ask("entries", (gens[0], gens[2]), list(range(size)))  # as reasonrl generates
        pairs = [(None if e["answer"] is None else str(e["answer"]), e) for e in fixed[0]]
        scores = ask("scores", gens[:2], pairs)
    except RuntimeError as err:
        return {"task": task, "verdict": "error", "error": str(err)}
    hash_seed, hash_meta = differ(raw[0], raw[1])
    process, process_meta = differ(raw[0], raw[2])
    unfixed = sum(differ(*fixed))
    verdict = ("unfixed" if unfixed else "process" if process or process_meta else "problems" if hash_seed
               else "metadata" if hash_meta else "same")
    return {"task": task, "verdict": verdict, "hash_seed_problems": hash_seed,
            "hash_seed_metadata": hash_meta, "process_problems": process + process_meta, "unfixed": unfixed,
            "score_differs": sum(x != y for x, y in zip(*scores, strict=True)), "size": size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="", help="comma-separated tasks (default: all)")
    parser.add_argument("--size", type=int, default=20, help="problems per task (0..size-1 of seed 0)")
    parser.add_argument("--starts", type=int, default=3, help="generator starts timed")
    parser.add_argument("--json", default="", help="write the rows here")
    args = parser.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t] or task_names()
    began = time.perf_counter()
    load = os.getloadavg()[0]
    costs = start_cost(args.starts)
    print(f"generator start (interpreter + import reasoning_gym, to its first problem): "
          f"{' '.join(f'{c:.2f}' for c in costs)} s (median {statistics.median(costs):.2f}); load {load:.1f}",
          flush=True)
    gens = (Generator("0"), Generator("1"), Generator("0"))
    rows = []
    with ThreadPoolExecutor(3) as pool:
        for task in tasks:
            t0 = time.perf_counter()
            row = compare(task, args.size, gens, pool)
            row["seconds"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            if row["verdict"] != "same" or row.get("score_differs"):
                print(f"  {task}: {row}", flush=True)
    for gen in gens:
        gen.close()
    elapsed = time.perf_counter() - began
    def listed(verdict: str) -> list[str]:
        return [r["task"] for r in rows if r["verdict"] == verdict]

    affected, process, meta, unfixed = (listed(v) for v in ("problems", "process", "metadata", "unfixed"))
    scored = [r["task"] for r in rows if r.get("score_differs")]
    print(f"\nreasoning-gym alone, {args.size} problems of each of {len(rows)} tasks:")
    print(f"  {len(affected)} ask other problems under PYTHONHASHSEED=1 than under 0: "
          f"{', '.join(affected) or '-'}")
    print(f"  {len(process)} ask other problems in every process, even under one hash seed (the global "
          f"random): {', '.join(process) or '-'}")
    print(f"  {len(meta)} more differ in the metadata only: {', '.join(meta) or '-'}")
    print(f"as reasonrl generates them (PYTHONHASHSEED=0, the global random seeded per problem): "
          f"{len(unfixed)} differ between two processes: {', '.join(unfixed) or '-'}")
    print(f"{len(scored)} score the reference answers differently under the two hash seeds: "
          f"{', '.join(scored) or '-'}")
    errors = listed("error")
    if errors:
        print(f"{len(errors)} failed: {', '.join(errors)}")
    print(f"{elapsed:.0f} s in all (load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
          f"{os.cpu_count()} cores)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "start_s": costs, "seconds": elapsed}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
