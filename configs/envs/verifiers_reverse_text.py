# verifiers' reverse-text taskset (github.com/PrimeIntellect-ai/verifiers, environments/reverse_text/
# reverse_text/taskset.py, verifiers 0.4.0's v1 API), its task and reward as written there; one
# change: `load()` reads the words below instead of the Hub dataset PrimeIntellect/Reverse-Text-RL,
# so that nothing is fetched (set data.verifiers.taskset=reverse-text to train on the installed
# package's own, dataset and all). reasonrl generates each reply and scores it with `lcs` in its
# reward workers: configs/envs/verifiers_reverse_text.yaml, docs/env-verifiers.md.

"""reverse-text: reverse a string character-by-character (single-turn).

The model is asked to reverse the prompt and wrap the answer in `<reversed_text>`
tags; the reward is the LCS ratio between the parsed answer and the ground-truth
reversal. A pure-trace reward (no runtime needed) — the canonical tiny RL env, and
the starter for prime-rl training against a v1 env server.
"""

import re
from difflib import SequenceMatcher

import verifiers.v1 as vf

SYSTEM = (
    "Reverse the text character-by-character. Put your answer in <reversed_text> tags."
)
_TAG = re.compile(r"<reversed_text>(.*?)</reversed_text>", re.DOTALL)

WORDS = {
    "train": ["apple", "river", "stone", "cloud", "green", "light", "paper", "music", "table", "water",
              "bread", "chair", "dream", "earth", "flame", "grape"],
    "test": ["house", "night", "ocean", "plant"],
}


class ReverseTextData(vf.TaskData):
    answer: str
    """The ground-truth reversal of the prompt text."""


class ReverseTextTask(vf.Task[ReverseTextData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        # Reverse-text is single-turn: refuse a second turn so the model answers once.
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def lcs(self, trace: vf.Trace) -> float:
        completion = trace.last_reply
        match = _TAG.search(completion or "")
        response = match.group(1).strip() if match else ""
        return SequenceMatcher(None, response, self.data.answer).ratio()


class ReverseTextConfig(vf.TasksetConfig):
    dataset_split: str = "train"


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> list[ReverseTextTask]:
        return [
            ReverseTextTask(
                ReverseTextData(
                    idx=i,
                    prompt=word,
                    system_prompt=SYSTEM,
                    answer=word[::-1],
                ),
                self.config.task,
            )
            for i, word in enumerate(WORDS[self.config.dataset_split])
        ]
