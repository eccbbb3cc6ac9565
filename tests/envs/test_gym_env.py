"""Gym-style text environments (reasonrl/envs/gym_env.py): SkyRL-Gym's init/step and
Gymnasium's reset/step 5-tuple, driven by scripted turns: observations as user messages,
masks, summed rewards, what ends an episode, a step that raises or hangs counted as any
environment's, the start-up checks and detection, and the example configs trained 2 steps."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
from helpers import ScriptedEngine

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.envs import environment_spec
from reasonrl.envs.gym_env import GymnasiumEnvironment, SkyRLEnvironment, example_seed
from reasonrl.errors import ConfigError
from reasonrl.rollout import RolloutWorker, SamplingParams

REPO = Path(__file__).parents[2]
HERE = __name__  # env.fn=<this module>:Class: the classes below, this very module (its events)
HANG = threading.Event()  # a hanging step waits on it; set when the test is done
EVENTS: list[str] = []  # what the environments were asked, in order


def env_config(*overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", ["rollout.max_new_tokens=64", *overrides]).env


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def user(text: str) -> str:
    """A user message after a turn that ended with EOS (<|im_end|>), then the generation prompt."""
    return f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


# ---- environments in the frameworks' own styles ------------------------------------------------

class Multiply:
    """SkyRL-Gym style (BaseTextEnv's methods, written out: SkyRL is not installed here)."""

    def __init__(self, env_config=None, extras=None):
        self.turns, self.extras = 0, extras
        self.answer = extras["reward_spec"]["ground_truth"]
        self.max_turns = extras["max_turns"]

    def init(self, prompt):
        return [{"role": "system", "content": "Box it."}, *prompt], {"started": True}

    def step(self, action):
        self.turns += 1
        if "boom" in action:
            raise RuntimeError("the grader broke")
        if "hang" in action:
            HANG.wait(60)
        right = f"\\boxed{{{self.answer}}}" in action
        done = right or self.turns >= self.max_turns
        out = {"observations": [] if done else [{"role": "user", "content": "Try again."}],
               "reward": 1.0 if right else 0.25, "done": done, "metadata": {"turn": self.turns}}
        if "tidy" in action:
            out["postprocessed_action"] = action.strip()
        return out

    def close(self):
        EVENTS.append(f"close {self.answer}")


class Guess:
    """Gymnasium style: the secret from options (the data row), the 5-tuple."""

    def reset(self, *, seed=None, options=None):
        self.secret, self.tries, self.seed = int(options["ground_truth"]), 0, seed
        EVENTS.append(f"reset seed={seed}")
        return "Guess it.", {}

    def step(self, action):
        self.tries += 1
        if "boom" in action:
            raise ValueError("bad guess")
        if "hang" in action:
            HANG.wait(60)
        if "old" in action:
            return "x", 0.0, False, {}
        guess = int(action.split()[-1].rstrip("."))
        terminated = guess == self.secret
        truncated = not terminated and self.tries >= 2
        word = "Correct." if terminated else "Higher." if guess < self.secret else "Lower."
        return word, 1.0 if terminated else -0.25, terminated, truncated, {}

    def close(self):
        EVENTS.append("close")


class NeedsLevel:
    def __init__(self, level):
        pass

    def reset(self, *, seed=None, options=None):
        return "", {}

    def step(self, action):
        return "", 0.0, True, False, {}


class ResetNeedsRow:
    def reset(self, row, seed=None):
        return "", {}

    def step(self, action):
        return "", 0.0, True, False, {}


class NoAction(Multiply):
    def step(self):
        return {}


# ---- detection and start-up --------------------------------------------------------------------

def test_the_style_is_told_by_the_methods():
    assert isinstance(environment_spec(env_config(f"env.fn={HERE}:Multiply")).make(), SkyRLEnvironment)
    assert isinstance(environment_spec(env_config(f"env.fn={HERE}:Guess")).make(), GymnasiumEnvironment)
    echo = environment_spec(env_config(f"env.fn={REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Echo"))
    assert echo.stop_strings == ("e",) and echo.chat_roles == ()  # reasonrl's own protocol
    spec = environment_spec(env_config(f"env.fn={HERE}:Guess", "env.format=gymnasium"))
    assert spec.chat_roles == ("user",) and spec.stop_strings == () and spec.tools == ()


@pytest.mark.parametrize("attr, overrides, message", [
    ("NeedsLevel", [], r"env.fn=.*:NeedsLevel: the Gymnasium adapter builds NeedsLevel\(\): missing a "
                       "required argument: 'level'"),
    ("ResetNeedsRow", ["env.format=gymnasium"], "ResetNeedsRow.reset needs row; Gymnasium's reset"),
    ("NoAction", [], "NoAction.step takes no action; SkyRL's step"),
    ("Guess", ["env.format=skyrl"], "Guess has no init; a SkyRL-Gym environment implements init"),
])
def test_a_class_that_does_not_fit_its_style_is_refused_in_one_line(attr, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        environment_spec(env_config(f"env.fn={HERE}:{attr}", *overrides))
    assert "\n" not in str(err.value)


def test_the_gymnasium_seed_is_a_hash_of_the_example():
    example = Example("What is 2 + 3?", "5")
    digest = hashlib.blake2b(b'["What is 2 + 3?", "5"]', digest_size=8).digest()
    assert example_seed(example) == int.from_bytes(digest, "little") % (2**31 - 1)
    assert example_seed(Example("What is 2 + 3?", "5", "other", {"x": 1})) == example_seed(example)


# ---- episodes -----------------------------------------------------------------------------------

def worker(tokenizer, script, attr: str, *overrides: str):
    engine = ScriptedEngine(tokenizer, script)
    spec = environment_spec(env_config(f"env.fn={HERE}:{attr}", "env.max_turns=3", *overrides))
    return engine, RolloutWorker(engine, tokenizer, env=spec)


def test_a_skyrl_episode_token_by_token(tokenizer):
    """Episode 0: a wrong answer (0.25, "Try again." as a user message), then the right one
    (1.0, done: no observation); the reward is the sum, 1.25. init added a system message: the
    prompt is rendered again with it. Episode 1 sets a postprocessed_action (not applied, said)
    and runs out of turns (max_turns reaches the class as extras["max_turns"])."""
    wrong, right = "It is \\boxed{5}.<|im_end|>", "It is \\boxed{6}.<|im_end|>"
    engine, w = worker(tokenizer, [[wrong, " tidy \\boxed{1}<|im_end|>"], [right, "x<|im_end|>"],
                                   ["y<|im_end|>"]], "Multiply")
    EVENTS.clear()
    examples = [Example("What is 2 * 3?", "6", "mul", {"k": 1}), Example("What is 1 * 9?", "9")]
    r = w.rollout(examples, SamplingParams(n=1, max_new_tokens=64), seeds=[1, 2])
    prompt = [{"role": "system", "content": "Box it."}, {"role": "user", "content": "What is 2 * 3?"}]
    assert r.examples[0].prompt == prompt and r.prompt_ids[0] == w.encode(Example(prompt, "6"))
    parts = [(wrong, 1), (user("Try again."), 0), (right, 1)]
    assert r.completion_ids[0] == [i for text, _ in parts for i in ids_of(tokenizer, text)]
    assert r.token_mask[0] == [bit for text, bit in parts for _ in ids_of(tokenizer, text)]
    assert [t.reward for t in r.episodes.turns[0]] == [0.25, 1.0]
    assert r.episodes.reward.tolist() == [1.25, 0.75]
    assert r.episodes.turns[0][0].observation == "[user] Try again."
    assert r.episodes.turns[0][1].observation is None
    assert r.episodes.num_turns.tolist() == [2, 3] and r.truncated.tolist() == [False, False]
    assert r.episodes.turns[1][0].error == \
        "postprocessed_action not applied: reasonrl trains on the ids the model sampled"
    assert r.episodes.step_errors.tolist() == [0, 0] and sorted(EVENTS) == ["close 6", "close 9"]
    env = SkyRLEnvironment(Multiply, 3)
    env.reset(examples[0])
    assert env.env.extras == {"k": 1, "data_source": "mul", "extra_info": {"k": 1}, "max_turns": 3,
                              "reward_spec": {"method": "rule", "ground_truth": "6"}}


def test_a_gymnasium_episode_token_by_token(tokenizer):
    """reset's observation joins the prompt; a wrong guess gets its observation as the next
    user message (reward -0.25); terminated ends episode 0 (reward 1.0), truncated (2 tries)
    ends episode 1. Both episodes of the prompt got the same prompt and seed: one prompt."""
    engine, w = worker(tokenizer, [["It is 4.<|im_end|>", "It is 9.<|im_end|>"],
                                   ["It is 5.<|im_end|>", "It is 8.<|im_end|>"]], "Guess")
    EVENTS.clear()
    example = Example("What is 2 + 3?", "5")
    r = w.rollout([example], SamplingParams(n=2, max_new_tokens=64), seeds=[3])
    assert r.examples[0].prompt == "What is 2 + 3?\n\nGuess it."
    assert engine.calls[0][0] == [w.encode(r.examples[0])] and engine.calls[0][1].n == 2
    parts = [("It is 4.<|im_end|>", 1), (user("Higher."), 0), ("It is 5.<|im_end|>", 1)]
    assert r.completion_ids[0] == [i for text, _ in parts for i in ids_of(tokenizer, text)]
    assert r.token_mask[0] == [bit for text, bit in parts for _ in ids_of(tokenizer, text)]
    assert r.episodes.reward.tolist() == [0.75, -0.5] and r.episodes.num_turns.tolist() == [2, 2]
    assert r.truncated.tolist() == [False, False]  # the environment's truncation is not a cut turn
    assert EVENTS == [f"reset seed={example_seed(example)}"] * 2 + ["close"] * 2


def test_steps_that_raise_hang_or_answer_badly_are_counted(tokenizer):
    """Gymnasium: a step that raises is an error observation (counted) and the episode goes on;
    a 4-tuple (gym's old API) is refused the same way; a step that hangs ends the episode at
    env.step_timeout (counted), and close is not asked of it. SkyRL: the same for a raise."""
    script = [["boom<|im_end|>", "old<|im_end|>"], ["hang<|im_end|>", "It is 5.<|im_end|>"]]
    engine, w = worker(tokenizer, script, "Guess", "env.step_timeout=0.5")
    EVENTS.clear()
    try:
        r = w.rollout([Example("q", "5"), Example("r", "5")], SamplingParams(n=1, max_new_tokens=64),
                      seeds=[1, 2])
    finally:
        HANG.set()
    first, second = r.episodes.turns
    assert first[0].error == "the environment's step raised ValueError: bad guess"
    assert first[1].error == "environment step timed out after 0.5 s"
    assert second[0].error.startswith("the environment's step raised BadStep: step returned a tuple of 4 "
                                      "items (gym's old API: observation, reward, done, info); Gymnasium's "
                                      "step returns")
    assert r.episodes.step_errors.tolist() == [2, 1] and r.episodes.step_timeouts.tolist() == [1, 0]
    assert r.truncated.tolist() == [True, False] and r.episodes.reward.tolist() == [0.0, 1.0]
    assert EVENTS.count("close") == 1  # the hung environment is asked nothing more
    error_obs = "\n[environment error: the environment's step raised ValueError: bad guess]\n"
    after, obs = len(ids_of(tokenizer, "boom<|im_end|>")), ids_of(tokenizer, error_obs)
    assert r.completion_ids[0][after:after + len(obs)] == obs
    HANG.clear()
    engine, w = worker(tokenizer, [["boom<|im_end|>"], ["It is \\boxed{6}.<|im_end|>"]], "Multiply")
    r = w.rollout([Example("What is 2 * 3?", "6")], SamplingParams(n=1, max_new_tokens=64), seeds=[1])
    assert r.episodes.step_errors.tolist() == [1] and r.episodes.reward.tolist() == [1.0]
    assert r.episodes.turns[0][0].error == "the environment's step raised RuntimeError: the grader broke"


# ---- the example configs ------------------------------------------------------------------------

@pytest.mark.parametrize("config", ["gym_guess", "skyrl_multiply"])
def test_the_example_config_trains_two_steps(tmp_path, config):
    from reasonrl.cli import main

    assert main(["train", f"configs/envs/{config}.yaml", "model.path=tiny", "trainer.steps=2",
                 "trainer.batch_size=8", "rollout.n=4", "tracking.report=false", "trainer.progress=false",
                 "rollout.max_new_tokens=12", "env.max_turn_tokens=6", "data.val_size=4", "eval.n=1",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert "reward/env" in lines[1] and lines[1]["env/step_errors"] == 0 and lines[2]["env/step_errors"] == 0
