"""A SkyRL-Gym text environment, written as SkyRL documents a new environment (docs/env-gym.md):
built with (env_config, extras), the extras holding the data row's `reward_spec`;
`step(action)` returns a BaseTextEnvStepOutput. The model answers in \\boxed{}; a wrong answer
gets feedback and another try until `max_turns`.

reasonrl does not need SkyRL: where it is not installed, the part of SkyRL's base class this
environment uses stands in for it.
"""

import re

try:
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
except ImportError:  # SkyRL not installed: what of its BaseTextEnv this class uses
    BaseTextEnvStepOutput = dict

    class BaseTextEnv:
        def __init__(self):
            self.turns, self.max_turns = 0, 1

        def init(self, prompt):
            return prompt, {}

        def close(self):
            pass


class MultiplyEnv(BaseTextEnv):
    def __init__(self, env_config=None, extras=None):
        super().__init__()
        extras = extras or {}
        self.ground_truth = extras["reward_spec"]["ground_truth"]
        self.max_turns = extras.get("max_turns", 3)

    def step(self, action):
        self.turns += 1
        found = re.search(r"\\boxed\{([^}]+)\}", action)
        answer = found.group(1).strip() if found else None
        right = answer == str(self.ground_truth).strip()
        done = right or self.turns >= self.max_turns
        reward = 1.0 if right else 0.5 if answer is not None else 0.0
        if done:
            return BaseTextEnvStepOutput(observations=[], reward=reward, done=True,
                                         metadata={"answer": answer})
        hint = "That is not it. Try again." if answer is not None else "Put your answer in \\boxed{}."
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": hint}], reward=0.0, done=False,
                                     metadata={"answer": answer})
