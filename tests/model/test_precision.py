"""model.precision: bf16-mixed keeps fp32 master weights and optimizer state and computes in bf16;
pure bf16 counts the updates it rounds away; `auto` is decided once, from the calibration cache."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import grouped_rows, needs_peft, policy_settings

from reasonrl.batch import TrainBatch
from reasonrl.config import ConfigError, load_config
from reasonrl.model import precision
from reasonrl.model.load import build_tiny_model
from reasonrl.registry import LOSS_AGGREGATIONS
from reasonrl.workers.policy import PolicyWorker

PROMPTS, COMPLETIONS = grouped_rows()
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.5, 0.7, -0.2])
U_BF16 = 2.0 ** -8  # bf16's unit roundoff: 8 significant bits (7 stored + the implicit one)


@pytest.fixture(scope="module")
def base_model():
    model, _ = build_tiny_model(seed=3)
    return model


def worker_for(base_model, prec: str, **settings) -> PolicyWorker:
    return PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(precision=prec, **settings))


def first_gradient(worker: PolicyWorker) -> list[torch.Tensor]:
    """The gradients the optimizer's first step is given (what it steps: the masters' in bf16-mixed)."""
    seen, step = [], worker.learner.optimizer.step

    def spy(*args, **kwargs):
        seen.append([p.grad.detach().clone() for p in worker.learner.trainable])
        return step(*args, **kwargs)

    worker.learner.optimizer.step = spy
    worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    return seen[0]


@pytest.mark.parametrize("budget", [0, 24])
@pytest.mark.parametrize("agg", LOSS_AGGREGATIONS.names())
def test_bf16_mixed_gradients_equal_fp32_within_the_bf16_rounding_bound(base_model, agg, budget):
    """Every operand of each matrix product is rounded to bf16 once (relative error at most
    u = 2^-8); a gradient of an L-layer decoder passes through at most 2L + 1 such products
    forward (L attention and L MLP blocks and the LM head) and as many backward, so to first
    order its relative error is at most 2 (2L + 1) u: 10 u = 0.039 for the tiny model's two
    layers (measured: about 0.007). The budget of 24 positions splits the step into more
    micro-batches, whose bf16 gradients are summed in fp32."""
    kw = dict(loss_agg=agg, micro_batch_size=2, max_tokens_per_micro_batch=budget, lr=1e-3)
    fp32 = first_gradient(worker_for(base_model, "fp32", **kw))
    mixed_worker = worker_for(base_model, "bf16-mixed", **kw)
    mixed = first_gradient(mixed_worker)
    assert all(g.dtype == torch.float32 for g in mixed)  # summed in fp32
    layers = base_model.config.num_hidden_layers
    a, b = torch.cat([g.flatten() for g in fp32]), torch.cat([g.flatten() for g in mixed])
    assert 0 < float((a - b).norm() / a.norm()) <= 2 * (2 * layers + 1) * U_BF16


def test_bf16_mixed_masters_move_by_the_fp32_update_where_pure_bf16_rounds_it_away(base_model):
    """lr 1e-6: AdamW's first step moves each weight by about lr (m / sqrt(v) = sign(g)), far
    below half the bf16 spacing of a weight of ~0.02 (6e-5). The fp32 masters take it; pure
    bf16 loses it (train/params_unchanged), and the fp32 run's weights move as the masters do."""
    lr = 1e-6
    mixed = worker_for(base_model, "bf16-mixed", lr=lr, max_grad_norm=0.0)
    pure = worker_for(base_model, "bf16", lr=lr, max_grad_norm=0.0)
    masters = [m.detach().clone() for m in mixed.learner.trainable]
    assert all(m.dtype == torch.float32 for m in masters)
    assert all(p.dtype == torch.bfloat16 for p in mixed.model.parameters())  # the compute copy
    pure_before = [p.detach().clone() for p in pure.learner.trainable]
    metrics_mixed = mixed.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    metrics_pure = pure.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    moved = torch.cat([(m.detach() - b).flatten()
                       for m, b in zip(mixed.learner.trainable, masters, strict=True)])
    grads_nonzero = moved != 0
    assert float(grads_nonzero.float().mean()) > 0.9
    # |step| = lr |m| / (sqrt(v) + eps) = lr |g| / (|g| + 1e-8): lr but where a gradient is ~eps
    assert float(moved[grads_nonzero].abs().median()) == pytest.approx(lr, rel=0.05)
    state = mixed.learner.optimizer.state[mixed.learner.trainable[0]]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert "train/params_unchanged" not in metrics_mixed
    kept = torch.cat([(p.detach() == b).flatten() for p, b in zip(pure.learner.trainable, pure_before,
                                                                   strict=True)])
    assert metrics_pure["train/params_unchanged"] == pytest.approx(float(kept.float().mean()))
    assert metrics_pure["train/params_unchanged"] > 0.9
    # the compute copy is the masters rounded to nearest
    for p, m in zip(mixed.model.parameters(), mixed.learner.trainable, strict=True):
        assert torch.equal(p, m.to(torch.bfloat16))


def test_bf16_mixed_saves_and_loads_its_masters(base_model, tmp_path):
    """The checkpoint's HF folder holds the fp32 masters; loading them into a fresh bf16-mixed
    worker restores masters and compute copy bitwise (an exact resume)."""
    from safetensors.torch import load_file

    a = worker_for(base_model, "bf16-mixed", lr=1e-3)
    a.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    a.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    b = worker_for(base_model, "bf16-mixed", lr=1e-3)
    b.load_weights(saved)
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # as from a file: nothing shared with a
    for x, y in zip(a.learner.trainable, b.learner.trainable, strict=True):
        assert torch.equal(x, y)
    for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(x, y)
    ma = a.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    mb = b.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    assert ma == mb
    for x, y in zip(a.learner.trainable, b.learner.trainable, strict=True):
        assert torch.equal(x, y)


def test_the_precisions_dtypes():
    assert [precision.load_dtype(p) for p in ("fp32", "bf16-mixed", "bf16")] == [
        torch.float32, torch.float32, torch.bfloat16]
    assert [precision.compute_dtype(p) for p in ("fp32", "bf16-mixed", "bf16")] == [
        torch.float32, torch.bfloat16, torch.bfloat16]
    with pytest.raises(ValueError, match="`auto` is resolved before any model loads"):
        precision.load_dtype("auto")


def test_the_old_model_dtype_key_names_its_replacement(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  dtype: bfloat16\n")
    with pytest.raises(ConfigError, match=r"model.dtype was replaced by model.precision: set "
                                          r"model.precision=bf16 .* or model.precision=bf16-mixed"):
        load_config(path)
    path.write_text("model:\n  dtype: float32\n")  # a saved config of before: the default then and now
    assert load_config(path).model.precision == "fp32"


def test_auto_is_decided_from_the_cached_calibration_without_measuring(monkeypatch):
    from reasonrl.accel import calibrate

    def cached(hidden, intermediate, tokens, device="cpu"):
        return ("bf16-mixed" if (hidden, intermediate) == (64, 128) else "fp32"), "cached"

    monkeypatch.setattr(calibrate, "precision_choice", cached, raising=False)
    assert precision.resolve("auto", "tiny", "", 256) == (
        "bf16-mixed", "cached")
    assert precision.resolve("fp32", "tiny", "", 256) == ("fp32", None)


def test_model_shapes_read_the_config_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 576, "intermediate_size": 1536}))
    assert precision.model_shapes(str(tmp_path)) == (576, 1536)
    assert precision.model_shapes("tiny") == (64, 128)


@needs_peft
def test_bf16_mixed_lora_trains_fp32_adapters_on_a_bf16_base(base_model):
    """LoRA under bf16-mixed: the frozen base computes in bf16, the adapters stay fp32 and are
    what the optimizer steps (no master copies: they are fp32 already), and a step moves them."""
    from reasonrl.model.lora import apply_lora

    model = apply_lora(copy.deepcopy(base_model), 4, 8.0, 0.0, ["q_proj", "v_proj"], seed=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B starts at 0: give A a gradient too
                p.normal_(0, 0.05)
    worker = PolicyWorker(model, 0, policy_settings(precision="bf16-mixed", lr=1e-3))
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n and p.dtype == torch.float32 for n, p in trained.items())
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    assert worker.learner.masters.pairs == []
    assert all(a is b for a, b in zip(worker.learner.trainable, trained.values(), strict=True))
    before = {n: p.detach().clone() for n, p in trained.items()}
    worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    assert all(not torch.equal(p, before[n]) for n, p in trained.items())
