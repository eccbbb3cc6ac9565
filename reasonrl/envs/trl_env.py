"""TRL's environment classes (`env.fn=file.py:Class`, `env.format=trl` or detected): a class
written for `GRPOTrainer(environment_factory=Class)` trains here unchanged.

What TRL does with such a class (`trl/trainer/grpo_trainer.py`: the `environment_factory`
argument's docstring, `__init__`, `_generate_and_score_completions`, `_tool_call_loop`; the
"Agent Training" section of `docs/source/grpo_trainer.md`), and what the adapter does:

- one instance per rollout, built with no arguments: `make()` builds one per episode;
- `reset(**row)` with the dataset row's columns: here the example's fields
  (`adapters.example_row`: `prompt`, `ground_truth`, `data_source` and the record's
  `extra_info` fields), cut to the parameters `reset` names unless it takes `**kwargs`. A
  string it returns is appended to the last user message (TRL: `content + observation`): the
  episode's prompt is rendered again with it (`reasonrl.envs.base`: reset returns an
  `Example`);
- its public methods (bound methods not starting with `_`, `reset` and `get_reward` reserved;
  `inspect.getmembers(instance, inspect.ismethod)` as TRL lists them) are the tools, each
  described by the JSON schema transformers derives from its signature, type hints and Google
  docstring (`transformers.utils.get_json_schema`, what `apply_chat_template(tools=...)` calls
  for TRL), rendered into the prompt through the chat template's `tools=` argument
  (`EnvSpec.tools`; `reasonrl.data.prompts.render_prompt`);
- the model's turn ends at EOS (TRL passes no stop strings); its tool calls are parsed
  (`parse_tool_calls`: the formats of `trl/chat_template_utils.py`'s response templates, below),
  each runs with its arguments as keywords (an `async` method on a loop of its own), and each
  result comes back as a `tool` message `{"role": "tool", "name": name, "content": str(result)}`;
  a call that raises, names no tool of the class, or does not parse answers
  `str({"error": message})` (TRL's text) and is counted in `env/tool_errors`. A turn without a
  call is the model's answer: the episode is over. TRL's `max_tool_calling_iterations` is
  `env.max_turns` - 1;
- `get_reward()` (optional, maybe `async`), called once when the episode is over (`end()`),
  is the environment's reward, added to the task reward as every environment reward is
  (`reward/env`; TRL: a reward function of weight 1 beside `reward_funcs`).

Tool-call formats (TRL's `qwen3_template`, `qwen3_5_template` / `nemotron_3_template`,
`glm4moe_template`, `llama3_template` in `trl/chat_template_utils.py`), all read whatever the
chat template, so no format key is needed:

- Hermes / Qwen2.5 / Qwen3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  (`arguments` may be a JSON string, OpenAI's form);
- Qwen3.5 / Qwen3-Coder / Nemotron 3: `<tool_call><function=NAME><parameter=KEY>VALUE</parameter>
  ...</function></tool_call>` (a value is JSON where it parses, else text);
- GLM-4-MoE: `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>`;
- Llama 3.1 / 3.2: the whole turn is `{"name": ..., "parameters": {...}}`.

Refused (at start-up, one line each): a class that does not build with no arguments, has no
`reset`, a `get_reward` that needs arguments, a tool whose schema transformers cannot derive
(no type hint, no docstring line for an argument); multimodal tool results (a list of content
blocks) are answered with an error. GPT-OSS's harmony and LFM2.5's pythonic calls are not
parsed (a turn in them reads as an answer).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any

from reasonrl.batch import Example
from reasonrl.config import EnvConfig
from reasonrl.envs.adapters import (
    accepted,
    append_to_prompt,
    as_reward,
    example_row,
    has_method,
    parameters,
    run,
    takes_var_keyword,
    where_defined,
)
from reasonrl.envs.base import EnvSpec, EnvStep, public_methods
from reasonrl.errors import ConfigError
from reasonrl.registry import ENV_FORMATS

RESERVED = ("reset", "get_reward")  # TRL's reserved methods: never tools
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FUNCTION = re.compile(r"^\s*<function=([^\n>]+)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\s*(.*?)\s*</parameter>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

Call = tuple[str, Any]  # (tool name, arguments)


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _json_call(text: str, keys: tuple[str, ...]) -> Call | str:
    """A JSON object {"name": ..., <one of keys>: {...}} as a call, or why it is not one."""
    try:
        call = json.loads(text)
    except ValueError as err:
        return f"the tool call is not JSON: {err}"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'the tool call must be a JSON object {"name": ..., "arguments": {...}}'
    arguments = next((call[k] for k in keys if k in call), {})
    if isinstance(arguments, str):  # OpenAI's form: the arguments as a JSON string
        arguments = _json_or_text(arguments)
    return call["name"], arguments


def parse_block(text: str) -> Call | str:
    """One `<tool_call>...</tool_call>` block's content as (name, arguments), in whichever of
    the Hermes (JSON), Qwen3.5 (`<function=...>`) and GLM (`<arg_key>`) forms it is; a string
    saying why when it is none of them."""
    stripped = text.strip()
    if stripped.startswith("{"):
        return _json_call(stripped, ("arguments", "parameters"))
    function = _FUNCTION.match(text)
    if function:
        return function.group(1).strip(), {k.strip(): _json_or_text(v) for k, v in
                                           _PARAMETER.findall(function.group(2))}
    name, _, rest = stripped.partition("<arg_key>")
    name = name.strip()
    if name and not any(c.isspace() for c in name) and "<" not in name:
        pairs = _GLM_ARG.findall("<arg_key>" + rest) if rest else []
        return name, {k.strip(): _json_or_text(v) for k, v in pairs}
    return f"the tool call is not in a known form: {stripped[:80]!r}"


def parse_tool_calls(turn: str) -> list[Call | str]:
    """The tool calls of a model turn, in order: every `<tool_call>` block (`parse_block`), or
    a turn that is one Llama 3 JSON call `{"name": ..., "parameters": {...}}`; [] when the turn
    calls nothing (it is the model's answer). A malformed block is the string saying why."""
    blocks = _BLOCK.findall(turn)
    if blocks:
        return [parse_block(b) for b in blocks]
    stripped = turn.strip()
    if stripped.startswith('{"name"'):
        call = _json_call(stripped, ("parameters", "arguments"))
        return [call] if not isinstance(call, str) else []
    return []


def tool_methods(instance: Any) -> dict[str, Any]:
    """The instance's tools as TRL lists them: its bound methods (`inspect.ismethod`) whose
    names do not start with `_`, less `reset` and `get_reward`; name -> method, sorted."""
    return {name: member for name, member in inspect.getmembers(instance, predicate=inspect.ismethod)
            if not name.startswith("_") and name not in RESERVED}


def tool_schemas(tools: dict[str, Any], where: str) -> tuple[dict, ...]:
    """The JSON schema of each tool, as transformers derives it for `apply_chat_template(tools=)`
    (`transformers.utils.get_json_schema`: the signature's type hints, the Google docstring's
    description and `Args:`); ConfigError naming the method, its file and line, and why not."""
    from transformers.utils import get_json_schema

    schemas = []
    for name, method in tools.items():
        try:
            schemas.append(get_json_schema(method))
        except Exception as err:  # DocstringParsingException, TypeHintParsingException
            raise ConfigError(f"{where}: tool {name} ({where_defined(method)}): {err} (TRL's tools need type "
                              "hints and a Google-style docstring with an Args: line per argument)") from None
    return tuple(schemas)


class TRLEnvironment:
    """One episode of a TRL environment class (see the module docstring)."""

    stop_strings: tuple[str, ...] = ()  # a turn ends at EOS, as in TRL's tool loop

    def __init__(self, cls: type):
        self.env = cls()
        self.tools = tool_methods(self.env)

    def reset(self, example: Example) -> Example | None:
        """`reset(**row)`; a string it returns is appended to the prompt's last user message."""
        reset = self.env.reset
        observation = run(reset, **accepted(reset, example_row(example)))
        if observation is None:
            return None
        if not isinstance(observation, str):
            raise TypeError(f"reset returned {type(observation).__name__}; TRL's reset returns None or a "
                            "string (appended to the last user message)")
        return dataclasses.replace(example, prompt=append_to_prompt(example.prompt, observation))

    def step(self, turn: str) -> EnvStep:
        """Run the turn's tool calls; their results are the observation (one `tool` message each)."""
        calls = parse_tool_calls(turn)
        if not calls:
            return EnvStep(done=True)
        messages, shown, errors = [], [], []
        for call in calls:
            if isinstance(call, str):  # a malformed block: answered with why, counted
                name, error, result = "unknown", call, None
                shown.append("<tool_call>")
            else:
                name, arguments = call
                shown.append(f"{name}: {json.dumps(arguments, default=str)}")
                error, result = self._call(name, arguments)
            if error is None and isinstance(result, list):
                error = "the tool returned a list of content blocks (multimodal); text results only"
            if error is not None:
                errors.append(f"{name}: {error}")
            content = str({"error": error}) if error is not None else str(result)
            messages.append({"role": "tool", "name": name, "content": content})
        return EnvStep(observation=messages, call="; ".join(shown), error="; ".join(errors) or None)

    def _call(self, name: str, arguments: Any) -> tuple[str | None, Any]:
        """(error, result) of one call: TRL's "Tool X not found." for a name of no tool."""
        if name not in self.tools:
            return f"Tool {name} not found.", None
        if not isinstance(arguments, dict):
            return f"the arguments must be a JSON object, got {type(arguments).__name__}", None
        try:
            return None, run(self.tools[name], **arguments)
        except Exception as err:  # TRL answers {"error": str(e)}
            return str(err) or type(err).__name__, None

    def end(self) -> float | None:
        """`get_reward()` when the class has one: the episode's reward from its state."""
        if not has_method(type(self.env), "get_reward"):
            return None
        return as_reward(run(self.env.get_reward), "get_reward")


def detect(cls: type) -> bool:
    """A TRL class (env.format=auto): it has `get_reward`, or a `reset` taking `**kwargs` (the
    dataset row) and neither `step` nor `init` (the gym styles' methods)."""
    if has_method(cls, "get_reward"):
        return True
    params = parameters(getattr(cls, "reset", None)) if has_method(cls, "reset") else None
    return params is not None and takes_var_keyword(params) and not has_method(cls, "step") \
        and not has_method(cls, "init")


@ENV_FORMATS.register("trl", doc="TRL's environment_factory classes: public methods are tools, "
                                 "reset(**row), get_reward()",
                      needs="reset(**row) and public tool methods (get_reward() optional)", detect=detect)
def trl_environment(cls: type, cfg: EnvConfig) -> EnvSpec:
    """The spec of a TRL environment class, checked now: it builds with no arguments, has
    `reset`, a `get_reward` without arguments, tools whose schemas transformers derives."""
    where = f"env.fn={cfg.fn}"
    try:
        inspect.signature(cls).bind()
    except TypeError as err:
        raise ConfigError(f"{where}: TRL builds the class with no arguments (environment_factory=Class): "
                          f"{err}") from None
    except ValueError:
        pass
    if not has_method(cls, "reset"):
        raise ConfigError(f"{where}: {cls.__name__} has no method reset; a TRL environment defines "
                          f"reset(**row) (it has: {', '.join(public_methods(cls)) or 'no public method'})")
    if has_method(cls, "get_reward"):
        params = parameters(cls.get_reward)
        if params is not None and any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                      for p in params):
            raise ConfigError(f"{where}: {cls.__name__}.get_reward ({where_defined(cls.get_reward)}) must "
                              "take no argument (TRL calls get_reward())")
    try:
        sample = cls()
    except Exception as err:
        raise ConfigError(f"{where}: building {cls.__name__}() failed: {type(err).__name__}: {err}") from None
    schemas = tool_schemas(tool_methods(sample), where)

    def make() -> TRLEnvironment:
        return TRLEnvironment(cls)

    return EnvSpec(cfg.fn, make, (), cfg, tools=schemas, chat_roles=("tool",))

