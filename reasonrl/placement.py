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
group of N data-parallel ranks (`reasonrl.policy.parallel`: torch.distributed + FSDP2, with
or without LoRA). `placement.rollout.replicas=N` makes N rollout actors behind one proxy
(`RemoteRollout`): prompts split by whole groups with seeds drawn by the trainer, results
merged in order, every replica synced and checked. A weight sync is streamed: the policy's
rank 0 gathers one bucket of `placement.sync_bucket_mb` at a time (`RemoteWeights`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib.util
import json
import os
import socket
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reasonrl.batch import Rollouts
from reasonrl.config import Config, check_context, resolve_device
from reasonrl.data import system_prompt_for
from reasonrl.envs import environment_spec
from reasonrl.errors import ConfigError, PlacementError, WeightSyncError
from reasonrl.policy.critic import CriticWorker, ValueModel
from reasonrl.policy.model import (
    DEFAULT_MODEL_NAME,
    HUB_ID,
    TINY,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_model_dir,
)
from reasonrl.policy.worker import PolicySettings, PolicyWorker
from reasonrl.registry import ENGINES, needs_critic
from reasonrl.rng import seed_everything
from reasonrl.rollout import RolloutWorker, make_engine, prompt_seeds
from reasonrl.tracking import missing_extra
from reasonrl.workers import (
    CriticWorkerAPI,
    PolicyWorkerAPI,
    RolloutWorkerAPI,
    api_methods,
    missing_methods,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# what every actor process gets in its environment (besides REASONRL_HOME when set here)
ACTOR_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
# The policy's weights leave its actor as zero-copy tensors (the receiver maps the object
# store's memory read-only and copies them into its model). Only the policy gets it: the
# rollout actor's `Rollouts` must arrive here as ordinary, writable tensors.
POLICY_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}


def preflight(cfg: Config) -> None:
    """What the config asks of this machine, checked before any model loads: the engine's
    and the tracking backends' extras, Ray for placement.mode=ray, peft for LoRA, the GPUs one
    engine needs on this machine in local mode (its ENGINES entry's `machine_gpus`; ray mode:
    `check_capacity`, once Ray is up), the environment of multi-turn runs (env.fn's class, the
    python tool's sandbox), and that the longest sequence fits the model's context
    (`check_model_context`: its config.json only)."""
    problems = [("rollout.engine", ENGINES[cfg.rollout.engine].info["missing"]())]
    problems += [("tracking.backends", missing_extra(b)) for b in cfg.tracking.backends]
    if cfg.placement.mode == "ray" and importlib.util.find_spec("ray") is None:
        problems.append(("placement.mode", "placement.mode=ray needs Ray: pip install 'reasonrl[ray]'"))
    if cfg.model.lora.rank > 0 and importlib.util.find_spec("peft") is None:
        problems.append(("model.lora.rank", "model.lora.rank > 0 needs peft: pip install 'reasonrl[lora]'"))
    need, key = ENGINES[cfg.rollout.engine].info["machine_gpus"](cfg.rollout)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.placement.mode == "local" and gpus < need:
        problems.append((key, f"{need} GPUs per engine, and this machine has {gpus}"))
    problems = [f"{key}: {problem}" for key, problem in problems if problem is not None]
    if problems:  # all of them at once: one install should not uncover the next problem
        raise ConfigError("\n".join(problems))
    environment_spec(cfg.env)  # env.fn imported and checked, the python tool's sandbox probed
    check_model_context(cfg)


TINY_POSITIONS = 2048  # build_tiny_model's max_position_embeddings (a test checks they agree)
DEFAULT_POSITIONS = 8192  # the embedded SmolLM2-135M-Instruct's (a test checks its converted config)
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx")  # n_*: GPT-2-style configs


@functools.lru_cache(maxsize=16)
def model_positions(path: str, revision: str = "") -> tuple[int, str] | None:
    """(the context length in positions of `model.path`'s model, where it was read), without
    loading the model: its config.json's max_position_embeddings (or a multimodal config's
    text_config's); for a Hub id its config.json alone is fetched. None when the config names
    none, or a Hub config cannot be fetched now (loading the model then says why)."""
    if path == TINY:
        return TINY_POSITIONS, "max_position_embeddings of model.path=tiny"
    if not path:
        return DEFAULT_POSITIONS, f"max_position_embeddings of the default {DEFAULT_MODEL_NAME}"
    if not Path(path).expanduser().exists() and HUB_ID.match(path):
        from huggingface_hub import constants, hf_hub_download

        try:
            config_file = Path(hf_hub_download(path, "config.json", revision=revision or None,
                                               local_files_only=constants.HF_HUB_OFFLINE))
        except Exception:  # offline, missing, private: the model's own load reports it
            return None
    else:
        config_file = resolve_model_dir(path) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sections = [config, config.get("text_config")] if isinstance(config, dict) else []
    for section in (s for s in sections if isinstance(s, dict)):
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{key} in {config_file}"
    return None


def check_model_context(cfg: Config) -> None:
    """`check_context` (a ConfigError naming data.max_prompt_tokens, rollout.max_new_tokens and
    the limit) for the policy's model and, with a critic, critic.path's."""
    models = [("the model", cfg.model.path, cfg.model.revision)]
    if cfg.critic.path and needs_critic(cfg.algo.advantage):
        models.append(("critic.path's model", cfg.critic.path, ""))
    for name, path, revision in models:
        found = model_positions(path, revision)
        if found is not None:
            check_context(cfg, *found, model=name)


@dataclass
class Workers:
    policy: PolicyWorkerAPI
    rollout: RolloutWorkerAPI
    tokenizer: object
    critic: CriticWorkerAPI | None = None  # critic estimators (algo.advantage=gae) only
    actors: list = field(default_factory=list)  # ray mode: the actor handles, for close()

    def close(self) -> None:
        """Free the workers: engines closed (vLLM's memory and process state), Ray actors
        stopped. Safe to call twice."""
        workers = (self.rollout, self.policy, self.critic)
        self.policy = self.rollout = self.critic = None
        try:
            for worker in workers:
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
                                                seed=cfg.trainer.seed, revision=cfg.model.revision)
    return model.to(device), tokenizer


def make_policy(cfg: Config, model, tokenizer) -> PolicyWorker:
    """The policy worker around `model` (wrapped in a LoRA adapter when `model.lora.rank` > 0)."""
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.policy.lora import apply_lora

        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed)
    return PolicyWorker(model, tokenizer.pad_token_id, PolicySettings.from_config(cfg))


def critic_lm(cfg: Config, policy_model, device: str):
    """The causal LM the critic starts from: `critic.path`'s, or a copy of the policy's model
    (before any LoRA wrapping). It must read the policy's token ids: same vocabulary size."""
    if not cfg.critic.path:
        return copy.deepcopy(policy_model)
    lm, _ = load_model_and_tokenizer(cfg.critic.path, DTYPES[cfg.model.dtype], seed=cfg.trainer.seed)
    if lm.config.vocab_size != policy_model.config.vocab_size:
        raise ConfigError(f"critic.path={cfg.critic.path}: its vocabulary ({lm.config.vocab_size} tokens) "
                          f"is not the policy's ({policy_model.config.vocab_size}); the critic reads the "
                          "policy's ids")
    return lm.to(device)


def value_model(cfg: Config, lm) -> ValueModel:
    """`lm` with a zero value head (and the policy's LoRA settings: adapters on the body, the
    head trained in full)."""
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.policy.lora import apply_lora

        lm = apply_lora(lm, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed + 1)
    return ValueModel(lm)


def make_critic(cfg: Config, lm, tokenizer) -> CriticWorker:
    return CriticWorker(value_model(cfg, lm), tokenizer.pad_token_id, cfg.critic, cfg.optim)


def make_rollout(cfg: Config, model, tokenizer) -> RolloutWorker:
    # hf shares `model`; vllm starts from a copy of its weights
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg.rollout, cfg.trainer.threads)
    d = cfg.data
    return RolloutWorker(engine, tokenizer, d.apply_chat_template, system_prompt_for(d), d.max_prompt_tokens,
                         d.truncate_prompts, env=environment_spec(cfg.env))


def build_workers(cfg: Config) -> Workers:
    check_model_context(cfg)  # again: `reasonrl probe`'s --max-new-tokens reaches only this config
    if cfg.placement.mode == "ray":
        return build_ray_workers(cfg)
    if cfg.placement.mode != "local":
        raise ValueError(f"placement.mode: unknown mode {cfg.placement.mode!r}; allowed: local, ray")
    device = resolve_device(cfg.placement.device)
    model, tokenizer = load_model(cfg, device)
    critic = (make_critic(cfg, critic_lm(cfg, model, device), tokenizer) if needs_critic(cfg.algo.advantage)
              else None)
    # LoRA wraps the policy's model in place: the engine keeps a plain copy (merged weights)
    engine_model = copy.deepcopy(model) if cfg.model.lora.rank > 0 else model
    policy = make_policy(cfg, model, tokenizer)
    rollout = make_rollout(cfg, engine_model, tokenizer)
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer, critic=critic)


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


def _build_critic(cfg: Config) -> CriticWorker:
    device = _device(cfg.placement.critic.num_gpus)
    model, tokenizer = load_model(cfg, device)
    return make_critic(cfg, critic_lm(cfg, model, device), tokenizer)


def _build_critic_rank(cfg: Config, rank: int, world: int, init_method: str, backend: str):
    """In a critic rank's actor: join the critic's own process group, build and shard."""
    from reasonrl.policy import parallel

    parallel.init_process_group(backend, init_method, rank, world, cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    lm = critic_lm(cfg, model, "cpu")
    device = torch.device(_device(cfg.placement.critic.num_gpus))
    sharded = parallel.shard_value_model(value_model(cfg, lm), device,
                                         parallel.ShardOptions.of(cfg.placement.critic))
    return parallel.RankCriticWorker(sharded, tokenizer.pad_token_id, cfg.critic, cfg.optim, rank, world,
                                     device=device)


def _build_policy(cfg: Config) -> PolicyWorker:
    model, tokenizer = load_model(cfg, _device(cfg.placement.policy.num_gpus))
    return make_policy(cfg, model, tokenizer)


def _build_policy_rank(cfg: Config, rank: int, world: int, init_method: str, backend: str):
    """In a policy rank's actor: join the process group, load the model (with LoRA: wrapped by
    the same adapter as every other rank's and local mode's, A drawn from `trainer.seed`) and
    shard it. The reference model is a sharded copy, or with LoRA the sharded model itself
    run with the adapter switched off."""
    from reasonrl.policy import parallel
    from reasonrl.policy.lora import AdapterDisabled, apply_lora, reference_model

    parallel.init_process_group(backend, init_method, rank, world, cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    settings, lo = PolicySettings.from_config(cfg), cfg.model.lora
    wants_ref = cfg.algo.beta > 0 or cfg.algo.log_kl
    ref = reference_model(model) if wants_ref and lo.rank == 0 else None  # LoRA: AdapterDisabled below
    if lo.rank > 0:
        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed)
    device = torch.device(_device(cfg.placement.policy.num_gpus))
    options = parallel.ShardOptions.of(cfg.placement.policy)
    root = parallel.shard_model(model, device, options)
    if ref is not None:
        ref = parallel.shard_model(ref, device, options)
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
    """A weight sync about to happen: the policy's actors and what they will send (the names
    of `sync_plan`, in buckets). `RemoteRollout.load_weights` moves the buckets one after the
    other from the policy's rank 0 to every rollout replica through Ray's object store: the
    tensors go actor to actor, never through the trainer, and at most two buckets are in
    flight (one being loaded by the replicas, the next being gathered)."""

    policy: RemotePolicy
    buckets: list[list[str]]


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

    def _wait(self, refs: list, what: str, names: list[str] | None = None) -> list:
        """ray.get(refs) within placement.call_timeout. `names`: whose each ref is (a rollout
        replica), for the errors: the ones that time out or die are named, and a
        `WeightSyncError` says which replica's check failed."""
        import warnings

        import ray

        timeout = self._timeout
        if names is not None:
            _, late = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
            if late:
                which = ", ".join(n for n, r in zip(names, refs, strict=True) if r in late)
                raise PlacementError(
                    f"ray: {which} did not finish {what} within {timeout:g} s (placement.call_timeout); "
                    f"each holds {self._request}. Raise placement.call_timeout if the work is just slow")
        try:
            with warnings.catch_warnings():  # tensors from the policy arrive read-only: we only read them
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                if names is None:
                    return ray.get(refs, timeout=timeout)
                out = []
                for name, ref in zip(names, refs, strict=True):
                    try:
                        out.append(ray.get(ref, timeout=timeout))
                    except ray.exceptions.ActorDiedError as err:
                        raise PlacementError(f"ray: {name} died during {what} (it holds {self._request}): "
                                             f"{err}") from None
                    except WeightSyncError as err:  # Ray's RayTaskError is also the cause's class
                        raise WeightSyncError(f"{name}: {getattr(err, 'cause', err)}") from None
                return out
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

    def __init__(self, name: str, actors: list, request: dict[str, float], timeout: float, bucket_bytes: int):
        super().__init__(name, actors, request, timeout)
        self._bucket_bytes = bucket_bytes

    def named_weights(self) -> RemoteWeights:
        """The sync to come (see `RemoteWeights`): rank 0's `sync_plan` for
        `placement.sync_bucket_mb`; nothing moves until the rollout proxy loads it."""
        plan = self._wait([self._actors[0].call.remote("sync_plan", (self._bucket_bytes,), {})],
                          "sync_plan()")[0]
        return RemoteWeights(self, plan)

    def _bucket(self, names: list[str]) -> tuple[Any, list]:
        """Start gathering one bucket (every rank takes part): (rank 0's reference to its
        tensors, the other ranks' references, whose results are empty)."""
        refs = [a.call.remote("weight_bucket", (names,), {}, rank == 0)
                for rank, a in enumerate(self._actors)]
        return refs[0], refs[1:]

    def save_pretrained(self, path, tokenizer=None) -> None:
        self._into_folder("save_pretrained", path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    def save_adapter(self, path) -> bool:
        return self._into_folder("save_adapter", path)


class RemoteCritic(RemoteWorker):
    """`CriticWorkerAPI` over the critic's actor (see `_forward_api`)."""

    def save(self, folder) -> None:
        self._into_folder("save", folder)


class RemoteRollout(RemoteWorker):
    """`RolloutWorkerAPI` over the rollout replicas' actors (`placement.rollout.replicas`), one
    engine each (see `_forward_api`): one rollout worker to the trainer. A rollout splits the
    prompts into contiguous shares (whole groups: each prompt's n samples stay on one replica),
    with the seeds drawn here in prompt order (`prompt_seeds`), and merges the replicas'
    `Rollouts` in the original order; a weight sync reaches every replica and each checks it.
    A replica that dies, times out or fails its check is named."""

    def __init__(self, name: str, actors: list, request: dict[str, float], timeout: float,
                 encoder: RolloutWorker):
        super().__init__(name, actors, request, timeout)
        self._encoder = encoder
        self._names = [f"the {name} worker"] if len(actors) == 1 else \
            [f"{name} replica {i} (of {len(actors)})" for i in range(len(actors))]

    def encode(self, example) -> list[int]:
        """Rendered here (the same code, no engine needed): no round trip per prompt."""
        return self._encoder.encode(example)

    def rollout(self, examples, params, seeds: list[int] | None = None) -> Rollouts:
        """The replicas' shares of `examples`, merged in order. The seeds are drawn here, from
        the trainer's RNG, one per prompt: the samples are those of one worker (local mode, or
        one replica) whatever the number of replicas, and a resumed run draws them again."""
        if seeds is None and not params.greedy:
            seeds = prompt_seeds(len(examples))
        shares = [s.tolist() for s in torch.arange(len(examples)).tensor_split(len(self._actors))]
        calls = [(name, actor, rows)
                 for name, actor, rows in zip(self._names, self._actors, shares, strict=True) if rows]
        refs = [actor.call.remote("rollout", ([examples[i] for i in rows], params,
                                              None if seeds is None else [seeds[i] for i in rows]), {})
                for _, actor, rows in calls]
        parts = self._wait(refs, f"rollout() of {len(examples)} prompts", [name for name, _, _ in calls])
        versions = {part.policy_version for part in parts}
        if len(versions) > 1:
            raise WeightSyncError("rollout replicas serve different policy versions: " + ", ".join(
                f"{name}: {part.policy_version}" for (name, _, _), part in zip(calls, parts, strict=True)))
        first = 0
        for part, (_, _, rows) in zip(parts, calls, strict=True):
            part.group = part.group + first  # each replica numbered its groups from 0
            first += len(rows)
        return Rollouts.concat(parts)

    def probe_due(self) -> list[int] | None:
        """The probe ids if any replica's engine wants the coming push verified (they count the
        same pushes)."""
        due = self._wait([a.call.remote("probe_due", (), {}) for a in self._actors], "probe_due()",
                         self._names)
        return next((ids for ids in due if ids is not None), None)

    def load_weights(self, named_tensors, version: int | None = None, expected_checksum: float | None = None,
                     expected_probe: torch.Tensor | None = None) -> None:
        """Every replica loads the weights and checks them (checksum, probe), then serves
        `version`. From the policy's actors (`RemoteWeights`): bucket by bucket, each gathered
        on the policy's rank 0 while the replicas load the previous one (at most two buckets
        in flight); the last bucket goes with the checks. Other tensors (from this process)
        are put in the object store once for all replicas."""
        import ray

        checks = dict(version=version, expected_checksum=expected_checksum, expected_probe=expected_probe)
        what = f"load_weights(version={version})"
        if not isinstance(named_tensors, RemoteWeights):
            ref = ray.put(list(named_tensors))
            self._wait([a.call.remote("load_weights", (ref,), checks, False) for a in self._actors], what,
                       self._names)
            return
        policy, buckets = named_tensors.policy, named_tensors.buckets or [[]]
        loading, gathered = [], []  # the replicas' loads of the previous bucket; its other ranks
        for i, names in enumerate(buckets):
            ref, others = policy._bucket(names)
            self._wait(loading, what, self._names[: len(loading)])
            policy._wait(gathered, f"weight_bucket() for {what}")
            last = i == len(buckets) - 1
            method, kwargs = ("load_weights", checks) if last else ("load_weight_bucket", {})
            loading = [a.call.remote(method, (ref,), kwargs, False) for a in self._actors]
            gathered = others
            del ref
        self._wait(loading, what, self._names)
        policy._wait(gathered, f"weight_bucket() for {what}")


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
_forward_api(RemoteCritic, CriticWorkerAPI)


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


def check_capacity(cfg: Config, critics: int) -> None:
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
    """Actors for the rollout replicas and the policy ranks (see the module docstring)."""
    p = cfg.placement
    if cfg.model.path not in ("", TINY) and Path(cfg.model.path).exists():  # actors may run elsewhere
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(
            cfg.model, path=str(Path(cfg.model.path).resolve())))
    if cfg.critic.path and Path(cfg.critic.path).exists():
        cfg = dataclasses.replace(cfg, critic=dataclasses.replace(
            cfg.critic, path=str(Path(cfg.critic.path).resolve())))
    _connect(p)
    env = dict(ACTOR_ENV)
    if "REASONRL_HOME" in os.environ:
        env["REASONRL_HOME"] = os.environ["REASONRL_HOME"]
    world, replicas = p.policy.ranks, p.rollout.replicas
    critics = p.critic.ranks if needs_critic(cfg.algo.advantage) else 0
    check_capacity(cfg, critics)
    names = ["rollout" if replicas == 1 else f"rollout replica {i}" for i in range(replicas)]
    names += [f"policy rank {r}" if world > 1 else "policy" for r in range(world)]
    names += [f"critic rank {r}" if critics > 1 else "critic" for r in range(critics)]
    roles = [p.rollout] * replicas + [p.policy] * world + [p.critic] * critics
    envs = [env] * replicas + [{**env, **POLICY_ENV}] * world + [env] * critics
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
    for rank, (_, actor, _) in enumerate(actors[replicas + world:]):
        if critics == 1:
            builds.append(actor.build.remote(_build_critic, CriticWorkerAPI, cfg))
        else:
            builds.append(actor.build.remote(_build_critic_rank, CriticWorkerAPI, cfg, rank, critics,
                                             critic_init, critic_backend))
    missing = _await_start(actors, builds, "load its model", cfg)
    check_api(actors, missing)

    tokenizer = load_tokenizer(cfg.model.path, cfg.model.revision)
    d = cfg.data
    encoder = RolloutWorker(None, tokenizer, d.apply_chat_template, system_prompt_for(d), d.max_prompt_tokens,
                            d.truncate_prompts)
    handles = [a for _, a, _ in actors]
    rollout = RemoteRollout("rollout", handles[:replicas], _request(p.rollout), p.call_timeout, encoder)
    policy = RemotePolicy("policy" if world == 1 else f"policy ({world} ranks)",
                          handles[replicas: replicas + world], _request(p.policy), p.call_timeout,
                          int(p.sync_bucket_mb * 2**20))
    critic = None
    if critics:
        critic = RemoteCritic("critic" if critics == 1 else f"critic ({critics} ranks)",
                              handles[replicas + world:], _request(p.critic), p.call_timeout)
    return Workers(policy=policy, rollout=rollout, tokenizer=tokenizer, critic=critic,
                   actors=[a for _, a, _ in actors])
