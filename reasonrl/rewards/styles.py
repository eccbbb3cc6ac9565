"""Reward functions written for other frameworks, called the way those frameworks call them.

`reward.fn` (and each `reward.fns` entry) may be written in any of five forms ("styles").
Each style is told by its parameter names (`reward.fn_style=auto`, `detect`) and its arguments
are passed by those names, so a function written for another framework is never handed the
wrong column: verl's `compute_score(data_source, solution_str, ground_truth, extra_info)`,
called positionally as reasonrl's own `(completion, ground_truth, extra_info)` used to be, got
the completion as its `data_source`.

    style           told by                      called (per completion, or once per batch)
    reasonrl        completion                   f(completion, ground_truth, extra_info)
    reasonrl_batch  completions, ground_truths   f(completions, ground_truths, groups, extra_infos)
    trl             completions | completion_ids f(prompts=, completions=, completion_ids=, **columns)
    verl            solution_str                 f(data_source=, solution_str=, ground_truth=, extra_info=)
    openrlhf        queries, labels              f(queries=, prompts=, labels=)

reasonrl's and verl's return a number or a dict with "score" per completion; reasonrl_batch
one of those per completion; TRL's a number or None per completion; OpenRLHF's {"rewards",
"scores", "extra_logs"}.

The sources, read in their code and documentation:
- TRL: `GRPOTrainer._calculate_rewards` (huggingface/trl trl/trainer/grpo_trainer.py, 2026-07):
  keyword arguments `prompts`, `completions`, `completion_ids`, every dataset column but
  `prompt` by its name, plus `trainer_state`, `log_extra`, `log_metric`; completions as text,
  or `[{"role": "assistant", "content": ...}]` when the prompts are conversations
  (`is_conversational`); an `async def` function's coroutine awaited; a None reward means the
  function does not apply to that completion (NaN, left out by `nansum`); docs/source/
  grpo_trainer.md, "Using a custom reward function".
- verl: `NaiveRewardManager.__call__` (volcengine/verl verl/workers/reward_manager/naive.py)
  calls `compute_score(data_source=, solution_str=, ground_truth=, extra_info=)` per response,
  the ground truth as the data file holds it (`reward_model.ground_truth`, any type); a dict
  return's "score" is the reward and every key goes to `reward_extra_info` (logged);
  `get_custom_reward_fn` (verl/trainer/ppo/reward.py) merges
  `custom_reward_function.reward_kwargs` over the call's keywords and awaits an async one.
- OpenRLHF: `SingleTurnAgentExecutor` (OpenRLHF openrlhf/utils/agent.py) loads
  `reward_func(queries, prompts, labels)` from a .py file; queries are the prompt and the
  response decoded together, labels the `--label_key` field; it returns {"rewards": tensor
  (the reward), "scores": tensor (dynamic filtering), "extra_logs": {...} (logged)}
  (README, "Custom Reward Function").

What reasonrl gives differently, and refuses, is in docs/reward-functions.md. This module
only reads signatures and makes calls (`invoke`, in the training process or a reward worker);
which function runs where is `verifiers.py`'s and `scoring.py`'s.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

STYLES = ("reasonrl", "reasonrl_batch", "trl", "verl", "openrlhf")
BATCH_STYLES = frozenset({"reasonrl_batch", "trl", "openrlhf"})  # one call for every completion of a batch

# reward.fn_style=auto: the parameter names that tell each style, tried in this order (the
# distinctive names first: a TRL function may well name a column `ground_truth`); TRL's docs'
# first example takes only completion_ids
SIGNS = (("verl", ("solution_str",)), ("openrlhf", ("queries", "labels")),
         ("reasonrl_batch", ("completions", "ground_truths")), ("trl", ("completions",)),
         ("trl", ("completion_ids",)), ("reasonrl", ("completion",)))

# each style's call, as messages name it
CALLS = {
    "reasonrl": "f(completion, ground_truth, extra_info)",
    "reasonrl_batch": "f(completions, ground_truths, groups, extra_infos)",
    "trl": "f(prompts, completions, completion_ids, **columns)",
    "verl": "f(data_source, solution_str, ground_truth, extra_info)",
    "openrlhf": "f(queries, prompts, labels)",
}

# the arguments each style gives by name (a TRL function also gets the records' columns)
OFFERED = {
    "reasonrl": ("completion", "ground_truth", "extra_info"),
    "reasonrl_batch": ("completions", "ground_truths", "groups", "extra_infos"),
    "trl": ("prompts", "completions", "completion_ids", "log_metric"),
    "verl": ("data_source", "solution_str", "ground_truth", "extra_info"),
    "openrlhf": ("queries", "prompts", "labels"),
}
TRL_COLUMNS = ("ground_truth", "data_source", "extra_info")  # every record's; its extra_info's keys beside
TRL_NOT_GIVEN = ("trainer_state", "log_extra", "environments")  # TRL passes these; reasonrl does not

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature
        return None


def describe(fn: Callable[..., Any]) -> str:
    """`name(params)`: a function as a message shows it."""
    sig = _signature(fn)
    return f"{getattr(fn, '__name__', type(fn).__name__)}{sig if sig is not None else '(...)'}"


def takes_any_keyword(fn: Callable[..., Any]) -> bool:
    sig = _signature(fn)
    return sig is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def _names(fn: Callable[..., Any]) -> set[str]:
    """The parameters `fn` takes by keyword."""
    sig = _signature(fn)
    return set() if sig is None else {p.name for p in sig.parameters.values() if p.kind in _KEYWORD}


def detect(fn: Callable[..., Any]) -> str | None:
    """The style `fn`'s parameter names tell (`SIGNS`, in order), or None."""
    names = _names(fn)
    return next((style for style, signs in SIGNS if set(signs) <= names), None)


def no_style_message(fn: Callable[..., Any]) -> str:
    styles = "; ".join(f"{s} {CALLS[s]}" for s in STYLES)
    return (f"{describe(fn)} matches no reward-function style ({styles}): name its parameters as one of "
            f"them, or set reward.fn_style")


def resolve(fn: Callable[..., Any], wanted: str) -> str:
    """The style `fn` is called in: `wanted`, or with "auto" the one its names tell; TypeError
    (one line, naming the signature and the styles) when none does."""
    if wanted != "auto":
        return wanted
    style = detect(fn)
    if style is None:
        raise TypeError(no_style_message(fn))
    return style


def _pick(fn: Callable[..., Any], offered: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments `fn` gets: every offered one it names (all with **kwargs), then
    `kwargs` (reward.fn_kwargs) over them, as verl's `_call_with_kwargs` merges reward_kwargs."""
    if takes_any_keyword(fn):
        return {**offered, **kwargs}
    names = _names(fn)
    return {**{k: v for k, v in offered.items() if k in names}, **kwargs}


def _by_name(fn: Callable[..., Any], style: str, kwargs: dict[str, Any]) -> bool:
    """Whether reasonrl's own form (`style`: reasonrl or reasonrl_batch) binds by name: the
    function names each of its arguments (or takes **kwargs), with `kwargs` beside them."""
    sig = _signature(fn)
    if sig is None:
        return False
    try:
        sig.bind(**dict.fromkeys(OFFERED[style]), **kwargs)
        return True
    except TypeError:
        return False


def check_call(fn: Callable[..., Any], style: str, kwargs: dict[str, Any], columns: tuple[str, ...] = (),
               explicit: bool = False) -> None:
    """TypeError (one line) unless `fn` takes `style`'s call with `kwargs` (reward.fn_kwargs).
    reasonrl's own forms give every argument: by name, or, asked for explicitly (reward.fn_style,
    reward.batch_fn: `explicit`), by position as before, unless the names are another style's
    (that call would misbind them). trl, verl and openrlhf give each argument the function names
    (all of them with **kwargs), `columns` being a TRL function's record columns: a parameter
    without a default that the style does not give is refused. So is a keyword of
    reward.fn_kwargs the function does not take."""
    sig = _signature(fn)
    if sig is None:
        return  # a builtin without a signature: trust it
    what = f"{describe(fn)} is called as a {style} reward function, {CALLS[style]}"
    offered = dict.fromkeys(OFFERED[style] + (columns if style == "trl" else ()))
    unknown = [k for k in kwargs if k not in _names(fn) and not takes_any_keyword(fn)]
    if unknown:
        raise TypeError(f"{what}: it takes no keyword {', '.join(map(repr, unknown))} of reward.fn_kwargs")
    if style in ("reasonrl", "reasonrl_batch"):
        try:
            sig.bind(**offered, **kwargs)
            return
        except TypeError as err:
            if not explicit:
                raise TypeError(f"{what} (by name): {err}") from None
        told = detect(fn)
        if told not in (None, style):  # by position it would be handed the wrong columns
            raise TypeError(f"{what} by position, but its parameter names are {told}'s, {CALLS[told]}: "
                            f"that call would hand it the wrong arguments; set reward.fn_style={told} or "
                            "auto")
        try:  # asked for explicitly: by position, as reasonrl always called it
            sig.bind(*[None] * len(OFFERED[style]), **kwargs)
        except TypeError as err:
            raise TypeError(f"{what} (by position): {err}") from None
        return
    try:
        sig.bind(**_pick(fn, offered, kwargs))
    except TypeError as err:
        hint = ""
        if style == "trl":
            missing = [n for n in TRL_NOT_GIVEN if n in str(err)]
            hint = (f" ({missing[0]} is TRL's and reasonrl does not pass it)" if missing else
                    f" (the records' columns: {', '.join(columns)})")
        raise TypeError(f"{what}: {err}{hint}") from None


def trl_columns(infos) -> tuple[str, ...]:
    """The columns a TRL function is given beside prompts, completions and completion_ids:
    every record's ground_truth, data_source and extra_info, then each key of the records'
    extra_info (`record_info`), in the order first met (TRL passes a dataset's columns by name);
    a key named as one of those, or as TRL's own arguments, is left to them."""
    keys = dict.fromkeys(TRL_COLUMNS)
    for info in infos:
        keys.update(dict.fromkeys(k for k in record_info(info) if k not in keys and k not in OFFERED["trl"]))
    return tuple(keys)


# ---- calls -------------------------------------------------------------------------------------

def decode_truth(text: str) -> Any:
    """A ground truth as the data file held it: reasonrl's reader keeps an object as its JSON text
    (`reasonrl.data.files`), which other frameworks pass as the object; text that is no JSON
    object is passed as it is (a number's text included: the reader does not keep its type)."""
    if isinstance(text, str) and text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            return text
        if isinstance(value, dict):
            return value
    return text


def record_info(meta: dict) -> dict:
    """A record's extra_info as its data file gives it: reasonrl's `origin` (file:line) left out."""
    return {k: v for k, v in meta.items() if k != "origin"}


def _awaited(value: Any) -> Any:
    """The value of an `async def` function's call (its coroutine run to the end, as TRL's and
    verl's trainers await one), or the value itself."""
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value
        return asyncio.run(wait())
    return value


def _listed(value: Any, what: str) -> list:
    """A list of `value` (a tensor's or an array's values flattened); TypeError otherwise."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = (value.reshape(-1) if hasattr(value, "reshape") else value).tolist()  # [N, 1] -> [N]
        value = value if isinstance(value, list) else [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what} must be a list (or a tensor), got {type(value).__name__}")
    return [v.item() if hasattr(v, "item") else v for v in value]


def _number(value: Any) -> float | None:
    """A value a metric can log (a number or a bool, a one-element tensor), or None."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, (bool, int, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _numbers(value: Any) -> list[float]:
    """The numbers an extra_logs value holds: itself (a number, a one-element tensor), or its
    items (a list, a tensor); anything else (text) holds none."""
    scalar = _number(value)
    if scalar is not None:
        return [scalar]
    try:
        items = [_number(v) for v in _listed(value, "")]
    except TypeError:
        return []
    return [v for v in items if v is not None]


def _one_per_row(values: list, n: int, what: str) -> list:
    if len(values) != n:
        raise ValueError(f"{what} must give one score per completion ({n}), got {len(values)}")
    return values


def _trl(fn: Callable[..., Any], rows: dict[str, list], kwargs: dict) -> dict:
    n = len(rows["completions"])
    conversational = [isinstance(p, list) for p in rows["prompts"]]
    completions = [[{"role": "assistant", "content": c}] if chat else c
                   for c, chat in zip(rows["completions"], conversational, strict=True)]
    infos = [record_info(m) for m in rows["extra_infos"]]
    columns: dict[str, list] = {"ground_truth": [decode_truth(t) for t in rows["ground_truths"]],
                                "data_source": list(rows["data_sources"]), "extra_info": infos}
    for key in trl_columns(infos)[len(TRL_COLUMNS):]:  # a dataset's columns: None where a record has none
        columns[key] = [i.get(key) for i in infos]
    metrics: dict[str, list[float]] = {}

    def log_metric(name: str, value: float) -> None:  # TRL's: a scalar per call, averaged
        metrics.setdefault(str(name), []).append(float(value))

    offered = {"prompts": list(rows["prompts"]), "completions": completions,
               "completion_ids": list(rows["completion_ids"]), **columns, "log_metric": log_metric}
    values = _listed(_awaited(fn(**_pick(fn, offered, kwargs))), "a TRL reward function's return")
    logged = {name: sum(v) / len(v) for name, v in metrics.items()}
    return {"values": _one_per_row(values, n, "a TRL reward function"), "logged": [dict(logged)] * n}


def _verl(fn: Callable[..., Any], rows: dict[str, list], kwargs: dict) -> dict:
    offered = {"data_source": rows["data_sources"][0], "solution_str": rows["completions"][0],
               "ground_truth": decode_truth(rows["ground_truths"][0]),
               "extra_info": record_info(rows["extra_infos"][0])}
    value = _awaited(fn(**_pick(fn, offered, kwargs)))
    if not isinstance(value, Mapping):
        return {"values": [value], "logged": [{}]}
    if "score" not in value:
        raise ValueError(f"verl's compute_score returned a dict without 'score' (keys {sorted(value)})")
    extras = {str(k): _number(v) for k, v in value.items() if k != "score"}
    extras = {k: v for k, v in extras.items() if v is not None}  # verl logs numbers; text it only dumps
    return {"values": [{"score": value["score"], **extras}], "logged": [extras]}


def _openrlhf(fn: Callable[..., Any], rows: dict[str, list], kwargs: dict) -> dict:
    n = len(rows["completions"])
    prompts = list(rows["prompts"])
    for p in prompts:
        if not isinstance(p, str):
            raise TypeError("OpenRLHF's reward_func reads text prompts; this one is a list of chat messages")
    offered = {"queries": [p + c for p, c in zip(prompts, rows["completions"], strict=True)],
               "prompts": prompts, "labels": [decode_truth(t) for t in rows["ground_truths"]]}
    out = _awaited(fn(**_pick(fn, offered, kwargs)))
    if not isinstance(out, Mapping):  # a tensor of rewards, as OpenRLHF's remote reward model answers
        out = {"rewards": out}
    if "rewards" not in out:
        raise ValueError(f"OpenRLHF's reward_func returned a dict without 'rewards' (keys {sorted(out)})")
    rewards = _one_per_row(_listed(out["rewards"], "'rewards'"), n, "OpenRLHF's reward_func 'rewards'")
    logged: list[dict[str, float]] = [{} for _ in range(n)]
    extra = dict(out.get("extra_logs") or {})
    if out.get("scores") is not None:
        extra = {"scores": out["scores"], **extra}
    for name, value in extra.items():
        values = _numbers(value)
        if len(values) == n:  # one per completion
            for row, v in zip(logged, values, strict=True):
                row[str(name)] = v
        elif values:  # a batch statistic (reward.mean().item()): the same for every completion
            for row in logged:
                row[str(name)] = sum(values) / len(values)
    return {"values": rewards, "logged": logged}


def _reasonrl(fn: Callable[..., Any], rows: dict[str, list], kwargs: dict) -> dict:
    args = (rows["completions"][0], rows["ground_truths"][0], rows["extra_infos"][0])
    return {"values": [_own(fn, "reasonrl", args, kwargs)], "logged": [{}]}


def _reasonrl_batch(fn: Callable[..., Any], rows: dict[str, list], kwargs: dict) -> dict:
    n = len(rows["completions"])
    args = (rows["completions"], rows["ground_truths"], rows["groups"], rows["extra_infos"])
    values = _listed(_own(fn, "reasonrl_batch", args, kwargs), "a batch reward's return")
    return {"values": _one_per_row(values, n, "a batch reward"), "logged": [{}] * n}


def _own(fn: Callable[..., Any], style: str, args: tuple, kwargs: dict) -> Any:
    """reasonrl's own call: by name when the function names its arguments, else (its style asked
    for explicitly, `check_call`) by position, as reasonrl always called it."""
    if _by_name(fn, style, kwargs):
        return _awaited(fn(**dict(zip(OFFERED[style], args, strict=True)), **kwargs))
    return _awaited(fn(*args, **kwargs))


CALLERS = {"reasonrl": _reasonrl, "reasonrl_batch": _reasonrl_batch, "trl": _trl, "verl": _verl,
           "openrlhf": _openrlhf}
COLUMNS = ("completions", "ground_truths", "groups", "extra_infos", "prompts", "completion_ids",
           "data_sources")


def invoke(style: str, fn: Callable[..., Any], rows: dict[str, list], kwargs: dict | None = None) -> dict:
    """Call `fn` on `rows` (`COLUMNS`: one list each, one row for a per-completion style) as `style`
    calls it, with `kwargs` (reward.fn_kwargs) beside; {"values": one reward per row (a number, a
    dict with "score", or None: TRL's "does not apply"), "logged": per row, the values to log}.
    Raises what the function raises, and ValueError / TypeError for a return of the wrong shape."""
    return CALLERS[style](fn, rows, dict(kwargs or {}))
