"""Environments and multi-turn episodes: the protocol and its checks, concurrent steps with
timeouts, the tool and feedback environments, the episode loop's limits, masks and error
handling (with a scripted engine: every id is known), token in / token out with the HF
engine on the tiny model, stop strings, metrics, the report and the evaluation's summary."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import ScriptedEngine, check_token_in_token_out, policy_settings, spy_on

from reasonrl.batch import EpisodeStats, Example, Rollouts, Scores, Turn
from reasonrl.config import load_config
from reasonrl.envs import BadStep, EnvStep, as_step, environment_spec, run_calls, with_env_reward
from reasonrl.envs.feedback import NO_NUMBER, TOO_HIGH, TOO_LOW, FeedbackEnvironment, feedback
from reasonrl.envs.tool import ToolEnvironment, parse_tag_call, parse_tool_call
from reasonrl.errors import ConfigError, SandboxError
from reasonrl.evaluate import PromptResult, summarize
from reasonrl.rollout import RolloutWorker, SamplingParams
from reasonrl.rollout.base import SEED_BOUND
from reasonrl.rollout.episodes import ObservationEncoder, turn_seed
from reasonrl.rollout.hf import HFEngine
from reasonrl.tools import sandbox_plan
from reasonrl.train.step_metrics import episode_metrics
from reasonrl.workers.policy import PolicyWorker

REPO = Path(__file__).parents[2]
ECHO = f"{REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Echo"
EXAMPLES = [Example("What is 2 + 3?", "5"), Example("What is 4 + 4?", "8")]


def env_config(*overrides: str, max_new_tokens: int = 16):
    return load_config(REPO / "configs" / "smoke.yaml",
                       [f"rollout.max_new_tokens={max_new_tokens}", *overrides]).env


def auto_sandbox_refusal() -> str | None:
    """Why the python tool's default sandbox (auto) refuses to run here, None where it runs: the
    sandbox's own probe (cached; the environment's start-up check asks the same)."""
    try:
        sandbox_plan("auto")
    except SandboxError as err:
        return str(err)
    return None


# ---- the protocol: what a step may return -------------------------------------------------

def test_as_step_accepts_steps_and_tuples_and_names_what_is_wrong():
    assert as_step(("hi", 0.5, False)) == EnvStep("hi", 0.5, False)
    assert as_step(EnvStep({"role": "user", "content": "x"}, None, True)).done
    bad = [(42, "a step returned int"), (("a", 1), "tuple of 2 items"),
           (EnvStep(observation=7), "the observation is int"),
           (EnvStep(observation={"role": "user"}), "a chat message is"),
           (EnvStep(observation={"role": "user", "content": "x", "name": 1}),
            "keys ['content', 'name', 'role']"),
           (EnvStep(reward=float("nan")), "the reward is nan"), (EnvStep(reward=True), "the reward is True"),
           (EnvStep(done="yes"), "done is 'yes'")]
    for value, message in bad:
        with pytest.raises(BadStep, match=message.replace("[", r"\[").replace("]", r"\]")):
            as_step(value)


# ---- concurrent steps with timeouts ------------------------------------------------------

def test_run_calls_returns_values_errors_and_timeouts_in_order():
    """`slow` hangs for 60 s (until released below): cut at its 0.3 s timeout, the calls return
    in well under 30 s on any machine; holding the turn, they would take the 60 s."""
    released = threading.Event()

    def slow():
        released.wait(60)
        return "late"

    def boom():
        raise RuntimeError("boom")

    def leave():
        raise SystemExit(3)

    t = time.monotonic()
    out = run_calls([lambda: 1, boom, slow, lambda: "x", leave], timeout=0.3, workers=8)
    elapsed = time.monotonic() - t
    released.set()
    assert elapsed < 30  # the hung call did not hold the turn
    assert [o.value for o in out] == [1, None, None, "x", None]
    assert out[1].error == "RuntimeError: boom" and not out[1].timed_out
    assert out[2].timed_out and out[2].error == "timed out after 0.3 s"
    assert out[4].error == "SystemExit: 3"
    assert run_calls([], 1.0, 2) == []


def test_run_calls_runs_at_most_workers_at_once_and_a_hung_call_frees_its_slot():
    running, peak, lock = [0], [0], threading.Lock()

    def work():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return True

    out = run_calls([work] * 6, timeout=5, workers=2)
    assert all(o.value for o in out) and peak[0] == 2
    # one worker slot, held by a call that never returns: the others still run after its timeout
    hang = threading.Event()
    out = run_calls([hang.wait, lambda: 2, lambda: 3], timeout=0.2, workers=1)
    hang.set()
    assert out[0].timed_out and [o.value for o in out[1:]] == [2, 3]


# ---- the tool environment -----------------------------------------------------------------

def test_tag_calls_are_parsed_last_one_first_and_fences_dropped():
    tools = ("calculator", "python")
    assert parse_tag_call("no call here", tools) is None
    assert parse_tag_call("<calculator>1 + 1</calculator> then <calculator> 347 * 29 </calculator>",
                          tools) == ("calculator", "347 * 29")
    assert parse_tag_call("<python>\n```python\nprint(1)\n```\n</python>", tools) == ("python", "print(1)")
    assert parse_tag_call("<shell>ls</shell>", tools) is None  # not one of the tools: no call
    assert parse_tag_call("<calculator>2 * 3</python>", tools) is None  # unmatched closing tag


def test_tool_call_blocks_are_parsed_or_explained():
    assert parse_tool_call('<tool_call>{"name": "python", "arguments": {"code": "print(2)"}}</tool_call>') \
        == ("python", {"code": "print(2)"})
    assert parse_tool_call('<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2*3\\"}"}'
                           "</tool_call>") == ("calculator", {"expression": "2*3"})
    assert parse_tool_call("plain text") is None
    assert parse_tool_call("<tool_call>{not json}</tool_call>").startswith("the tool call is not JSON")
    assert parse_tool_call('<tool_call>["python"]</tool_call>').startswith("the tool call must be a JSON")


def test_tool_environment_runs_the_call_and_counts_failures():
    env = ToolEnvironment(["calculator"])
    assert env.stop_strings == ("</calculator>",)
    env.reset(EXAMPLES[0])
    step = env.step("Let me compute. <calculator>347 * 29</calculator>")
    assert step == EnvStep(observation="<output>\n10063\n</output>\n", call="calculator: 347 * 29")
    refused = env.step("<calculator>__import__('os')</calculator>")
    assert refused.call == "calculator: __import__('os')" and refused.error.startswith("calculator:")
    assert refused.observation.startswith("<output>\nerror: calculator:") and not refused.done
    assert env.step("The answer is 10063.") == EnvStep(done=True)  # no call: the model answered
    chat = ToolEnvironment(["calculator"], call_format="tool_call", observation_format="chat")
    assert chat.stop_strings == ("</tool_call>",)
    step = chat.step('<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>')
    assert step.observation == {"role": "tool", "content": "42"}
    unknown = chat.step('<tool_call>{"name": "shell", "arguments": {}}</tool_call>')
    assert unknown.error == "unknown tool 'shell'; tools: calculator" and unknown.call == "shell: {}"
    malformed = chat.step("<tool_call>{oops</tool_call>")
    assert malformed.call == "<tool_call>" and malformed.error.startswith("the tool call is not JSON")
    with pytest.raises(ConfigError, match="unknown tool"):
        ToolEnvironment(["shell"])


def test_feedback_environment_says_higher_or_lower():
    assert feedback(None, 5) == NO_NUMBER and feedback(7, 5) == TOO_HIGH and feedback(3, 5) == TOO_LOW
    assert feedback(5.0000000001, 5) == TOO_HIGH and feedback(5.0, 5) is None  # exact: no tolerance
    env = FeedbackEnvironment("chat")
    env.reset(Example("What is 2 + 3?", "5"))
    assert env.step("It is 7.") == EnvStep(observation={"role": "user", "content": TOO_HIGH})
    assert env.step("The answer is \\boxed{5}.").done
    tagged = FeedbackEnvironment("tagged")
    tagged.reset(Example("q", "5"))
    assert tagged.step("three") == EnvStep(observation=f"\n{NO_NUMBER}\n")
    with pytest.raises(ValueError, match="numeric ground truth"):
        tagged.reset(Example("q", "five"))


# ---- start-up checks ------------------------------------------------------------------------

def write_module(tmp_path: Path, text: str) -> str:
    path = tmp_path / "my_envs.py"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("source, attr, message", [
    ("def Env():\n    pass\n", "Env", "expected a class"),
    ("class Env:\n    def __init__(self, level):\n        pass\n", "Env", "must build with no arguments"),
    ("class Env:\n    def reset(self, example):\n        pass\n", "Env", r"has no method step\(turn\)"),
    ("class Env:\n    def reset(self):\n        pass\n    def step(self, turn):\n        pass\n", "Env",
     r"Env.reset must accept \(example\)"),
    ("class Env:\n    stop_strings = '</x>'\n    def reset(self, e):\n        pass\n    def step(self, t):\n"
     "        pass\n", "Env", "stop_strings must be a tuple of non-empty strings"),
    ("class Env:\n    def __init__(self):\n        raise OSError('no game server')\n    def reset(self, e):\n"
     "        pass\n    def step(self, t):\n        pass\n", "Env",
     "building Env\\(\\) failed: OSError: no game server"),
    ("X = 1\n", "Missing", "cannot load"),
])
def test_user_environments_are_checked_at_start_up(tmp_path, source, attr, message):
    target = f"{write_module(tmp_path, source)}:{attr}"
    with pytest.raises(ConfigError, match=message):
        environment_spec(env_config(f"env.fn={target}"))


def test_env_config_rules():
    spec = environment_spec(env_config(f"env.fn={ECHO}"))
    assert spec.stop_strings == ("e",) and spec.name == ECHO
    assert environment_spec(env_config()) is None  # single-turn
    # where auto refuses (no bubblewrap, no namespaces), the start-up check would refuse the python
    # tool: rlimit, chosen, runs everywhere
    chosen = [] if auto_sandbox_refusal() is None else ["env.sandbox=rlimit"]
    tool = environment_spec(env_config("env.name=tool", "env.tools=[calculator, python]", *chosen))
    assert tool.stop_strings == ("</calculator>", "</python>")
    for overrides, message in [
        (["env.max_turns=3"], "env.max_turns: set, but env.name=none"),
        (["env.name=tool", f"env.fn={ECHO}"], "env.fn and env.name: set one"),
        (["env.fn=nocolon"], "env.fn: expected module:Class"),
        (["env.name=tool", "env.tools=[shell]"],
         "env.tools.shell: unknown tool; allowed: calculator, python"),
        (["env.name=tool", "env.tools=[]"], "needs at least one tool"),
        (["env.name=tool", "env.step_timeout=5", "env.tool_timeout=10"],
         "must be more than env.tool_timeout"),
        (["env.name=tool", "env.max_turn_tokens=32"], "more than rollout.max_new_tokens=16"),
        (["env.name=tool", "env.max_total_tokens=8"], "less than one model turn"),
        (["env.name=guess"], "env.name: 'guess' is not allowed"),
    ]:
        with pytest.raises(ConfigError, match=message):
            env_config(*overrides)


# ---- the episode loop, with a scripted engine: every id is known ----------------------------


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_tool_episode_token_by_token(tokenizer):
    """Two prompts x 2 samples with the calculator: row 0 calls, reads the output, answers;
    row 1 answers at once; row 2's call is refused and it runs out of turns; row 3 is cut by
    the per-turn limit. Every id, mask bit and count is known."""
    call, answer = "<calculator>347 * 29</calculator>", "The answer is 10063.<|im_end|>"
    script = [[call, "It is 5.<|im_end|>", "<calculator>x</calculator>",
               "a b c d e f g h i j k l m n o p q r s t u"],
              [answer, "<calculator>y</calculator>"]]
    engine = ScriptedEngine(tokenizer, script, logprobs=True)
    cfg = env_config("env.name=tool", "env.max_turns=2", "env.max_turn_tokens=16", max_new_tokens=40)
    worker = RolloutWorker(engine, tokenizer, env=environment_spec(cfg))
    r = worker.rollout(EXAMPLES, SamplingParams(n=2, max_new_tokens=40), seeds=[11, 22])
    output = ids_of(tokenizer, "<output>\n10063\n</output>\n")
    c, a = ids_of(tokenizer, call), ids_of(tokenizer, answer)
    assert r.completion_ids[0] == c + output + a
    assert r.token_mask[0] == [1] * len(c) + [0] * len(output) + [1] * len(a)
    assert r.texts[0] == "The answer is 10063." and r.episodes.turns[0][0].call == "calculator: 347 * 29"
    turns = r.episodes.turns
    assert turns[0][0].observation == "<output>\n10063\n</output>\n" and turns[0][1].observation is None
    assert r.completion_ids[1] == ids_of(tokenizer, "It is 5.<|im_end|>") and r.token_mask[1] == [1] * 6
    refused = ids_of(tokenizer, "<calculator>x</calculator>")
    error_obs = r.completion_ids[2][len(refused): -len(ids_of(tokenizer, "<calculator>y</calculator>"))]
    assert tokenizer.decode(error_obs).startswith("<output>\nerror: calculator:")
    assert r.episodes.turns[2][1].call == "calculator: y"  # ran at the last turn: observation not appended
    assert r.completion_ids[3] == ids_of(tokenizer, script[0][3])[:16] and r.token_mask[3] == [1] * 16
    assert r.truncated.tolist() == [False, False, True, True]
    assert r.episodes.num_turns.tolist() == [2, 1, 2, 1] and r.episodes.tool_calls.tolist() == [1, 0, 2, 0]
    assert r.episodes.tool_errors.tolist() == [0, 0, 2, 0] and r.episodes.step_errors.tolist() == [0, 0, 0, 0]
    # sampler log-probs: the engine's per model token, 0 on the environment's
    assert r.sampler_logprobs[0].tolist() == ([-0.5 - k for k in range(len(c))] + [0.0] * len(output)
                                              + [-0.5 - k for k in range(len(a))])
    # turn 2: one sample per episode still going, its trajectory as the prompt, a seed of its own
    prompts, params, seeds = engine.calls[1]
    assert prompts == [r.prompt_ids[0] + c + output, r.prompt_ids[2] + refused + error_obs]
    assert params.n == 1 and params.max_new_tokens == 16 and params.stop == ("</calculator>",)
    assert seeds == [turn_seed(11, 0, 2), turn_seed(22, 0, 2)]
    assert engine.calls[0][1].stop == ("</calculator>",) and engine.calls[0][2] == [11, 22]


def test_turn_seed_is_the_hash_of_the_episode():
    digest = hashlib.blake2b(b"11:0:2", digest_size=8).digest()
    assert turn_seed(11, 0, 2) == int.from_bytes(digest, "little") % SEED_BOUND
    assert len({turn_seed(11, s, t) for s in range(4) for t in range(2, 6)}) == 16


def test_token_limits_end_episodes_truncated(tokenizer):
    """max_new_tokens counts model tokens over turns; max_total_tokens counts every token."""
    say = "<calculator>2 * 3</calculator>"
    n_say = len(ids_of(tokenizer, say))
    obs = len(ids_of(tokenizer, "<output>\n6\n</output>\n"))
    # model budget: after turn 1 only 4 model tokens are left: turn 2 asks for 4 and is cut there
    engine = ScriptedEngine(tokenizer, [[say], [say]])
    cfg = env_config("env.name=tool", "env.max_turns=4", max_new_tokens=n_say + 4)
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        EXAMPLES[:1], SamplingParams(n=1, max_new_tokens=n_say + 4), seeds=[1])
    assert engine.calls[1][1].max_new_tokens == 4
    assert r.model_lengths.tolist() == [n_say + 4] and bool(r.truncated[0])
    # total budget: the observation would leave no room for a model token: not appended, truncated
    engine = ScriptedEngine(tokenizer, [[say]])
    cfg = env_config("env.name=tool", f"env.max_total_tokens={n_say + obs}", max_new_tokens=n_say + 10)
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        EXAMPLES[:1], SamplingParams(n=1, max_new_tokens=n_say + 10), seeds=[1])
    assert engine.calls[0][1].max_new_tokens == n_say + obs  # the total budget bounds turn 1 too
    assert len(engine.calls) == 1 and r.completion_ids[0] == ids_of(tokenizer, say) and bool(r.truncated[0])


def test_an_environment_that_fails_is_an_error_observation_never_a_crash(tokenizer, tmp_path):
    """Broken raises at turn 1 (error observation, the episode goes on), answers a bare
    number at turn 2 (not an observation: error observation), hangs at turn 3 (the episode
    ends); one whose reset fails plays a single turn. All counted."""
    engine = ScriptedEngine(tokenizer, [["ae", "be"], ["ce", "de"], ["ee", "fe"]])
    cfg = env_config(f"env.fn={REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Broken", "env.max_turns=4",
                     "env.step_timeout=0.5")
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=16), seeds=[3])
    assert r.episodes.step_errors.tolist() == [3, 3] and r.episodes.step_timeouts.tolist() == [1, 1]
    assert r.episodes.num_turns.tolist() == [3, 3] and r.truncated.tolist() == [True, True]
    first = r.episodes.turns[0]
    assert first[0].error == "the environment's step raised RuntimeError: boom"
    assert first[0].observation == "\n[environment error: the environment's step raised RuntimeError: boom]\n"
    assert first[1].error.startswith("the observation is int")
    assert first[2].error == "environment step timed out after 0.5 s"
    # the two error observations were appended (mask 0), the hung step's turn ended the episode
    assert r.token_mask[0].count(0) == len(ids_of(tokenizer, first[0].observation)) + \
        len(ids_of(tokenizer, first[1].observation))
    bad_reset = write_module(tmp_path, "class Env:\n    def reset(self, example):\n"
                                       "        raise KeyError('x')\n"
                                       "    def step(self, turn):\n        return 'obs', None, False\n")
    engine = ScriptedEngine(tokenizer, [["It is 5.<|im_end|>"]])
    r = RolloutWorker(engine, tokenizer, env=environment_spec(env_config(f"env.fn={bad_reset}:Env"))).rollout(
        EXAMPLES[:1], SamplingParams(n=1, max_new_tokens=16), seeds=[3])
    assert r.episodes.step_errors.tolist() == [1] and r.episodes.num_turns.tolist() == [1]
    assert not bool(r.truncated[0])
    assert r.episodes.turns[0][0].error == "the environment did not start: KeyError: 'x'"


def test_chat_observations_close_the_model_turn_and_open_the_next(tokenizer):
    encoder = ObservationEncoder(tokenizer)
    message = {"role": "tool", "content": "42"}
    eos = tokenizer.eos_token_id  # <|im_end|>: the model closed its message itself
    assert encoder.chat_text(message, eos) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    stopped = ids_of(tokenizer, "</calculator>")[-1]  # stopped at a tool call: its message is closed here
    assert encoder.chat_text(message, stopped) == \
        "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    engine = ScriptedEngine(tokenizer, [["It is 9.<|im_end|>"], ["It is 5.<|im_end|>"]])
    cfg = env_config("env.name=feedback", "env.observation_format=chat", "env.max_turns=3")
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        EXAMPLES[:1], SamplingParams(n=1, max_new_tokens=16), seeds=[5])
    feedback_ids = ids_of(tokenizer, "\n<|im_start|>user\nToo high.<|im_end|>\n<|im_start|>assistant\n")
    assert r.completion_ids[0] == ids_of(tokenizer, "It is 9.<|im_end|>") + feedback_ids + \
        ids_of(tokenizer, "It is 5.<|im_end|>")
    assert not bool(r.truncated[0]) and r.episodes.num_turns.tolist() == [2] and r.texts == ["It is 5."]


def test_single_turn_is_the_one_turn_case(tokenizer):
    engine = ScriptedEngine(tokenizer, [["It is 5.<|im_end|>", "It is"]])
    r = RolloutWorker(engine, tokenizer).rollout(EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=8),
                                                 seeds=[1])
    assert len(engine.calls) == 1 and engine.calls[0][1] == SamplingParams(n=2, max_new_tokens=8)
    assert r.episodes is None and r.token_mask == [[1] * 6, [1] * 2]  # no episode statistics
    assert r.truncated.tolist() == [False, True]
    assert r.texts == ["It is 5.", "It is"]


# ---- token in, token out: the HF engine on the tiny model -----------------------------------

def test_token_in_token_out_hf(tiny):
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    engine = HFEngine(model, tokenizer, decoder="modules")
    sampled = spy_on(engine)
    cfg = env_config(f"env.fn={ECHO}", "env.max_turns=3", "env.max_turn_tokens=6")
    torch.manual_seed(0)
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        EXAMPLES, SamplingParams(n=2, max_new_tokens=16))
    check_token_in_token_out(r, sampled, tokenizer, tokenizer.pad_token_id)
    # the HF engine's log-probs: one per completion id, finite and < 0 on the model's, 0 on the env's
    for logp, mask in zip(r.sampler_logprobs, r.token_mask, strict=True):
        keep = torch.tensor(mask, dtype=torch.bool)
        assert logp.shape == (len(mask),) and bool((logp[~keep] == 0).all())
        assert bool(torch.isfinite(logp).all()) and bool((logp[keep] < 0).all())
    # the same seeds give the same episodes, whatever else is in the batch (per-episode seeds)
    torch.manual_seed(0)
    seeds = torch.randint(0, SEED_BOUND, (2,)).tolist()
    worker = RolloutWorker(engine, tokenizer, env=environment_spec(cfg))
    alone = worker.rollout(EXAMPLES[1:], SamplingParams(n=2, max_new_tokens=16), seeds=seeds[1:])
    assert alone.completion_ids == r.completion_ids[2:] and alone.token_mask == r.token_mask[2:]
    # the policy trains on exactly those ids: its log-probs of them are finite, env tokens masked
    policy = PolicyWorker(model, tokenizer.pad_token_id, policy_settings())
    logp = policy.row_logprobs(model, r.prompt_ids, r.completion_ids)
    assert all(len(lp) == len(c) and torch.isfinite(lp).all()
               for lp, c in zip(logp, r.completion_ids, strict=True))


def test_episodes_with_kv_reuse_equal_episodes_that_re_prefill(tiny):
    """The lean decoder keeps each episode's KV cache between turns (`rollout.hf_reuse_kv`):
    its turns prefill only the new tokens, and the episodes (ids, masks, turns) are those of
    the path that re-prefills every trajectory; token in, token out holds."""
    model, tokenizer = tiny
    cfg = env_config(f"env.fn={ECHO}", "env.max_turns=3", "env.max_turn_tokens=6")
    runs = {}
    for reuse in (True, False):
        engine = HFEngine(model, tokenizer, decoder="lean", reuse_kv=reuse)
        sampled, reused = spy_on(engine), []
        generate = engine.generate

        def counting(prompt_ids, params, seeds=None, generate=generate, engine=engine, reused=reused):
            gen = generate(prompt_ids, params, seeds)
            reused.append(engine.reused_tokens)
            return gen
        engine.generate = counting
        torch.manual_seed(0)
        r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
            EXAMPLES, SamplingParams(n=2, max_new_tokens=16))
        check_token_in_token_out(r, sampled, tokenizer, tokenizer.pad_token_id)
        assert int(r.episodes.num_turns.max()) >= 2, "no episode reached a second turn"
        assert reused[0] == 0 and (all(n > 0 for n in reused[1:]) if reuse else not any(reused))
        runs[reuse] = r
    a, b = runs[True], runs[False]
    assert a.completion_ids == b.completion_ids and a.token_mask == b.token_mask
    assert a.episodes.num_turns.tolist() == b.episodes.num_turns.tolist() and a.texts == b.texts


def test_hf_engine_stops_at_a_stop_string(tiny):
    model, tokenizer = tiny
    engine = HFEngine(model, tokenizer, decoder="modules")
    prompt = ids_of(tokenizer, "What is 2 + 3?")
    greedy = SamplingParams(n=1, max_new_tokens=12, greedy=True)
    free = engine.generate([prompt], greedy).completion_ids[0]
    # a stop string that a token past the first writes (a token that decodes cleanly on its own)
    at = next(t for t in range(2, len(free)) if (w := tokenizer.decode(free[t: t + 1]).strip())
              and "\ufffd" not in w)
    stop = tokenizer.decode(free[at: at + 1]).strip()
    first_end = next(t for t in range(1, len(free) + 1) if stop in tokenizer.decode(free[:t]))
    stopped = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=12, greedy=True, stop=(stop,)))
    assert stopped.completion_ids == [free[:first_end]] and stopped.truncated == [False]
    assert first_end <= at + 1
    # a stop string never written: as without one
    none = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=12, greedy=True, stop=("\x00never",)))
    assert none.completion_ids == [free] and none.truncated == [True]


# ---- metrics, evaluation, report ---------------------------------------------------------------

def test_episode_metrics_and_env_reward_hand_computed():
    episodes = EpisodeStats("tool", turns=[[Turn("a1"), Turn("a")], [Turn("b")]],
                            tool_calls=torch.tensor([2, 0]), tool_errors=torch.tensor([1, 0]),
                            tool_timeouts=torch.tensor([1, 0]), step_errors=torch.tensor([0, 1]),
                            step_timeouts=torch.tensor([0, 0]),
                            reward=torch.tensor([0.5, -1.0]))
    r = Rollouts(prompt_ids=[[1]] * 2, completion_ids=[[5, 6, 7, 8], [9, 10]], texts=["a", "b"],
                 group=torch.tensor([0, 0]), truncated=torch.tensor([False, True]), examples=EXAMPLES,
                 token_mask=[[1, 0, 0, 1], [1, 1]], episodes=episodes)
    m = episode_metrics(r)
    assert m == {"env/turns_mean": 1.5, "env/tool_calls_mean": 1.0, "env/tool_call_share": 0.5,
                 "env/tool_errors": 1.0, "env/tool_error_rate": 0.5, "env/tool_timeouts": 1.0,
                 "env/step_errors": 1.0, "env/step_timeouts": 0.0, "env/reward_mean": -0.25,
                 "env/model_tokens_mean": 2.0, "env/env_tokens_mean": 1.0}
    scores = with_env_reward(Scores(torch.tensor([1.0, 0.0]), {"correct": torch.tensor([1.0, 0.0])}), r)
    assert scores.total.tolist() == [1.5, -1.0] and scores.components["env"].tolist() == [0.5, -1.0]
    single = Rollouts([[1]], [[5]], ["a"], torch.tensor([0]), torch.tensor([False]), EXAMPLES[:1])
    plain = Scores(torch.tensor([1.0]), {"correct": torch.tensor([1.0])})
    assert with_env_reward(plain, single) is plain
    # cut and joined like every row record
    both = Rollouts.concat([r.take([1]), r.take([0])])
    assert both.token_mask == [[1, 1], [1, 0, 0, 1]] and both.episodes.tool_calls.tolist() == [0, 2]
    assert both.episodes.num_turns.tolist() == [1, 2] and both.episodes.environment == "tool"


def test_evaluation_summarises_episodes():
    results = [PromptResult("a", [1.0, 0.0], [True, False], ["5", None], [4, 6], [False, True],
                            turns=[2, 1], tool_calls=[1, 0], tool_errors=[0, 0]),
               PromptResult("a", [1.0, 1.0], [True, True], ["8", "8"], [5, 5], [False, False],
                            turns=[3, 2], tool_calls=[2, 1], tool_errors=[1, 0])]
    m = summarize(results, (1,))
    assert m["turns_mean"] == 2.0 and m["tool_calls_mean"] == 1.0 and m["tool_call_share"] == 0.75
    assert m["tool_error_rate"] == 0.25  # 1 failed of 4 calls
    single = [PromptResult("a", [1.0], [True], ["5"], [4], [False])]
    assert "turns_mean" not in summarize(single, (1,))


def test_report_shows_each_turn_escaped(tmp_path):
    from reasonrl.report import load_run, render_html

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    turns = [{"model": "<calculator>2 * 3</calculator>", "call": "calculator: 2 * 3",
              "observation": "<output>\n6\n</output>\n", "error": None, "reward": None},
             {"model": "The answer is <b>6</b>.", "call": None, "observation": None, "error": None,
              "reward": None}]
    sample = {"step": 1, "prompt": "What is 2 * 3?", "ground_truth": "6", "completion": "The answer is 6.",
              "reward": 1.0, "components": {}, "advantage": 0.5, "truncated": False, "turns": turns}
    (run / "samples.jsonl").write_text(json.dumps(sample) + "\n")
    html = render_html([load_run(run)])
    assert '<div class="turn" data-turn="1">' in html and '<div class="turn" data-turn="2">' in html
    assert '<div class="text turn-model">&lt;calculator&gt;2 * 3&lt;/calculator&gt;</div>' in html
    assert '<div class="text turn-call">calculator: 2 * 3</div>' in html
    assert '<div class="text turn-observation">&lt;output&gt;\n6\n&lt;/output&gt;\n</div>' in html
    assert "&lt;b&gt;6&lt;/b&gt;" in html and "<b>6</b>" not in html


# ---- the python tool in an episode, and the tool configs --------------------------------------

@pytest.fixture
def python_sandbox() -> None:
    """Skip, with the refusal's reason, where the python tool's default sandbox (auto) refuses
    to run here (no bubblewrap, no namespaces)."""
    if (refusal := auto_sandbox_refusal()) is not None:
        pytest.skip(f"the python tool's sandbox (auto) refuses here: {refusal}")


def test_a_python_call_runs_in_the_sandbox_within_an_episode(tokenizer, python_sandbox):
    code, answer = "<python>print(6 * 7)</python>", "So #### 42<|im_end|>"
    engine = ScriptedEngine(tokenizer, [[code, "#### 7<|im_end|>"], [answer]])
    cfg = env_config("env.name=tool", "env.tools=[python]", "env.tool_timeout=5", max_new_tokens=40)
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=40), seeds=[9])
    assert r.completion_ids[0] == ids_of(tokenizer, code) + ids_of(tokenizer, "<output>\n42\n</output>\n") + \
        ids_of(tokenizer, answer)
    assert r.episodes.turns[0][0].call == "python: print(6 * 7)" and r.episodes.turns[0][0].error is None
    assert r.episodes.tool_calls.tolist() == [1, 0] and r.episodes.num_turns.tolist() == [2, 1]
    assert r.texts[0] == "So #### 42"


@pytest.fixture(scope="module")
def gsm8k_files() -> list[str]:
    """The official question/answer layout (the repo's GSM8K fixture), mapped by the config's
    data.format=gsm8k as the Hub dataset would be."""
    fixtures = REPO / "tests" / "fixtures" / "gsm8k"
    return [f"data.train_path={fixtures / 'train.jsonl'}", f"data.val_path={fixtures / 'test.jsonl'}"]


TINY_RUN = ["model.path=tiny", "trainer.steps=2", "trainer.batch_size=8", "rollout.n=4",
            "trainer.progress=false", "rollout.max_new_tokens=12", "env.max_turn_tokens=6", "data.val_size=4",
            "eval.n=1", "eval.temperature=0"]


def test_tool_gsm8k_config_trains_on_the_tiny_model(tmp_path, gsm8k_files, python_sandbox):
    from reasonrl.cli import main

    assert main(["train", "configs/tool_gsm8k.yaml", *TINY_RUN, *gsm8k_files, "env.max_total_tokens=32",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    for key in ("env/turns_mean", "env/tool_calls_mean", "env/tool_errors", "env/tool_timeouts", "time/env",
                "env/model_tokens_mean", "env/env_tokens_mean", "eval/turns_mean", "eval/tool_call_share"):
        assert key in lines[1] or key in lines[2], key
    report = (tmp_path / "r" / "report.html").read_text()
    assert 'class="turn"' in report


def test_tool_calculator_config_trains_and_probes_on_the_tiny_model(tmp_path, capsys):
    from reasonrl.cli import main

    assert main(["train", "configs/tool_calculator.yaml", *TINY_RUN, "data.arithmetic.train_size=32",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert lines[1]["env/tool_error_rate"] >= 0 and lines[0]["eval/num_prompts"] == 4
    assert main(["probe", "--config", "configs/tool_calculator.yaml", "model.path=tiny", "--limit", "4",
                 "--n", "2", "--max-new-tokens", "12", "env.max_turn_tokens=6", "--no-progress"]) == 0
    assert "tool calls in" in capsys.readouterr().out


def test_the_documented_environment_trains(tmp_path):
    """docs/environments.md's custom environment, as printed there, trains on the tiny model."""
    from reasonrl.cli import main

    doc = (REPO / "docs" / "environments.md").read_text()
    code = doc.split("<!-- example: my_envs.py -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_envs.py").write_text(code)
    assert main(["train", "configs/default.yaml", *TINY_RUN, "data.arithmetic.train_size=32",
                 f"env.fn={tmp_path / 'my_envs.py'}:TryAgain", "env.max_turns=3", "env.max_turn_tokens=0",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert "env/turns_mean" in lines[1] and lines[1]["env/step_errors"] == 0
