"""The role table: every worker of a run, one row each.

A row says what placement needs to know of a role and nothing of what is inside it: its
protocol (`reasonrl.worker_protocols`), how many (0 = off; a policy's or critic's data-parallel
ranks, the rollout replicas), its `placement.<role>` section (Ray resources), how it is built (a
`from_config(cfg, host)` in the worker's own module), whether it is isolated (a frozen model
whose calls have a deadline, killed and replaced past it: in local placement it runs in a
process of its own), its proxy in Ray placement, and the config keys naming its models (made
absolute for actors, their context checked by the preflight). The local and Ray builders, the
preflight, the capacity check and `Workers.close` loop over `ROLES`; a new role is a row here,
a worker class and a protocol.

A role may be served within another's worker (`within`): the reference model lives in the
policy's worker (the same process, device and data-parallel ranks, and the micro-batch layout
of the policy's update, which its values must match bitwise; with LoRA it is the policy's own
base with the adapter switched off, no copy). Its row builds no worker and starts no actor:
`build(cfg, worker)` gives the role's view of that role's worker (a local worker or its Ray
proxy), placed by that role's section (`placement.policy`).

Rows are built in table order in one process (local placement): the policy before its rollout
engine, which may share its model (`reasonrl.model.colocate`). A `side` row (the judge) is used
only where batches are collected: where asynchronous training collects them in a rollout process
beside the trainer (local placement), that process builds it (`placement.side_workers`) and the
trainer's does not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reasonrl.config import Config
from reasonrl.placement.proxies import RemoteCritic, RemotePolicy, RemoteRollout, remote_class
from reasonrl.registry import needs_critic
from reasonrl.rollout import RolloutWorker
from reasonrl.worker_protocols import (
    CriticWorkerAPI,
    JudgeWorkerAPI,
    PolicyWorkerAPI,
    ReferenceWorkerAPI,
    RolloutWorkerAPI,
    TeacherWorkerAPI,
)
from reasonrl.workers.critic import CriticWorker
from reasonrl.workers.frozen import ReferenceOf, wants_reference
from reasonrl.workers.judge import RewardModelWorker, judge_kind
from reasonrl.workers.policy import policy_from_config, policy_loss_fn
from reasonrl.workers.ranks import rank_critic, rank_policy
from reasonrl.workers.teacher import TeacherWorker, check_tokenizers, teacher_source

# The policy's weights leave its actor as zero-copy tensors (the receiver maps the object
# store's memory read-only and copies them into its model). Only the policy gets it: the
# rollout actor's `Rollouts` must arrive here as ordinary, writable tensors.
POLICY_ENV = {"RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1"}


@dataclass(frozen=True)
class Host:
    """Where one worker is built, as its `from_config` sees it: the device, its rank in its
    role's process group (`world` > 1: data-parallel ranks, joined at `init_method` with
    `backend`), and `shared`, the dict the workers built in one process share (None: a process
    of its own)."""

    device: Any = "cpu"
    rank: int = 0
    world: int = 1
    init_method: str | None = None
    backend: str = "gloo"
    shared: dict | None = None


@dataclass(frozen=True)
class Role:
    """One row of the table (see the module docstring)."""

    name: str  # the `Workers` attribute, and the name errors give it
    api: type  # its protocol
    build: Callable[..., Any]  # from_config(cfg, host) -> the worker; `within`: (cfg, that worker) -> view
    count: Callable[[Config], int]  # 0 = off
    ranked: Callable[..., Any] | None = None  # the same for one of several data-parallel ranks
    section: str = ""  # placement.<section> (Ray resources); "" = the name
    unit: str = "actor"  # several of it are "rank"s of one process group, or "replica"s
    count_key: str = ""  # the key that sets how many, for the capacity check's message
    isolated: bool = False  # a deadline per call, killed and replaced past it; local: its own process
    load_timeout: Callable[[Config], float] | None = None  # isolated: seconds to build it
    call_timeout: Callable[[Config], float] | None = None  # isolated: seconds per call
    proxy: Callable[..., Any] | None = None  # ray: (ActorGroup, cfg) -> proxy; None: `remote_class(api)`
    env: dict = field(default_factory=dict)  # ray: its actors' extra environment
    paths: tuple[str, ...] = ()  # config keys naming its models (absolute for actors elsewhere)
    # (what the error calls it, path, revision) of its model, whose context must fit the run's lengths
    context: Callable[[Config], tuple[str, str, str] | None] | None = None
    check: Callable[[Config], None] | None = None  # the preflight's check, before any model loads
    within: str = ""  # served within that role's worker: no worker or actor of its own
    # used where batches are collected alone (rewards are scored there): where asynchronous
    # training's rollout side is a process beside the trainer, that process builds it, the trainer's not
    side: bool = False

    def placement(self, cfg: Config):
        """Its `placement.<section>`."""
        return getattr(cfg.placement, self.section or self.name)

    def builder(self, host: Host) -> Callable[..., Any]:
        """How the worker at `host` is built: one of several ranks, or the whole worker."""
        return self.ranked if host.world > 1 else self.build


def _rollout_proxy(group, cfg: Config):
    # the replicas' own rendering (an env.fn class's tools are in every prompt): lengths checked here
    return RemoteRollout(group, RolloutWorker.encoder(cfg))


ROLES: tuple[Role, ...] = (
    Role("policy", PolicyWorkerAPI, policy_from_config, lambda cfg: cfg.placement.policy.ranks,
         ranked=rank_policy, unit="rank",
         count_key="placement.policy.ranks", proxy=lambda group, cfg: RemotePolicy(group), env=POLICY_ENV,
         paths=("model.path",), context=lambda cfg: ("the model", cfg.model.path, cfg.model.revision),
         check=lambda cfg: policy_loss_fn(cfg.algo)),  # algo.loss_fn imported and its signature checked
    # the reference model: a frozen model within the policy's worker (its layout, ranks, device)
    Role("reference", ReferenceWorkerAPI, ReferenceOf.within, lambda cfg: 1 if wants_reference(cfg) else 0,
         section="policy", count_key="algo.beta", within="policy"),
    Role("rollout", RolloutWorkerAPI, RolloutWorker.from_config, lambda cfg: cfg.placement.rollout.replicas,
         unit="replica", count_key="placement.rollout.replicas", proxy=_rollout_proxy),
    Role("critic", CriticWorkerAPI, CriticWorker.from_config,
         lambda cfg: cfg.placement.critic.ranks if needs_critic(cfg.algo.advantage) else 0,
         ranked=rank_critic, unit="rank",
         count_key="placement.critic.ranks", proxy=lambda group, cfg: RemoteCritic(group),
         paths=("critic.path",),
         context=lambda cfg: ("critic.path's model", cfg.critic.path, "") if cfg.critic.path else None),
    Role("teacher", TeacherWorkerAPI, TeacherWorker.from_config, lambda cfg: 1 if cfg.teacher.path else 0,
         count_key="teacher.path", paths=("teacher.path",),
         context=lambda cfg: ("teacher.path's model", teacher_source(cfg.teacher.path), cfg.teacher.revision),
         check=check_tokenizers),  # a teacher reading other token ids: refused before any model loads
    Role("judge", JudgeWorkerAPI, RewardModelWorker.from_config, lambda cfg: 1 if judge_kind(cfg) else 0,
         count_key="reward.weights", isolated=True, side=True, paths=("reward.model.path",),
         check=RewardModelWorker.check,  # a wrong reward.model.path: refused before any model loads
         load_timeout=lambda cfg: cfg.reward.model.load_timeout,
         call_timeout=lambda cfg: cfg.reward.model.timeout),
)


def active(cfg: Config, names: tuple[str, ...] | None = None) -> list[tuple[Role, int]]:
    """(role, how many) of every role the run has (count > 0), in table order; `names`: only
    those."""
    return [(role, n) for role in ROLES
            if (names is None or role.name in names) and (n := role.count(cfg)) > 0]


def served_within(roles: list[tuple[Role, int]], workers: dict[str, Any], cfg: Config) -> None:
    """Add to `workers` (the built ones by role name) each role of `roles` served within
    another's worker: its view of that worker (none when that role was not built)."""
    for row, _ in roles:
        if row.within and workers.get(row.within) is not None:
            workers[row.name] = row.build(cfg, workers[row.within])


def role(name: str) -> Role:
    """The row of `name`."""
    found = [r for r in ROLES if r.name == name]
    if not found:
        raise KeyError(f"no role {name!r}; the roles: {', '.join(r.name for r in ROLES)}")
    return found[0]


def proxy_of(role: Role, group, cfg: Config):
    """The trainer's side of `role`'s actors (ray placement)."""
    return role.proxy(group, cfg) if role.proxy is not None else remote_class(role.api)(group)
