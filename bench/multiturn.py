"""What a multi-turn episode's continuation turn costs in the HF engine: re-prefilling the
trajectory, or reusing the KV cache kept from the turn before (`rollout.hf_reuse_kv`).

A continuation turn is one `generate` call over each episode's trajectory so far: the
decoder is set up (the lean paths copy the weights into their layouts), the trajectory of L
tokens is prefilled, and T tokens are decoded. With KV reuse the engine keeps each row's cache
when its turn ends (`LeanLlama.rows_cache`) and the next turn prefills only the k new tokens
(the last sampled token and the observation) against it (`LeanLlama.prefill_cached`). This
measures, on the model and decoder a run would use:

  setup        entering `accel.decoder` (the decoder `rollout.hf_decoder=auto` picks)
  prefill_L    prefilling B rows of L tokens with it (re-prefill)
  decode_T     T decode steps of B rows with it
  keep         taking the B rows' caches of L - k tokens at the end of the turn before
  prefill_k    the k new tokens against the kept caches (KV reuse; lean decoders)
  prefill_k_m  the transformers modules with a DynamicCache: k tokens against a cache of L - k

    python bench/multiturn.py [--rows 16] [--length 160] [--new 12] [--turn 24] [--repeats 5]

Prints the medians and both turns; note the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from reasonrl import accel
from reasonrl.model.load import load_model_and_tokenizer


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="model.path ('' = the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--rows", type=int, default=16, help="episodes in the turn (B)")
    parser.add_argument("--length", type=int, default=160, help="trajectory tokens so far (L)")
    parser.add_argument("--new", type=int, default=12, help="observation tokens since the last turn (k)")
    parser.add_argument("--turn", type=int, default=24, help="tokens the turn decodes (T)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", os.cpu_count() or 1)))
    model, _ = load_model_and_tokenizer(args.model, torch.float32)
    model.eval()
    B, L, k, T = args.rows, args.length, args.new, args.turn
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (B, L), generator=gen)
    mask = torch.ones(B, L, dtype=torch.long)
    path, why = accel.choose(model, "auto", B)
    print(f"decoder: {path}" + (f" ({why})" if why else ""), flush=True)

    def turn() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        with accel.decoder(model, L, T, path) as d:
            t1 = time.perf_counter()
            logits = d.prefill(ids, mask)
            t2 = time.perf_counter()
            for _ in range(T):
                logits = d.step(logits.argmax(-1))
            t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    from transformers import DynamicCache

    cached: dict = {}

    def modules_prefix() -> None:
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, : L - k], attention_mask=mask[:, : L - k], use_cache=True,
              past_key_values=cache)
        cached["cache"] = cache

    def modules_increment() -> None:
        cache = cached["cache"]
        model(input_ids=ids[:, L - k:], attention_mask=mask, use_cache=True, past_key_values=cache)
        cache.crop(-k)  # back to the prefix for the next repeat

    lean = path in accel.KV_REUSE
    past: list = []
    if lean:
        with accel.decoder(model, L - k, 1, path) as d:  # the turn before: L - k tokens in its cache
            d.prefill(ids[:, : L - k], mask[:, : L - k])
            t = time.perf_counter()
            past = d.rows_cache(torch.arange(B))
            t_keep = time.perf_counter() - t

    def turn_reuse() -> tuple[float, float, float]:
        t0 = time.perf_counter()
        with accel.decoder(model, L, T, path) as d:
            t1 = time.perf_counter()
            logits = d.prefill_cached(past, ids[:, L - k:], mask[:, L - k:])
            t2 = time.perf_counter()
            for _ in range(T):
                logits = d.step(logits.argmax(-1))
            t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    turn()  # warm-up (and the decoder's first-use costs)
    parts = [turn() for _ in range(args.repeats)]
    t_setup, t_prefill, t_decode = (statistics.median(p[j] for p in parts) for j in range(3))
    t_turn = t_setup + t_prefill + t_decode
    modules_prefix()
    modules_increment()
    t_inc = median_time(modules_increment, args.repeats)
    print(f"B={B} L={L} k={k} T={T}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print(f"  setup        {t_setup * 1e3:8.1f} ms")
    print(f"  prefill_L    {t_prefill * 1e3:8.1f} ms")
    print(f"  decode_T     {t_decode * 1e3:8.1f} ms  ({t_decode / T * 1e3:.1f} ms/step)")
    print(f"  turn         {t_turn * 1e3:8.1f} ms  (setup + prefill_L + decode_T: re-prefill)")
    print(f"  prefill_k_m  {t_inc * 1e3:8.1f} ms  (modules, k tokens on a cache of L - k)")
    if lean:
        turn_reuse()
        reuse = [turn_reuse() for _ in range(args.repeats)]
        r_setup, r_prefill, r_decode = (statistics.median(p[j] for p in reuse) for j in range(3))
        r_turn = t_keep + r_setup + r_prefill + r_decode
        print(f"  keep         {t_keep * 1e3:8.1f} ms  (the rows' caches, at the end of the turn before)")
        print(f"  prefill_k    {r_prefill * 1e3:8.1f} ms  (k new tokens against the kept caches)")
        print(f"  decode_T     {r_decode * 1e3:8.1f} ms  (after the cached prefill)")
        print(f"  turn         {r_turn * 1e3:8.1f} ms  (keep + setup + prefill_k + decode_T: KV reuse), "
              f"{1 - r_turn / t_turn:.0%} less than re-prefill")
    else:
        print(f"  ({path} re-prefills: KV reuse needs a lean decoder)")


if __name__ == "__main__":
    main()
