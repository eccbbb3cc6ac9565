"""The tool task's prompts (`data.task=calculator`): `data.arithmetic` problems asked after one
worked call of the calculator, in the tool environment's format (`env.name=tool`,
`env.call_format=tags`, `env.observation_format=tagged`).

Measured on SmolLM2-135M-Instruct (docs/environments.md): told about the calculator in a
system prompt alone it never calls it (0 of 64 samples); with this one demonstration turn it
calls it in about half of its samples at temperature 1, and RL takes it from there.
"""

from __future__ import annotations

import dataclasses

from reasonrl.batch import Example
from reasonrl.config import ArithmeticConfig
from reasonrl.data.arithmetic import arithmetic_examples

CALCULATOR_SYSTEM_PROMPT = ("You can use a calculator: write <calculator>expression</calculator>; its result "
                            "comes back in <output></output>.")
DEMONSTRATION = (12, 34)  # the worked example; never asked in training or held out


def demonstration(a: int, b: int) -> list[dict[str, str]]:
    """One question and its answer through the calculator, as chat messages."""
    return [{"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": f"<calculator>{a} * {b}</calculator>\n"
                                             f"<output>\n{a * b}\n</output>\nThe answer is {a * b}."}]


def calculator_examples(cfg: ArithmeticConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """`arithmetic_examples` with each question after the demonstration (messages); the
    demonstration's own problem is left out of both splits."""
    train, held_out = arithmetic_examples(cfg, seed)
    shown = f"{DEMONSTRATION[0]} * {DEMONSTRATION[1]}"
    demo = demonstration(*DEMONSTRATION)

    def ask(example: Example) -> Example:
        return dataclasses.replace(example, prompt=[*demo, {"role": "user", "content": example.prompt}])

    return ([ask(e) for e in train if e.meta.get("expression") != shown],
            [ask(e) for e in held_out if e.meta.get("expression") != shown])
