"""The OpenAI-compatible endpoint (`reasonrl.serve`) on the tiny model, over loopback HTTP with
the `openai` client: the token ids it returns are the engine's, its log-probs the sampler's
(re-scored by the policy's forward within TOL), prompt token ids are accepted, concurrent
requests share generate calls, refusals are OpenAI-shaped errors with the reason, every call
is recorded with its policy version, and the version guard refuses another version.

TOL(T) = 2e-5 / T + 8e-6: the bound derived in tests/rollout/test_hf_logprobs.py for the same
two quantities (the HF engine's lean decoder vs the training forward, float32, tiny model).
"""

from __future__ import annotations

import copy
import importlib.util
import threading
import time

import pytest
import torch
from helpers import policy_settings

from reasonrl.batch import Example
from reasonrl.data import render_prompt
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.hf import HFEngine
from reasonrl.serve import CallLog, Endpoint, RequestError
from reasonrl.serve.protocol import cut_at_stop, parse_tool_calls
from reasonrl.workers.policy import PolicyWorker

HAS_SERVER = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))
HAS_OPENAI = importlib.util.find_spec("openai") is not None
needs_server = pytest.mark.skipif(not HAS_SERVER, reason="fastapi and uvicorn (the `serve` extra) are not "
                                                         "installed")
needs_openai = pytest.mark.skipif(not (HAS_SERVER and HAS_OPENAI),
                                  reason="the `openai` client and the `serve` extra are needed")
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
WINDOW_S = 0.05  # wide enough that requests started together share a call on a loaded machine


def tol(temperature: float) -> float:
    return 2e-5 / temperature + 8e-6


@pytest.fixture(scope="module")
def served(tiny):
    """(endpoint, its call log, the engine's own model, tokenizer, server or None)."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)  # the lean decoder patches kernels in
    engine = HFEngine(model, tokenizer, decoder="lean")
    endpoint = Endpoint(engine, tokenizer, "tiny", 2048, window_s=WINDOW_S, max_rows=64,
                        default_max_tokens=16)
    log = CallLog()
    endpoint.on_call.append(log)
    server = None
    if HAS_SERVER:
        from reasonrl.serve.app import Server

        server = Server(endpoint, "127.0.0.1", 0).start()
    yield endpoint, log, model, tokenizer, server
    if server is not None:
        server.stop()
    endpoint.close()


@pytest.fixture
def client(served):
    if not (HAS_SERVER and HAS_OPENAI):
        pytest.skip("the `openai` client and the `serve` extra are needed")
    import openai

    return openai.OpenAI(base_url=served[4].url, api_key="unused", max_retries=0, timeout=60)


def chat_ids(tokenizer, messages, tools=()) -> list[int]:
    text = render_prompt(Example(prompt=messages, ground_truth=""), tokenizer, True, "", tools)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def direct(endpoint, prompt, seed, **params):
    """The engine's own answer for `prompt` from `seed`, called directly."""
    with endpoint.paused():
        return endpoint.engine.generate([prompt], SamplingParams(**params), None if seed is None else [seed])


def rescored(model, tokenizer, prompt, completions, temperature):
    worker = PolicyWorker(model, tokenizer.pad_token_id, policy_settings(temperature=temperature,
                                                                         micro_batch_size=4))
    with torch.no_grad():
        return worker.row_logprobs(model, [prompt] * len(completions), completions)


@needs_openai
def test_chat_returns_the_engines_ids_and_the_samplers_logprobs(served, client):
    endpoint, log, model, tokenizer, _ = served
    log.take()
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=12, seed=7,
                                       temperature=0.8, logprobs=True, n=2)
    prompt = chat_ids(tokenizer, MESSAGES)
    assert r.prompt_token_ids == prompt
    expected = direct(endpoint, prompt, 7, n=2, temperature=0.8, max_new_tokens=12)
    ids = [c.token_ids for c in r.choices]
    assert ids == expected.completion_ids
    logprobs = [[t.logprob for t in c.logprobs.content] for c in r.choices]
    assert logprobs == [lp.tolist() for lp in expected.logprobs]  # float32 -> JSON -> float: exact
    worst = max((torch.tensor(a) - b).abs().max().item()
                for a, b in zip(logprobs, rescored(model, tokenizer, prompt, ids, 0.8), strict=True))
    assert worst <= tol(0.8), f"served log-probs vs the policy's forward: {worst:.3g} > {tol(0.8):.3g}"
    for c in r.choices:
        assert c.message.content == tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert c.finish_reason == ("length" if len(c.token_ids) == 12 else "stop")
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == sum(map(len, ids))
    records = log.take()
    got = [(x.prompt_ids, x.completion_ids, x.logprobs, x.policy_version, x.route, x.seed) for x in records]
    assert got == [(prompt, i, lp, 0, "chat", 7) for i, lp in zip(ids, logprobs, strict=True)]


@needs_openai
def test_completions_take_token_ids_and_strings(served, client):
    endpoint, log, model, tokenizer, _ = served
    prompt = tokenizer("The answer is", add_special_tokens=False)["input_ids"]
    r = client.completions.create(model="tiny", prompt=[prompt, "Hello"], max_tokens=6, seed=11, logprobs=0,
                                  temperature=1.0)
    assert len(r.choices) == 2
    first, second = r.choices
    assert first.prompt_token_ids == prompt and second.prompt_token_ids == tokenizer("Hello")["input_ids"]
    assert first.token_ids == direct(endpoint, prompt, 11, max_new_tokens=6).completion_ids[0]
    # a request's prompts are sampled from seed, seed + 1, ...
    again = direct(endpoint, second.prompt_token_ids, 12, max_new_tokens=6)
    assert second.token_ids == again.completion_ids[0]
    assert len(first.logprobs.token_logprobs) == len(first.token_ids)
    worst = (torch.tensor(first.logprobs.token_logprobs)
             - rescored(model, tokenizer, prompt, [first.token_ids], 1.0)[0]).abs().max().item()
    assert worst <= tol(1.0)


@needs_openai
def test_a_chat_request_may_give_prompt_token_ids(served, client):
    _, _, _, tokenizer, _ = served
    ids = chat_ids(tokenizer, MESSAGES)
    by_text = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, seed=3)
    by_ids = client.chat.completions.create(model="tiny", messages=[], max_tokens=8, seed=3,
                                            extra_body={"prompt_token_ids": ids})
    assert by_ids.prompt_token_ids == by_text.prompt_token_ids == ids
    assert by_ids.choices[0].token_ids == by_text.choices[0].token_ids


@needs_openai
def test_greedy_and_stop(served, client):
    endpoint, _, _, tokenizer, _ = served
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                       logprobs=True)
    expected = direct(endpoint, r.prompt_token_ids, None, greedy=True, max_new_tokens=8)
    assert r.choices[0].token_ids == expected.completion_ids[0]
    assert all(t.logprob is None for t in r.choices[0].logprobs.content)  # greedy: no sampler log-probs
    text = tokenizer.decode(r.choices[0].token_ids[:6], skip_special_tokens=True)
    stop = text[-2:] if text.strip() else None
    if stop:
        cut = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                             stop=[stop])
        assert stop not in cut.choices[0].message.content and cut.choices[0].finish_reason == "stop"


@needs_openai
def test_tools_are_rendered_by_the_chat_template(served, client):
    _, _, _, tokenizer, _ = served
    tools = [{"type": "function", "function": {"name": "calculator", "description": "arithmetic",
                                               "parameters": {"type": "object", "properties": {
                                                   "expression": {"type": "string"}}}}}]
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=tools, max_tokens=4, seed=1)
    assert r.prompt_token_ids == chat_ids(tokenizer, MESSAGES, tools) != chat_ids(tokenizer, MESSAGES)
    assert "calculator" in tokenizer.decode(r.prompt_token_ids)


@needs_openai
def test_concurrent_requests_share_generate_calls(served, client, monkeypatch):
    """8 requests submitted while generation is paused are served in at most 2 generate calls
    (the batch the batcher was collecting, then everything queued), whatever the machine's speed:
    the pause, not a race against the window, puts them in the queue together."""
    endpoint = served[0]
    before, replies, errors, submitted = endpoint.generate_calls, [], [], []
    real_submit = endpoint.batcher.submit

    def submit(job):
        submitted.append(job)
        return real_submit(job)

    monkeypatch.setattr(endpoint.batcher, "submit", submit)

    def ask(i: int) -> None:
        try:
            replies.append(client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": f"question {i}"}], max_tokens=6, seed=i))
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    with endpoint.paused():
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120  # a liveness bound, not the verdict
        while len(submitted) < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(submitted) == 8, f"only {len(submitted)} of 8 requests reached the batcher"
    for t in threads:
        t.join()
    assert not errors and len(replies) == 8
    calls = endpoint.generate_calls - before
    assert calls <= 2, f"8 requests queued together took {calls} generate calls"


@needs_server
def test_refusals_are_openai_errors_with_the_reason(served):
    import httpx

    url = served[4].url
    cases = [  # (body or raw text, status, words the message must hold)
        ("{not json", 400, "not valid JSON"),
        ({"model": "tiny"}, 400, "messages"),
        ({"model": "tiny", "messages": MESSAGES, "n": 0}, 400, "n: must be"),
        ({"model": "tiny", "messages": MESSAGES, "temperature": "hot"}, 400, "temperature: expected a"),
        ({"model": "tiny", "messages": MESSAGES, "stream": True}, 400, "streaming is not supported"),
        ({"model": "gpt-4", "messages": MESSAGES}, 404, "does not exist"),
        ({"model": "tiny", "messages": MESSAGES, "max_tokens": 4000}, 400, "maximum context length is 2048"),
        ({"model": "tiny", "messages": [], "prompt_token_ids": [1, 10**9]}, 400, "outside the vocabulary"),
        ({"model": "tiny", "messages": [], "prompt_token_ids": list(range(2048))}, 400, "leaves no room"),
    ]
    for body, status, words in cases:
        kwargs = {"content": body} if isinstance(body, str) else {"json": body}
        r = httpx.post(f"{url}/chat/completions", timeout=30, **kwargs)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert words in error["message"] and set(error) == {"message", "type", "param", "code"}, error
    r = httpx.post(f"{url}/completions", json={"model": "tiny", "prompt": "x", "echo": True}, timeout=30)
    assert r.status_code == 400 and "echo" in r.json()["error"]["message"]
    assert httpx.get(f"{url}/nothing", timeout=30).json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{url}/models", timeout=30).json()["data"][0]["id"] == "tiny"


@needs_openai
def test_the_openai_client_sees_a_bad_request(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, logprobs=True, top_logprobs=3)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES)


def test_the_version_guard_and_the_recorded_version(served):
    endpoint, log, _, _, _ = served
    log.take()
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 3, "seed": 0}
    with endpoint.paused():
        endpoint.policy_version = 5  # as after a weight push
    try:
        with pytest.raises(RequestError, match="serves policy version 5") as refused:
            endpoint.chat({**body, "policy_version": 4})
        assert refused.value.status == 409 and refused.value.code == "policy_version_mismatch"
        assert endpoint.chat({**body, "policy_version": 5})["policy_version"] == 5
        assert endpoint.chat(body, episode="e1")["policy_version"] == 5  # no version named: tagged
    finally:
        with endpoint.paused():
            endpoint.policy_version = 0
    records = log.take()
    assert [(r.policy_version, r.episode) for r in records] == [(5, None), (5, "e1")]


@needs_server
def test_an_episode_route_tags_its_calls(served):
    import httpx

    endpoint, log, _, _, server = served
    log.take()
    base = server.url.removesuffix("/v1")
    r = httpx.post(f"{base}/episodes/ep-7/v1/completions", json={"model": "tiny", "prompt": [1, 2, 3],
                                                                  "max_tokens": 3}, timeout=30)
    assert r.status_code == 200, r.text
    assert [(x.episode, x.route, x.prompt_ids) for x in log.take()] == [("ep-7", "completions", [1, 2, 3])]


def test_tool_calls_and_stop_strings_are_read_from_the_text():
    content, calls = parse_tool_calls('Let me compute.\n<tool_call>{"name": "calculator", "arguments": '
                                      '{"expression": "2+3"}}</tool_call>')
    assert content == "Let me compute." and calls[0]["function"] == {"name": "calculator",
                                                                     "arguments": '{"expression": "2+3"}'}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", None)
    assert parse_tool_calls("plain") == ("plain", None)
    assert cut_at_stop("a b STOP c END", ("END", "STOP")) == ("a b ", "STOP")
    assert cut_at_stop("abc", ("x",)) == ("abc", None)


def test_a_lone_request_does_not_wait_for_a_batch(tiny):
    """window 0: every request is its own generate call, served at once."""
    model, tokenizer = tiny
    endpoint = Endpoint(HFEngine(copy.deepcopy(model), tokenizer, decoder="lean"), tokenizer, "tiny", 2048,
                        window_s=0.0)
    try:
        r = endpoint.completions({"prompt": [5, 6, 7], "max_tokens": 2, "n": 3, "seed": 1})
        assert len(r["choices"]) == 3 and endpoint.generate_calls == 1
    finally:
        endpoint.close()
