"""TRL's environment classes (`env.format=trl`, reasonrl/envs/trl_env.py): tool calls parsed in
every format TRL reads, the tools' JSON schemas as transformers derives them, the start-up
checks, scripted episodes (observations, masks, rewards, counts), a tool that raises or hangs,
a reset that writes the prompt, and configs/envs/trl_tools.yaml trained for 2 steps."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest
from helpers import ScriptedEngine

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.data.prompts import render_prompt, tools_system_text
from reasonrl.envs import environment_spec
from reasonrl.envs.trl_env import TRLEnvironment, parse_tool_calls, tool_methods
from reasonrl.errors import ConfigError
from reasonrl.rollout import RolloutWorker, SamplingParams
from reasonrl.rollout.episodes import turn_seed

REPO = Path(__file__).parents[2]
HERE = __name__  # env.fn=<this module>:Class: the classes below, this very module (its events)
STALL = threading.Event()  # the hanging tool waits on it; set when the test is done


def env_config(*overrides: str, max_new_tokens: int = 64):
    return load_config(REPO / "configs" / "smoke.yaml",
                       [f"rollout.max_new_tokens={max_new_tokens}", *overrides]).env


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- environments as TRL documents them ----------------------------------------------------

class Counter:
    """Two tools over a counter; `get_reward` is 1.0 when it reached the row's target."""

    def reset(self, target, **kwargs):
        self.counter, self.target, self.row = 0, target, kwargs

    def get_reward(self) -> float:
        if self.target == 99:
            raise RuntimeError("no score for 99")
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Add to the counter.

        Args:
            step: How much to add.

        Returns:
            The counter after the addition.
        """
        self.counter += step
        return self.counter

    def read(self, unit: str = "") -> str:
        """
        Read the counter.

        Args:
            unit: Written after the value.
        """
        return f"{self.counter}{unit}"

    def _helper(self):  # private: not a tool
        return None


class Faulty(Counter):
    """Counter's tools plus one that raises and one that hangs."""

    def explode(self) -> str:
        """Raise."""
        raise ValueError("boom")

    def stall(self) -> str:
        """Hang until the test ends."""
        STALL.wait(60)
        return "late"


class Owner:
    """TRL's environment-owned task: reset returns the text the prompt gains."""

    def reset(self, **kwargs) -> str:
        return f" Reach {kwargs['target']}."

    def increment(self, step: int) -> int:
        """
        Add.

        Args:
            step: How much.
        """
        return step


class Diverse(Owner):
    """Each episode's reset writes a different task (TRL's note: a group may not share a state)."""

    made = 0

    def reset(self, **kwargs) -> str:
        Diverse.made += 1
        return f" Variant {Diverse.made}."


class NoReward:
    def reset(self, **kwargs):
        pass

    def look(self, where: str) -> str:
        """
        Look somewhere.

        Args:
            where: The place.
        """
        return where


class BadReward(NoReward):
    def get_reward(self, completion) -> float:
        return 0.0


class Untyped(NoReward):
    def peek(self, where):
        """
        Peek.

        Args:
            where: The place.
        """
        return where


class NoReset:
    def get_reward(self) -> float:
        return 0.0


class Nothing:
    def go(self):
        pass


# the schemas transformers' get_json_schema derives from Counter's tools (hand-written from its
# rules: type hints -> JSON types, the docstring's first paragraph, Args: and Returns:)
COUNTER_SCHEMAS = (
    {"type": "function", "function": {
        "name": "increment", "description": "Add to the counter.",
        "parameters": {"type": "object",
                       "properties": {"step": {"type": "integer", "description": "How much to add."}},
                       "required": ["step"]},
        "return": {"type": "integer", "description": "The counter after the addition."}}},
    {"type": "function", "function": {
        "name": "read", "description": "Read the counter.",
        "parameters": {"type": "object", "properties": {"unit": {"type": "string",
                                                                 "description": "Written after the value."}}},
        "return": {"type": "string"}}},
)


# ---- tool calls in TRL's formats -----------------------------------------------------------------

def test_tool_calls_are_read_in_every_format_trl_parses():
    hermes = '<tool_call>\n{"name": "increment", "arguments": {"step": 2}}\n</tool_call>'
    assert parse_tool_calls(hermes) == [("increment", {"step": 2})]
    openai = '<tool_call>{"name": "increment", "arguments": "{\\"step\\": 1}"}</tool_call>'
    assert parse_tool_calls(openai) == [("increment", {"step": 1})]
    qwen35 = ("<tool_call>\n<function=read>\n<parameter=unit>\n cm\n</parameter>\n"
              "<parameter=n>\n[1, 2]\n</parameter>\n</function>\n</tool_call>")
    assert parse_tool_calls(qwen35) == [("read", {"unit": "cm", "n": [1, 2]})]  # JSON where it parses
    glm = "<tool_call>increment\n<arg_key>step</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    assert parse_tool_calls(glm) == [("increment", {"step": 3})]
    llama = '{"name": "increment", "parameters": {"step": 4}}'
    assert parse_tool_calls(llama) == [("increment", {"step": 4})]
    # several calls in one turn, in order; a malformed block is the reason why
    both = f"Let me.{hermes}\n<tool_call>{{oops</tool_call>"
    calls = parse_tool_calls(both)
    assert calls[0] == ("increment", {"step": 2}) and calls[1].startswith("the tool call is not JSON")
    assert parse_tool_calls("The answer is 3.") == []
    assert parse_tool_calls('The answer is {"name": 3}') == []  # not a Llama call: the turn is not one
    assert parse_tool_calls("<tool_call>two words</tool_call>")[0].startswith("the tool call is not in a")


# ---- start-up: tools, schemas, detection, refusals ---------------------------------------------------

def test_the_tools_and_their_schemas_are_derived_as_trl_derives_them():
    assert sorted(tool_methods(Counter())) == ["increment", "read"]  # not reset, get_reward, _helper
    spec = environment_spec(env_config(f"env.fn={HERE}:Counter"))  # env.format=auto: it has get_reward
    assert spec.tools == COUNTER_SCHEMAS and spec.chat_roles == ("tool",) and spec.stop_strings == ()
    assert environment_spec(env_config(f"env.fn={HERE}:NoReward")).tools[0]["function"]["name"] == "look"
    assert environment_spec(env_config(f"env.fn={HERE}:NoReward", "env.format=trl")).chat_roles == ("tool",)


@pytest.mark.parametrize("attr, overrides, message", [
    ("BadReward", [], r"BadReward.get_reward \(.*test_trl_env.py:\d+\) must take no argument"),
    ("Untyped", [], r"tool peek \(.*test_trl_env.py:\d+\): .*type hint"),
    ("NoReset", ["env.format=trl"], "NoReset has no method reset; a TRL environment defines reset"),
    ("Nothing", [], r"Nothing has no method reset\(example\); an environment implements reset\(example\) "
                    r"and step\(turn\) \(docs/environments.md\); nor does it match another style "
                    r"\(env.format\): it has go; "),
])
def test_a_class_that_is_not_a_trl_environment_is_refused_in_one_line(attr, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        environment_spec(env_config(f"env.fn={HERE}:{attr}", *overrides))
    assert "\n" not in str(err.value)
    if attr == "Nothing":  # what each style needs
        for needs in ("skyrl needs init(prompt) and step(action)",
                      "gymnasium needs reset(seed=None, options=None) and step(action)",
                      "trl needs reset(**row) and public tool methods (get_reward() optional)"):
            assert needs in str(err.value)


def test_env_format_names_a_style_only_for_env_fn():
    with pytest.raises(ConfigError, match="env.format: trl is the style of an env.fn class"):
        env_config("env.name=feedback", "env.format=trl")
    with pytest.raises(ConfigError, match="env.format: 'gym' is not allowed"):
        env_config(f"env.fn={HERE}:Counter", "env.format=gym")


# ---- episodes ------------------------------------------------------------------------------------

def worker(tokenizer, script, attr: str, *overrides: str, template: str | None = None):
    engine = ScriptedEngine(tokenizer, script)
    if template is not None:
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = template
    spec = environment_spec(env_config(f"env.fn={HERE}:{attr}", "env.max_turns=4", *overrides))
    return engine, RolloutWorker(engine, tokenizer, max_prompt_tokens=512, env=spec)


def test_a_tool_episode_token_by_token(tokenizer):
    """Turn 1 calls increment(2); turn 2 calls increment(1) (arguments as a JSON string) and
    read(" units") (Qwen3.5's form) at once; turn 3 answers. The tools' results come back as
    tool messages through the chat template; get_reward scores the counter (3 = the target)."""
    t1 = '<tool_call>{"name": "increment", "arguments": {"step": 2}}</tool_call><|im_end|>'
    t2 = ('<tool_call>{"name": "increment", "arguments": "{\\"step\\": 1}"}</tool_call>\n'
          "<tool_call><function=read><parameter=unit> units</parameter></function></tool_call><|im_end|>")
    t3 = "The counter is 3.<|im_end|>"
    engine, w = worker(tokenizer, [[t1], [t2], [t3]], "Counter")
    example = Example("Count to 3.", "3", meta={"target": 3, "origin": "rows.jsonl:1"})
    r = w.rollout([example], SamplingParams(n=1, max_new_tokens=160), seeds=[7])
    # the prompt: SmolLM2's template ignores tools=, so the schemas are in a system message
    asked = [{"role": "user", "content": "Count to 3."}]
    assert tokenizer.apply_chat_template(asked, tools=list(COUNTER_SCHEMAS), tokenize=False) == \
        tokenizer.apply_chat_template(asked, tokenize=False)
    prompt = ("<|im_start|>system\n" + tools_system_text(COUNTER_SCHEMAS) + "<|im_end|>\n<|im_start|>user\n"
              "Count to 3.<|im_end|>\n<|im_start|>assistant\n")
    assert r.prompt_ids[0] == ids_of(tokenizer, prompt)
    obs1 = "\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n"  # <|im_end|> was the model's own
    obs2 = "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>tool\n3units<|im_end|>\n<|im_start|>assistant\n"
    parts = [(t1, 1), (obs1, 0), (t2, 1), (obs2, 0), (t3, 1)]
    assert r.completion_ids[0] == [i for text, _ in parts for i in ids_of(tokenizer, text)]
    assert r.token_mask[0] == [bit for text, bit in parts for _ in ids_of(tokenizer, text)]
    turns = r.episodes.turns[0]
    assert [t.call for t in turns] == ['increment: {"step": 2}',
                                      'increment: {"step": 1}; read: {"unit": "units"}', None]
    assert turns[0].observation == "[tool] 2" and turns[1].observation == "[tool] 3\n[tool] 3units"
    assert r.episodes.reward.tolist() == [1.0] and turns[2].reward == 1.0  # get_reward, on the last turn
    assert r.episodes.tool_calls.tolist() == [2] and r.episodes.tool_errors.tolist() == [0]
    assert r.texts == ["The counter is 3."] and not bool(r.truncated[0])
    # each later turn: the trajectory so far, one sample, its own seed
    assert engine.calls[1][0] == [r.prompt_ids[0] + r.completion_ids[0][:len(ids_of(tokenizer, t1 + obs1))]]
    assert engine.calls[1][2] == [turn_seed(7, 0, 2)] and engine.calls[0][1].stop == ()


def test_reset_gets_the_rows_fields():
    env = TRLEnvironment(Counter)
    example = Example([{"role": "user", "content": "Count."}], "3", "counts", {"target": 3, "origin": "f:2"})
    assert env.reset(example) is None
    assert env.env.target == 3 and env.env.row == {"prompt": example.prompt, "ground_truth": "3",
                                                    "data_source": "counts"}


def test_failing_tools_are_answered_and_counted_and_a_hang_ends_the_episode(tokenizer):
    """Turn 1: a tool that raises, a tool the class lacks and a malformed block, answered with
    TRL's error texts (3 failed calls, one step); turn 2 calls a tool that hangs: the step is
    cut at env.step_timeout, counted, the episode ends and get_reward is not asked. The second
    episode's get_reward raises: counted as a failed step, no environment reward."""
    calls = ('<tool_call>{"name": "explode", "arguments": {}}</tool_call>'
             '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{oops</tool_call><|im_end|>')
    stall = '<tool_call>{"name": "stall", "arguments": {}}</tool_call><|im_end|>'
    engine, w = worker(tokenizer, [[calls, "Done.<|im_end|>"], [stall]], "Faulty", "env.step_timeout=0.5")
    examples = [Example("a", "3", meta={"target": 3}), Example("b", "99", meta={"target": 99})]
    try:
        r = w.rollout(examples, SamplingParams(n=1, max_new_tokens=200), seeds=[1, 2])
    finally:
        STALL.set()
    first = r.episodes.turns[0]
    bad_json = first[0].observation.split("\n")[2]
    assert first[0].observation.split("\n")[:2] == ["[tool] {'error': 'boom'}",
                                                     "[tool] {'error': 'Tool nope not found.'}"]
    assert bad_json.startswith("[tool] {'error': 'the tool call is not JSON:")
    assert first[0].error.startswith("explode: boom; nope: Tool nope not found.; unknown: the tool call is "
                                     "not JSON")
    assert first[1].error == "environment step timed out after 0.5 s"
    assert first[1].reward is None  # get_reward was not asked (it would have said 0.0 on this turn)
    assert r.episodes.tool_calls.tolist() == [1, 0] and r.episodes.tool_errors.tolist() == [1, 0]
    assert r.episodes.step_timeouts.tolist() == [1, 0] and r.episodes.step_errors.tolist() == [1, 1]
    assert r.episodes.reward.tolist() == [0.0, 0.0] and r.truncated.tolist() == [True, False]
    assert r.episodes.turns[1][0].error == "the environment's end RuntimeError: no score for 99"


def test_a_reset_that_writes_the_prompt(tokenizer):
    """TRL appends reset's string to the last user message. The n episodes of a prompt that all
    got the same prompt are sampled from it as one prompt, from its seed; episodes that got
    different prompts are sampled one by one from turn_seed(seed, sample, 1)."""
    engine, w = worker(tokenizer, [["Hi.<|im_end|>"] * 2], "Owner")
    example = Example("Count.", "3", meta={"target": 3})
    r = w.rollout([example], SamplingParams(n=2, max_new_tokens=16), seeds=[11])
    moved = Example("Count. Reach 3.", "3", meta={"target": 3})
    assert r.prompt_ids == [w.encode(moved)] * 2 and r.examples[0].prompt == "Count. Reach 3."
    prompts, params, seeds = engine.calls[0]
    assert prompts == [w.encode(moved)] and params.n == 2 and seeds == [11]
    Diverse.made = 0
    engine, w = worker(tokenizer, [["Hi.<|im_end|>"] * 2], "Diverse")
    r = w.rollout([example], SamplingParams(n=2, max_new_tokens=16), seeds=[11])
    variants = [Example(f"Count. Variant {k}.", "3", meta={"target": 3}) for k in (1, 2)]
    prompts, params, seeds = engine.calls[0]
    assert sorted(prompts) == sorted(w.encode(v) for v in variants) and params.n == 1
    assert seeds == [turn_seed(11, 0, 1), turn_seed(11, 1, 1)] and r.prompt_ids == prompts


def test_a_template_that_renders_tools_gets_them_through_tools(tokenizer):
    template = ("{% if tools %}<|im_start|>system\nTOOLS {% for t in tools %}{{ t.function.name }} "
                "{% endfor %}<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                "{% endif %}")
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    text = render_prompt(Example("Count.", "3"), tok, True, "", COUNTER_SCHEMAS)
    assert text == ("<|im_start|>system\nTOOLS increment read <|im_end|>\n<|im_start|>user\nCount."
                    "<|im_end|>\n<|im_start|>assistant\n")
    # without tools: no system block at all; SmolLM2's own template: the schemas in the system message
    assert render_prompt(Example("Count.", "3"), tok, True) == \
        "<|im_start|>user\nCount.<|im_end|>\n<|im_start|>assistant\n"
    block = tools_system_text(COUNTER_SCHEMAS)
    assert block.count("\n{\"type\": \"function\"") == 2 and json.dumps(COUNTER_SCHEMAS[1]) in block
    with pytest.raises(ConfigError, match="data.apply_chat_template=false leaves out"):
        RolloutWorker(None, tokenizer, apply_chat_template=False,
                      env=environment_spec(env_config(f"env.fn={HERE}:Counter")))


# ---- the example config ------------------------------------------------------------------------

def test_the_trl_tools_config_trains_two_steps(tmp_path):
    from reasonrl.cli import main

    assert main(["train", "configs/envs/trl_tools.yaml", "model.path=tiny", "trainer.steps=2",
                 "trainer.batch_size=8", "rollout.n=4", "tracking.report=false", "trainer.progress=false",
                 "rollout.max_new_tokens=16", "env.max_turn_tokens=8", "data.val_size=4", "eval.n=1",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    for key in ("reward/env", "env/turns_mean", "env/tool_calls_mean", "env/step_errors", "time/env"):
        assert key in lines[1], key
    assert lines[1]["env/step_errors"] == 0 and lines[2]["env/step_errors"] == 0
