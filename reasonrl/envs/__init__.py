"""Environments for multi-turn episodes: the model's turns alternate with observations.

- `base.py`: the protocol (`reset(example)`, `step(turn) -> EnvStep`), `EnvStep`, and
  `environment_spec`: the run's environment from the `env` section, checked at start-up
  (a registered `env.name`, or a user class `env.fn=module:Class`).
- `runner.py`: `run_calls`, one turn's steps run concurrently, each with a timeout, never raising.
- `tool.py`: `env.name=tool`, the model calls the sandboxed tools of `reasonrl.tools`.
- `feedback.py`: `env.name=feedback`, "too high / too low" until a numeric answer is right.
- `trl_env.py`, `gym_env.py`: other frameworks' classes (`env.format`: TRL's environment
  classes, SkyRL-Gym's and Gymnasium's) wrapped in the protocol; `adapters.py`: what they share.

Environments know nothing of models or tokenizers: they read the text of a turn and answer
with text or chat messages; `reasonrl.rollout` turns that into token ids (the TRL adapter's
tool schemas are rendered into the prompt there too) (docs/environments.md).
"""

from reasonrl.envs.base import (
    BadStep,
    Environment,
    EnvSpec,
    EnvStep,
    as_step,
    check_environment_class,
    environment_spec,
    observation_text,
    with_env_reward,
)
from reasonrl.envs.runner import Outcome, run_calls

__all__ = ["BadStep", "EnvSpec", "EnvStep", "Environment", "Outcome", "as_step", "check_environment_class",
           "environment_spec", "observation_text", "run_calls", "with_env_reward"]
