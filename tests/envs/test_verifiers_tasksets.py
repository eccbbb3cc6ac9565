"""verifiers v1 tasksets (`data.task=verifiers`, `reward.task=verifiers`): a taskset's tasks as
examples, its `@vf.reward` functions scoring completions in reasonrl's reward workers (hand
computed), a reward that raises or hangs counted, the tasksets refused at start-up (what only a
verifiers rollout gives: tests/envs/test_verifiers_agent.py plays it) in one line each, the
config's rules, and the example config's two steps. The tasksets are the tests' own
(tests/fixtures/verifiers_tasksets.py); nothing is fetched."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from reasonrl.config import load_config
from reasonrl.data.tasks import load_examples
from reasonrl.errors import ConfigError

REPO = Path(__file__).parents[2]
TASKSETS = REPO / "tests" / "fixtures" / "verifiers_tasksets.py"
SYSTEM = "Reverse the text character-by-character."


def config(*overrides: str):
    return load_config(REPO / "configs" / "smoke.yaml", ["data.task=verifiers", "reward.task=verifiers",
                                                         *overrides])


def verifiers_or_skip():
    pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install "
                                               "'reasonrl[verifiers]')")


@pytest.mark.parametrize("overrides, message", [
    (["data.task=arithmetic", "data.verifiers.taskset=x.py:T"],
     "data.verifiers.taskset: set, but data.task=arithmetic; they configure data.task=verifiers"),
    ([], "data.verifiers.taskset: required when data.task=verifiers"),
    (["data.verifiers.taskset=x.py:T", "reward.task=numeric"],
     "reward.task: numeric, but data.task=verifiers is scored by its taskset's own rewards"),
])
def test_config_rules(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(*overrides)


def test_a_tasksets_tasks_become_examples():
    """Reverse's train split (ab, abc, xyz) and, with val_args, its test split (hello): the
    system prompt and the prompt as chat messages, the answer as the ground truth, each
    example carrying what rebuilds its task in a reward worker."""
    verifiers_or_skip()
    cfg = config(f"data.verifiers.taskset={TASKSETS}:Reverse", "data.verifiers.val_args={split: test}")
    train, held_out = load_examples(cfg.data, seed=0)
    assert [e.prompt for e in train] == [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": w}] for w in ("ab", "abc", "xyz")]
    assert [e.ground_truth for e in train] == ["ba", "cba", "zyx"] and held_out[0].ground_truth == "olleh"
    assert train[0].data_source == "verifiers/Reverse" and train[2].meta["origin"] == "Reverse:2"
    info = train[1].meta["verifiers"]
    assert info["taskset"] == f"{TASKSETS}:Reverse" and info["task_class"] == "ReverseTask"
    assert info["data"]["answer"] == "cba" and info["data"]["prompt"] == "abc"
    assert held_out[0].meta["verifiers"]["args"] == {"split": "test"}
    limited, _ = load_examples(config(f"data.verifiers.taskset={TASKSETS}:Reverse",
                                      "data.verifiers.limit=2").data, 0)
    assert len(limited) == 2


def test_the_tasks_rewards_score_the_transcript_here_and_in_the_workers():
    """The trace of a reply: system, user, the model's (sampled) message. exact (weight 1) +
    brevity's short (weight 0.5): "ba" -> 1 + 0.5; "nope" -> 0 + 0; "b" -> 0 + 0.5. The same
    through the reward workers (reward.task=verifiers), with each reward a named part."""
    verifiers_or_skip()
    from reasonrl.rewards import score_examples
    from reasonrl.rewards.verifiers_taskset import rebuild_task, score, transcript

    cfg = config(f"data.verifiers.taskset={TASKSETS}:Reverse")
    train, _ = load_examples(cfg.data, seed=0)
    task = rebuild_task(train[0].meta["verifiers"])
    trace = transcript(task, "ba")
    assert [m.role for m in trace.messages] == ["system", "user", "assistant"]
    assert trace.last_reply == "ba" and trace.num_turns == 1
    assert score("ba", "ba", train[0].meta) == {"score": 1.5, "exact": 1.0, "short": 1.0}
    assert score("nope", "ba", train[0].meta) == {"score": 0.0, "exact": 0.0, "short": 0.0}
    scores = score_examples(["ba", "nope", "b"], [train[0]] * 3, cfg.reward)
    assert scores.total.tolist() == [1.5, 0.0, 0.5] and scores.errors == 0 and scores.timeouts == 0
    assert scores.parts[2] == {"exact": 0.0, "short": 1.0}
    assert asyncio.run(task.score(transcript(task, "b"))) is None  # the taskset's own scoring agrees
    assert score("b", "ba", train[0].meta)["score"] == 0.5


def test_a_reward_that_raises_or_hangs_scores_0_and_is_counted():
    """Flaky's reward raises on "boom" and sleeps 60 s on "hang": each scores 0, counted in
    errors and timeouts (reward.timeout=2: the worker is killed), the right reply scores 1."""
    verifiers_or_skip()
    from reasonrl.rewards import score_examples

    cfg = config(f"data.verifiers.taskset={TASKSETS}:Flaky", "reward.timeout=2")
    train, _ = load_examples(cfg.data, seed=0)
    scores = score_examples(["boom", "hang", "ba"], train * 3, cfg.reward)
    assert scores.total.tolist() == [0.0, 0.0, 1.0]
    assert scores.errors == 1 and scores.timeouts == 1
    assert "RuntimeError: boom" in scores.failures[0] and "timed out" in scores.failures[1]


ROUTE = ("which need verifiers' own rollout: run it as an agent episode, data.verifiers.rollout=verifiers "
         "env.format=agent env.fn=reasonrl.envs.verifiers_agent:agent (docs/env-verifiers.md)")
NEITHER = "Neither reasonrl's reply (verifiers' null harness) nor verifiers' own rollout as reasonrl runs it"


@pytest.mark.parametrize("taskset, uses", [
    ("Runtime", "it uses RuntimeTask.setup (a runtime prepared or read); rewards that read more than the "
                f"transcript: correct(runtime) (runtime state from a custom rollout), {ROUTE}"),
    ("Stateful", f"it uses a State of its own, Counter (state a rollout's tools fill), {ROUTE}"),
    ("Tools", "it uses tool servers defined in a file loaded by its path (SearchServer: verifiers starts "
              "each as `python -m <its module>`; give the taskset as module:Class, importable); it also uses "
              "tools (SearchServer: MCP servers whose calls have side effects), which "
              "data.verifiers.rollout=verifiers"),
    ("Unscored", f"it uses no @vf.reward function (nothing to train on). {NEITHER}"),
    ("Silent", "the task has no prompt (the user opens the conversation: a simulated user, which only an "
               "Env of its own plays)"),
])
def test_what_only_a_verifiers_rollout_gives_is_refused_in_one_line(taskset, uses):
    """Refused by reasonrl's reply, each in one line: what verifiers' own rollout plays here names
    that route (tests/envs/test_verifiers_agent.py plays one), what nothing here plays says so."""
    verifiers_or_skip()
    with pytest.raises(ConfigError) as err:
        load_examples(config(f"data.verifiers.taskset={TASKSETS}:{taskset}").data, seed=0)
    text = str(err.value)
    assert text.startswith(f"data.verifiers.taskset={TASKSETS}:{taskset}")
    assert "refused: " in text and uses in text and "issue #44" not in text
    assert "\n" not in text


def test_a_taskset_with_its_own_env_is_refused():
    verifiers_or_skip()
    target = f"{REPO / 'tests' / 'fixtures' / 'verifiers_custom_env.py'}:Interview"
    with pytest.raises(ConfigError, match=r"refused: it uses an Env of its own, InterviewEnv \(a custom "
                                          r"episode loop.*reasonrl plays one agent per episode\)\. Neither"):
        load_examples(config(f"data.verifiers.taskset={target}").data, seed=0)


def test_a_taskset_that_is_not_one_is_refused():
    verifiers_or_skip()
    with pytest.raises(ConfigError, match=r"cannot load it: TypeError: .*'ReverseTask', not a verifiers.v1 "
                                          "Taskset subclass"):
        load_examples(config(f"data.verifiers.taskset={TASKSETS}:ReverseTask").data, seed=0)


def test_the_example_config_trains_two_steps(tmp_path):
    """configs/envs/verifiers_reverse_text.yaml (verifiers' reverse-text task and reward, beside
    it): two steps of the tiny model, the taskset's lcs reward scored in the reward workers."""
    verifiers_or_skip()
    from reasonrl.cli import main

    assert main(["train", "configs/envs/verifiers_reverse_text.yaml", "model.path=tiny", "trainer.steps=2",
                 "trainer.batch_size=8", "rollout.n=4", "tracking.report=false", "trainer.progress=false",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    step = [x for x in lines if x.get("step") == 2][-1]
    assert step["reward/errors"] == 0 and step["reward/timeouts"] == 0
    assert any(k.startswith("eval/") for x in lines for k in x)  # the held-out split (val_args)
