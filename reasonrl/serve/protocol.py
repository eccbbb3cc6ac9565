"""The OpenAI wire format: request bodies checked and turned into token ids and
`SamplingParams`, engine results turned into response bodies, errors as OpenAI's JSON.

Pure functions of dicts, a tokenizer and numbers: no server library here, so the format is
tested without one. What a request may say (`docs/serve.md` lists it):

- chat (`/v1/chat/completions`): `messages` rendered by the model's chat template with the
  generation prompt (`tools` through the template's `tools=`, or as a system message when the
  template ignores them: `reasonrl.data.render_prompt`), or `prompt_token_ids` instead (then
  `messages` is empty or absent: the ids are the prompt, as they are).
- completions (`/v1/completions`): `prompt` as a string, a list of strings, a list of token
  ids, or a list of such lists (one sampled set per prompt).
- sampling: `n`, `temperature` (0: greedy), `top_p`, `top_k` (vLLM's; 0 or -1: off),
  `max_tokens` (chat also `max_completion_tokens`; default: the server's, cut to what the
  context has left), `stop`, `seed`, `logprobs` (chat: true/false with `top_logprobs` 0;
  completions: 0), `return_token_ids` (default true), `policy_version` (the version guard).
- refused with the reason, never ignored: `stream`, `echo`, `suffix`, `best_of` other than n,
  non-zero `presence_penalty` / `frequency_penalty`, a `logit_bias`, alternatives in
  `logprobs` / `top_logprobs`, a non-text `response_format`, `tool_choice` naming a function or
  `required` (nothing here can force a call). Other fields (`user`, `metadata`, ...) are ignored.

Token-in/token-out fields follow vLLM's `return_token_ids`: a chat response carries
`prompt_token_ids` and each choice `token_ids`; a completion choice carries both. Every
response also says `policy_version`. The sampled ids are returned whole (EOS or the stop
string's last token included); the text is decoded from them, without special tokens and
cut before a stop string, as OpenAI's is.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from reasonrl.batch import Example
from reasonrl.data import render_prompt
from reasonrl.rollout.base import SEED_BOUND, SamplingParams
from reasonrl.serve.batcher import Served

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


class RequestError(Exception):
    """A request refused, as OpenAI's error body: {"error": {message, type, param, code}}."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Limits:
    """What the server allows: the model's context, its vocabulary, the default `max_tokens`
    and the most samples per request."""

    max_model_len: int
    vocab_size: int
    default_max_tokens: int = 512
    max_n: int = 64


@dataclass(frozen=True)
class Plan:
    """A checked request: its prompts' ids and how to sample them."""

    prompts: list[list[int]]
    params: SamplingParams
    seed: int | None
    logprobs: bool
    return_token_ids: bool
    version: int | None
    tools: bool  # parse tool calls out of the text (chat with tools)


def _number(body: dict, key: str, default, kind: type, low=None, high=None):
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok:
        what = "an integer" if kind is int else "a number"
        raise RequestError(f"{key}: expected {what}, got {value!r}", param=key)
    value = kind(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise RequestError(f"{key}: must be {bounds}, got {value}", param=key)
    return value


def _bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key}: expected true or false, got {value!r}", param=key)
    return value


def check_model(body: dict, served: str) -> None:
    """404 unless the request's `model` is the served one (absent: the served one)."""
    model = body.get("model")
    if model is not None and model != served:
        raise RequestError(f"The model `{model}` does not exist: this endpoint serves `{served}`", status=404,
                           param="model", code="model_not_found")


def refuse_unsupported(body: dict, route: str) -> None:
    if body.get("stream"):
        raise RequestError("stream: streaming is not supported by reasonrl's endpoint; send stream=false",
                           param="stream")
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise RequestError(f"{key}: not supported (the sampler applies no penalties); send 0", param=key)
    if body.get("logit_bias"):
        raise RequestError("logit_bias: not supported (the sampler draws from the policy's distribution)",
                           param="logit_bias")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError('response_format: only {"type": "text"} is supported (no constrained '
                           'decoding)', param="response_format")
    if route == "completions":
        if body.get("echo"):
            raise RequestError("echo: not supported (the prompt's log-probs are not computed here)",
                               param="echo")
        if body.get("suffix"):
            raise RequestError("suffix: not supported (no infilling)", param="suffix")
        best_of = body.get("best_of")
        if best_of is not None and best_of != body.get("n", 1):
            raise RequestError("best_of: not supported other than equal to n (every sample is returned)",
                               param="best_of")
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise RequestError("tool_choice: only \"auto\" and \"none\" are supported (the model decides whether "
                           "to call a tool; nothing forces a call)", param="tool_choice")


def _check_ids(ids: Any, key: str, limits: Limits) -> list[int]:
    if (not isinstance(ids, list) or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
        raise RequestError(f"{key}: expected a non-empty list of token ids (integers)", param=key)
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise RequestError(f"{key}: token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})",
                           param=key)
    return ids


def _text_content(content: Any, where: str) -> str | None:
    """A message's content as the chat templates take it: a string (text parts joined)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
            if not isinstance(text, str):
                raise RequestError(f'{where}.content: only text parts ({{"type": "text", "text": ...}}) are '
                                   "supported", param="messages")
            texts.append(text)
        return "".join(texts)
    raise RequestError(f"{where}.content: expected a string or a list of text parts", param="messages")


def chat_prompt(body: dict, tokenizer, limits: Limits) -> tuple[list[int], bool]:
    """(the prompt's ids, whether tools were given and are to be parsed from the answer)."""
    messages = body.get("messages")
    if body.get("prompt_token_ids") is not None:
        if messages:
            raise RequestError("give messages or prompt_token_ids, not both (send messages=[] with "
                               "prompt_token_ids)", param="prompt_token_ids")
        return _check_ids(body["prompt_token_ids"], "prompt_token_ids", limits), False
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list of {\"role\", \"content\"} objects (or "
                           "prompt_token_ids)", param="messages")
    cleaned = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}]: expected an object with a string `role`", param="messages")
        cleaned.append({**m, "content": _text_content(m.get("content"), f"messages[{i}]")})
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise RequestError("tools: expected a list of {\"type\": \"function\", \"function\": {...}} objects",
                           param="tools")
    if body.get("tool_choice") == "none":
        tools = []
    try:
        text = render_prompt(Example(prompt=cleaned, ground_truth=""), tokenizer, True, "", tools)
    except Exception as err:  # the template's own message (roles that do not alternate, ...)
        raise RequestError(f"messages: the model's chat template refused them: {err}",
                           param="messages") from None
    return tokenizer(text, add_special_tokens=False)["input_ids"], bool(tools)


def completion_prompts(body: dict, tokenizer, limits: Limits) -> list[list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompt = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                      for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise RequestError("prompt: expected a string, a list of strings, a list of token ids, or a list of "
                           "lists of token ids", param="prompt")
    out = []
    for p in prompt:
        if isinstance(p, str):
            if not p:
                raise RequestError("prompt: an empty string has no token to continue from", param="prompt")
            out.append(tokenizer(p)["input_ids"])
        else:
            out.append(_check_ids(p, "prompt", limits))
    return out


def plan(body: dict, route: str, prompts: list[list[int]], limits: Limits, tools: bool = False) -> Plan:
    """The sampling of a request whose prompts are `prompts` (see the module docstring)."""
    n = _number(body, "n", 1, int, 1, limits.max_n)
    temperature = _number(body, "temperature", 1.0, float, 0.0)
    top_p = _number(body, "top_p", 1.0, float, 0.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p: must be in (0, 1], got {top_p}", param="top_p")
    top_k = _number(body, "top_k", 0, int, -1)
    longest = max(len(p) for p in prompts)
    room = limits.max_model_len - longest
    if room < 1:
        raise RequestError(f"This model's maximum context length is {limits.max_model_len} tokens; the "
                           f"prompt has {longest}, which leaves no room for a completion",
                           param="messages" if route == "chat" else "prompt", code="context_length_exceeded")
    key = "max_completion_tokens" if route == "chat" and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = _number(body, key, None, int, 1)
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, room)
    elif longest + max_tokens > limits.max_model_len:
        raise RequestError(f"This model's maximum context length is {limits.max_model_len} tokens; you asked "
                           f"for {longest + max_tokens} ({longest} in the prompt, {max_tokens} in the "
                           f"completion): lower {key}", param=key, code="context_length_exceeded")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("stop: expected a non-empty string or a list of them", param="stop")
    seed = _number(body, "seed", None, int)
    if body.get("policy_version") is not None:
        version = _number(body, "policy_version", None, int, 0)
    else:
        version = None
    if route == "chat":
        logprobs = _bool(body, "logprobs", False)
        if _number(body, "top_logprobs", 0, int, 0) > 0:
            raise RequestError("top_logprobs: only the sampled tokens' log-probs are reported; send 0",
                               param="top_logprobs")
    else:
        wanted = _number(body, "logprobs", None, int, 0)
        if wanted:
            raise RequestError("logprobs: only the sampled tokens' log-probs are reported (logprobs=0), not "
                               "alternatives", param="logprobs")
        logprobs = wanted is not None
    params = SamplingParams(n=n, temperature=temperature if temperature > 0 else 1.0, top_p=top_p,
                            top_k=max(top_k, 0), max_new_tokens=max_tokens, greedy=temperature == 0,
                            stop=tuple(stop))
    return Plan(prompts=prompts, params=params, seed=None if seed is None else seed % SEED_BOUND,
                logprobs=logprobs, return_token_ids=_bool(body, "return_token_ids", True), version=version,
                tools=tools)


@dataclass(frozen=True)
class Choice:
    """One sampled row, decoded: what a response's choice and the call's record say."""

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str
    stop_reason: str | None
    tool_calls: list[dict] | None
    policy_version: int
    seed: int | None


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, str | None]:
    """(the text before the first stop string in it, that string) or (text, None)."""
    hits = [(text.find(s), s) for s in stop if s in text]
    if not hits:
        return text, None
    at, which = min(hits)
    return text[:at], which


def parse_tool_calls(text: str) -> tuple[str | None, list[dict] | None]:
    """(the content before the first `<tool_call>` block, the calls) when the text holds
    Hermes-style blocks `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (the layout
    Qwen2.5's template and `reasonrl.data.tools_system_text` teach), every one valid JSON;
    (text, None) otherwise."""
    if TOOL_CALL_OPEN not in text:
        return text, None
    calls, rest = [], text
    content = text[: text.index(TOOL_CALL_OPEN)].strip() or None
    while TOOL_CALL_OPEN in rest:
        start = rest.index(TOOL_CALL_OPEN) + len(TOOL_CALL_OPEN)
        end = rest.find(TOOL_CALL_CLOSE, start)
        block = rest[start:] if end < 0 else rest[start:end]
        try:
            call = json.loads(block)
        except ValueError:
            return text, None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return text, None
        arguments = call.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"], "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments)}})
        rest = "" if end < 0 else rest[end + len(TOOL_CALL_CLOSE):]
    return content, calls


def decode_choices(prompt_ids: list[int], served: Served, plan: Plan, tokenizer) -> list[Choice]:
    out = []
    for ids, truncated, i in zip(served.completion_ids, served.truncated, range(len(served.truncated)),
                                 strict=True):
        text, stop_reason = cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), plan.params.stop)
        finish = "length" if truncated else "stop"
        tool_calls = None
        if plan.tools:
            content, tool_calls = parse_tool_calls(text)
            if tool_calls:
                text, finish = content, finish if truncated else "tool_calls"
        logprobs = None if served.logprobs is None else served.logprobs[i]
        out.append(Choice(prompt_ids, list(ids), logprobs, text, finish, stop_reason, tool_calls,
                          served.policy_version, served.seed))
    return out


def _token_texts(ids: list[int], tokenizer) -> list[str]:
    return tokenizer.batch_decode([[t] for t in ids])


def _usage(prompts: list[list[int]], choices: list[Choice]) -> dict:
    prompt = sum(len(p) for p in prompts)
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_response(request_id: str, model: str, plan: Plan, choices: list[Choice], tokenizer) -> dict:
    out = []
    for i, c in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        logprobs = None
        if plan.logprobs:  # greedy decoding has no sampler log-probs: null values
            values = c.logprobs if c.logprobs is not None else [None] * len(c.token_ids)
            tokens = _token_texts(c.token_ids, tokenizer)
            logprobs = {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                                    for t, lp in zip(tokens, values, strict=True)]}
        choice = {"index": i, "message": message, "logprobs": logprobs, "finish_reason": c.finish_reason,
                  "stop_reason": c.stop_reason}
        if plan.return_token_ids:
            choice["token_ids"] = c.token_ids
        out.append(choice)
    body = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": out, "usage": _usage(plan.prompts, choices),
            "policy_version": choices[0].policy_version}
    if plan.return_token_ids:
        body["prompt_token_ids"] = plan.prompts[0]
    return body


def completion_response(request_id: str, model: str, plan: Plan, choices: list[Choice], tokenizer) -> dict:
    out = []
    for i, c in enumerate(choices):
        logprobs = None
        if plan.logprobs:
            tokens = _token_texts(c.token_ids, tokenizer)
            offsets, at = [], 0
            for t in tokens:
                offsets.append(at)
                at += len(t)
            values = c.logprobs if c.logprobs is not None else [None] * len(c.token_ids)
            logprobs = {"tokens": tokens, "token_logprobs": values, "text_offset": offsets,
                        "top_logprobs": None}
        choice = {"index": i, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason,
                  "stop_reason": c.stop_reason}
        if plan.return_token_ids:
            choice["prompt_token_ids"] = c.prompt_ids
            choice["token_ids"] = c.token_ids
        out.append(choice)
    return {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": out, "usage": _usage(plan.prompts, choices),
            "policy_version": choices[0].policy_version}
