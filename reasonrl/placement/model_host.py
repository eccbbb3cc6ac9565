"""reward.model.placement=ray: the reward model (or judge) in a Ray actor of its own
(`RayModelHost`, a `REWARD_MODEL_HOSTS` entry), its calls run by a `FunctionHost` as a reward
worker process runs them. Out of `actors.py`, which builds the run's workers: this host is
started by the reward scoring, not by `build_ray_workers`.
"""

from __future__ import annotations

import json
import os

import torch

from reasonrl.errors import PlacementError
from reasonrl.placement.actors import ACTOR_ENV
from reasonrl.placement.proxies import stop_actors
from reasonrl.registry import REWARD_MODEL_HOSTS
from reasonrl.rewards.pool import Call, Outcome, hard_deadline, load_request, outcome_of, request_of
from reasonrl.rewards.worker import call_reply, load_reply


class FunctionHost:
    """Runs inside a Ray actor: reward functions by target, as a reward worker process runs them
    (`reasonrl.rewards.worker`'s replies), without its SIGALRM timer (an actor's calls need not
    run on its main thread): the caller's deadline kills the actor instead."""

    def __init__(self, threads: int):
        torch.set_num_threads(threads)

    def load(self, request: dict) -> dict:
        return load_reply(request)

    def call(self, request: dict) -> dict:
        return call_reply(request, timer=False)


@REWARD_MODEL_HOSTS.register("ray")
class RayModelHost:
    """a Ray actor with reward.model.num_cpus / num_gpus (placement.mode=ray)

    reward.model.placement=ray: reward.model's calls, one at a time, in one `FunctionHost` actor
    on the run's Ray. A call gets `pool.hard_deadline(timeout)`; past it the actor is killed (the
    call timed out) and the next call starts a fresh one, which loads the model again within
    reward.model.load_timeout. The same interface as the worker pool (`load`, `run`, `close`)."""

    def __init__(self, spec: dict):
        import ray

        if not ray.is_initialized():
            raise PlacementError("reward.model.placement=ray: Ray is not running in this process (only a "
                                 "placement.mode=ray run starts it); use reward.model.placement=process")
        self.spec, self.actor, self.loaded = spec, None, set()

    def load(self, target: str, warmup: dict | None) -> str | None:
        import ray

        key = f"{target} {json.dumps(warmup, sort_keys=True)}"
        if self.actor is not None and key in self.loaded:
            return None
        if self.actor is None:
            env = dict(ACTOR_ENV, **{k: v for k, v in os.environ.items() if k == "REASONRL_HOME"})
            self.actor = ray.remote(FunctionHost).options(
                num_cpus=self.spec["num_cpus"], num_gpus=self.spec["num_gpus"],
                runtime_env={"env_vars": env}).remote(max(1, int(self.spec["num_cpus"])))
            self.loaded = set()
        ref = self.actor.load.remote(load_request(target, warmup))
        ready, _ = ray.wait([ref], timeout=self.spec["load_timeout"])
        if not ready:
            self.close()
            return (f"the reward-model actor did not load {target} within reward.model.load_timeout="
                    f"{self.spec['load_timeout']:g} s (it asks Ray for {self.spec['num_cpus']:g} CPU and "
                    f"{self.spec['num_gpus']:g} GPU)")
        try:
            reply = ray.get(ref)
        except ray.exceptions.RayError as err:
            self.close()
            return f"the reward-model actor failed: {err}"
        error = outcome_of(reply).error
        if error is None:
            self.loaded.add(key)
        return error

    def run(self, calls: list[Call], timeout: float) -> list[Outcome]:
        import ray

        outcomes = []
        for call in calls:
            error = self.load(call.target, call.warmup)
            if error is not None:
                outcomes.append(Outcome(error=error))
                continue
            ref = self.actor.call.remote(request_of(call, timeout))
            ready, _ = ray.wait([ref], timeout=hard_deadline(timeout))
            if not ready:
                self.close()
                outcomes.append(Outcome(timed_out=True))
                continue
            try:
                outcomes.append(outcome_of(ray.get(ref)))
            except ray.exceptions.RayError as err:
                self.close()
                outcomes.append(Outcome(error=f"the reward-model actor failed: {err}"))
        return outcomes

    def close(self) -> None:
        if self.actor is not None:
            stop_actors([self.actor])
            self.actor = None
