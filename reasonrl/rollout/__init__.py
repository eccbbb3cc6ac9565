"""Rollout: engines behind one protocol (`base`), the registry that builds them
(`engines`), and the worker that turns examples into `Rollouts` (`worker`)."""

from reasonrl.rollout.base import Generation, RolloutEngine, SamplingParams, prompt_seeds
from reasonrl.rollout.engines import make_engine
from reasonrl.rollout.worker import RolloutWorker, check_prompt_lengths, prompt_cuts

__all__ = ["Generation", "RolloutEngine", "RolloutWorker", "SamplingParams", "check_prompt_lengths",
           "make_engine", "prompt_cuts", "prompt_seeds"]
