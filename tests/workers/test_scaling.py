"""Scale-out: data-parallel ranks (gloo + FSDP2), LoRA, the placement config's rules
(docs/scaling.md). Placement itself (Ray actors, proxies, weight sync) is tested in
test_placement.py.

The 2-rank gradient test runs its ranks as plain processes with torch.distributed (gloo).
"""

from __future__ import annotations

import copy
import functools
import math
import pickle
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch
from helpers import (
    HAS_PEFT,
    REPO,
    keep_torch_threads,  # noqa: F401 (autouse)
    metrics,
    needs_peft,
    smoke_cfg,
)

from reasonrl.config import load_config
from reasonrl.errors import ConfigError
from reasonrl.learn.learner import LAYOUT_METRICS
from reasonrl.model.precision import cast_for_compute
from reasonrl.train.trainer import Trainer, train

# ---- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "message"), [
    (["placement.policy.ranks=2"], "2 ranks need placement.mode=ray"),
    (["placement.rollout.replicas=2"], "placement.rollout.replicas: 2 replicas need placement.mode=ray"),
    (["placement.mode=ray", "placement.sync_bucket_mb=0"], "placement.sync_bucket_mb: must be > 0"),
    (["placement.mode=ray", "placement.policy.cpu_offload=true"],
     "placement.policy.cpu_offload: applies to FSDP2 ranks; set placement.policy.ranks > 1"),
    (["placement.mode=ray", "placement.policy.reshard_after_forward=false"],
     "placement.policy.reshard_after_forward: applies to FSDP2 ranks"),
    (["rollout.vllm.tensor_parallel_size=2"], "rollout.vllm.tensor_parallel_size: 2 is vLLM's"),
    (["rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2", "placement.mode=ray",
      "placement.rollout.num_gpus=1"], r"need placement.rollout.num_gpus=2 \(each rollout replica's actor"),
    (["placement.mode=ray", "placement.rollout.num_gpus=1.5"], "a fraction must be < 1"),
    (["placement.rollout.num_gpus=0.5"], "only used with placement.mode=ray"),
    (["placement.mode=ray", "placement.start_timeout=0"], "placement.start_timeout: must be > 0"),
    (["placement.mode=cluster"], "allowed values: local, ray"),
    (["model.lora.rank=-1"], "model.lora.rank: must be >= 0"),
    (["model.lora.rank=4", "model.lora.dropout=1.0"], r"model.lora.dropout: must be in \[0, 1\)"),
])
def test_bad_placement_and_lora_config_is_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs" / "smoke.yaml", overrides)


# ---- LoRA -------------------------------------------------------------------------------


@needs_peft
def test_merged_weight_is_w_plus_scaled_b_a(tiny):
    """LoRA's merged weight W + (alpha / r) B A (Hu et al. 2021, eq. 3), by hand: r = 2,
    alpha = 4 (scale 2), A = [[1, 0, ...], [0, 3, 0, ...]], B[0] = [0.5, 0.25], B[5] = [0, 1]
    -> (B A)[0, 0] = 0.5, (B A)[0, 1] = 0.75, (B A)[5, 1] = 3, elsewhere 0."""
    from reasonrl.model.lora import apply_lora, merged_named_weights

    model = copy.deepcopy(tiny[0])
    w = model.model.layers[1].self_attn.q_proj.weight.detach().clone()
    adapted = apply_lora(model, rank=2, alpha=4.0, dropout=0.0, target_modules=["q_proj"])
    layer = adapted.get_base_model().model.layers[1].self_attn.q_proj
    a, b = torch.zeros(2, w.shape[1]), torch.zeros(w.shape[0], 2)
    a[0, 0], a[1, 1] = 1.0, 3.0
    b[0] = torch.tensor([0.5, 0.25])
    b[5] = torch.tensor([0.0, 1.0])
    with torch.no_grad():
        layer.lora_A["default"].weight.copy_(a)
        layer.lora_B["default"].weight.copy_(b)
    merged = dict(merged_named_weights(adapted))
    assert set(merged) == {n for n, _ in tiny[0].named_parameters()}  # plain HF names
    expected = w.clone()
    expected[0, 0] += 2 * 0.5
    expected[0, 1] += 2 * 0.75
    expected[5, 1] += 2 * 3.0
    torch.testing.assert_close(merged["model.layers.1.self_attn.q_proj.weight"], expected, rtol=0, atol=1e-6)
    untouched = "model.layers.0.self_attn.q_proj.weight"  # adapted too, but B A = 0 there (B starts at 0)
    assert torch.equal(merged[untouched], tiny[0].get_parameter(untouched))


@needs_peft
def test_lora_run_trains_saves_and_resumes_exactly(tmp_path):
    """Two LoRA steps (KL to the adapter-free reference in the loss): only the adapter
    trains, the engine serves the merged weights (checksum-verified each sync), checkpoints
    hold adapter/ and a merged huggingface/ that transformers loads, and 1 step + resume +
    1 step ends exactly where 2 straight steps end."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from reasonrl.model.forward import completion_logprobs, make_micro_batches

    lora = ["model.lora.rank=4", "model.lora.alpha=8", "algo.beta=0.1", "trainer.steps=2"]
    trainer = Trainer(smoke_cfg(tmp_path, "lora", *lora, "trainer.save_every=1", "trainer.keep_last=0"))
    base = {n: p.detach().clone() for n, p in trainer.policy.model.get_base_model().named_parameters()
            if ".lora_" not in n}
    trainer.fit()
    policy = trainer.policy
    trained = {n: p for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    assert max(p.abs().max().item() for n, p in trained.items() if "lora_B" in n) > 0  # B left zero
    assert all(torch.equal(p, base[n]) for n, p in policy.model.get_base_model().named_parameters()
               if ".lora_" not in n)  # the base is frozen
    assert len(policy.learner.optimizer.state) == len(trained)  # AdamW state for the adapter only
    assert policy.ref_model.__class__.__name__ == "AdapterDisabled"  # no second copy
    rows = metrics(tmp_path / "lora")
    assert rows[-1]["train/kl"] > 0  # the adapter moved the policy away from the base

    step = tmp_path / "lora" / "checkpoints" / "step_2"
    assert (step / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(step / "huggingface")
    mb = make_micro_batches([[1, 5, 9]], [[20, 21, 2]], 1, 0)[0]
    with torch.no_grad():
        want, _ = completion_logprobs(policy.model.eval(), mb.to(policy.device))  # the GPU, if any
        got, _ = completion_logprobs(merged, mb)
    torch.testing.assert_close(got, want.cpu(), rtol=1e-4, atol=1e-5)  # merged = W + scale * B A

    # resume from step 1 (as if stopped before step 2 was saved): the straight run's end
    run2 = tmp_path / "resumed"
    shutil.copytree(tmp_path / "lora", run2)
    shutil.rmtree(run2 / "checkpoints" / "step_2")
    Trainer(smoke_cfg(tmp_path, "resumed", *lora, "trainer.resume=auto")).fit()
    assert metrics(run2) == rows
    a = load_file(step / "adapter" / "adapter_model.safetensors")
    b = load_file(run2 / "checkpoints" / "step_2" / "adapter" / "adapter_model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


@needs_peft
def test_lora_without_merged_copy_saves_only_the_adapter(tmp_path):
    from reasonrl.checkpoint import list_checkpoints, read_checkpoint

    train(smoke_cfg(tmp_path, "r", "model.lora.rank=2", "model.lora.save_merged=false",
                    "model.lora.target_modules=[q_proj]", "trainer.steps=1"))
    (step,) = list_checkpoints(tmp_path / "r")
    assert sorted(p.name for p in step.iterdir()) == ["adapter", "manifest.json", "state.pt",
                                                      "trainer_state.json"]
    _, _, weights = read_checkpoint(step)
    assert weights and all(".lora_" in k and "q_proj" in k for k in weights)


# ---- data-parallel ranks: 2 gloo ranks give the gradient of 1 process ---------------------

PROMPTS = [[1, 5, 9, 11], [1, 7], [1, 5, 9, 11], [3, 4, 5, 6, 7, 8], [2, 3]]
COMPLETIONS = [[20, 21, 2], [30], [40, 41, 42, 43, 44], [50, 51], [7, 7, 7, 7]]
ADVANTAGES = [1.0, -0.5, 0.25, -1.5, 0.7]
# 5 rows over 2 ranks: rank 0 trains 3, rank 1 2 (one micro-batch of padding with size 1)
CASES = {
    "token, KL + entropy in the loss": dict(loss_agg="token", beta=0.1, entropy_coef=0.01,
                                            micro_batch_size=1),
    "sequence, 2 epochs x 2 mini-batches": dict(loss_agg="sequence", ppo_epochs=2, mini_batches=2,
                                                micro_batch_size=2, sgd_lr=0.5),
}


def run_case(worker, model, hyper: dict) -> tuple[list[dict], dict, list[dict]]:
    """(full gradient at each optimizer step, the step's metrics, each update's own metrics)
    of one train_step."""
    from reasonrl.batch import TrainBatch
    from reasonrl.model.shards import full_tensor

    learner = worker.learner
    steps, per_update, inner, update = [], [], learner.optimizer.step, learner.update

    # what the optimizer steps, by the model's names (bf16-mixed in one process: the fp32 masters)
    names = [n.removeprefix("lm.") for n, p in model.named_parameters() if p.requires_grad]

    def step(*args, **kwargs):  # the trained parameters' gradients (LoRA: A and B only)
        steps.append({n: full_tensor(p.grad).clone() for n, p in zip(names, learner.trainable, strict=True)
                      if p.grad is not None})
        return inner(*args, **kwargs)

    def recorded_update(*args, **kwargs):
        metrics = update(*args, **kwargs)
        per_update.append({k: m.value for k, m in metrics.items()})
        return metrics

    learner.optimizer.step = step
    learner.update = recorded_update
    metrics = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, torch.tensor(ADVANTAGES)))
    return steps, metrics, per_update


# Float32 reduction order: a sum of n terms computed in another order differs by at most
# ~n * eps * sum|terms| (eps = 6e-8). The losses and metrics here sum <= 20 token terms and
# the gradients <= 64-term dot products, so 1e-5 relative (metrics) and 1e-4 of the largest
# entry (gradients) hold on any CPU with margin; measured ~1e-6 on Intel and AMD.
METRIC_REL = 1e-5
GRAD_REL = 1e-4
# `train/grad_norm` is torch's float32 norm over up to 3.1M elements of a tensor, accumulated
# with error ~eps * sqrt(N) (worst eps * N): it is compared with the float64 norm of the same
# run's gradient (measured 2e-5), the gradients themselves elementwise above.
NORM_REL = 2e-4
# bf16-mixed: the ranks and the one process round the same operands to bf16 (u = 2^-8) but
# multiply them in other shapes (a rank's half of each micro-batch) and sum in other orders;
# as in tests/model/test_precision.py, 2 (2L + 1) u (L = 2 layers) bounds the relative error
# of a gradient (against the largest entry) and of a metric.
BF16_REL = 2 * (2 * 2 + 1) * 2.0 ** -8


def norm(tensors: dict) -> float:
    return math.sqrt(sum(t.double().pow(2).sum().item() for t in tensors.values()))


def assert_same_step(name: str, dp: tuple, one: tuple, lr: float) -> None:
    """The data-parallel step equals one process's, within the bounds above.

    After an update the two runs' parameters differ by what SGD made of their gradients'
    round-off: delta_k = lr * sum_{j<k} (g_dp_j - g_one_j), known exactly here. A later
    update's loss then differs by at most ||grad L_k|| * ||delta_k|| (first order; x2 for the
    curvature over a step of ~1e-7), on top of the reduction-order bound. The other metrics of
    a later update have no such bound at hand: they are compared at the first update only
    (and the gradients at every update)."""
    (dp_steps, dp_metrics, dp_updates), (one_steps, one_metrics, one_updates) = dp, one
    grad_rel, metric_rel = (BF16_REL, BF16_REL) if "bf16" in name else (GRAD_REL, METRIC_REL)
    assert len(dp_steps) == len(one_steps) == len(dp_updates) == len(one_updates)
    for k, (grads, expected) in enumerate(zip(dp_steps, one_steps, strict=True)):
        assert grads.keys() == expected.keys()
        assert max(g.abs().max().item() for g in expected.values()) > 1e-3  # a real gradient
        for n, g in grads.items():
            scale = expected[n].abs().max().item()
            diff = (g - expected[n]).abs().max().item()
            assert diff <= grad_rel * scale + 1e-9, f"{name}, optimizer step {k}: {n} differs by {diff}"
    assert dp_metrics.keys() == one_metrics.keys()
    for key in ("train/lr", "train/tokens", "train/sequences", "train/updates"):
        assert dp_metrics[key] == one_metrics[key], f"{name}: {key}"
    for key, value in one_updates[0].items():
        if key == "grad_norm" or key in LAYOUT_METRICS:  # a rank lays out only its rows
            continue
        assert dp_updates[0][key] == pytest.approx(value, rel=metric_rel, abs=1e-7), f"{name}: update 0 {key}"
    drift = {n: torch.zeros_like(g, dtype=torch.float64) for n, g in one_steps[0].items()}
    for k in range(1, len(one_updates)):
        for n in drift:
            drift[n] += lr * (dp_steps[k - 1][n].double() - one_steps[k - 1][n].double())
        a, b = dp_updates[k], one_updates[k]
        bound = metric_rel * abs(b["loss"]) + 1e-7 + 2 * norm(one_steps[k]) * norm(drift)
        assert abs(a["loss"] - b["loss"]) <= bound, f"{name}: update {k} loss {a['loss']} vs {b['loss']}"
    for updates, steps in ((dp_updates, dp_steps), (one_updates, one_steps)):
        for u, grads in zip(updates, steps, strict=True):
            assert u["grad_norm"] == pytest.approx(norm(grads), rel=NORM_REL)


# The same checks for what data-parallel ranks add: LoRA (A and B sharded with the layers they
# adapt, the reference = the adapter switched off) and FSDP2's memory options, each against
# one process with the same settings (and the same bounds, `assert_same_step`).
LORA = dict(lora_rank=4, loss_agg="token", beta=0.1, entropy_coef=0.01, micro_batch_size=1)
RANK_CASES = {
    "LoRA, token, KL to the adapter switched off + entropy": LORA,
    "LoRA, sequence, 2 epochs x 2 mini-batches": dict(lora_rank=4, loss_agg="sequence", ppo_epochs=2,
                                                      mini_batches=2, micro_batch_size=2, sgd_lr=0.5),
    "ZeRO-2 (reshard_after_forward=false)": dict(CASES["token, KL + entropy in the loss"],
                                                 reshard_after_forward=False),
    "cpu_offload": dict(CASES["sequence, 2 epochs x 2 mini-batches"], cpu_offload=True),
    # FSDP2's MixedPrecisionPolicy against one process's MasterWeights (bounds: BF16_REL)
    "bf16-mixed": dict(CASES["token, KL + entropy in the loss"], precision="bf16-mixed"),
}
# every case the ranks run; the LoRA ones need peft (absent from `make test-bare`)
DP_CASES = {name: hyper for name, hyper in {**CASES, **RANK_CASES}.items()
            if HAS_PEFT or not hyper.get("lora_rank")}
TEST_KEYS = ("sgd_lr", "lora_rank", "reshard_after_forward", "cpu_offload")  # not PolicySettings'


@functools.cache
def tiny_model():
    from reasonrl.model.load import build_tiny_model

    return build_tiny_model(seed=3)[0]


def make_worker(rank: int, world: int, hyper: dict, device: torch.device | None = None):
    """A policy on the tiny model (seed 3) and a reference that differs from it; with
    `lora_rank`, a LoRA adapter whose B starts random (so that A gets a gradient too) and the
    reference is the adapter switched off. One process (`world` 1) builds it on `device`."""
    from helpers import policy_settings

    from reasonrl.model import sharding
    from reasonrl.model.lora import AdapterDisabled, apply_lora
    from reasonrl.workers import ranks as parallel
    from reasonrl.workers.policy import PolicyWorker

    model = copy.deepcopy(tiny_model())
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    lora_rank = hyper.get("lora_rank", 0)
    if lora_rank:
        ref = None
        model = apply_lora(model, lora_rank, 8.0, 0.0, ["q_proj", "v_proj", "down_proj"], seed=1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    sgd_lr = hyper.get("sgd_lr")
    h = policy_settings(**{"lr": 0.0, "max_grad_norm": 0.0,
                           **{k: v for k, v in hyper.items() if k not in TEST_KEYS}})
    if world == 1:
        if device is not None:  # before the worker: its optimizer state lives where the weights do
            model, ref = model.to(device), None if ref is None else ref.to(device)
        if ref is not None and hyper.get("precision") == "bf16-mixed":  # the ranks' computes in bf16 too
            ref = cast_for_compute(ref, "bf16-mixed")
        worker = PolicyWorker(model, 0, h, ref_model=ref)
    else:
        cpu = torch.device("cpu")
        options = sharding.ShardOptions(hyper.get("reshard_after_forward", True),
                                        hyper.get("cpu_offload", False),
                                        hyper.get("precision") == "bf16-mixed")
        root = sharding.shard_model(model, cpu, options)
        if ref is not None:
            ref = sharding.shard_model(ref, cpu, options)
        elif hyper.get("beta", 0) > 0:  # as PolicyWorker does for one process
            ref = AdapterDisabled(root, model)
        worker = parallel.RankPolicyWorker(root, 0, h, rank, world, ref, device=cpu)
        model = root
    if sgd_lr is not None:  # later updates depend on earlier gradients linearly (AdamW's first
        # step is ~lr * sign(g))
        worker.learner.optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad],
                                                   lr=sgd_lr)
    return worker, model


def sync_pieces(worker) -> dict:
    """What a streamed sync reads from a policy: its plan for 20 kB buckets, every bucket, the
    served weights all-gathered (`named_weights`) and the checksum; for LoRA ranks also each
    adapted layer's W + s B A computed in one place from the whole (all-gathered) W, A and B."""
    from reasonrl.model import lora
    from reasonrl.model.shards import full_tensor

    plan = worker.sync_plan(20_000)
    out = {"plan": plan, "buckets": [worker.weight_bucket(names) for names in plan],
           "weights": dict(worker.named_weights()), "checksum": worker.weights_checksum(), "merged": {}}
    if getattr(worker, "lora", False):
        for name, layer in lora.adapted_layers(worker.model.lm).items():
            base = worker.model.lm.get_base_model().get_parameter(name)
            w, a, b = (full_tensor(t.detach()) for t in (base, layer.lora_A[lora.ADAPTER].weight,
                                                   layer.lora_B[lora.ADAPTER].weight))
            out["merged"][lora.served_name(name)] = (w, a, b, layer.scaling[lora.ADAPTER])
    return out


def rank_main(rank: int, world: int, init_method: str, queue, folder: str) -> None:
    import torch.distributed as dist
    from safetensors.torch import load_file

    from reasonrl.model.sharding import init_process_group

    torch.set_num_threads(1)
    init_process_group("gloo", init_method, rank, world, 120)
    out = {}
    for name, hyper in DP_CASES.items():
        worker, model = make_worker(rank, world, hyper)
        seen = []  # the dtype the first projection computes in
        hook = model.lm.get_decoder().layers[0].self_attn.q_proj.register_forward_pre_hook(
            lambda module, args, seen=seen: seen.append(module.weight.dtype))
        out[name] = run_case(worker, model, hyper)
        hook.remove()
        out[f"compute dtype of {name}"] = seen[0]
        if hyper.get("reshard_after_forward") is False:  # a forward without backward leaves full
            before = worker.weights_checksum()  # weights in place: the weight methods reshard first
            worker.probe_logprobs([1, 5, 9, 11])
            out["ZeRO-2 checksum before and after a probe"] = (before, worker.weights_checksum())
        if name in ("LoRA, sequence, 2 epochs x 2 mini-batches", "sequence, 2 epochs x 2 mini-batches"):
            out[f"sync after {name}"] = pieces = sync_pieces(worker)  # trained by SGD: comparable
            if rank != 0:
                assert all(bucket == [] for bucket in pieces["buckets"])  # gathered on rank 0 alone
    def resumed(hyper, saved_weights):
        """One step, then its weights (`saved_weights(worker)`) and optimizer state into a fresh
        rank; one more identical step on both: (checksum of the first, of the resumed one)."""
        first, model = make_worker(rank, world, hyper)
        run_case(first, model, hyper)
        weights, state = saved_weights(first), first.state_dict()
        second, model2 = make_worker(rank, world, hyper)
        second.load_weights(weights)
        second.load_state_dict(state)
        run_case(first, model, hyper)
        run_case(second, model2, hyper)
        return first.weights_checksum(), second.weights_checksum()

    def adapter_of(worker):  # LoRA: the adapter the ranks write (rank 0), read back by every rank
        assert worker.save_adapter(Path(folder) / "adapter")
        dist.barrier()  # rank 0 has written it
        return load_file(Path(folder) / "adapter" / "adapter_model.safetensors")

    if HAS_PEFT:
        out["LoRA resumed checksums"] = resumed({**LORA, "lr": 0.01}, adapter_of)
    out["resumed checksums"] = resumed({**CASES["token, KL + entropy in the loss"], "lr": 0.01},
                                       lambda worker: dict(worker.named_weights()))
    if rank == 0:
        queue.put(pickle.dumps(out))
    # Leave together: a rank that exits with its process group alive lets Gloo's threads meet
    # a torn-down interpreter (`terminate called without an active exception`, exit -6).
    dist.barrier()
    dist.destroy_process_group()


def test_two_gloo_ranks_give_the_gradient_of_one_process(tmp_path):
    """Each rank trains on half of each mini-batch with the normalisers of the
    whole step; FSDP sums the shards' gradients. Tolerances: `assert_same_step`. The same
    with LoRA and with each FSDP2 memory option (`RANK_CASES`); the streamed sync's pieces
    (`sync_pieces`) are those of one process; a LoRA rank resumes exactly."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, 2, init_method, queue, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    import queue as queues

    deadline, ranks = time.time() + 300, None
    try:
        while ranks is None:  # fail fast when a rank dies
            try:
                ranks = pickle.loads(queue.get(timeout=1))
            except queues.Empty:
                assert all(p.is_alive() for p in procs) and time.time() < deadline, \
                    f"a rank stopped (exit codes {[p.exitcode for p in procs]}) or took > 300 s"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    for name, hyper in DP_CASES.items():
        worker, model = make_worker(0, 1, hyper)
        one = run_case(worker, model, hyper)
        assert len(one[0]) == hyper.get("ppo_epochs", 1) * hyper.get("mini_batches", 1)
        if hyper.get("lora_rank"):
            # A and B of q_proj, v_proj and down_proj in each of the 2 layers
            assert all(".lora_" in n for n in one[0][0]) and len(one[0][0]) == 2 * 3 * 2
        assert_same_step(name, ranks[name], one, hyper.get("sgd_lr", 0.0))
        mixed = hyper.get("precision") == "bf16-mixed"
        assert ranks[f"compute dtype of {name}"] == (torch.bfloat16 if mixed else torch.float32)
        if f"sync after {name}" in ranks:
            assert_same_sync(name, ranks[f"sync after {name}"], sync_pieces(worker), one[0], hyper["sgd_lr"])
    a, b = ranks["resumed checksums"]
    assert math.isclose(a, b, rel_tol=1e-12)
    if HAS_PEFT:
        a, b = ranks["LoRA resumed checksums"]
        assert math.isclose(a, b, rel_tol=1e-12)
    a, b = ranks["ZeRO-2 checksum before and after a probe"]
    assert a == b


EPS = torch.finfo(torch.float32).eps


def assert_same_sync(name: str, ranks: dict, one: dict, one_steps: list[dict], lr: float) -> None:
    """A streamed sync from the ranks sends what one process sends: the same plan (LoRA: only
    the adapted layers, merged), rank 0's buckets exactly the all-gathered weights, and a
    checksum that is the weights' (within `checksums_match`: float64 sums in another order).

    Bounds: a LoRA layer sent (each rank merged its own rows) equals W + s B A computed from
    the whole W, A and B up to float32 round-off: 4 eps (|W| + s r max|B| max|A|). A fully
    trained weight equals one process's up to what SGD made of the gradients' differences
    (`assert_same_step`: <= GRAD_REL * max|g| + 1e-9 per element and optimizer step), times lr,
    plus the round-off of both sides' updates: <= 4 eps |W| per side over 4 steps."""
    from reasonrl.weights import checksums_match, weights_checksum

    assert ranks["plan"] == one["plan"] and len(one["plan"]) > 1, name  # several 20 kB buckets
    sent = dict(pair for bucket in ranks["buckets"] for pair in bucket)
    assert list(sent) == [n for bucket in one["plan"] for n in bucket]
    mine = dict(pair for bucket in one["buckets"] for pair in bucket)
    for n, tensor in sent.items():
        assert torch.equal(tensor, ranks["weights"][n]), f"{name}: {n}"
        if ranks["merged"]:
            w, a, b, s = ranks["merged"][n]
            bound = 4 * EPS * (w.abs().max() + s * a.shape[0] * b.abs().max() * a.abs().max()).item()
            assert (tensor - (w + (b @ a) * s)).abs().max().item() <= bound, f"{name}: {n}"
        else:
            drift = lr * sum(GRAD_REL * g[n].abs().max().item() + 1e-9 for g in one_steps)
            bound = drift + 2 * 4 * EPS * tensor.abs().max().item()
            assert (tensor - mine[n]).abs().max().item() <= bound, f"{name}: {n}"
    if ranks["merged"]:
        assert sorted(ranks["merged"]) == sorted(sent) and all(
            any(m in n for m in ("q_proj", "v_proj", "down_proj")) for n in sent), name
    assert ranks["weights"].keys() == one["weights"].keys()
    assert checksums_match(ranks["checksum"], weights_checksum(ranks["weights"].items())), name
    assert checksums_match(one["checksum"], weights_checksum(one["weights"].items())), name


# ---- rollout replicas, weight buckets, tensor parallelism: the pieces --------------------


def test_each_prompt_samples_from_its_own_seed_whatever_the_split(tiny):
    """The HF engine samples prompt i from seeds[i] alone (`prompt_seeds`: one draw per prompt
    from torch's RNG, in order), so prompts split between replicas in any way give, together,
    exactly the samples of one worker; rollout() without seeds draws the same ones."""
    from reasonrl.batch import Example
    from reasonrl.rollout import RolloutWorker, SamplingParams, prompt_seeds
    from reasonrl.rollout.hf import HFEngine

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    eos = model.generation_config.eos_token_id

    def raise_eos(module, inputs, logits):  # P(EOS) ~ 5 % per step: rows end at different steps
        logits = logits.clone()
        logits[..., eos] += 8.0
        return logits

    model.lm_head.register_forward_hook(raise_eos)
    worker = RolloutWorker(HFEngine(model, tokenizer), tokenizer)
    examples = [Example(prompt=f"What is {i} + {i + 3}?", ground_truth=str(2 * i + 3)) for i in range(6)]
    params = SamplingParams(n=3, max_new_tokens=12, temperature=1.0)
    torch.manual_seed(11)
    seeds = prompt_seeds(len(examples))
    torch.manual_seed(11)
    whole = worker.rollout(examples, params)
    parts = [worker.rollout(examples[a:b], params, seeds[a:b]) for a, b in ((0, 1), (1, 4), (4, 6))]
    assert whole.completion_ids == [c for part in parts for c in part.completion_ids]
    assert whole.truncated.tolist() == [t for part in parts for t in part.truncated.tolist()]
    assert 0 < sum(whole.truncated.tolist()) < len(whole)  # some rows ended early, some ran to the limit
    assert len({tuple(c) for c in whole.completion_ids}) == len(whole)  # every sample its own


# ---- CUDA (skipped without a GPU) --------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_one_nccl_rank_gives_the_gradient_of_one_process():
    """FSDP2 over NCCL (world 1: NCCL refuses two ranks on one GPU, so this is the most one
    GPU checks): the sharded rank's gradients and metrics equal the plain worker's on the
    same GPU. The rank's collectives (micro-batch count, metrics) run on GPU tensors."""
    import torch.distributed as dist
    from helpers import policy_settings

    from reasonrl.model import sharding
    from reasonrl.workers import ranks as parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cuda = torch.device("cuda")
    sharding.init_process_group("nccl", init_method, 0, 1, 120)
    try:
        for name, hyper in CASES.items():
            sgd_lr = hyper.get("sgd_lr")
            h = policy_settings(**{"lr": 0.0, "max_grad_norm": 0.0,
                               **{k: v for k, v in hyper.items() if k != "sgd_lr"}})
            plain, _ = make_worker(0, 1, hyper, cuda)
            model = sharding.shard_model(copy.deepcopy(tiny_model()), cuda)
            rank = parallel.RankPolicyWorker(model, 0, h, 0, 1, sharding.shard_model(
                copy.deepcopy(make_worker(0, 1, hyper)[0].ref_model), cuda))
            if sgd_lr is not None:  # (the plain worker's: make_worker's)
                rank.learner.optimizer = torch.optim.SGD(model.parameters(), lr=sgd_lr)
            one = run_case(plain, plain.model, hyper)
            assert_same_step(name, run_case(rank, model, hyper), one, sgd_lr or 0.0)
    finally:
        dist.destroy_process_group()
