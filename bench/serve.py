"""The OpenAI-compatible endpoint (`reasonrl serve`, docs/serve.md) against direct engine calls:
requests/s and completion tokens/s for the same work, done each way once in one run (#44).

    python bench/serve.py                     # SmolLM2-135M-Instruct: 32 requests x 64 tokens, 8 clients
    python bench/serve.py --model tiny        # the random tiny model: a quick run
    python bench/serve.py --requests 32 --max-tokens 64 --concurrency 8 --engines hf rollout.hf_decoder=lean

The engine is the one `rollout.engine` names (`--engines`, default `hf,vllm`, one after the
other; vLLM is skipped, saying so, where it is not installed), built as `reasonrl serve` builds
it: the model loaded as training loads it (`model.precision`, `placement.device`; `--model`: '' =
the config's `model.path`, the embedded SmolLM2-135M-Instruct, `tiny`, or a folder), `make_engine`
over it (dotted overrides apply: `rollout.hf_decoder=lean`), `reasonrl.serve.Endpoint` over the
engine and `reasonrl.serve.app.Server` (FastAPI + uvicorn) on a free loopback port, in this
process. The work: `--requests` chat requests of a generated task (`--task`, default the default
task's seeded arithmetic problems, with its system prompt), each sampled once at `--temperature`
for at most `--max-tokens` tokens, request i from seed `--seed` + i. Warm-up first, untimed: a
call of each row count the ways make (1, 2, 4, ... rows: `rollout.hf_decoder=auto` measures the
decoders per power of two of rows, on the first such call) and two requests through the server.
Then the ways, each once:

- `direct`: the engine's `generate` as the trainer calls it: every prompt in one call (calls of
  at most `--max-batch-rows` prompts), with their seeds; the prompts are the messages rendered
  by the chat template beforehand, as the endpoint renders them;
- `direct, 1 prompt per call`: the same calls one prompt at a time: the batching the next way
  goes without, without HTTP (`--no-single` leaves it out);
- `endpoint, 1 client`: through HTTP with the `openai` client, one request after another (each
  a generate call of its own, after the batcher's `--batch-window-ms` window);
- `endpoint, K clients`: `--concurrency` client threads, each sending its next request when its
  last is answered, so the batcher groups them into shared generate calls.

The clients run in a child process (this script with `--client`), as an agent program would, so
their HTTP and JSON work does not share the server's interpreter; an endpoint way's seconds are
the child's, from its first request sent to its last answer received (its start-up and imports
not counted). Printed per way: the engine's generate calls and the decoders they ran, the
completion tokens, wall seconds, requests/s and completion tokens/s and both as a ratio of
`direct`'s (endpoint / direct), the CPU seconds of this process (engine and server) and of the
client, and two checks of the ids: `ids = the engine call's`, the requests whose returned
`prompt_token_ids` and `token_ids` are those of the engine call that served them (the engine is
wrapped to keep each call's prompts, seeds and answers: exactness, whatever the batch), and
`ids = direct's`, those equal to `direct`'s for the same seeds (with the first difference, and
the rows and decoders of the two calls: which requests share a call, and under `auto` the
decoder chosen for that many rows, change the float rounding of the forward, which may flip a
rare sampled token). Also printed: the CPU model and cores, and the load average at the start,
around each way and at the end. One run each: on a shared machine, read the figures with the
load beside them (and the CPU seconds, which load changes least).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def say(text: str) -> None:
    print(f"[bench/serve] {text}", flush=True)


# ---- the client: a child process, as an agent program is ---------------------------------------

def client_main() -> int:
    """Read the work from stdin (JSON), send it with the openai client, print the answers (JSON)."""
    from openai import OpenAI

    spec = json.load(sys.stdin)
    client = OpenAI(base_url=spec["url"], api_key="unused", max_retries=0, timeout=3600)
    client.models.list()  # imports and the first connection, before the clock starts

    def ask(i: int) -> dict:
        r = client.chat.completions.create(model=spec["model"], messages=spec["messages"][i],
                                           max_tokens=spec["max_tokens"], temperature=spec["temperature"],
                                           seed=spec["seeds"][i])
        return {"prompt_token_ids": r.prompt_token_ids, "token_ids": r.choices[0].token_ids,
                "completion_tokens": r.usage.completion_tokens, "policy_version": r.policy_version}

    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(spec["concurrency"]) as pool:
        answers = list(pool.map(ask, range(len(spec["messages"]))))
    out = {"wall_s": time.perf_counter() - wall, "client_cpu_s": time.process_time() - cpu,
           "answers": answers}
    print("CLIENT " + json.dumps(out), flush=True)
    return 0


def through_endpoint(url: str, model: str, messages: list, seeds: list[int], args, concurrency: int) -> dict:
    spec = {"url": url, "model": model, "messages": messages, "seeds": seeds, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "concurrency": concurrency}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--client"], input=json.dumps(spec),
                          capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("CLIENT ")), None)
    if proc.returncode != 0 or line is None:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"[bench/serve] the client failed with status {proc.returncode}")
    return json.loads(line.removeprefix("CLIENT "))


# ---- the server side: the engine, the endpoint over it, the direct calls -----------------------

def build(engine_name: str, args):
    """(engine, tokenizer, context, config) as `reasonrl serve` builds them."""
    from reasonrl.commands.serve import serving_engine
    from reasonrl.config import load_config
    from reasonrl.placement import with_precision

    cfg = with_precision(load_config(None, [f"model.path={args.model}", f"rollout.engine={engine_name}",
                                            f"data.task={args.task}", *args.overrides]))
    engine, tokenizer, context = serving_engine(cfg)
    return engine, tokenizer, context, cfg


def the_work(cfg, tokenizer, count: int) -> tuple[list[list[dict]], list[list[int]]]:
    """(`count` chat requests' messages, their prompts' ids as the endpoint renders them)."""
    from reasonrl.batch import Example
    from reasonrl.data import render_prompt
    from reasonrl.registry import DATA_TASKS

    entry = DATA_TASKS[cfg.data.task]
    if not getattr(entry, "generated", False):
        raise SystemExit(f"[bench/serve] --task {cfg.data.task}: not a generated task (it needs files)")
    train, held_out = entry.fn(cfg.data, cfg.trainer.seed)
    examples = (train + held_out)[:count]
    if len(examples) < count:
        raise SystemExit(f"[bench/serve] --task {cfg.data.task} has {len(examples)} problems, < --requests")
    system = entry.system_prompt if cfg.data.system_prompt == "auto" else cfg.data.system_prompt
    messages = []
    for e in examples:
        turns = [{"role": "user", "content": e.prompt}] if isinstance(e.prompt, str) else list(e.prompt)
        if system and turns[0]["role"] != "system":
            turns = [{"role": "system", "content": system}, *turns]
        messages.append(turns)
    ids = [tokenizer(render_prompt(Example(prompt=m, ground_truth=""), tokenizer, True, ""),
                     add_special_tokens=False)["input_ids"] for m in messages]
    return messages, ids


def direct(engine, prompts: list[list[int]], seeds: list[int], params, rows: int) -> dict:
    calls, ids = 0, []
    cpu, wall = time.process_time(), time.perf_counter()
    for start in range(0, len(prompts), rows):
        out = engine.generate(prompts[start:start + rows], params, seeds[start:start + rows])
        ids += out.completion_ids
        calls += 1
    return {"wall_s": time.perf_counter() - wall, "server_cpu_s": time.process_time() - cpu, "calls": calls,
            "answers": [{"prompt_token_ids": p, "token_ids": c, "completion_tokens": len(c)}
                        for p, c in zip(prompts, ids, strict=True)]}


class Recorded:
    """The engine, each `generate` call's prompts, seeds, answers and decoder kept (`calls`): what
    the endpoint's answers are checked against, whatever batch the batcher put them in."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompt_ids, params, seeds=None):
        out = self.engine.generate(prompt_ids, params, seeds)
        path = getattr(self.engine, "last_path", None) or "-"
        seeds = None if params.greedy else seeds
        self.calls += [{"prompt": tuple(p), "seed": None if seeds is None else seeds[i], "ids": c,
                        "decoder": path, "rows": len(prompt_ids)}
                       for i, (p, c) in enumerate(zip(prompt_ids, out.completion_ids, strict=True))]
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def compare(answers: list[dict], reference: list[dict], calls: list[dict], direct_calls: list[dict]) -> str:
    """'N/N' requests whose prompt and completion ids equal the reference's (the direct call's),
    where the first that differs differs and with which decoders."""
    same, first = 0, ""
    for i, (a, b) in enumerate(zip(answers, reference, strict=True)):
        if a["prompt_token_ids"] == b["prompt_token_ids"] and a["token_ids"] == b["token_ids"]:
            same += 1
        elif not first:
            pairs = enumerate(zip(a["token_ids"], b["token_ids"], strict=False))
            where = "prompt" if a["prompt_token_ids"] != b["prompt_token_ids"] else \
                next((f"token {k}" for k, (x, y) in pairs if x != y),
                     f"length {len(a['token_ids'])} vs {len(b['token_ids'])}")
            mine, theirs = calls[i], direct_calls[i]
            first = (f" (first: request {i} from {where}; a call of {mine['rows']} rows by "
                     f"{mine['decoder']}, direct's of {theirs['rows']} by {theirs['decoder']})")
    return f"{same}/{len(reference)}{first}"


def served_by(answers: list[dict], seeds: list[int], calls: list[dict]) -> tuple[str, list[dict]]:
    """('N/N' answers whose ids are those of the engine call that served them, those calls)."""
    by_key = {(c["prompt"], c["seed"]): c for c in calls}
    found = [by_key.get((tuple(a["prompt_token_ids"]), s)) for a, s in zip(answers, seeds, strict=True)]
    same = sum(c is not None and c["ids"] == a["token_ids"] for a, c in zip(answers, found, strict=True))
    return f"{same}/{len(answers)}", found


def bench_engine(engine_name: str, args) -> list[dict]:
    import torch

    from reasonrl.rollout import SamplingParams
    from reasonrl.serve import Endpoint
    from reasonrl.serve.app import Server

    t = time.perf_counter()
    built, tokenizer, context, cfg = build(engine_name, args)
    engine = Recorded(built)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.model or "SmolLM2-135M-Instruct"
    say(f"{engine_name}: {name} loaded and its engine built in {time.perf_counter() - t:.1f} s "
        f"(model.precision={cfg.model.precision}, rollout.hf_decoder={cfg.rollout.hf_decoder}, "
        f"{torch.get_num_threads()} torch threads, context {context})")
    messages, prompts = the_work(cfg, tokenizer, args.requests)
    seeds = [args.seed + i for i in range(args.requests)]
    greedy = args.temperature == 0
    params = SamplingParams(n=1, temperature=args.temperature if not greedy else 1.0,
                            max_new_tokens=args.max_tokens, greedy=greedy)  # as the endpoint plans it
    endpoint = Endpoint(engine, tokenizer, name, context, window_s=args.batch_window_ms / 1000,
                        max_rows=args.max_batch_rows, default_max_tokens=args.max_tokens, seed=args.seed)
    server = Server(endpoint, "127.0.0.1", 0).start()
    rows = []
    try:
        # warm-up: a call of each row count the ways will make (1, 2, 4, ... rows: the HF engine's
        # `auto` decoder is measured per power of two of rows, on the first call of each), and the
        # server and the client
        t, count = time.perf_counter(), 1
        while True:
            built.generate(prompts[:count], dataclasses.replace(params, max_new_tokens=2), seeds[:count])
            if count >= min(len(prompts), args.max_batch_rows):
                break
            count = min(2 * count, len(prompts), args.max_batch_rows)
        through_endpoint(server.url, name, messages[:2], seeds[:2], args, 2)
        say(f"warm-up {time.perf_counter() - t:.1f} s; the work: {args.requests} prompts of {args.task} "
            f"({min(map(len, prompts))}-{max(map(len, prompts))} prompt tokens), at most {args.max_tokens} "
            f"tokens each, temperature {args.temperature}, seeds {seeds[0]}..{seeds[-1]}")
        ways = [("direct", None, args.max_batch_rows), ("direct, 1 prompt per call", None, 1),
                ("endpoint, 1 client", 1, 0), (f"endpoint, {args.concurrency} clients", args.concurrency, 0)]
        if args.no_single:
            del ways[1]
        for way, concurrency, per_call in ways:
            before_load, calls = load(), endpoint.generate_calls
            engine.calls = []
            if concurrency is None:
                with endpoint.paused():
                    found = direct(engine, prompts, seeds, params, per_call)
            else:
                cpu = time.process_time()
                found = through_endpoint(server.url, name, messages, seeds, args, concurrency)
                found["server_cpu_s"] = time.process_time() - cpu
                found["calls"] = endpoint.generate_calls - calls
            found.update(way=way, engine=engine_name, load_before=before_load, load_after=load(),
                         tokens=sum(a["completion_tokens"] for a in found["answers"]))
            keys = [None if greedy else s for s in seeds]
            found["served"], found["engine_calls"] = served_by(found["answers"], keys, engine.calls)
            found["decoders"] = ",".join(sorted({c["decoder"] for c in engine.calls}))
            rows.append(found)
            say(f"{engine_name} {way}: {found['wall_s']:.2f} s, {found['calls']} generate calls "
                f"(decoder {found['decoders']}), {found['tokens']} completion tokens (load average "
                f"{before_load} -> {found['load_after']})")
    finally:
        server.stop()
        endpoint.close()
        built.close()
    reference = rows[0]
    for row in rows:
        row["same_ids"] = "-" if row is reference else \
            compare(row["answers"], reference["answers"], row["engine_calls"], reference["engine_calls"])
    return rows


def main() -> int:
    if "--client" in sys.argv[1:]:
        return client_main()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="'' = the config's model.path (the embedded "
                                                "SmolLM2-135M-Instruct), tiny, or an HF folder")
    ap.add_argument("--engines", default="hf,vllm", help="rollout.engine values, one after the other "
                                                         "(vLLM skipped where it is not installed)")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8, help="client threads of the third way")
    ap.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    ap.add_argument("--seed", type=int, default=0, help="request i is sampled from seed + i")
    ap.add_argument("--task", default="arithmetic",
                    help="a generated data.task (arithmetic, countdown, ...)")
    ap.add_argument("--batch-window-ms", type=float, default=5.0,
                    help="the endpoint's (reasonrl serve's default)")
    ap.add_argument("--max-batch-rows", type=int, default=64, help="the endpoint's, and direct's call size")
    ap.add_argument("--no-single", action="store_true",
                    help="leave out `direct, 1 prompt per call` (the longest way after `endpoint, 1 client`)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("overrides", nargs="*",
                    help="dotted.key=value config overrides (e.g. rollout.hf_decoder=lean)")
    args = ap.parse_args()
    from reasonrl.accel.calibrate import cpu_model

    start_load = load()
    say(f"{cpu_model()}, {os.cpu_count()} cores; load average at the start {start_load}")
    rows, skipped = [], []
    for engine_name in args.engines.split(","):
        if engine_name == "vllm" and importlib.util.find_spec("vllm") is None:
            skipped.append(engine_name)
            say("vllm: skipped (not installed here: `make vllm`)")
            continue
        rows += bench_engine(engine_name, args)
    end_load = load()
    print()
    print(f"{args.requests} chat requests of {args.task}, at most {args.max_tokens} tokens each, temperature "
          f"{args.temperature}, model {args.model or 'SmolLM2-135M-Instruct'}; {cpu_model()}, "
          f"{os.cpu_count()} cores; load average at the start {start_load}, at the end {end_load}"
          + (f"; skipped: {', '.join(skipped)} (not installed)" if skipped else ""))
    print("| engine | way | generate calls (decoder) | completion tokens | wall s | requests/s | tokens/s | "
          "requests/s vs direct | tokens/s vs direct | server CPU s | client CPU s | "
          "ids = the engine call's | ids = direct's | load average before -> after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    base: dict[str, dict] = {}
    for r in rows:
        rps, tps = len(r["answers"]) / r["wall_s"], r["tokens"] / r["wall_s"]
        first = base.setdefault(r["engine"], {"rps": rps, "tps": tps})
        client = f"{r['client_cpu_s']:.2f}" if "client_cpu_s" in r else "-"
        print(f"| {r['engine']} | {r['way']} | {r['calls']} ({r['decoders']}) | {r['tokens']} | "
              f"{r['wall_s']:.2f} | {rps:.2f} | {tps:.1f} | {rps / first['rps']:.2f} | "
              f"{tps / first['tps']:.2f} | {r['server_cpu_s']:.2f} | {client} | {r['served']} | "
              f"{r['same_ids']} | {r['load_before']} -> {r['load_after']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
