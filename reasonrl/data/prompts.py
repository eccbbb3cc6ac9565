"""What the model sees of an example (`render_prompt`) and in which order examples come
(`PromptSampler`: seeded, resumable epochs)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

from reasonrl.batch import Example


def render_prompt(example: Example, tokenizer, apply_chat_template: bool,
                  system_prompt: str = "", tools: Sequence[dict] = ()) -> str:
    """The exact text fed to the model for `example`.

    A plain `prompt` string gets the tokenizer's chat template (with `system_prompt` as
    the system turn when non-empty) unless `apply_chat_template` is false, in which case
    it is used verbatim (already templated, as ReasonRL's data is). `messages` are
    always templated; a system message in them wins over `system_prompt`. `tools` (JSON
    schemas, an environment's) go through the template's `tools=` argument; a template that
    ignores it (renders the same without them) gets them in the system message instead
    (`tools_system_text`).
    """
    if isinstance(example.prompt, str):
        if not apply_chat_template:
            return example.prompt
        messages = [{"role": "user", "content": example.prompt}]
    else:
        messages = list(example.prompt)
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if not tools:
        return text
    with_tools = tokenizer.apply_chat_template(messages, tools=list(tools), tokenize=False,
                                               add_generation_prompt=True)
    if with_tools != text:
        return with_tools
    block = tools_system_text(tools)
    if messages[0]["role"] == "system":
        messages = [{"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]]
    else:
        messages = [{"role": "system", "content": block}, *messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tools_system_text(tools: Sequence[dict]) -> str:
    """The tools described in a system message, for a chat template that does not render
    `tools=`: the Hermes function-calling layout that Qwen2.5's template writes (the schemas,
    one JSON object a line, inside `<tools></tools>`; a call as JSON inside
    `<tool_call></tool_call>`), which the tool environments parse."""
    schemas = "\n".join(json.dumps(t) for t in tools)
    return ("# Tools\n\nYou may call the functions below to help with the user's request; their "
            f"signatures, one JSON object a line:\n<tools>\n{schemas}\n</tools>\n\nTo call one, write its "
            "name and arguments as a JSON object between <tool_call></tool_call> tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class PromptSampler:
    """Deterministic, resumable stream of training examples: shuffled epochs from a seed.

    `state_dict()` is (epoch, position), enough to continue exactly where a run stopped.
    """

    def __init__(self, examples: list[Example], seed: int, shuffle: bool = True):
        self.examples, self.seed, self.shuffle = examples, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(f"sampler:{self.seed}:{self.epoch}").shuffle(order)
        return order

    def next(self, count: int) -> list[Example]:
        batch = []
        while len(batch) < count:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            batch.append(self.examples[self._order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()
