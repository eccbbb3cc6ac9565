"""What a multi-turn episode's continuation turn costs in the HF engine, and what reusing the
KV cache between turns (instead of re-prefilling the trajectory) could save.

A continuation turn is one `generate` call over each episode's trajectory so far: the
decoder is set up (the lean paths copy the weights into their layouts), the trajectory of L
tokens is prefilled, and T tokens are decoded. Keeping each episode's KV cache across the
environment step would replace the prefill of L tokens by a prefill of the k new
(observation) tokens against the cached L - k, and would skip the setup. This measures, on the
model and decoder a run would use:

  setup        entering `accel.decoder` (the decoder `rollout.hf_decoder=auto` picks)
  prefill_L    prefilling B rows of L tokens with it
  decode_T     T decode steps of B rows with it
  prefill_k    the transformers modules with a DynamicCache: k tokens against a cache of L - k
  prefill_L_m  the same modules prefilling all L tokens (the modules' own re-prefill)

    python bench/multiturn.py [--rows 16] [--length 160] [--new 12] [--turn 24] [--repeats 5]

Prints the medians and the share of a turn that KV reuse could save; note the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from reasonrl import accel
from reasonrl.policy.model import load_model_and_tokenizer


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

    def modules_prefill_full() -> None:
        model(input_ids=ids, attention_mask=mask, use_cache=True,
              past_key_values=DynamicCache(config=model.config))

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

    turn()  # warm-up (and the decoder's first-use costs)
    parts = [turn() for _ in range(args.repeats)]
    t_setup, t_prefill, t_decode = (statistics.median(p[j] for p in parts) for j in range(3))
    t_turn = t_setup + t_prefill + t_decode
    modules_prefix()
    modules_increment()
    t_inc = median_time(modules_increment, args.repeats)
    t_full_m = median_time(modules_prefill_full, args.repeats)
    saved = t_setup + t_prefill - t_inc
    print(f"B={B} L={L} k={k} T={T}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f}")
    print(f"  setup        {t_setup * 1e3:8.1f} ms")
    print(f"  prefill_L    {t_prefill * 1e3:8.1f} ms")
    print(f"  decode_T     {t_decode * 1e3:8.1f} ms  ({t_decode / T * 1e3:.1f} ms/step)")
    print(f"  turn         {t_turn * 1e3:8.1f} ms  (setup + prefill_L + decode_T)")
    print(f"  prefill_k    {t_inc * 1e3:8.1f} ms  (modules, k tokens on a cache of L - k)")
    print(f"  prefill_L_m  {t_full_m * 1e3:8.1f} ms  (modules, all L tokens)")
    print(f"  KV reuse would save at most {saved * 1e3:.1f} ms of a {t_turn * 1e3:.1f} ms turn "
          f"({saved / t_turn:.0%})")


if __name__ == "__main__":
    main()
