"""A Gymnasium environment over text, written as Gymnasium documents custom environments
(docs/env-gym.md): `reset(seed=None, options=None) -> (observation, info)` and
`step(action) -> (observation, reward, terminated, truncated, info)`. The number to find is the
task's answer, which reset gets in `options` (the data row); the model guesses, the environment
says higher or lower; three guesses at most.

reasonrl does not need Gymnasium: where it is not installed, the two lines of `gymnasium.Env`
this class uses stand in for it (its seeded generator, as Gymnasium seeds it).
"""

import re

try:
    from gymnasium import Env
except ImportError:  # Gymnasium not installed: what of gymnasium.Env this class uses
    import numpy as np

    class Env:
        def reset(self, *, seed=None, options=None):
            if seed is not None or not hasattr(self, "np_random"):
                self.np_random = np.random.default_rng(seed)


class GuessNumber(Env):
    max_guesses = 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        options = options or {}
        if "ground_truth" in options:
            self.secret = float(options["ground_truth"])
        else:
            self.secret = float(self.np_random.integers(1, 101))
        self.guesses = 0
        return "Answer with one number; you have 3 tries.", {}

    def step(self, action):
        self.guesses += 1
        numbers = re.findall(r"-?\d+(?:\.\d+)?", action)
        if not numbers:
            observation, reward, terminated = "Answer with a number.", 0.0, False
        elif float(numbers[-1]) == self.secret:
            observation, reward, terminated = "Correct.", 1.0, True
        else:
            word = "lower" if float(numbers[-1]) > self.secret else "higher"
            observation, reward, terminated = f"Wrong: the number is {word}.", 0.0, False
        truncated = not terminated and self.guesses >= self.max_guesses
        return observation, reward, terminated, truncated, {"guesses": self.guesses}
