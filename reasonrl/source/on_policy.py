"""`OnPolicy`: the batch source of the on-policy loop (trainer.max_staleness = 0). Each step's
batch is collected when the step asks for it (`reasonrl.source.collect.collect_batch`: the rollout
worker, the prompt sampler, the rewards), by the policy as it is; each new version is pushed
to the rollout engine(s) and checked there (`WeightSync.push`)."""

from __future__ import annotations

from reasonrl.batch import StepBatch
from reasonrl.config import Config
from reasonrl.data import PromptSampler
from reasonrl.errors import WeightSyncError
from reasonrl.placement import WeightSync, Workers
from reasonrl.rollout import SamplingParams
from reasonrl.source.collect import collect_batch
from reasonrl.source.held_out import held_out_metrics
from reasonrl.source.sides import SideParts


class OnPolicy:
    """The batch source of the on-policy loop (see the module docstring)."""

    def __init__(self, cfg: Config, rollout, sync: WeightSync, parts: SideParts, sampling: SamplingParams):
        self.cfg, self.rollout, self.sync, self.parts, self.sampling = cfg, rollout, sync, parts, sampling
        self.sampler = PromptSampler(parts.examples, cfg.trainer.seed, cfg.data.shuffle)

    @classmethod
    def build(cls, cfg: Config, workers: Workers, parts: SideParts, sampling: SamplingParams) -> OnPolicy:
        """Over the trainer's rollout worker and the run's weight sync (`push`)."""
        return cls(cfg, workers.rollout, workers.sync, parts, sampling)

    def take(self, step: int) -> tuple[StepBatch, dict[str, float]]:
        """Batch `step`, collected now by policy version `step` (checked); no `async/` metrics."""
        batch = collect_batch(self.rollout, self.sampler, self.sampling, self.cfg, self.parts.judge)
        if batch.rollouts.policy_version != step:
            raise WeightSyncError(f"step {step + 1}: rollouts came from policy version "
                                  f"{batch.rollouts.policy_version}, expected {step}")
        return batch, {}

    def publish(self, version: int, evaluate: bool = False) -> None:
        """Version `version` into the rollout engine(s), checked (`evaluate` changes nothing:
        the eval runs when `evaluate` is called, on the engine that now serves it)."""
        self.sync.push(version)

    def evaluate(self, version: int) -> dict[str, float]:
        """The held-out `eval/` metrics of the version the engine serves, with `time/eval`."""
        return held_out_metrics(self.rollout, self.parts.held_out, self.parts.eval_settings,
                                self.cfg.reward, self.parts.judge)

    def state(self, step: int) -> tuple[dict, None]:
        """(the sampler's state, no batch in flight)."""
        return self.sampler.state_dict(), None

    def restore(self, sampler: dict, in_flight: dict | None) -> None:
        """A checkpoint's sampler state (batches an asynchronous run kept in flight are not
        used: the run continues on-policy from the sampler's state after them)."""
        self.sampler.load_state_dict(sampler)

    def close(self) -> None:
        """Nothing of its own to stop (the workers are the trainer's)."""
