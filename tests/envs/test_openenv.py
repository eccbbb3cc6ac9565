"""OpenEnv environments (`reasonrl.envs.openenv`): a turn -> an Action, an Observation -> the
next message, episodes in this process on OpenEnv-shaped classes without the package
(tests/fixtures/openenv_duck.py) and on the package's own base class
(tests/fixtures/openenv_pkg.py), and episodes on a real OpenEnv server started here on
127.0.0.1 (openenv-core's `create_fastapi_app` under uvicorn): one WebSocket session each,
failures counted as the episode loop counts them, the server's session limit checked at
start-up, waves of episodes (`env.max_concurrent_episodes`). Every turn is scripted (an
engine that answers each call with given texts), every reward computed by hand."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ScriptedEngine

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.envs import environment_spec
from reasonrl.envs.openenv import (
    EVAL_EPISODES_PER_CALL,
    OpenEnvEpisode,
    Renderer,
    class_fields,
    schema_fields,
    text_field,
)
from reasonrl.envs.openenv_server import ServerEpisode, check_sessions
from reasonrl.errors import ConfigError
from reasonrl.rollout import RolloutWorker, SamplingParams

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "tests" / "fixtures"
DUCK = FIXTURES / "openenv_duck.py"
PKG = FIXTURES / "openenv_pkg.py"
HI = Example("Say hi.", "0")


def env_config(*overrides: str, max_new_tokens: int = 32):
    return load_config(REPO / "configs" / "smoke.yaml",
                       [f"rollout.max_new_tokens={max_new_tokens}", *overrides])


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def play(tokenizer, cfg, script, examples=(HI,), n: int = 1, seeds=None):
    engine = ScriptedEngine(tokenizer, script)
    worker = RolloutWorker(engine, tokenizer, env=environment_spec(cfg.env))
    r = worker.rollout(list(examples), SamplingParams(n=n, max_new_tokens=cfg.rollout.max_new_tokens),
                       seeds=seeds or [3] * len(examples))
    return r, engine, worker


# ---- a turn -> an Action; an Observation -> a message ---------------------------------------

@dataclass
class Move:
    square: str
    note: str = ""


@dataclass
class Count:
    times: int


def test_the_turn_fills_the_actions_one_text_field():
    """One text field (others optional): it; an explicit field; no text field, or two required:
    refused naming the fields and the two settings. A server's /schema reads the same way."""
    assert text_field(class_fields(Move), "", "Move") == "square"  # the one required text field
    assert text_field(class_fields(Move), "note", "Move") == "note"
    for cls, message in [(Count, r"Count has fields times \(not text, required\)"),
                         (None, "the turn's text fills one text field")]:
        fields = class_fields(cls) if cls else [("a", True, True), ("b", True, True)]
        with pytest.raises(ConfigError, match=message) as err:
            text_field(fields, "", cls.__name__ if cls else "Two")
        assert "env.openenv.action_field" in str(err.value) and "env.openenv.parse_action" in str(err.value)
    with pytest.raises(ConfigError, match="Move has no field 'nope'; its fields: square"):
        text_field(class_fields(Move), "nope", "Move")
    schema = {"properties": {"metadata": {"type": "object"}, "message": {"type": "string"},
                             "level": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
              "required": ["message"]}
    assert schema_fields(schema) == [("message", True, True), ("level", False, False)]
    assert text_field(schema_fields(schema), "", "EchoAction") == "message"


def test_observations_become_messages_with_their_reward_and_done():
    both = {"echoed_message": "hi", "message_length": 2, "done": False, "reward": 0.2, "metadata": {"x": 1}}
    step = Renderer().step(both)  # two fields: both, as JSON, between newlines (tagged)
    assert step.observation == '\n{"echoed_message": "hi", "message_length": 2}\n'
    assert step.reward == 0.2 and step.done is False
    step = Renderer(field="echoed_message", chat=True).step({**both, "done": True, "reward": True})
    assert step.observation == {"role": "user", "content": "hi"} and step.done is True and step.reward == 1.0
    assert Renderer().step({"done": True, "reward": None}).observation is None  # nothing to say
    assert Renderer().step({"board": ["x", "o"]}).observation == '\n["x", "o"]\n'  # one field, not text
    shown = Renderer(render=lambda f: {"role": "tool", "content": f"got {f['n']}"}).step({"n": 3})
    assert shown.observation == {"role": "tool", "content": "got 3"}
    with pytest.raises(KeyError, match="no field 'nope'"):
        Renderer(field="nope").step(both)
    # reset's observation joins the prompt's last user message; nothing to show: no new prompt
    chat = Example([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}], "0")
    assert Renderer(field="echoed_message").prompt(chat, both).prompt[1]["content"] == "Q\n\nhi"
    assert Renderer().prompt(HI, {"done": False, "reward": 0.0}) is None


# ---- in this process, without the package ---------------------------------------------------

def test_an_openenv_shaped_class_plays_episodes_token_by_token(tokenizer):
    """openenv init's echo template, duck-typed: detected as OpenEnv's (env.format=auto); the
    reset observation joins the prompt; each turn is the EchoAction's message, each echo the
    next message (mask 0) with reward 0.1 per character; end() closes each environment."""
    cfg = env_config(f"env.fn={DUCK}:Echo", "env.max_turns=2", "env.openenv.observation_field=echoed_message")
    spec = environment_spec(cfg.env)
    assert spec.make.func is OpenEnvEpisode  # not Gymnasium's, which has the same reset(seed=...)
    module = sys.modules[spec.make.args[0].__module__]
    closed = module.Echo.closed
    script = [["hello<|im_end|>", "hey<|im_end|>"], ["bye<|im_end|>", "ok<|im_end|>"]]
    r, engine, _ = play(tokenizer, cfg, script, n=2)
    hello, echo, bye = (ids(tokenizer, t) for t in ("hello<|im_end|>", "\nhello\n", "bye<|im_end|>"))
    assert r.completion_ids[0] == hello + echo + bye
    assert r.token_mask[0] == [1] * len(hello) + [0] * len(echo) + [1] * len(bye)
    # 0.1 x len("hello") + 0.1 x len("bye"); 0.1 x len("hey") + 0.1 x len("ok")
    assert r.episodes.reward.tolist() == pytest.approx([0.5 + 0.3, 0.3 + 0.2])
    assert r.episodes.num_turns.tolist() == [2, 2] and r.truncated.tolist() == [True, True]  # max_turns
    # the last turn steps too (its reward counts); its observation is logged, not appended
    assert [t.observation for t in r.episodes.turns[0]] == ["\nhello\n", "\nbye\n"]
    prompt = tokenizer.decode(r.prompt_ids[0])
    assert "Say hi.\n\nEcho environment ready!<|im_end|>" in prompt  # reset's echoed_message
    assert module.Echo.closed == closed + 1 + 2  # play's start-up check's instance, then 2 episodes
    assert r.episodes.step_errors.tolist() == [0, 0]


def test_parse_action_render_and_done(tokenizer):
    """Knock: parse_action reads <move>...</move> (none: the episode is over), render makes
    the reply a tool message; "stop" ends the episode with reward 1, another move costs 0.25."""
    cfg = env_config(f"env.fn={DUCK}:Knock", "env.max_turns=3", "env.observation_format=chat",
                     f"env.openenv.parse_action={DUCK}:parse_move", f"env.openenv.render={DUCK}:render_reply",
                     "env.openenv.stop_strings=[</move>]")
    script = [["<move>go</move>", "I pass.<|im_end|>"], ["<move>stop</move>"]]
    r, engine, _ = play(tokenizer, cfg, script, n=2)
    assert engine.calls[0][1].stop == ("</move>",)
    reply = ids(tokenizer, "<|im_end|>\n<|im_start|>tool\nreply: Who's there?<|im_end|>\n"
                           "<|im_start|>assistant\n")
    go, stop = ids(tokenizer, "<move>go</move>"), ids(tokenizer, "<move>stop</move>")
    assert r.completion_ids[0] == go + reply + stop
    assert r.episodes.reward.tolist() == [-0.25 + 1.0, 0.0]  # the second never moved: over, no reward
    assert r.episodes.num_turns.tolist() == [2, 1] and r.truncated.tolist() == [False, False]


def test_a_step_that_raises_or_hangs_is_counted_as_the_loop_counts_it(tokenizer):
    """Broken raises at its first step (an error observation, the episode goes on) and hangs at
    its second: cut at env.step_timeout=0.5, the episode over; released afterwards."""
    cfg = env_config(f"env.fn={DUCK}:Broken", "env.max_turns=3", "env.step_timeout=0.5")
    module = sys.modules[environment_spec(cfg.env).make.args[0].__module__]
    try:
        start = time.monotonic()
        r, _, _ = play(tokenizer, cfg, [["a<|im_end|>"], ["b<|im_end|>"]])
        assert time.monotonic() - start < 30  # the hang is 60 s
    finally:
        module.RELEASE.set()
    assert r.episodes.step_errors.tolist() == [2] and r.episodes.step_timeouts.tolist() == [1]
    turns = r.episodes.turns[0]
    assert turns[0].error == "the environment's step raised RuntimeError: boom"
    assert turns[1].error == "environment step timed out after 0.5 s" and r.truncated.tolist() == [True]


def write(tmp_path: Path, source: str) -> str:
    path = tmp_path / "envs_here.py"
    path.write_text(source)
    return str(path)


ONE_SHOT = '''
from dataclasses import dataclass

@dataclass
class Act:
    text: str

class Env:
    {attr}
    def reset(self, seed=None):
        return {{"done": False}}
    def step(self, action: Act):
        return {{"done": True, "reward": 1.0}}
    @property
    def state(self):
        return {{}}
'''


@pytest.mark.parametrize("source, overrides, message", [
    (f"{DUCK}:Untyped", [], r"cannot tell Untyped's Action class \(step's action parameter has no "
                            r"annotation\); set env.openenv.action"),
    (f"{DUCK}:Ambiguous", [], r"its Action TwoFields has fields message \(text, required\), times \(text, "
                              r"required\)"),
    ("REQUIRES_SINGLE_THREAD_EXECUTOR = True", [], "REQUIRES_SINGLE_THREAD_EXECUTOR: its steps must run on"),
    ("SUPPORTS_CONCURRENT_SESSIONS = False", [], "SUPPORTS_CONCURRENT_SESSIONS is False"),
    ("def __init__(self):\n        raise OSError('no board')", [],
     r"building Env\(\) failed \(OpenEnv's server builds it with no arguments too\): OSError: no board"),
    (f"{DUCK}:Echo", ["env.openenv.render=nowhere.py:fn"], "env.openenv.render: cannot load 'nowhere.py:fn'"),
])
def test_a_class_refused_at_start_up_in_one_line(tmp_path, source, overrides, message):
    if not source.startswith(str(DUCK)):
        source = f"{write(tmp_path, ONE_SHOT.format(attr=source))}:Env"
    target = source
    with pytest.raises(ConfigError, match=message) as err:
        environment_spec(env_config(f"env.fn={target}", "env.format=openenv", *overrides).env)
    assert "\n" not in str(err.value)


def test_explicit_action_field_and_class(tmp_path):
    spec = environment_spec(env_config(f"env.fn={DUCK}:Ambiguous", "env.openenv.action_field=times").env)
    assert spec.make.args[1].field == "times"
    spec = environment_spec(env_config(f"env.fn={DUCK}:Untyped", f"env.openenv.action={DUCK}:EchoAction").env)
    assert spec.make.args[1].field == "message"


@pytest.mark.parametrize("overrides, message", [
    (["env.url=ws://127.0.0.1:9"], "env.url: set, but env.name=none"),
    (["env.name=openenv"], "env.url: env.name=openenv needs the server's URL"),
    (["env.name=openenv", "env.url=ftp://127.0.0.1:9"], "is not ws://host:port"),
    (["env.name=tool", "env.openenv.action_field=x"], "env.openenv.action_field: set, but they configure"),
    (["env.name=openenv", "env.url=ws://127.0.0.1:9", "env.openenv.action=a.py:A"],
     "env.openenv.action: names a class in this process"),
    ([f"env.fn={DUCK}:Echo", "env.openenv.action_field=a", "env.openenv.parse_action=a.py:f"],
     "env.openenv.action_field and env.openenv.parse_action: set one"),
    ([f"env.fn={DUCK}:Echo", "env.openenv.stop_strings=['']"], "an empty string would end every turn"),
    ([f"env.fn={DUCK}:Echo", "env.max_concurrent_episodes=2", "rollout.n=4"],
     r"env.max_concurrent_episodes: 2 is fewer than the samples of one prompt \(rollout.n=4"),
])
def test_config_rules(overrides, message):
    with pytest.raises(ConfigError, match=message):
        env_config(*overrides)


def test_waves_play_whole_groups_at_most_max_concurrent_episodes_at_once(tokenizer):
    """3 prompts x 2 samples with env.max_concurrent_episodes=2: three waves of one prompt,
    each turn 1 its own engine call of 2 rows from that prompt's seed; the rows joined in
    order, groups numbered on."""
    cfg = env_config(f"env.fn={DUCK}:Knock", "env.max_concurrent_episodes=3", "env.max_turns=1",
                     "rollout.n=2", "env.openenv.observation_field=reply")
    examples = [Example(f"Q{i}", "0") for i in range(3)]
    script = [[f"w{k}s{s}<|im_end|>" for s in range(2)] for k in range(3)]
    r, engine, _ = play(tokenizer, cfg, script, examples, n=2, seeds=[11, 22, 33])
    assert [len(p) for p, _, _ in engine.calls] == [1, 1, 1]
    assert [s for _, _, s in engine.calls] == [[11], [22], [33]]
    assert r.group.tolist() == [0, 0, 1, 1, 2, 2]
    assert [t[0].model for t in r.episodes.turns] == ["w0s0", "w0s1", "w1s0", "w1s1", "w2s0", "w2s1"]
    assert r.episodes.reward.tolist() == [-0.25] * 6


def test_the_eval_bound_is_the_evaluations():
    from reasonrl.evaluate.loop import GENERATE_BATCH

    assert EVAL_EPISODES_PER_CALL == GENERATE_BATCH


# ---- on the package's own base class ---------------------------------------------------------

def openenv_or_skip():
    return pytest.importorskip("openenv.core.env_server.http_server",
                               reason="openenv-core is not installed (pip install 'reasonrl[openenv]')")


def test_an_environment_subclass_in_this_process(tokenizer):
    """Guess (an openenv Environment subclass, pydantic Action/Observation): the record's
    extra_info.reset seed 7 sets the target; "5" -> "higher" (-0.1), "7" -> done (+1)."""
    openenv_or_skip()
    cfg = env_config(f"env.fn={PKG}:Guess", "env.max_turns=3", "env.openenv.observation_field=hint",
                     "env.observation_format=chat")
    assert environment_spec(cfg.env).make.func is OpenEnvEpisode
    guess = Example("Guess my digit.", "7", meta={"reset": {"seed": 7}})
    r, _, _ = play(tokenizer, cfg, [["5<|im_end|>"], ["7<|im_end|>"]], [guess])
    assert r.episodes.reward.tolist() == pytest.approx([-0.1 + 1.0])
    assert [t.observation for t in r.episodes.turns[0]] == ["[user] higher", "[user] right"]
    assert "Guess my digit.\n\nGuess a digit.<|im_end|>" in tokenizer.decode(r.prompt_ids[0])
    assert r.truncated.tolist() == [False]
    with pytest.raises(ConfigError, match="Serial.SUPPORTS_CONCURRENT_SESSIONS is False"):
        environment_spec(env_config(f"env.fn={PKG}:Serial").env)


# ---- a real OpenEnv server on 127.0.0.1 ------------------------------------------------------

@pytest.fixture(scope="module")
def server():
    """openenv-core's app for `Flaky` (at most 4 sessions) under uvicorn, on a free loopback
    port, in a thread of this process; stopped (its hung steps released) at the end."""
    http_server = openenv_or_skip()
    uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed (openenv-core's server "
                                                    "needs it)")
    sys.path.insert(0, str(FIXTURES))
    import openenv_pkg

    app = http_server.create_fastapi_app(openenv_pkg.Flaky, openenv_pkg.EchoAction,
                                         openenv_pkg.EchoObservation, max_concurrent_envs=4)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical",
                                        timeout_graceful_shutdown=2))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(600):  # 30 s at most
        if srv.started or not thread.is_alive():
            break
        time.sleep(0.05)
    assert srv.started, "the OpenEnv server did not start within 30 s"
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"ws://127.0.0.1:{port}", openenv_pkg
    openenv_pkg.RELEASE.set()
    srv.should_exit = True
    thread.join(30)


def server_config(url: str, *overrides: str):
    return env_config("env.name=openenv", f"env.url={url}", *overrides)


def test_server_episodes_one_session_each(server, tokenizer):
    """Two episodes on the server (an http:// URL reaches it too): each turn a step of its own
    session; "boom" raises on the server (EXECUTION_ERROR: an error observation, counted, the
    episode goes on), "hang" is cut at env.step_timeout=1; every session is closed after."""
    url, pkg = server
    from reasonrl.envs.openenv_client import endpoints, probe_sessions

    cfg = server_config(url.replace("ws://", "http://"), "env.max_turns=3", "env.step_timeout=1")
    spec = environment_spec(cfg.env)
    assert isinstance(spec.make(), ServerEpisode)
    script = [["hi<|im_end|>", "boom<|im_end|>"], ["yo<|im_end|>", "again<|im_end|>"],
              ["hang<|im_end|>", "fine<|im_end|>"]]
    try:
        r, _, _ = play(tokenizer, cfg, script, n=2)
    finally:
        pkg.RELEASE.set()
    first, second = r.episodes.turns
    assert [t.observation for t in first] == ["\nhi\n", "\nyo\n", None]
    assert first[2].error == "environment step timed out after 1 s"
    assert second[0].error == ("the environment's step raised ServerError: the server answered "
                               "EXECUTION_ERROR: boom")
    assert [t.observation for t in second[1:]] == ["\nagain\n", "\nfine\n"]
    assert r.episodes.reward.tolist() == [0.5 + 0.5, 0.5 + 0.5]
    assert r.episodes.step_errors.tolist() == [1, 1] and r.episodes.step_timeouts.tolist() == [1, 0]
    assert "Say hi.\n\nready<|im_end|>" in tokenizer.decode(r.prompt_ids[0])  # reset's observation
    pkg.RELEASE.clear()
    deadline = time.monotonic() + 30  # the hung step's session closes once its step returns
    while probe_sessions(endpoints(url)[1], 4, 5, 5) != (4, None) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert probe_sessions(endpoints(url)[1], 4, 5, 5) == (4, None)


def test_the_servers_session_limit_is_checked_at_start_up(server):
    """4 sessions at most: a step of rollout.n=4 x 2 prompts is refused in one line naming the
    setting that queues episodes; with it (4 at a time) the check passes; rollout.n=8 cannot
    be queued; a held-out eval call counts too."""
    url, _ = server
    cfg = server_config(url, "trainer.batch_size=8", "rollout.n=4", "data.val_size=1")
    with pytest.raises(ConfigError) as err:
        check_sessions(cfg)
    assert str(err.value) == (
        f"env.url={url}: the server holds 4 sessions at once (the server answered CAPACITY_REACHED: Server "
        "at capacity: 4/4 sessions active. Cannot accept new connections.), but a training step "
        "(trainer.batch_size=8: rollout.n=4 x 2 prompts) plays 8 episodes at once, one session each; set "
        "env.max_concurrent_episodes=4 to queue them (4 at a time, whole prompts' groups), or start the "
        "server with a larger max_concurrent_envs")
    check_sessions(server_config(url, "trainer.batch_size=8", "rollout.n=4", "data.val_size=1",
                                 "env.max_concurrent_episodes=4"))
    with pytest.raises(ConfigError, match=r"fewer than one prompt's samples \(rollout.n=8, eval.n=1\)"):
        check_sessions(server_config(url, "trainer.batch_size=8", "rollout.n=8"))
    with pytest.raises(ConfigError, match=r"a held-out eval call \(eval.n=1 x 5 prompts: data.val_size=5"):
        check_sessions(server_config(url, "trainer.batch_size=4", "rollout.n=4", "data.val_size=5"))


def test_no_server_is_refused_in_one_line():
    pytest.importorskip("websockets.sync.client", reason="websockets is not installed (pip install "
                        "'reasonrl[openenv]'): without it env.url is refused for that first")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match=f"env.url=ws://127.0.0.1:{port}: no OpenEnv server answers at "
                                          f"http://127.0.0.1:{port} \\(/health, /schema\\)"):
        environment_spec(server_config(f"ws://127.0.0.1:{port}", "env.openenv.connect_timeout=2").env)


# ---- the example config -----------------------------------------------------------------------

def test_the_example_config_trains_two_steps(tmp_path, monkeypatch):
    """configs/envs/openenv_echo.yaml (openenv init's echo environment, unchanged, beside it) with
    the command docs/env-openenv.md prints; a stop string makes the tiny random model's turns
    end within their budget, so that episodes have several turns here."""
    openenv_or_skip()
    from reasonrl.cli import main

    assert main(["train", "configs/envs/openenv_echo.yaml", "model.path=tiny", "trainer.steps=2",
                 "trainer.batch_size=8", "rollout.n=4", "tracking.report=false", "trainer.progress=false",
                 "env.openenv.stop_strings=[e]", f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "step" in x][-2:] == [1, 2]
    step = lines[-1]
    assert step["env/step_errors"] == 0 and step["env/turns_mean"] > 1 and "reward/env" in step
