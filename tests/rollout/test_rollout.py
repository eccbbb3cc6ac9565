"""Tests for reasonrl.rollout: the HF engine and the RolloutWorker on the tiny random model."""

from __future__ import annotations

import copy

import pytest
import torch

from reasonrl.accel.modules import growing_cache, transposed_linear_weights
from reasonrl.batch import Example
from reasonrl.errors import WeightSyncError
from reasonrl.rollout import RolloutWorker, SamplingParams, make_engine
from reasonrl.rollout.hf import HFEngine, filter_logits, sample_tokens
from reasonrl.weights import CHECKSUM_SAMPLE, weights_checksum

MAX_NEW = 12
EXAMPLES = [
    Example(prompt="What is 2 + 3?", ground_truth="5"),
    Example(prompt="What is 17 + 25? Think step by step.", ground_truth="42"),
    Example(prompt=[{"role": "user", "content": "What is 9 - 4?"}], ground_truth="5"),
]


def eos_biased(model, bias: float):
    """A copy of `model` whose logits for EOS are raised by `bias` (a hook on lm_head).

    The random tiny model's logits are nearly uniform over the 49k-token vocabulary, so
    P(EOS) per step is about e^bias / (e^bias + 49151): bias=100 makes EOS certain,
    bias=8 gives roughly 5% per step, a mix of finished and truncated rows.
    """
    model = copy.deepcopy(model)
    eos = model.generation_config.eos_token_id

    def hook(module, inputs, logits):
        logits = logits.clone()
        logits[..., eos] += bias
        return logits

    model.lm_head.register_forward_hook(hook)
    return model


def eos_after_token_multiple(model, k: int):
    """A copy of `model` that answers EOS right after any token id divisible by `k`: an
    end that depends on each row's own text only, not on its place in the batch (greedy
    decoding of the random model stays far from EOS otherwise)."""
    model = copy.deepcopy(model)
    eos, last = model.generation_config.eos_token_id, {}

    def remember_input(module, args, kwargs):
        last["ids"] = kwargs["input_ids"][:, -1]

    def hook(module, inputs, logits):
        logits = logits.clone()
        logits[last["ids"] % k == 0, -1, eos] += 100.0
        return logits

    model.register_forward_pre_hook(remember_input, with_kwargs=True)
    model.lm_head.register_forward_hook(hook)
    return model


def make_worker(model, tokenizer, **kwargs) -> RolloutWorker:
    return RolloutWorker(HFEngine(model, tokenizer), tokenizer, system_prompt="Be brief.", **kwargs)


def check_invariants(rollouts, tokenizer, examples, n, max_new_tokens):
    eos = tokenizer.eos_token_id
    encoder = RolloutWorker(None, tokenizer, system_prompt="Be brief.")
    worker_prompts = [encoder.encode(e) for e in examples]
    assert len(rollouts) == len(examples) * n
    assert rollouts.group.tolist() == [g for g in range(len(examples)) for _ in range(n)]
    assert rollouts.group.dtype == torch.long
    assert rollouts.prompt_ids == [p for p in worker_prompts for _ in range(n)]
    assert all(r is examples[i // n] for i, r in enumerate(rollouts.examples))
    assert rollouts.truncated.dtype == torch.bool
    # the sampled tokens' log-probs (the HF engine's, `reasonrl.rollout.hf`): one per id, <= 0
    assert [len(x) for x in rollouts.sampler_logprobs] == [len(c) for c in rollouts.completion_ids]
    assert all(bool((x <= 0).all()) and bool(torch.isfinite(x).all()) for x in rollouts.sampler_logprobs)
    for ids, truncated, text in zip(rollouts.completion_ids, rollouts.truncated.tolist(),
                                    rollouts.texts, strict=True):
        assert 1 <= len(ids) <= max_new_tokens
        assert truncated == (eos not in ids)
        if truncated:
            assert len(ids) == max_new_tokens
        else:
            assert ids[-1] == eos and eos not in ids[:-1]
        assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert rollouts.completion_lengths.tolist() == [float(len(c)) for c in rollouts.completion_ids]


# ---------------------------------------------------------------------------- rollouts


def test_rollout_shapes_on_random_model(tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)
    rollouts = make_worker(model, tokenizer).rollout(EXAMPLES, SamplingParams(n=4, max_new_tokens=MAX_NEW))
    check_invariants(rollouts, tokenizer, EXAMPLES, n=4, max_new_tokens=MAX_NEW)


def test_rollout_mix_of_finished_and_truncated_rows(tiny):
    model, tokenizer = tiny
    worker = make_worker(eos_biased(model, 8.0), tokenizer)
    torch.manual_seed(1)
    rollouts = worker.rollout(EXAMPLES, SamplingParams(n=4, max_new_tokens=MAX_NEW))
    check_invariants(rollouts, tokenizer, EXAMPLES, n=4, max_new_tokens=MAX_NEW)
    truncated = rollouts.truncated.tolist()
    assert any(truncated) and not all(truncated)  # both branches were exercised
    assert any(1 < len(c) < MAX_NEW for c in rollouts.completion_ids)  # an EOS mid-way


@pytest.mark.parametrize("greedy", [True, False])
def test_rollout_certain_eos_stops_at_once(tiny, greedy):
    model, tokenizer = tiny
    worker = make_worker(eos_biased(model, 100.0), tokenizer)
    rollouts = worker.rollout(EXAMPLES[:2], SamplingParams(n=3, max_new_tokens=MAX_NEW, greedy=greedy))
    assert rollouts.completion_ids == [[tokenizer.eos_token_id]] * 6
    assert rollouts.truncated.tolist() == [False] * 6
    assert rollouts.texts == [""] * 6


def test_engine_output_rows_are_prompt_major(tiny):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer)
    prompts = [tokenizer("short", add_special_tokens=False)["input_ids"],
               tokenizer("a much longer prompt than the first", add_special_tokens=False)["input_ids"]]
    greedy = SamplingParams(n=2, max_new_tokens=6, greedy=True)
    gen = engine.generate(prompts, greedy)
    assert len(gen.completion_ids) == 4 and len(gen.truncated) == 4
    # greedy samples of one prompt are identical; rows 0-1 answer prompt 0, rows 2-3 prompt 1
    assert gen.completion_ids[0] == gen.completion_ids[1]
    assert gen.completion_ids[2] == gen.completion_ids[3]
    assert gen.completion_ids[0] != gen.completion_ids[2]
    single = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=6, greedy=True))
    assert gen.completion_ids == [single.completion_ids[i] for i in (0, 0, 1, 1)]
    assert gen.truncated == [single.truncated[i] for i in (0, 0, 1, 1)]
    assert gen.completion_ids[0] is not gen.completion_ids[1]  # rows are not aliased


def test_generate_restores_training_mode(tiny):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer)
    was_training = model.training
    try:
        for mode in (True, False):
            model.train(mode)
            engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2, greedy=True))
            assert model.training is mode
    finally:
        model.train(was_training)


def test_greedy_is_deterministic(tiny):
    model, tokenizer = tiny
    worker = make_worker(model, tokenizer)
    params = SamplingParams(n=2, max_new_tokens=MAX_NEW, greedy=True)
    torch.manual_seed(0)
    first = worker.rollout(EXAMPLES, params)
    torch.manual_seed(123)  # the seed must not matter
    second = worker.rollout(EXAMPLES, params)
    assert first.completion_ids == second.completion_ids
    assert first.texts == second.texts


def test_sampling_reproducible_with_seed(tiny):
    model, tokenizer = tiny
    worker = make_worker(model, tokenizer)
    params = SamplingParams(n=3, max_new_tokens=8, temperature=0.9, top_k=50, top_p=0.95)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(worker.rollout(EXAMPLES[:1], params).completion_ids)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert len(set(map(tuple, runs[0]))) > 1  # samples within a group differ


def test_top_k_one_equals_greedy(tiny):
    model, tokenizer = tiny
    worker = make_worker(model, tokenizer)
    greedy = worker.rollout(EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=8, greedy=True))
    torch.manual_seed(0)
    top1 = worker.rollout(EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=8, top_k=1))
    assert top1.completion_ids == greedy.completion_ids


# ------------------------------------------------------------------- the decode loop


def test_greedy_decode_equals_transformers_generate(tiny):
    """The lean loop (shared prefill, finished rows leaving the batch, transposed weights)
    decodes exactly what `model.generate` decodes, padding and early EOS included."""
    model, tokenizer = tiny
    model = eos_after_token_multiple(model, 11)  # rows end at different steps, two run to the limit
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"]
               for t in ("hi", "a longer prompt with more tokens in it", "two words", "x y z")]
    gen = HFEngine(model, tokenizer).generate(prompts, SamplingParams(n=1, max_new_tokens=24, greedy=True))
    width = max(map(len, prompts))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    eos = tokenizer.eos_token_id
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                             eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    expected = []
    for row in out[:, width:].tolist():
        expected.append(row[: row.index(eos) + 1] if eos in row else row)
    assert gen.completion_ids == expected
    assert gen.truncated == [eos not in row for row in expected]
    assert [len(c) for c in gen.completion_ids] == [24, 22, 24, 1]


def test_growing_cache_holds_what_concatenation_holds(tiny):
    model, _ = tiny
    cache = growing_cache(model.config, reserve=2)
    g = torch.Generator().manual_seed(0)
    expected_k = torch.zeros(3, 1, 0, 4)
    expected_v = torch.zeros(3, 1, 0, 4)
    for step, new in enumerate([5, 1, 1, 1, 3]):  # the room of 2 overflows twice
        rows = expected_k.size(0)
        k, v = torch.randn(rows, 1, new, 4, generator=g), torch.randn(rows, 1, new, 4, generator=g)
        keys, values = cache.layers[0].update(k, v)
        expected_k, expected_v = torch.cat([expected_k, k], 2), torch.cat([expected_v, v], 2)
        assert torch.equal(keys, expected_k) and torch.equal(values, expected_v)
        if step == 1:
            cache.layers[0].batch_repeat_interleave(2)
            expected_k, expected_v = expected_k.repeat_interleave(2, 0), expected_v.repeat_interleave(2, 0)
        if step == 3:
            cache.layers[0].batch_select_indices(torch.tensor([0, 4, 5]))
            expected_k, expected_v = expected_k[[0, 4, 5]], expected_v[[0, 4, 5]]
    assert cache.layers[0].get_seq_length() == 11


def test_filter_logits_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.9),
                                      (0.8, 10, 0.5), (1.3, 1, 0.95), (1.0, 0, 0.01)]:
        expected = logits.clone()
        if temperature != 1.0:
            expected = TemperatureLogitsWarper(temperature)(None, expected)
        if top_k:
            expected = TopKLogitsWarper(top_k)(None, expected)
        if top_p < 1.0:
            expected = TopPLogitsWarper(top_p)(None, expected)
        got = filter_logits(logits, temperature, top_k, top_p)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_filter_logits_hand_computed_nucleus():
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    # top-p 0.5: 0.4 alone is short of 0.5, 0.4 + 0.3 reaches it -> tokens 3 and 2 stay
    kept = torch.isfinite(filter_logits(probs.log(), top_p=0.5))
    assert kept.tolist() == [[False, False, True, True]]
    # top-k 1 keeps the argmax; top-p tiny still keeps one token
    assert torch.isfinite(filter_logits(probs.log(), top_k=1)).tolist() == [[False, False, False, True]]
    assert torch.isfinite(filter_logits(probs.log(), top_p=1e-6)).tolist() == [[False, False, False, True]]


def test_sample_tokens_inverts_the_cdf():
    logits = torch.tensor([0.1, 0.2, 0.3, 0.4]).log().expand(6, 4)
    # cumulative probabilities 0.1, 0.3, 0.6, 1.0: u picks the first bin whose edge exceeds it
    u = torch.tensor([0.0, 0.05, 0.15, 0.45, 0.61, 0.999999])
    assert sample_tokens(logits, u).tolist() == [0, 0, 1, 2, 3, 3]
    # filtered tokens (-inf) are never drawn, whatever u
    masked = filter_logits(logits[:3], top_p=0.5)
    assert set(sample_tokens(masked, torch.tensor([0.0, 0.5, 0.999999])).tolist()) <= {2, 3}


def test_sample_tokens_distribution():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    g = torch.Generator().manual_seed(0)
    draws = sample_tokens(probs.log().expand(40000, 4), torch.rand(40000, generator=g))
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    torch.testing.assert_close(freq, probs, atol=0.01, rtol=0)  # binomial sd <= 0.0025


def test_transposed_weights_same_outputs_and_restored(tiny):
    model, tokenizer = tiny
    before = {n: p for n, p in model.named_parameters()}
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits
        with transposed_linear_weights(model):
            assert not model.model.layers[0].mlp.up_proj.weight.is_contiguous()
            assert model.lm_head.weight is not before["model.embed_tokens.weight"]
            got = model(input_ids=ids).logits
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
    assert {n: p for n, p in model.named_parameters()} == before  # the very same objects
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tying restored


# ------------------------------------------------------------------------- load_weights


def greedy_ids(model, tokenizer) -> list[list[int]]:
    worker = make_worker(model, tokenizer)
    return worker.rollout(EXAMPLES, SamplingParams(n=1, max_new_tokens=MAX_NEW, greedy=True)).completion_ids


def test_load_weights_shared_model_is_a_no_op(tiny):
    model, tokenizer = tiny
    before = {k: v.clone() for k, v in model.state_dict().items()}
    expected = greedy_ids(model, tokenizer)
    worker = make_worker(model, tokenizer)
    worker.load_weights(model.named_parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert greedy_ids(model, tokenizer) == expected


def test_load_weights_into_separate_model(tiny):
    model, tokenizer = tiny
    policy, engine_model = copy.deepcopy(model), copy.deepcopy(model)
    worker = make_worker(engine_model, tokenizer)
    params = SamplingParams(n=1, max_new_tokens=MAX_NEW, greedy=True)
    old = worker.rollout(EXAMPLES, params).completion_ids

    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.5)
    new = greedy_ids(policy, tokenizer)
    assert new != old
    assert worker.rollout(EXAMPLES, params).completion_ids == old  # not synced yet

    worker.load_weights(policy.named_parameters())
    engine_params = dict(engine_model.named_parameters())
    assert engine_params.keys() == dict(policy.named_parameters()).keys()
    for name, tensor in policy.named_parameters():
        assert torch.equal(engine_params[name], tensor), name
        assert engine_params[name].data_ptr() != tensor.data_ptr()  # copied, not aliased
    assert engine_model.lm_head.weight is engine_model.model.embed_tokens.weight  # still tied
    assert worker.rollout(EXAMPLES, params).completion_ids == new


def test_load_weights_unknown_name(tiny):
    model, tokenizer = tiny
    engine = HFEngine(copy.deepcopy(model), tokenizer)
    with pytest.raises(KeyError, match="no parameter 'model.not_a_layer.weight'"):
        engine.load_weights([("model.not_a_layer.weight", torch.zeros(2))])


# --------------------------------------------------------------- checksum and version


def test_weights_checksum_hand_computed():
    # two tensors, name order a < b: 1 * sum(a) + 2 * sum(b); "a" again (tied) counts once
    a, b = torch.tensor([1.0, 2.0, 3.5]), torch.tensor([[0.25, -1.0], [4.0, 0.0]])
    assert weights_checksum([("b", b), ("a", a), ("a", torch.zeros(3))]) == 1 * 6.5 + 2 * 3.25
    # swapping the tensors' names changes it
    assert weights_checksum([("a", b), ("b", a)]) == 1 * 3.25 + 2 * 6.5
    # a large tensor is sampled with an even stride: elements 0, s, 2s, ... are read
    big = torch.zeros(CHECKSUM_SAMPLE * 3)
    big[0], big[3], big[1] = 1.0, 10.0, 100.0  # stride 3: index 1 is not read
    assert weights_checksum([("w", big)]) == 11.0


def test_checksum_catches_a_skipped_push_and_stamps_the_version(tiny):
    model, tokenizer = tiny
    policy, engine_model = copy.deepcopy(model), copy.deepcopy(model)
    worker = make_worker(engine_model, tokenizer)
    params = SamplingParams(n=1, max_new_tokens=4, greedy=True)
    assert worker.rollout(EXAMPLES[:1], params).policy_version == 0
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1e-5)  # about one Adam step at lr 1e-5
    expected = weights_checksum(policy.named_parameters())
    assert expected != weights_checksum(engine_model.named_parameters())

    class SkippingEngine(HFEngine):  # a transport that silently drops the push
        def load_weights(self, named_tensors):
            pass

    skipping = RolloutWorker(SkippingEngine(engine_model, tokenizer), tokenizer)
    with pytest.raises(WeightSyncError, match="policy version 1.*skipped or incomplete"):
        skipping.load_weights(policy.named_parameters(), version=1, expected_checksum=expected)
    assert skipping.policy_version == 0

    worker.load_weights(policy.named_parameters(), version=1, expected_checksum=expected)
    assert worker.policy_version == 1
    assert worker.rollout(EXAMPLES[:1], params).policy_version == 1


# ------------------------------------------------------------------------------ encode


def test_encode_renders_and_tokenizes(tiny):
    model, tokenizer = tiny
    worker = make_worker(model, tokenizer)
    ids = worker.encode(EXAMPLES[0])
    assert tokenizer.decode(ids) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                     "What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    raw = RolloutWorker(HFEngine(model, tokenizer), tokenizer, apply_chat_template=False)
    assert raw.encode(EXAMPLES[0]) == tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]


def test_encode_too_long_names_origin(tiny):
    model, tokenizer = tiny
    worker = make_worker(model, tokenizer, max_prompt_tokens=20)
    long = Example(prompt="add these numbers " * 10, ground_truth="0", meta={"origin": "data/train.jsonl:17"})
    with pytest.raises(ValueError) as info:
        worker.encode(long)
    msg = str(info.value)
    assert msg.startswith("data/train.jsonl:17: prompt has ")
    assert "data.max_prompt_tokens=20" in msg
    n_tokens = len(make_worker(model, tokenizer, max_prompt_tokens=1000).encode(long))
    assert f"prompt has {n_tokens} tokens" in msg


def test_encode_too_long_without_origin_quotes_prompt(tiny):
    model, tokenizer = tiny
    worker = make_worker(model, tokenizer, max_prompt_tokens=5)
    with pytest.raises(ValueError, match=r"^'What is 2 \+ 3\?': prompt has \d+ tokens"):
        worker.encode(EXAMPLES[0])


def test_encode_at_the_limit_is_fine(tiny):
    model, tokenizer = tiny
    n_tokens = len(make_worker(model, tokenizer).encode(EXAMPLES[0]))
    assert len(make_worker(model, tokenizer, max_prompt_tokens=n_tokens).encode(EXAMPLES[0])) == n_tokens


def test_make_engine(tiny):
    model, tokenizer = tiny
    assert isinstance(make_engine("hf", model, tokenizer), HFEngine)
    with pytest.raises(ValueError, match="rollout.engine: unknown value 'vllm2'; allowed: hf, vllm"):
        make_engine("vllm2", model, tokenizer)
