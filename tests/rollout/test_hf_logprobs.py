"""The HF engine's per-token log-probs (`Generation.logprobs`): the policy worker's quantity,
log softmax(logits / temperature) at the sampled token, no top-k / top-p renormalisation
(`reasonrl.rollout.hf`), from every decoder the engine can take, single- and multi-turn.

Tolerance (TOL): the engine's log-prob and the policy's recomputed one are float32 values of
the same function computed by two kernels (the decoder's forward vs the training forward with
its chunked LM head). The tiny model's logits from two kernels agree to DELTA = 1e-5
(tests/accel/test_accel.py: n <= 192 terms of size <= ~1 per product, reordered); an error of DELTA
in each logit moves z_t - logsumexp(z) by at most 2 DELTA / temperature (logsumexp is
1-Lipschitz in the max norm). On top of that each side rounds a value of size ~11 (log of the
49k vocabulary: the random model is nearly uniform) a few times (the engine takes the log of its
softmax's probability, the policy z_t - logsumexp(z)): 4 ulp(16) = 4 * 2^-19 < 8e-6.
So TOL(T) = 2e-5 / T + 8e-6 (measured: at most 1.9e-6, at T in {0.7, 1, 1.3}). A renormalised
(top-p / top-k) log-prob would differ by -log(kept mass), 0.1 at top_p = 0.9: far outside.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers import needs_peft, policy_settings, spy_on

from reasonrl.accel import lean_decode
from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.envs import environment_spec
from reasonrl.registry import ENGINES
from reasonrl.rollout import RolloutWorker, SamplingParams
from reasonrl.rollout.hf import HFEngine, filter_logits, sample_probs, sample_tokens, token_logprobs
from reasonrl.workers.policy import PolicyWorker

REPO = Path(__file__).parents[2]
ECHO = f"{REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Echo"
PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [100, 200, 300, 400, 500, 600, 700]]
PATHS = ("lean_mkl", "lean", "modules") if lean_decode.mkl_packing() else ("lean", "modules")
# (temperature, top_p, top_k): the plain distribution, and filtered ones at other temperatures
SETTINGS = [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 0.8, 50)]


def tol(temperature: float) -> float:
    """The bound derived in the module docstring."""
    return 2e-5 / temperature + 8e-6


def policy_logprobs(model, tokenizer, prompts, completions, temperature: float) -> list[torch.Tensor]:
    worker = PolicyWorker(model, tokenizer.pad_token_id, policy_settings(temperature=temperature,
                                                                         micro_batch_size=4))
    return worker.row_logprobs(model, prompts, completions)


def assert_close(engine_logp, policy_logp, bound: float) -> float:
    worst = 0.0
    for a, b in zip(engine_logp, policy_logp, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape
        worst = max(worst, (a - b.cpu()).abs().max().item() if len(a) else 0.0)
    assert worst <= bound, f"engine vs policy log-probs differ by {worst:.3g} > {bound:.3g}"
    return worst


def test_the_hf_entry_declares_logprobs():
    assert ENGINES["hf"].logprobs is True


def test_token_logprobs_is_log_softmax_of_the_unfiltered_logits():
    """The log of the gathered probability is log_softmax's value up to float rounding (1e-6
    here: |log p| < 10, a few ulp); a probability that underflowed to 0 gets z_t - logsumexp(z),
    finite. Not the renormalised (top-p) log-prob, which is larger."""
    g = torch.Generator().manual_seed(0)
    scaled = torch.randn(5, 40, generator=g) / 0.7
    scaled[4, 9] = -200.0  # exp(-200 - max) is 0 in float32
    tokens = torch.tensor([0, 3, 39, 7, 9])
    expected = torch.log_softmax(scaled, -1)[torch.arange(5), tokens]
    got = token_logprobs(scaled, scaled.softmax(-1), tokens)
    assert scaled.softmax(-1)[4, 9] == 0 and torch.isfinite(got).all()
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
    kept = filter_logits(scaled, top_p=0.5)
    top = scaled.argmax(-1)
    renormalised = torch.log_softmax(kept, -1)[torch.arange(5), top]
    assert (renormalised - token_logprobs(scaled, scaled.softmax(-1), top) > 1e-3).all()


def test_sampling_from_the_probabilities_is_sampling_from_the_logits():
    """The engine samples from the softmax it reuses for the log-probs: the same tokens, bit for
    bit, as `sample_tokens` of the logits."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 300, generator=g) * 3
    u = torch.rand(64, generator=g)
    assert torch.equal(sample_probs(logits.softmax(-1), u), sample_tokens(logits, u))


@pytest.mark.parametrize("temperature,top_p,top_k", SETTINGS)
@pytest.mark.parametrize("path", PATHS)
def test_sampled_logprobs_equal_the_policys_recomputed_ones(tiny, path, temperature, top_p, top_k):
    """Every decoder (lean_mkl, lean, and the modules: the fallback of the lean paths) reports,
    for every row (ended by EOS, a stop string or the limit), the policy's log-probs of its
    completion within TOL; same tokens from every decoder (the sampling did not change)."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]  # the policy worker patches its kernels in
    engine = HFEngine(model, tokenizer, decoder=path)
    prompts = [p for p in PROMPTS for _ in range(3)]
    for stop in ((), ("e",)):  # rows at the limit; rows of many lengths (a stop string ends them)
        params = SamplingParams(n=3, max_new_tokens=12, temperature=temperature, top_p=top_p, top_k=top_k,
                                stop=stop)
        gen = engine.generate(PROMPTS, params, seeds=[1, 2, 3])
        assert engine.last_path == path
        assert [len(lp) for lp in gen.logprobs] == [len(c) for c in gen.completion_ids]
        assert all(torch.isfinite(lp).all() and (lp <= 0).all() for lp in gen.logprobs)
        if stop:
            assert len({len(c) for c in gen.completion_ids}) > 2
        expected = policy_logprobs(model, tokenizer, prompts, gen.completion_ids, temperature)
        assert_close(gen.logprobs, expected, tol(temperature))
        # sampling is the same on every path, with or without the log-probs
        reference = HFEngine(model, tokenizer, decoder="modules").generate(PROMPTS, params, seeds=[1, 2, 3])
        assert gen.completion_ids == reference.completion_ids and gen.truncated == reference.truncated


@needs_peft
def test_a_lora_policy_decodes_through_the_modules_with_its_logprobs(tiny):
    """LoRA sends the lean paths to their fallback (the modules); the log-probs are still the
    policy's (its adapter on), within TOL."""
    from reasonrl.model.lora import apply_lora

    model, tokenizer = tiny
    wrapped = apply_lora(copy.deepcopy(model), 4, 8, 0.0, ["q_proj", "v_proj"], seed=0)
    with torch.no_grad():  # B = 0 at start: make the adapter count
        for name, p in wrapped.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    engine = HFEngine(wrapped, tokenizer, decoder="lean")
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0.8, top_p=0.9)
    gen = engine.generate(PROMPTS, params, seeds=[4, 5, 6])
    assert engine.last_path == "modules"
    prompts = [p for p in PROMPTS for _ in range(2)]
    expected = policy_logprobs(wrapped, tokenizer, prompts, gen.completion_ids, 0.8)
    assert_close(gen.logprobs, expected, tol(0.8))


@pytest.mark.parametrize("path", PATHS)
def test_greedy_decoding_reports_no_logprobs(tiny, path):
    """Greedy decoding (evaluation) reports None, as vLLM's engine does: it computes nothing
    for them."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    gen = HFEngine(model, tokenizer, decoder=path).generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4,
                                                                                    greedy=True))
    assert gen.logprobs is None and len(gen.completion_ids) == 6


def env_config(*overrides: str, max_new_tokens: int = 16):
    return load_config(REPO / "configs" / "smoke.yaml",
                       [f"rollout.max_new_tokens={max_new_tokens}", *overrides]).env


@pytest.mark.parametrize("path,reuse", [("lean", True), ("lean", False), ("modules", True)])
def test_multi_turn_rows_carry_the_engines_logprobs(tiny, path, reuse):
    """Episodes splice each turn's engine log-probs (a later turn decoded after the kept KV cache
    with `reuse`, or re-prefilled) with 0 on the environment's tokens: on the model's tokens they
    are the policy's log-probs of the whole trajectory within TOL, and exactly what the engine
    reported for that turn. Greedy episodes carry none."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    engine = HFEngine(model, tokenizer, decoder=path, reuse_kv=reuse)
    sampled = spy_on(engine)
    cfg = env_config(f"env.fn={ECHO}", "env.max_turns=3", "env.max_turn_tokens=6")
    worker = RolloutWorker(engine, tokenizer, env=environment_spec(cfg))
    examples = [Example("What is 2 + 3?", "5"), Example("What is 4 + 4?", "8")]
    torch.manual_seed(0)
    r = worker.rollout(examples, SamplingParams(n=2, max_new_tokens=16, temperature=0.9))
    assert int(r.episodes.num_turns.max()) >= 2, "no episode reached a second turn"
    assert r.sampler_logprobs is not None
    expected = policy_logprobs(model, tokenizer, r.prompt_ids, r.completion_ids, 0.9)
    for k, (logp, mask) in enumerate(zip(r.sampler_logprobs, r.token_mask, strict=True)):
        mask = torch.tensor(mask, dtype=torch.bool)
        assert logp.dtype == torch.float32 and len(logp) == len(mask) == len(r.completion_ids[k])
        assert torch.all(logp[~mask] == 0) and torch.all(logp[mask] < 0)
        assert (logp[mask] - expected[k][mask]).abs().max().item() <= tol(0.9)
        # turn by turn, exactly the engine's numbers (turn t of row k is row j of call t)
        turns = engine.sampled_logprobs
        model_ids = logp[mask]
        start = 0
        for t in range(int(r.episodes.num_turns[k])):
            j = sum(1 for i in range(k) if int(r.episodes.num_turns[i]) > t)
            part = turns[t][j][: len(sampled[t][j])]
            n = min(len(part), len(model_ids) - start)  # the last turn may be cut by a limit
            assert torch.equal(model_ids[start: start + n], part[:n])
            start += n
        assert start == len(model_ids)
    torch.manual_seed(0)
    greedy = worker.rollout(examples, SamplingParams(n=1, max_new_tokens=16, greedy=True))
    assert greedy.sampler_logprobs is None
