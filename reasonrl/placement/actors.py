"""Ray mode (placement.mode=ray): the workers built inside Ray actors, and the checks that
an actor Ray cannot place fails at start-up with the keys to change.

The same plain classes (`PolicyWorker`, `RolloutWorker`, `CriticWorker`, `TeacherWorker`) are
built inside `WorkerHost` actors with the resources of `placement.policy` / `placement.rollout` /
`placement.critic` / `placement.teacher` (fractional `num_gpus`, `num_cpus`, custom resources),
on the Ray at `placement.address` or on one started for the run. The trainer gets proxies
(`reasonrl.placement.proxies`) with the same methods. Every wait has a timeout and an error
naming the worker and the resources it asks for (an actor Ray cannot place otherwise waits
forever, silently). `placement.policy.ranks=N` makes the policy a group of N data-parallel
ranks (`reasonrl.policy.parallel`: torch.distributed + FSDP2, with or without LoRA), and
`placement.critic.ranks` the critic; `placement.rollout.replicas=N` makes N rollout actors
behind one proxy. Weights go from the policy's actors to the rollout actors through Ray's
object store, never through this process (`sync.StreamedBuckets`, its plan fixed here).
Ray is imported inside the functions that call it: this module loads without the extra.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

from reasonrl import console
from reasonrl.config import Config
from reasonrl.data import system_prompt_for
from reasonrl.envs import environment_spec
from reasonrl.errors import PlacementError
from reasonrl.placement.local import (
    Workers,
    critic_lm,
    load_model,
    make_critic,
    make_policy,
    make_rollout,
    make_teacher,
    value_model,
)
from reasonrl.placement.proxies import (
    ActorGroup,
    RemoteCritic,
    RemotePolicy,
    RemoteRollout,
    RemoteTeacher,
    for_transport,
    resources_of,
    stop_actors,
)
from reasonrl.placement.sync import StreamedBuckets, WeightSync
from reasonrl.policy.critic import CriticWorker
from reasonrl.policy.model import TINY, load_tokenizer
from reasonrl.policy.teacher import TeacherWorker
from reasonrl.policy.worker import PolicySettings, PolicyWorker
from reasonrl.registry import ENGINES, needs_critic
from reasonrl.rng import seed_everything
from reasonrl.rollout import RolloutWorker
from reasonrl.worker_protocols import (
    CriticWorkerAPI,
    PolicyWorkerAPI,
    RolloutWorkerAPI,
    TeacherWorkerAPI,
    missing_methods,
)

# what every actor process gets in its environment (besides REASONRL_HOME and REASONRL_CONSOLE when set here)
ACTOR_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
# The policy's weights leave its actor as zero-copy tensors (the receiver maps the object
# store's memory read-only and copies them into its model). Only the policy gets it: the
# rollout actor's `Rollouts` must arrive here as ordinary, writable tensors.
POLICY_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}


def _device(num_gpus: float) -> str:
    return "cuda" if num_gpus > 0 else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU


def _build_rollout(cfg: Config) -> RolloutWorker:
    """In the rollout actor: its own model and engine, then the run's seed, so that sampling
    draws the same random numbers as the colocated engine of local mode."""
    model, tokenizer = load_model(cfg, _device(cfg.placement.rollout.num_gpus))
    worker = make_rollout(cfg, model, tokenizer)
    seed_everything(cfg.trainer.seed)
    return worker


def _build_critic(cfg: Config) -> CriticWorker:
    device = _device(cfg.placement.critic.num_gpus)
    model, tokenizer = load_model(cfg, device)
    return make_critic(cfg, critic_lm(cfg, model, device), tokenizer)


def _build_critic_rank(cfg: Config, rank: int, world: int, init_method: str, backend: str):
    """In a critic rank's actor: join the critic's own process group, build and shard."""
    from reasonrl.policy import parallel, sharding

    sharding.init_process_group(backend, init_method, rank, world, cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    lm = critic_lm(cfg, model, "cpu")
    device = torch.device(_device(cfg.placement.critic.num_gpus))
    sharded = sharding.shard_value_model(value_model(cfg, lm), device,
                                         sharding.ShardOptions.of(cfg.placement.critic, cfg.model.precision))
    return parallel.RankCriticWorker(sharded, tokenizer.pad_token_id, cfg.critic, cfg.optim, rank, world,
                                     device=device)


def _build_teacher(cfg: Config) -> TeacherWorker:
    """In the teacher's actor: its own model (teacher.path), never synced."""
    return make_teacher(cfg, _device(cfg.placement.teacher.num_gpus))


def _build_policy(cfg: Config) -> PolicyWorker:
    model, tokenizer = load_model(cfg, _device(cfg.placement.policy.num_gpus))
    return make_policy(cfg, model, tokenizer)


def _build_policy_rank(cfg: Config, rank: int, world: int, init_method: str, backend: str):
    """In a policy rank's actor: join the process group, load the model (with LoRA: wrapped by
    the same adapter as every other rank's and local mode's, A drawn from `trainer.seed`) and
    shard it. The reference model is a sharded copy, or with LoRA the sharded model itself
    run with the adapter switched off."""
    from reasonrl.policy import parallel, sharding
    from reasonrl.policy.lora import AdapterDisabled, apply_lora, reference_model

    sharding.init_process_group(backend, init_method, rank, world, cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    settings, lo = PolicySettings.from_config(cfg), cfg.model.lora
    wants_ref = cfg.algo.beta > 0 or cfg.algo.log_kl
    ref = reference_model(model) if wants_ref and lo.rank == 0 else None  # LoRA: AdapterDisabled below
    if lo.rank > 0:
        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed)
    device = torch.device(_device(cfg.placement.policy.num_gpus))
    options = sharding.ShardOptions.of(cfg.placement.policy, cfg.model.precision)
    root = sharding.shard_model(model, device, options)
    if ref is not None:
        ref = sharding.shard_model(ref, device, options)
    elif wants_ref:
        ref = AdapterDisabled(root, adapters=model)
    return parallel.RankPolicyWorker(root, tokenizer.pad_token_id, settings, rank, world, ref, device=device)


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
        return for_transport(out)

    def call_into_folder(self, method: str, args: tuple, keep: bool = True):
        """`method(folder, *args)` into a temporary folder here; returns (its result, the
        files it wrote) so that the caller's machine gets them, wherever this actor runs."""
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "out"
            result = getattr(self.worker, method)(folder, *args)
            files = ({str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
                      if f.is_file()} if keep and folder.is_dir() else {})
        return result, files


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
            request = resources_of(role)
            fits = all(available.get(k, 0.0) >= v for k, v in request.items() if v)
            why = ("Ray has these resources free now, so it is starting slowly: raise "
                   "placement.start_timeout" if fits else
                   f"no machine of the Ray cluster offers that; Ray has {available} free")
            lines.append(f"the {name} worker waits for {request} to {what}: {why}")
        stop_actors([actor for _, actor, _ in actors])
        raise PlacementError(f"ray: not ready within {timeout:g} s (placement.start_timeout): "
                             + "; ".join(lines) + ". Lower placement.<worker>.num_cpus / num_gpus / "
                             "resources, or add machines to the cluster")
    try:
        return ray.get(refs)
    except Exception:
        stop_actors([actor for _, actor, _ in actors])
        raise


def check_api(actors: list[tuple[str, Any, Any]], missing: list[list[str]]) -> None:
    """PlacementError (and the actors stopped) when a built worker lacks declared methods."""
    lacking = [f"the {name} worker has no {', '.join(m)}"
               for (name, _, _), m in zip(actors, missing, strict=True) if m]
    if lacking:
        stop_actors([actor for _, actor, _ in actors])
        raise PlacementError("ray: " + "; ".join(lacking) + " (reasonrl.worker_protocols declares them)")


def check_capacity(cfg: Config, critics: int, teachers: int = 0) -> None:
    """PlacementError, before any actor starts, when the workers ask for more CPUs or GPUs than
    the Ray cluster has in all, or a rollout replica for more GPUs than any one machine has
    (an actor Ray cannot place would wait for placement.start_timeout): names the keys and
    the resources that exist. Custom resources are left to the start timeout."""
    import ray

    p = cfg.placement
    groups = [("placement.rollout.replicas", p.rollout.replicas, "rollout", p.rollout),
              ("placement.policy.ranks", p.policy.ranks, "policy", p.policy)]
    if critics:
        groups.append(("placement.critic.ranks", critics, "critic", p.critic))
    if teachers:
        groups.append(("teachers", teachers, "teacher", p.teacher))
    total = ray.cluster_resources()
    have = f"{total.get('CPU', 0):g} CPU and {total.get('GPU', 0):g} GPU"
    for resource, attr in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
        asked = sum(count * getattr(role, attr) for _, count, _, role in groups)
        if asked > total.get(resource, 0) + 1e-9:
            parts = " + ".join(f"{key}={count} x placement.{name}.{attr}={getattr(role, attr):g}"
                               for key, count, name, role in groups if getattr(role, attr))
            raise PlacementError(f"ray: the workers ask for {asked:g} {resource} in all ({parts}); the Ray "
                                 f"cluster has {have} in all. Lower placement.rollout.replicas, the ranks or "
                                 f"the workers' {attr}, or add machines (or placement.num_cpus for a Ray "
                                 "started by the run)")
    per_node = [node["Resources"].get("GPU", 0) for node in ray.nodes() if node.get("Alive")]
    need, key = ENGINES[cfg.rollout.engine].info["machine_gpus"](cfg.rollout)
    if max(per_node, default=0) < need:
        raise PlacementError(f"{key}: {need} GPUs per engine on one machine; the Ray cluster's machines "
                             f"have {sorted(per_node, reverse=True)} GPUs")


def build_ray_workers(cfg: Config) -> Workers:
    """Actors for the rollout replicas, the policy ranks, the critic's and the teacher (see the
    module docstring); the proxies over them, and the streamed weight sync with its plan (which
    never reaches the teacher)."""
    p = cfg.placement
    if cfg.model.path not in ("", TINY) and Path(cfg.model.path).exists():  # actors may run elsewhere
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, path=str(Path(cfg.model.path).resolve())))
    if cfg.critic.path and Path(cfg.critic.path).exists():
        cfg = dataclasses.replace(cfg, critic=dataclasses.replace(
            cfg.critic, path=str(Path(cfg.critic.path).resolve())))
    if cfg.teacher.path and Path(cfg.teacher.path).exists():
        cfg = dataclasses.replace(cfg, teacher=dataclasses.replace(
            cfg.teacher, path=str(Path(cfg.teacher.path).resolve())))
    _connect(p)
    env = dict(ACTOR_ENV)
    if "REASONRL_HOME" in os.environ:
        env["REASONRL_HOME"] = os.environ["REASONRL_HOME"]
    env.update(console.inherited_env())  # the actors' [reasonrl] lines in this run's console mode
    world, replicas = p.policy.ranks, p.rollout.replicas
    critics = p.critic.ranks if needs_critic(cfg.algo.advantage) else 0
    teachers = 1 if cfg.teacher.path else 0
    check_capacity(cfg, critics, teachers)
    names = ["rollout" if replicas == 1 else f"rollout replica {i}" for i in range(replicas)]
    names += [f"policy rank {r}" if world > 1 else "policy" for r in range(world)]
    names += [f"critic rank {r}" if critics > 1 else "critic" for r in range(critics)]
    names += ["teacher"] * teachers
    roles = [p.rollout] * replicas + [p.policy] * world + [p.critic] * critics + [p.teacher] * teachers
    envs = [env] * replicas + [{**env, **POLICY_ENV}] * world + [env] * (critics + teachers)
    actors = [(name, _start(role, cfg, e), role) for name, role, e in zip(names, roles, envs, strict=True)]
    # 1. every actor running (scheduled on a machine with its resources); rank 0 of the policy
    # (and of the critic) offers its group's rendezvous
    rendezvous = _await_start(actors, [a.rendezvous.remote() for _, a, _ in actors], "start", cfg)
    init_method, critic_init = rendezvous[replicas], rendezvous[replicas + world] if critics else None
    # 2. every worker built (models loaded; policy ranks joined their process group)
    backend = p.backend if p.backend != "auto" else ("nccl" if p.policy.num_gpus > 0 else "gloo")
    builds = [actor.build.remote(_build_rollout, RolloutWorkerAPI, cfg) for _, actor, _ in actors[:replicas]]
    for rank, (_, actor, _) in enumerate(actors[replicas: replicas + world]):
        if world == 1:
            builds.append(actor.build.remote(_build_policy, PolicyWorkerAPI, cfg))
        else:
            builds.append(actor.build.remote(_build_policy_rank, PolicyWorkerAPI, cfg, rank, world,
                                             init_method, backend))
    critic_backend = p.backend if p.backend != "auto" else ("nccl" if p.critic.num_gpus > 0 else "gloo")
    for rank, (_, actor, _) in enumerate(actors[replicas + world: replicas + world + critics]):
        if critics == 1:
            builds.append(actor.build.remote(_build_critic, CriticWorkerAPI, cfg))
        else:
            builds.append(actor.build.remote(_build_critic_rank, CriticWorkerAPI, cfg, rank, critics,
                                             critic_init, critic_backend))
    builds += [actor.build.remote(_build_teacher, TeacherWorkerAPI, cfg)
               for _, actor, _ in actors[replicas + world + critics:]]
    missing = _await_start(actors, builds, "load its model", cfg)
    check_api(actors, missing)

    tokenizer = load_tokenizer(cfg.model.path, cfg.model.revision)
    d = cfg.data
    # the replicas' own rendering (an env.fn class's tools are in every prompt): the lengths checked here
    encoder = RolloutWorker(None, tokenizer, d.apply_chat_template, system_prompt_for(d), d.max_prompt_tokens,
                            d.truncate_prompts, env=environment_spec(cfg.env))
    handles = [a for _, a, _ in actors]
    spans = (("rollout", 0, replicas, "replica", p.rollout),
             ("policy" if world == 1 else f"policy ({world} ranks)", replicas, world, "rank", p.policy),
             ("critic" if critics == 1 else f"critic ({critics} ranks)", replicas + world, critics, "rank",
              p.critic),
             ("teacher", replicas + world + critics, teachers, "actor", p.teacher))
    groups = [ActorGroup(name, handles[start: start + count], actor_names(name, count, unit),
                         resources_of(role), p.call_timeout) for name, start, count, unit, role in spans]
    rollout, policy = RemoteRollout(groups[0], encoder), RemotePolicy(groups[1])
    critic = RemoteCritic(groups[2]) if critics else None
    teacher = RemoteTeacher(groups[3]) if teachers else None
    try:  # what a sync sends never changes: planned once, here (no communication between ranks)
        plan = policy.sync_plan(int(p.sync_bucket_mb * 2**20))
    except BaseException:
        stop_actors(handles)
        raise
    sync = WeightSync(policy, rollout, StreamedBuckets(groups[1], groups[0], plan))
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer, sync=sync, critic=critic,
                   teacher=teacher, actors=handles)


def actor_names(name: str, count: int, unit: str) -> list[str]:
    """How errors name each of a worker's actors: "the rollout worker", "rollout replica 1 (of 2)"."""
    return [f"the {name} worker"] if count == 1 else [f"{name} {unit} {i} (of {count})" for i in range(count)]
