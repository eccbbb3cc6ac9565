"""Scale-out: Ray placement, data-parallel ranks (gloo + FSDP2), LoRA (docs/scaling.md).

Ray tests share one Ray instance for the session (started once, ~10 s on 2 cores, shut down
at the end); every run stops its own actors. The 2-rank gradient test runs its ranks as
plain processes with torch.distributed (gloo).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import pickle
import shutil
import socket
import time
from pathlib import Path

import pytest
import torch

from reasonrl.config import load_config
from reasonrl.errors import ConfigError
from reasonrl.trainer import Trainer, train

REPO = Path(__file__).parent.parent
TRAINS = [f"reward.fn={REPO / 'tests' / 'fixtures' / 'length_reward.py'}:length",
          "reward.isolate_fn=false", "optim.lr=1e-3"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """The runs here set torch's thread count (trainer.threads=1); later tests get it back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def smoke_cfg(out: Path, name: str, *overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={out}", f"trainer.run_name={name}", "trainer.progress=false",
        "trainer.steps=3", "trainer.threads=1", "tracking.report=false", *TRAINS, *overrides])


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items()
             if not k.startswith(("time/", "mem/")) and k != "rollout/tokens_per_s"} for r in rows]


def assert_metrics_close(a: list[dict], b: list[dict], rel: float) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=rel, abs=1e-7), f"step {ra['step']}: {k}"


# ---- config -----------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "message"), [
    (["placement.policy.ranks=2"], "2 ranks need placement.mode=ray"),
    (["placement.mode=ray", "placement.policy.ranks=2", "model.lora.rank=8"], "with model.lora.rank > 0"),
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


def test_merged_weight_is_w_plus_scaled_b_a(tiny):
    """LoRA's merged weight W + (alpha / r) B A (Hu et al. 2021, eq. 3), by hand: r = 2,
    alpha = 4 (scale 2), A = [[1, 0, ...], [0, 3, 0, ...]], B[0] = [0.5, 0.25], B[5] = [0, 1]
    -> (B A)[0, 0] = 0.5, (B A)[0, 1] = 0.75, (B A)[5, 1] = 3, elsewhere 0."""
    from reasonrl.policy.lora import apply_lora, merged_named_weights

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


def test_lora_run_trains_saves_and_resumes_exactly(tmp_path):
    """Two LoRA steps (KL to the adapter-free reference in the loss): only the adapter
    trains, the engine serves the merged weights (checksum-verified each sync), checkpoints
    hold adapter/ and a merged huggingface/ that transformers loads, and 1 step + resume +
    1 step ends exactly where 2 straight steps end."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from reasonrl.policy.worker import completion_logprobs, make_micro_batches

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
    assert len(policy.optimizer.state) == len(trained)  # AdamW state for the adapter only
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


def test_lora_without_merged_copy_saves_only_the_adapter(tmp_path):
    from reasonrl.checkpoint import list_checkpoints, read_checkpoint

    train(smoke_cfg(tmp_path, "r", "model.lora.rank=2", "model.lora.save_merged=false",
                    "model.lora.target_modules=[q_proj]", "trainer.steps=1"))
    (step,) = list_checkpoints(tmp_path / "r")
    assert sorted(p.name for p in step.iterdir()) == ["adapter", "state.pt", "trainer_state.json"]
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
    from reasonrl.policy.parallel import _full

    steps, per_update, inner, update = [], [], worker.optimizer.step, worker._update

    def step(*args, **kwargs):
        steps.append({n.removeprefix("lm."): _full(p.grad).clone() for n, p in model.named_parameters()})
        return inner(*args, **kwargs)

    def recorded_update(*args, **kwargs):
        per_update.append(update(*args, **kwargs))
        return per_update[-1]

    worker.optimizer.step = step
    worker._update = recorded_update
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
    assert len(dp_steps) == len(one_steps) == len(dp_updates) == len(one_updates)
    for k, (grads, expected) in enumerate(zip(dp_steps, one_steps, strict=True)):
        assert grads.keys() == expected.keys()
        assert max(g.abs().max().item() for g in expected.values()) > 1e-3  # a real gradient
        for n, g in grads.items():
            scale = expected[n].abs().max().item()
            diff = (g - expected[n]).abs().max().item()
            assert diff <= GRAD_REL * scale + 1e-9, f"{name}, optimizer step {k}: {n} differs by {diff}"
    assert dp_metrics.keys() == one_metrics.keys()
    for key in ("train/lr", "train/tokens", "train/sequences", "train/updates"):
        assert dp_metrics[key] == one_metrics[key], f"{name}: {key}"
    for key, value in one_updates[0].items():
        if key == "grad_norm":
            continue
        assert dp_updates[0][key] == pytest.approx(value, rel=METRIC_REL, abs=1e-7), f"{name}: update 0 {key}"
    drift = {n: torch.zeros_like(g, dtype=torch.float64) for n, g in one_steps[0].items()}
    for k in range(1, len(one_updates)):
        for n in drift:
            drift[n] += lr * (dp_steps[k - 1][n].double() - one_steps[k - 1][n].double())
        a, b = dp_updates[k], one_updates[k]
        bound = METRIC_REL * abs(b["loss"]) + 1e-7 + 2 * norm(one_steps[k]) * norm(drift)
        assert abs(a["loss"] - b["loss"]) <= bound, f"{name}: update {k} loss {a['loss']} vs {b['loss']}"
    for updates, steps in ((dp_updates, dp_steps), (one_updates, one_steps)):
        for u, grads in zip(updates, steps, strict=True):
            assert u["grad_norm"] == pytest.approx(norm(grads), rel=NORM_REL)


@functools.cache
def tiny_model():
    from reasonrl.policy.model import build_tiny_model

    return build_tiny_model(seed=3)[0]


def make_worker(rank: int, world: int, hyper: dict):
    """A policy on the tiny model (seed 3) and a reference that differs from it."""
    from helpers import policy_settings

    from reasonrl.policy import parallel
    from reasonrl.policy.worker import PolicyWorker

    model = copy.deepcopy(tiny_model())
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    sgd_lr = hyper.get("sgd_lr")
    h = policy_settings(**{"lr": 0.0, "max_grad_norm": 0.0,
                           **{k: v for k, v in hyper.items() if k != "sgd_lr"}})
    if world == 1:
        worker = PolicyWorker(model, 0, h, ref_model=ref)
    else:
        cpu = torch.device("cpu")
        model = parallel.shard_model(model, cpu)
        worker = parallel.RankPolicyWorker(model, 0, h, rank, world, parallel.shard_model(ref, cpu))
    if sgd_lr is not None:  # later updates depend on earlier gradients linearly (AdamW's first
        worker.optimizer = torch.optim.SGD(model.parameters(), lr=sgd_lr)  # step is ~lr * sign(g))
    return worker, model


def rank_main(rank: int, world: int, init_method: str, queue) -> None:
    from reasonrl.policy.parallel import init_process_group

    torch.set_num_threads(1)
    init_process_group("gloo", init_method, rank, world, 120)
    out = {}
    for name, hyper in CASES.items():
        worker, model = make_worker(rank, world, hyper)
        out[name] = run_case(worker, model, hyper)
    # resume path: weights + optimizer state into a fresh rank, then one more identical step
    hyper = {**CASES["token, KL + entropy in the loss"], "lr": 0.01}
    first, model = make_worker(rank, world, hyper)
    run_case(first, model, hyper)
    weights, state = dict(first.named_weights()), first.state_dict()
    second, model2 = make_worker(rank, world, hyper)
    second.load_weights(weights)
    second.load_state_dict(state)
    run_case(first, model, hyper)
    run_case(second, model2, hyper)
    out["resumed checksums"] = (first.weights_checksum(), second.weights_checksum())
    if rank == 0:
        queue.put(pickle.dumps(out))


def test_two_gloo_ranks_give_the_gradient_of_one_process():
    """Each rank trains on half of each mini-batch with the normalisers of the
    whole step; FSDP sums the shards' gradients. Tolerances: `assert_same_step`."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, 2, init_method, queue)) for r in range(2)]
    for p in procs:
        p.start()
    import queue as queues

    deadline, ranks = time.time() + 240, None
    try:
        while ranks is None:  # fail fast when a rank dies
            try:
                ranks = pickle.loads(queue.get(timeout=1))
            except queues.Empty:
                assert all(p.is_alive() for p in procs) and time.time() < deadline, \
                    f"a rank stopped (exit codes {[p.exitcode for p in procs]}) or took > 240 s"
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    for name, hyper in CASES.items():
        worker, model = make_worker(0, 1, hyper)
        one = run_case(worker, model, hyper)
        assert len(one[0]) == hyper.get("ppo_epochs", 1) * hyper.get("mini_batches", 1)
        assert_same_step(name, ranks[name], one, hyper.get("sgd_lr", 0.0))
    a, b = ranks["resumed checksums"]
    assert math.isclose(a, b, rel_tol=1e-12)


# ---- CUDA (skipped without a GPU) --------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_one_nccl_rank_gives_the_gradient_of_one_process():
    """FSDP2 over NCCL (world 1: NCCL refuses two ranks on one GPU, so this is the most one
    GPU checks): the sharded rank's gradients and metrics equal the plain worker's on the
    same GPU. The rank's collectives (micro-batch count, metrics) run on GPU tensors."""
    import torch.distributed as dist
    from helpers import policy_settings

    from reasonrl.policy import parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    cuda = torch.device("cuda")
    parallel.init_process_group("nccl", init_method, 0, 1, 120)
    try:
        for name, hyper in CASES.items():
            sgd_lr = hyper.get("sgd_lr")
            h = policy_settings(**{"lr": 0.0, "max_grad_norm": 0.0,
                               **{k: v for k, v in hyper.items() if k != "sgd_lr"}})
            plain, _ = make_worker(0, 1, hyper)
            plain.model.to(cuda)
            plain.ref_model.to(cuda)
            plain.device = cuda
            model = parallel.shard_model(copy.deepcopy(tiny_model()), cuda)
            rank = parallel.RankPolicyWorker(model, 0, h, 0, 1, parallel.shard_model(
                copy.deepcopy(make_worker(0, 1, hyper)[0].ref_model), cuda))
            if sgd_lr is not None:
                plain.optimizer = torch.optim.SGD(plain.model.parameters(), lr=sgd_lr)
                rank.optimizer = torch.optim.SGD(model.parameters(), lr=sgd_lr)
            one = run_case(plain, plain.model, hyper)
            assert_same_step(name, run_case(rank, model, hyper), one, sgd_lr or 0.0)
    finally:
        dist.destroy_process_group()


@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_local_mode_trains_on_the_gpu(tmp_path, dtype):
    """placement.device=auto puts the policy and the colocated engine on the GPU; a run
    trains, logs its peak GPU memory (mem/) and saves a checkpoint."""
    trainer = Trainer(smoke_cfg(tmp_path, "gpu", f"model.dtype={dtype}", "trainer.steps=2"))
    assert trainer.policy.device.type == "cuda"
    assert next(trainer.rollout.engine.model.parameters()).device.type == "cuda"
    trainer.fit()
    rows = [json.loads(x) for x in (tmp_path / "gpu" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and math.isfinite(rows[-1]["train/loss"])
    assert rows[-1]["mem/gpu_peak_allocated_gib"] > 0
    assert (tmp_path / "gpu" / "checkpoints" / "step_2" / "huggingface").is_dir()


# ---- Ray -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for the session: 4 logical CPUs (two policy ranks + the rollout
    worker fit), a small object store; shut down (no process left) at the end."""
    ray = pytest.importorskip("ray")  # the dev extra; a GPU machine without it skips these
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    t = time.perf_counter()
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=200 * 2**20,
             configure_logging=False, log_to_driver=False)
    print(f"[test_scaling] ray.init took {time.perf_counter() - t:.1f} s")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("local")
    train(smoke_cfg(out, "local"))
    return metrics(out / "local")


def test_ray_mode_gives_the_metrics_of_local_mode(ray_session, local_run, tmp_path):
    """The same 3 steps with the policy and the rollout worker in two Ray actors: weights
    go actor to actor (checksum-checked each sync), rollouts carry the policy version, the
    rollout actor samples from the same seed. Metrics equal to rel 1e-6 (measured: equal)."""
    train(smoke_cfg(tmp_path, "ray", "placement.mode=ray"))
    run = tmp_path / "ray"
    assert_metrics_close(metrics(run), local_run, rel=1e-6)
    assert (run / "checkpoints" / "step_3" / "huggingface" / "model.safetensors").is_file()
    assert ray_session.available_resources().get("CPU") is not None


def test_two_ray_policy_ranks_match_one_local_process(ray_session, local_run, tmp_path):
    """placement.policy.ranks=2: two FSDP2 ranks (gloo) in Ray actors train the same 3 steps;
    metrics match local mode to rel 1e-4 (float32 sums in another order), and the
    checkpoint written through the ranks loads as an HF folder."""
    from transformers import AutoModelForCausalLM

    train(smoke_cfg(tmp_path, "dp", "placement.mode=ray", "placement.policy.ranks=2"))
    assert_metrics_close(metrics(tmp_path / "dp"), local_run, rel=1e-4)
    AutoModelForCausalLM.from_pretrained(tmp_path / "dp" / "checkpoints" / "step_3" / "huggingface")


def test_a_worker_asking_for_a_missing_resource_fails_within_the_timeout(ray_session, tmp_path):
    from reasonrl.errors import PlacementError
    from reasonrl.placement import build_workers

    cfg = smoke_cfg(tmp_path, "r", "placement.mode=ray", "placement.start_timeout=3",
                    "placement.rollout.resources={tpu_pod: 1}")
    t = time.perf_counter()
    with pytest.raises(PlacementError) as err:
        build_workers(cfg)
    elapsed = time.perf_counter() - t
    assert elapsed < 3 + 5, elapsed  # the timeout plus a little bookkeeping
    message = str(err.value)
    assert "the rollout worker waits for" in message and "'tpu_pod': 1.0" in message
    assert "placement.start_timeout" in message and "no machine of the Ray cluster offers that" in message
    deadline = time.time() + 10  # the actors were killed: their CPUs come back
    while ray_session.available_resources().get("CPU", 0) < 4 and time.time() < deadline:
        time.sleep(0.2)
    assert ray_session.available_resources().get("CPU", 0) == 4


def test_proxies_are_the_declared_worker_apis_and_the_workers_implement_them():
    """The Ray proxies have exactly the protocols' methods (no attribute forwarding that would
    let a renamed method fail mid-run), and every worker class implements its protocol."""
    from reasonrl.placement import RemotePolicy, RemoteRollout
    from reasonrl.policy.parallel import RankPolicyWorker
    from reasonrl.policy.worker import PolicyWorker
    from reasonrl.rollout import RolloutEngine, RolloutWorker
    from reasonrl.rollout.hf import HFEngine
    from reasonrl.rollout.vllm import VLLMEngine
    from reasonrl.workers import PolicyWorkerAPI, RolloutWorkerAPI, api_methods, missing_methods

    for proxy, api in ((RemotePolicy, PolicyWorkerAPI), (RemoteRollout, RolloutWorkerAPI)):
        public = {n for n in dir(proxy) if not n.startswith("_") and callable(getattr(proxy, n))}
        assert public == set(api_methods(api))
        assert "__getattr__" not in vars(proxy) and "__getattr__" not in vars(proxy.__mro__[1])
    assert "close" in api_methods(PolicyWorkerAPI) and "close" in api_methods(RolloutWorkerAPI)
    for worker, api in ((PolicyWorker, PolicyWorkerAPI), (RankPolicyWorker, PolicyWorkerAPI),
                        (RolloutWorker, RolloutWorkerAPI), (HFEngine, RolloutEngine),
                        (VLLMEngine, RolloutEngine)):
        assert missing_methods(worker, api) == [], worker


def test_a_worker_lacking_a_declared_method_fails_when_its_actor_starts(ray_session, tmp_path, monkeypatch):
    import reasonrl.placement as placement
    from reasonrl.errors import PlacementError

    def rollout_without_close(cfg):  # a local function: Ray ships it to the actor by value
        class NoClose:
            def encode(self, example):
                return [1]

            def rollout(self, examples, params):
                raise NotImplementedError

            def probe_due(self):
                return None

            def load_weights(self, named_tensors, version=None, expected_checksum=None, expected_probe=None):
                pass

        return NoClose()

    monkeypatch.setattr(placement, "_build_rollout", rollout_without_close)
    with pytest.raises(PlacementError, match=r"ray: the rollout worker has no close \(reasonrl.workers"):
        placement.build_workers(smoke_cfg(tmp_path, "r", "placement.mode=ray"))
    deadline = time.time() + 10  # the actors were killed: their CPUs come back
    while ray_session.available_resources().get("CPU", 0) < 4 and time.time() < deadline:
        time.sleep(0.2)
    assert ray_session.available_resources().get("CPU", 0) == 4


def test_lora_in_ray_mode_matches_local_and_checkpoints_through_the_actor(ray_session, tmp_path):
    """LoRA with the policy in an actor: merged weights go actor to actor (checksum-checked),
    the adapter and merged folders come back to the trainer's machine; the metrics of 2 steps
    are those of local mode (rel 1e-6)."""
    lora = ["model.lora.rank=4", "algo.beta=0.1", "trainer.steps=2"]
    train(smoke_cfg(tmp_path, "local", *lora))
    train(smoke_cfg(tmp_path, "ray", *lora, "placement.mode=ray"))
    assert_metrics_close(metrics(tmp_path / "ray"), metrics(tmp_path / "local"), rel=1e-6)
    step = tmp_path / "ray" / "checkpoints" / "step_2"
    assert (step / "adapter" / "adapter_model.safetensors").is_file()
    assert (step / "huggingface" / "model.safetensors").is_file()
