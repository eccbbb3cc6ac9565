"""Where the workers live. The only module that decides placement, and the only one that
imports `ray`.

`placement.mode=local`: the policy and rollout workers are plain objects in this process,
on `placement.device` (auto = the GPU when torch sees one); the HF rollout engine shares the
policy's model (weight sync is a no-op share), except with LoRA, where the engine holds a
plain copy (on the same device) and receives the merged weights.

`placement.mode=ray`: the same plain classes (`PolicyWorker`, `RolloutWorker`) are built
inside Ray actors with the resources of `placement.policy` / `placement.rollout`
(fractional `num_gpus`, `num_cpus`, custom resources), on the Ray at `placement.address`
or on one started for the run. The trainer gets proxies with the same methods, so it does
not know the difference: a method call is `actor.call.remote(...)` and then
`ray.get(..., timeout=placement.call_timeout)`. Every wait has a timeout and an error naming
the worker and the resources it asks for (an actor Ray cannot place otherwise waits
forever, silently). Weights go from the policy actor to the rollout actor through Ray's
object store (torch tensors zero-copy), never through this process, and the rollout worker
checks them by checksum as in local mode. `placement.policy.ranks=N` makes the policy a
group of N data-parallel ranks (`reasonrl.policy.parallel`: torch.distributed + FSDP2).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import socket
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reasonrl.config import Config, resolve_device
from reasonrl.errors import ConfigError, PlacementError
from reasonrl.policy.model import TINY, load_model_and_tokenizer, load_tokenizer
from reasonrl.policy.worker import PolicySettings, PolicyWorker
from reasonrl.registry import ENGINES
from reasonrl.rng import seed_everything
from reasonrl.rollout import RolloutWorker, make_engine
from reasonrl.tracking import missing_extra
from reasonrl.workers import PolicyWorkerAPI, RolloutWorkerAPI, api_methods, missing_methods

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# what every actor process gets in its environment (besides REASONRL_HOME when set here)
ACTOR_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
# The policy's weights leave its actor as zero-copy tensors (the receiver maps the object
# store's memory read-only and copies them into its model). Only the policy gets it: the
# rollout actor's `Rollouts` must arrive here as ordinary, writable tensors.
POLICY_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}


def preflight(cfg: Config) -> None:
    """What the config asks of this machine, checked before any model loads: the engine's
    and the tracking backends' extras, Ray for placement.mode=ray, peft for LoRA."""
    problems = [("rollout.engine", ENGINES[cfg.rollout.engine].info["missing"]())]
    problems += [("tracking.backends", missing_extra(b)) for b in cfg.tracking.backends]
    if cfg.placement.mode == "ray" and importlib.util.find_spec("ray") is None:
        problems.append(("placement.mode", "placement.mode=ray needs Ray: pip install 'reasonrl[ray]'"))
    if cfg.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        problems.append(("model.lora.rank", "model.lora.rank > 0 needs peft: pip install 'reasonrl[lora]'"))
    for key, problem in problems:
        if problem is not None:
            raise ConfigError(f"{key}: {problem}")


@dataclass
class Workers:
    policy: PolicyWorkerAPI
    rollout: RolloutWorkerAPI
    tokenizer: object
    actors: list = field(default_factory=list)  # ray mode: the actor handles, for close()

    def close(self) -> None:
        """Free the workers: engines closed (vLLM's memory and process state), Ray actors
        stopped. Safe to call twice."""
        policy, rollout, self.policy, self.rollout = self.policy, self.rollout, None, None
        try:
            for worker in (rollout, policy):
                if worker is not None:
                    worker.close()
        finally:
            if self.actors:
                import ray

                for actor in self.actors:
                    ray.kill(actor)
                self.actors = []


def load_model(cfg: Config, device: str = "cpu"):
    """(model, tokenizer) of `model.path` in `model.dtype` on `device`."""
    model, tokenizer = load_model_and_tokenizer(cfg.model.path, DTYPES[cfg.model.dtype],
                                                seed=cfg.trainer.seed)
    return model.to(device), tokenizer


def make_policy(cfg: Config, model, tokenizer) -> PolicyWorker:
    """The policy worker around `model` (wrapped in a LoRA adapter when `model.lora.rank` > 0)."""
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.policy.lora import apply_lora

        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed)
    return PolicyWorker(model, tokenizer.pad_token_id, PolicySettings.from_config(cfg))


def make_rollout(cfg: Config, model, tokenizer) -> RolloutWorker:
    # hf shares `model`; vllm starts from a copy of its weights
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg.rollout, cfg.trainer.threads)
    d = cfg.data
    return RolloutWorker(engine, tokenizer, d.apply_chat_template, d.system_prompt, d.max_prompt_tokens)


def build_workers(cfg: Config) -> Workers:
    if cfg.placement.mode == "ray":
        return build_ray_workers(cfg)
    if cfg.placement.mode != "local":
        raise ValueError(f"placement.mode: unknown mode {cfg.placement.mode!r}; allowed: local, ray")
    model, tokenizer = load_model(cfg, resolve_device(cfg.placement.device))
    # LoRA wraps the policy's model in place: the engine keeps a plain copy (merged weights)
    engine_model = copy.deepcopy(model) if cfg.model.lora.rank > 0 else model
    policy = make_policy(cfg, model, tokenizer)
    rollout = make_rollout(cfg, engine_model, tokenizer)
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer)


# ---- ray mode ---------------------------------------------------------------------------


def _device(num_gpus: float) -> str:
    return "cuda" if num_gpus > 0 else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU


def _build_rollout(cfg: Config) -> RolloutWorker:
    """In the rollout actor: its own model and engine, then the run's seed, so that sampling
    draws the same random numbers as the colocated engine of local mode."""
    model, tokenizer = load_model(cfg, _device(cfg.placement.rollout.num_gpus))
    worker = make_rollout(cfg, model, tokenizer)
    seed_everything(cfg.trainer.seed)
    return worker


def _build_policy(cfg: Config) -> PolicyWorker:
    model, tokenizer = load_model(cfg, _device(cfg.placement.policy.num_gpus))
    return make_policy(cfg, model, tokenizer)


def _build_policy_rank(cfg: Config, rank: int, world: int, init_method: str, backend: str):
    """In a policy rank's actor: join the process group, load and shard the model."""
    from reasonrl.policy import parallel
    from reasonrl.policy.lora import reference_model

    parallel.init_process_group(backend, init_method, rank, world, cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    settings = PolicySettings.from_config(cfg)
    ref = reference_model(model) if cfg.algo.beta > 0 or cfg.algo.log_kl else None
    device = torch.device(_device(cfg.placement.policy.num_gpus))
    return parallel.RankPolicyWorker(
        parallel.shard_model(model, device), tokenizer.pad_token_id, settings, rank, world,
        None if ref is None else parallel.shard_model(ref, device))


class WorkerHost:
    """Runs inside a Ray actor: builds one plain worker and calls its methods by name."""

    def __init__(self, threads: int):
        import warnings

        torch.set_num_threads(threads)
        # the weights we return are detached, contiguous and not written while in flight;
        # those we receive are only read (copied into the model)
        warnings.filterwarnings("ignore", message="Zero-copy tensor serialization is enabled")
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.worker: Any = None

    def rendezvous(self) -> str:
        """tcp://ip:port of a free port on this actor's machine (rank 0 of a policy group)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def build(self, builder, api: type, *args) -> list[str]:
        """Build the worker; returns the methods of `api` it lacks (none, or start-up fails)."""
        self.worker = builder(*args)
        return missing_methods(self.worker, api)

    def call(self, method: str, args: tuple, kwargs: dict, keep: bool = True):
        import ray

        # object references inside `args` (weights, a batch shared by all ranks) are fetched here
        args = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
        out = getattr(self.worker, method)(*args, **kwargs)
        if isinstance(out, types.GeneratorType):
            out = list(out)
        if not keep:
            return None
        # tensors leave a GPU actor on the CPU: the receiver (the trainer) may have no GPU
        return torch.utils._pytree.tree_map(
            lambda x: x.cpu() if isinstance(x, torch.Tensor) and x.device.type != "cpu" else x, out)

    def call_into_folder(self, method: str, args: tuple, keep: bool = True):
        """`method(folder, *args)` into a temporary folder here; returns (its result, the
        files it wrote) so that the caller's machine gets them, wherever this actor runs."""
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "out"
            result = getattr(self.worker, method)(folder, *args)
            files = ({str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
                      if f.is_file()} if keep and folder.is_dir() else {})
        return result, files


@dataclass
class RemoteWeights:
    """The policy's named weights, left in Ray's object store: the rollout proxy hands the
    reference to its actor, so the tensors go actor to actor."""

    ref: Any


def _request(w) -> dict[str, float]:
    out = {"CPU": w.num_cpus, **w.resources}
    if w.num_gpus:
        out["GPU"] = w.num_gpus
    return out


class RemoteWorker:
    """A worker (or a group of data-parallel ranks) in Ray actors, called like the plain
    object. Every rank gets every call, in the same order; the answer is rank 0's."""

    def __init__(self, name: str, actors: list, request: dict[str, float], timeout: float):
        self._name, self._actors, self._request, self._timeout = name, actors, request, timeout

    def _wait(self, refs: list, what: str) -> list:
        import warnings

        import ray

        timeout = self._timeout
        try:
            with warnings.catch_warnings():  # tensors from the policy arrive read-only: we only read them
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(
                f"ray: the {self._name} worker did not finish {what} within {timeout:g} s "
                f"(placement.call_timeout); it holds {self._request}. Raise placement.call_timeout "
                "if the work is just slow") from None
        except ray.exceptions.ActorDiedError as err:
            raise PlacementError(f"ray: the {self._name} worker died during {what} (it holds "
                                 f"{self._request}): {err}") from None

    def _args(self, args: tuple) -> tuple:
        if len(self._actors) == 1:
            return args
        import ray

        return tuple(ray.put(a) for a in args)  # one copy in the object store for all ranks

    def _call(self, method: str, *args, **kwargs):
        args = self._args(args)
        refs = [a.call.remote(method, args, kwargs, rank == 0) for rank, a in enumerate(self._actors)]
        return self._wait(refs, f"{method}()")[0]

    def _into_folder(self, method: str, path, *args):
        result, files = self._wait([a.call_into_folder.remote(method, args, rank == 0)
                                    for rank, a in enumerate(self._actors)], f"{method}()")[0]
        for name, data in files.items():
            target = Path(path) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return result


class RemotePolicy(RemoteWorker):
    """`PolicyWorkerAPI` over the policy's actors (see `_forward_api`)."""

    def named_weights(self) -> RemoteWeights:
        """All ranks gather; rank 0's weights stay in the object store (see `RemoteWeights`)."""
        import ray

        refs = [a.call.remote("named_weights", (), {}, rank == 0) for rank, a in enumerate(self._actors)]
        self._wait(refs[1:], "named_weights()")
        ready, _ = ray.wait(refs[:1], timeout=self._timeout, fetch_local=False)
        if not ready:
            raise PlacementError(f"ray: the {self._name} worker did not finish named_weights() within "
                                 f"{self._timeout:g} s (placement.call_timeout); it holds {self._request}")
        return RemoteWeights(refs[0])

    def save_pretrained(self, path, tokenizer=None) -> None:
        self._into_folder("save_pretrained", path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    def save_adapter(self, path) -> bool:
        return self._into_folder("save_adapter", path)


class RemoteRollout(RemoteWorker):
    """`RolloutWorkerAPI` over the rollout actor (see `_forward_api`)."""

    def __init__(self, name: str, actors: list, request: dict[str, float], timeout: float,
                 encoder: RolloutWorker):
        super().__init__(name, actors, request, timeout)
        self._encoder = encoder

    def encode(self, example) -> list[int]:
        """Rendered here (the same code, no engine needed): no round trip per prompt."""
        return self._encoder.encode(example)

    def load_weights(self, named_tensors, version: int | None = None, **kwargs) -> None:
        tensors = named_tensors.ref if isinstance(named_tensors, RemoteWeights) else list(named_tensors)
        self._wait([self._actors[0].call.remote("load_weights", (tensors,), {"version": version, **kwargs})],
                   f"load_weights(version={version})")


def _forward(method: str):
    def call(self, *args, **kwargs):
        return self._call(method, *args, **kwargs)

    call.__name__ = method
    return call


def _forward_api(cls: type, api: type) -> None:
    """Give `cls` every method of `api` it does not define itself, each one a remote call
    (`RemoteWorker._call`): the proxy has exactly the declared API, nothing by accident."""
    for method in api_methods(api):
        if method not in vars(cls):
            setattr(cls, method, _forward(method))


_forward_api(RemotePolicy, PolicyWorkerAPI)
_forward_api(RemoteRollout, RolloutWorkerAPI)


def _connect(p) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = dict(include_dashboard=False, log_to_driver=True)
    if p.address:
        ray.init(address=p.address, **kwargs)
    else:
        ray.init(num_cpus=p.num_cpus or None, **kwargs)


def _start(role, cfg: Config, env: dict[str, str]) -> Any:
    """A `WorkerHost` actor with the resources of `role` (not waited for here)."""
    import ray

    threads = cfg.trainer.threads or max(1, int(role.num_cpus))
    return ray.remote(WorkerHost).options(
        num_cpus=role.num_cpus, num_gpus=role.num_gpus, resources=dict(role.resources),
        runtime_env={"env_vars": env}).remote(threads)


def _await_start(actors: list[tuple[str, Any, Any]], refs: list, what: str, cfg: Config) -> list:
    """ray.get(refs) within `placement.start_timeout`, else kill the actors and raise
    PlacementError naming the worker(s) not ready and the resources they ask for."""
    import ray

    timeout = cfg.placement.start_timeout
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if len(ready) < len(refs):
        late = [(name, role) for (name, _, role), ref in zip(actors, refs, strict=True) if ref not in ready]
        available = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
        lines = []
        for name, role in late:
            request = _request(role)
            fits = all(available.get(k, 0.0) >= v for k, v in request.items() if v)
            why = ("Ray has these resources free now, so it is starting slowly: raise "
                   "placement.start_timeout" if fits else
                   f"no machine of the Ray cluster offers that; Ray has {available} free")
            lines.append(f"the {name} worker waits for {request} to {what}: {why}")
        for _, actor, _ in actors:
            ray.kill(actor)
        raise PlacementError(f"ray: not ready within {timeout:g} s (placement.start_timeout): "
                             + "; ".join(lines) + ". Lower placement.<worker>.num_cpus / num_gpus / "
                             "resources, or add machines to the cluster")
    try:
        return ray.get(refs)
    except Exception:
        for _, actor, _ in actors:
            ray.kill(actor)
        raise


def check_api(actors: list[tuple[str, Any, Any]], missing: list[list[str]]) -> None:
    """PlacementError (and the actors stopped) when a built worker lacks declared methods."""
    lacking = [f"the {name} worker has no {', '.join(m)}"
               for (name, _, _), m in zip(actors, missing, strict=True) if m]
    if lacking:
        import ray

        for _, actor, _ in actors:
            ray.kill(actor)
        raise PlacementError("ray: " + "; ".join(lacking) + " (reasonrl.workers declares them)")


def build_ray_workers(cfg: Config) -> Workers:
    """Actors for the rollout worker and the policy ranks (see the module docstring)."""
    p = cfg.placement
    if cfg.model.path not in ("", TINY) and Path(cfg.model.path).exists():  # actors may run elsewhere
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, path=str(Path(cfg.model.path).resolve())))
    _connect(p)
    env = dict(ACTOR_ENV)
    if "REASONRL_HOME" in os.environ:
        env["REASONRL_HOME"] = os.environ["REASONRL_HOME"]
    world = p.policy.ranks
    names = ["rollout"] + [f"policy rank {r}" if world > 1 else "policy" for r in range(world)]
    roles = [p.rollout] + [p.policy] * world
    envs = [env] + [{**env, **POLICY_ENV}] * world
    actors = [(name, _start(role, cfg, e), role) for name, role, e in zip(names, roles, envs, strict=True)]
    # 1. every actor running (scheduled on a machine with its resources)
    init_method = _await_start(actors, [a.rendezvous.remote() for _, a, _ in actors], "start", cfg)[1]
    # 2. every worker built (models loaded; policy ranks joined their process group)
    backend = p.backend if p.backend != "auto" else ("nccl" if p.policy.num_gpus > 0 else "gloo")
    builds = [actors[0][1].build.remote(_build_rollout, RolloutWorkerAPI, cfg)]
    for rank, (_, actor, _) in enumerate(actors[1:]):
        if world == 1:
            builds.append(actor.build.remote(_build_policy, PolicyWorkerAPI, cfg))
        else:
            builds.append(actor.build.remote(_build_policy_rank, PolicyWorkerAPI, cfg, rank, world,
                                             init_method, backend))
    missing = _await_start(actors, builds, "load its model", cfg)
    check_api(actors, missing)

    tokenizer = load_tokenizer(cfg.model.path)
    d = cfg.data
    encoder = RolloutWorker(None, tokenizer, d.apply_chat_template, d.system_prompt, d.max_prompt_tokens)
    rollout = RemoteRollout("rollout", [actors[0][1]], _request(p.rollout), p.call_timeout, encoder)
    policy = RemotePolicy("policy" if world == 1 else f"policy ({world} ranks)",
                          [a for _, a, _ in actors[1:]], _request(p.policy), p.call_timeout)
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer, actors=[a for _, a, _ in actors])
