"""Agent episodes in training (env.format=agent, docs/agents.md) on the tiny model, over loopback:
an agent's calls are recorded by their ids and joined into one sequence when each extends the
one before (environment ids masked, sampled ids and their log-probs kept), split when a call
rewrites the history; failures are counted and scored 0 (or dropped); the command form; a
training run from configs/agent.yaml; and the in-process turn loop vs the same loop written as
an agent: the same ids, masks, log-probs and advantages from the same seeds.

Verdicts never hang on what the tiny model samples: rewards are given by the agents or built
from what was sampled."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from helpers import Prompts

from reasonrl.algo import AdvantageInputs, estimate
from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.envs import environment_spec, with_env_reward
from reasonrl.envs.agent import agent_metrics
from reasonrl.errors import ConfigError
from reasonrl.rewards import score_rollouts
from reasonrl.rollout import RolloutWorker, SamplingParams
from reasonrl.rollout.episodes import turn_seed
from reasonrl.rollout.hf import HFEngine
from reasonrl.serve import CallLog

REPO = Path(__file__).parent.parent.parent
AGENTS = REPO / "tests" / "fixtures" / "agents.py"
HAS_SERVER = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))
HAS_OPENAI = importlib.util.find_spec("openai") is not None
pytestmark = pytest.mark.skipif(not HAS_SERVER, reason="fastapi and uvicorn (the `serve` extra) are not "
                                                        "installed")
needs_openai = pytest.mark.skipif(not HAS_OPENAI, reason="the `openai` client is not installed (pip install "
                                                         "openai)")
EXAMPLES = [Example("What is 2 + 3?", "5"), Example("What is 4 + 4?", "8")]
EXTRA = [9, 10, 11]  # the ids tests/fixtures/agents.py:two_calls puts between its calls


def agent_cfg(*overrides: str, config: str = "smoke.yaml"):
    return load_config(REPO / "configs" / config, ["env.format=agent", *overrides])


def smoke_reward():
    return load_config(REPO / "configs" / "smoke.yaml", []).reward


@pytest.fixture(scope="module")
def engine(tiny):
    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    return HFEngine(model, tokenizer, decoder="modules", reuse_kv=False)


def agent_worker(engine, tokenizer, *overrides: str):
    return RolloutWorker(engine, tokenizer, env=environment_spec(agent_cfg(*overrides).env))


def logged(worker) -> CallLog:
    """Every call the worker's endpoint serves from now on."""
    from reasonrl.serve.agent_episodes import serving

    log = CallLog()
    serving(worker)[0].on_call.append(log)
    return log


@needs_openai
def test_calls_that_extend_are_one_sequence_with_the_environment_masked(engine, tokenizer):
    worker = agent_worker(engine, tokenizer, f"env.fn={AGENTS}:two_calls")
    log = logged(worker)
    torch.manual_seed(0)
    r = worker.rollout(EXAMPLES, SamplingParams(n=2, max_new_tokens=8))
    assert len(r) == 4 and r.group.tolist() == [0, 0, 1, 1] and r.episode.tolist() == [0, 1, 0, 1]
    assert r.episode_rows()[0] == [0, 1, 2, 3]  # joined: a row per episode
    agent = r.episodes.agent
    assert agent["calls"].tolist() == [2] * 4 and agent["chains"].tolist() == [1] * 4
    by_episode: dict[str, list] = {}
    for record in log.records:
        by_episode.setdefault(record.episode, []).append(record)
    assert len(by_episode) == 4
    expected = []
    for first, second in by_episode.values():
        assert second.prompt_ids == first.prompt_ids + first.completion_ids + EXTRA
        n1, n2 = len(first.completion_ids), len(second.completion_ids)
        expected.append((first.prompt_ids,  # the first call's prompt, then both calls and the ids between
                         first.completion_ids + EXTRA + second.completion_ids, [1] * n1 + [0] * 3 + [1] * n2,
                         list(first.logprobs) + [0.0] * 3 + list(second.logprobs),
                         tokenizer.decode(second.completion_ids, skip_special_tokens=True)))
    got = [(r.prompt_ids[i], r.completion_ids[i], r.token_mask[i], r.sampler_logprobs[i].tolist(), r.texts[i])
           for i in range(4)]
    assert sorted(got) == sorted(expected)  # exactly: the recorded ids and log-probs
    # the agent returned 0.5: its reward replaces the task's
    scores = with_env_reward(score_rollouts(r.texts, r.examples, smoke_reward()), r)
    assert scores.total.tolist() == [0.5] * 4
    m = agent_metrics(agent)
    assert (m["agent/episodes"], m["agent/joined"], m["agent/split"]) == (4, 4, 0)
    assert m["agent/calls_per_episode"] == 2
    assert m["agent/failed"] == 0 and m["agent/rewards_given"] == 4


@needs_openai
def test_a_history_rewrite_trains_every_sequence_as_a_row_of_its_episode(engine, tokenizer):
    worker = agent_worker(engine, tokenizer, f"env.fn={AGENTS}:rewrites_history")
    log = logged(worker)
    r = worker.rollout(EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=6), seeds=[1])
    assert len(r) == 4 and r.group.tolist() == [0] * 4 and r.episode.tolist() == [0, 0, 1, 1]
    assert r.episode_rows()[0] == [0, 2] and r.episode_rows()[1].tolist() == [0, 0, 1, 1]
    agent = r.episodes.agent  # an episode's counts on its first row, zeros on the others
    assert agent["chains"].tolist() == [2, 0, 2, 0] and agent["calls"].tolist() == [2, 0, 2, 0]
    assert agent["untrained_calls"].tolist() == [0] * 4
    m = agent_metrics(r.take(r.episode_rows()[0]).episodes.agent)
    assert (m["agent/episodes"], m["agent/joined"], m["agent/split"]) == (2, 0, 2)
    assert m["agent/untrained_calls"] == 0
    episodes: dict[str, list] = {}
    for record in log.records:
        episodes.setdefault(record.episode, []).append(record)
    assert [len(calls) for calls in episodes.values()] == [2, 2]
    expected = []
    for calls in episodes.values():  # the final call's sequence first, then the other; each all model ids
        text = tokenizer.decode(calls[-1].completion_ids, skip_special_tokens=True)
        expected.append([(c.prompt_ids, c.completion_ids, [1] * len(c.completion_ids), list(c.logprobs))
                         for c in (calls[1], calls[0])] + [text])
    got = [[(r.prompt_ids[i], r.completion_ids[i], r.token_mask[i], r.sampler_logprobs[i].tolist())
            for i in (e, e + 1)] + [r.texts[e]] for e in (0, 2)]
    assert sorted(got) == sorted(expected)
    assert not agent["given"].any()


@needs_openai
def test_a_split_episodes_sequences_share_its_advantage(engine, tokenizer):
    from reasonrl.source.collect import collect_batch
    from reasonrl.train.advantage_stage import estimate_advantages
    from reasonrl.train.step_metrics import batch_metrics

    cfg = agent_cfg(f"env.fn={AGENTS}:rewrites_history_scored", "trainer.batch_size=4", "rollout.n=2")
    worker = RolloutWorker(engine, tokenizer, env=environment_spec(cfg.env))
    batch = collect_batch(worker, Prompts(EXAMPLES), SamplingParams(n=2, max_new_tokens=6), cfg)
    r = batch.rollouts  # 2 prompts x 2 episodes x 2 sequences
    assert len(r) == 8 and r.group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert r.episode.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0] * 2  # the episode's, on each of its rows
    assert batch.trainable.all() and len(batch.scores.total) == 8
    assert all(sum(m) == len(m) > 0 for m in r.token_mask)  # every sequence's ids are sampled ids
    advantages, _, _ = estimate_advantages(batch, None, None, batch.trainable, cfg.algo)
    # GRPO over each prompt's 2 episodes, rewards 1 and 0: mean 0.5, std (ddof 1) sqrt(0.5)
    a = 0.5 / (0.5 ** 0.5 + cfg.algo.std_eps)
    assert advantages.tolist() == pytest.approx([a, a, -a, -a] * 2, abs=1e-6)
    assert advantages[0] == advantages[1] and advantages[2] == advantages[3]
    m = batch_metrics(batch, advantages, batch.trainable)  # per episode
    assert (m["agent/episodes"], m["agent/split"], m["agent/untrained_calls"]) == (4, 4, 0)
    assert m["reward/mean"] == 0.5 and m["advantage/mean"] == pytest.approx(0.0, abs=1e-6)


def test_episode_advantages_over_constructed_rows():
    """Hand-built: prompt 0's 3 episodes, the first split in 2 rows and the last in 2; rewards
    1, 0, 0.5: the advantages are the episodes' GRPO ones, given to each of their rows; with one
    row per episode (joined) the same as before."""
    from reasonrl.batch import Rollouts, Scores, StepBatch
    from reasonrl.config import AlgoConfig
    from reasonrl.source.collect import split_rows
    from reasonrl.train.advantage_stage import estimate_advantages

    ex = Example("q", "a")
    full = Rollouts(prompt_ids=[[1]] * 5, completion_ids=[[2, 3], [4], [5, 6, 7], [8], [9, 10]],
                    texts=["x"] * 5, group=torch.zeros(5, dtype=torch.long),
                    truncated=torch.zeros(5, dtype=torch.bool), examples=[ex] * 5,
                    episode=torch.tensor([0, 0, 1, 2, 2]))
    first, of = full.episode_rows()
    assert first == [0, 2, 3] and of.tolist() == [0, 0, 1, 2, 2]
    view = full.take(first)
    rewards = torch.tensor([1.0, 0.0, 0.5])
    batch = split_rows(StepBatch(view, Scores(rewards.clone(), {}), rewards, torch.ones(3, dtype=torch.bool)),
                       full)
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.5, 0.5] and len(batch.scores.total) == 5
    algo = AlgoConfig()
    advantages, _, _ = estimate_advantages(batch, None, None, batch.trainable, algo)
    # mean 0.5, std (ddof 1) sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    a = 0.5 / (0.5 + algo.std_eps)
    assert advantages.tolist() == pytest.approx([a, a, -a, 0.0, 0.0], abs=1e-7)
    # the joined case: one row per episode, as every other environment's rows
    joined = dataclasses.replace(view, episode=torch.tensor([0, 1, 2]))
    every = torch.ones(3, dtype=torch.bool)
    one, plain = (estimate_advantages(StepBatch(r, Scores(rewards, {}), rewards, every), None, None, every,
                                      algo)[0] for r in (joined, view))
    assert torch.equal(one, plain) and torch.equal(one, advantages[first])


def test_the_loss_weighs_a_split_episodes_rows_as_sequences_of_the_step():
    """Hand-computed: per-token loss -A (ratio 1), episode 0 split in rows of 2 and 3 model tokens
    (A = 1, both), episode 1 one row of 5 (A = -1). Token mean: every token once, as if joined:
    (-2 - 3 + 5) / 10 = 0. Sequence mean: episode 0 is 2 of the step's 3 sequences: (-1 - 1 + 1) / 3."""
    from reasonrl.algo import Totals, aggregate

    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float32)
    per_token = -torch.tensor([1.0, 1.0, -1.0])[:, None] * torch.ones(3, 5)
    totals = Totals.of([2, 3, 5])
    assert (totals.tokens, totals.sequences) == (10.0, 3.0)
    token = aggregate(per_token, mask, "token", totals.tokens, totals.sequences)
    sequence = aggregate(per_token, mask, "sequence", totals.tokens, totals.sequences)
    assert token.item() == pytest.approx(0.0) and sequence.item() == pytest.approx(-1 / 3)
    # summed over micro-batches of one row each: the same (the step's totals, not the micro-batch's)
    parts = [aggregate(per_token[i:i + 1], mask[i:i + 1], "sequence", totals.tokens, totals.sequences)
             for i in range(3)]
    assert sum(p.item() for p in parts) == pytest.approx(-1 / 3)


@needs_openai
@pytest.mark.parametrize("on_failure", ["zero", "drop"])
def test_failures_are_counted_and_score_zero_or_are_dropped(engine, tokenizer, on_failure):
    reasons = {"raises": "raised", "hangs": "timeout", "no_call": "no_call", "malformed": "malformed",
               "bad_reward": "bad_reward"}
    for agent, reason in reasons.items():
        timeout = 2 if agent == "hangs" else 120  # the others' calls must not time out on a loaded machine
        worker = agent_worker(engine, tokenizer, f"env.fn={AGENTS}:{agent}", f"env.agent.timeout={timeout}",
                              f"env.agent.on_failure={on_failure}")
        r = worker.rollout(EXAMPLES[:1], SamplingParams(n=2, max_new_tokens=4), seeds=[3])
        m = agent_metrics(r.episodes.agent)
        assert m[f"agent/failed_{reason}"] == 2 and m["agent/failed"] == 2, (agent, m)
        assert r.episodes.step_errors.tolist() == [1, 1] and "agent failed" in r.episodes.turns[0][-1].error
        # a reward of 1 from the task: what the agent returned or sampled cannot lift a failure
        scores = score_rollouts(r.texts, r.examples, smoke_reward())
        scores = with_env_reward(dataclasses.replace(scores, total=torch.ones(2)), r)
        assert scores.total.tolist() == [0.0, 0.0]
        assert scores.unscored.tolist() == [on_failure == "drop"] * 2
        if agent == "no_call":  # nothing sampled: the row trains nothing
            assert r.token_mask == [[0], [0]]


@pytest.fixture(scope="module")
def agents_module():
    """tests/fixtures/agents.py as the module `fixtures_agents` (env.fn=fixtures_agents:...), one
    object for the module's tests (env.fn's targets are loaded once), so a test can set its globals."""
    spec = importlib.util.spec_from_file_location("fixtures_agents", AGENTS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["fixtures_agents"] = module
    yield module
    del sys.modules["fixtures_agents"]


@needs_openai
@pytest.mark.parametrize("pin", [True, False])
def test_a_call_after_a_weight_push_is_refused_on_policy_and_tagged_otherwise(engine, tokenizer,
                                                                              agents_module, pin):
    worker = agent_worker(engine, tokenizer, "env.fn=fixtures_agents:pinned_version",
                          f"env.agent.pin_version={str(pin).lower()}",
                          f"trainer.max_staleness={int(not pin)}")
    log = logged(worker)
    agents_module.LOAD_DURING = lambda: setattr(worker, "policy_version", 7)  # a push, mid-episode
    r = worker.rollout(EXAMPLES[:1], SamplingParams(n=1, max_new_tokens=4), seeds=[2])
    m = agent_metrics(r.episodes.agent)
    if pin:
        assert m["agent/failed_stale_version"] == 1 and not log.records
        assert "policy_version=0 was asked" in r.episodes.turns[0][-1].error
    else:
        assert m["agent/failed"] == 0 and [x.policy_version for x in log.records] == [7]
        assert r.policy_version == 0  # the rows' oldest version: the rollout's


def test_the_command_form(engine, tokenizer):
    worker = agent_worker(engine, tokenizer, f"env.agent.command={sys.executable} "
                          f"{REPO / 'tests' / 'fixtures' / 'agent_command.py'}")
    log = logged(worker)
    r = worker.rollout(EXAMPLES, SamplingParams(n=2, max_new_tokens=6), seeds=[5, 6])
    agent = r.episodes.agent
    assert agent["calls"].tolist() == [1] * 4 and agent["given"].tolist() == [1] * 4
    scores = with_env_reward(score_rollouts(r.texts, r.examples, smoke_reward()), r)
    assert scores.total.tolist() == [1.0] * 4  # the command's printed reward
    assert sorted(map(tuple, r.completion_ids)) == sorted(tuple(x.completion_ids) for x in log.records)
    # its task: the example's, with the prompt as the turn loop renders it
    assert sorted(x.prompt_ids for x in log.records)[0] in [worker.encode(e) for e in EXAMPLES]


def test_agent_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="set one of env.fn"):
        agent_cfg()
    with pytest.raises(ConfigError, match="env.agent.timeout: set, but"):
        load_config(REPO / "configs" / "smoke.yaml", ["env.agent.timeout=3"])
    with pytest.raises(ConfigError, match="needs a function agent"):
        environment_spec(agent_cfg(f"env.fn={REPO / 'tests' / 'fixtures' / 'echo_env.py'}:Echo").env)
    with pytest.raises(ConfigError, match="not a program found"):
        environment_spec(agent_cfg("env.agent.command=no-such-program-here --x").env)


@needs_openai
def test_agent_config_trains_two_steps_and_writes_metrics(tmp_path):
    from reasonrl.cli import main

    assert main(["train", "configs/agent.yaml", "model.path=tiny", "trainer.steps=2", "trainer.batch_size=4",
                 "rollout.n=2", "rollout.max_new_tokens=8", "data.arithmetic.val_size=2", "eval.n=1",
                 "trainer.progress=false", f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["step"] >= 1]
    assert len(steps) == 2
    for line in steps:
        assert line["agent/episodes"] == 4 and line["agent/failed"] == 0
        assert line["agent/joined"] + line["agent/split"] == 4 and line["agent/calls_per_episode"] >= 1


@needs_openai
def test_a_history_rewriting_agent_trains_two_steps(tmp_path):
    from reasonrl.cli import main

    assert main(["train", "configs/agent.yaml", "model.path=tiny", "trainer.steps=2", "trainer.batch_size=4",
                 "rollout.n=2", "rollout.max_new_tokens=8", "data.arithmetic.val_size=2", "eval.n=1",
                 f"env.fn={AGENTS}:rewrites_history_scored", "trainer.progress=false",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=r"]) == 0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["step"] >= 1]
    assert len(steps) == 2
    for line in steps:  # 4 episodes of 2 sequences each: 8 rows trained, metrics per episode
        assert (line["agent/episodes"], line["agent/split"], line["agent/untrained_calls"]) == (4, 4, 0)
        assert line["reward/mean"] == 0.5 and line["agent/failed"] == 0


# ---- the equivalence: the turn loop in process vs the same loop as an agent program ----------

def play_through_agent(engine, tokenizer, cfg, example, seed):
    """`example`'s episode (n=1) by the in-process loop and by `plays_environment` through the
    endpoint, from `seed`."""
    from fixtures_agents import PLAY  # the agents_module fixture

    spec = environment_spec(cfg.env)
    params = SamplingParams(n=1, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    inside = RolloutWorker(engine, tokenizer, env=spec).rollout([example], params, seeds=[seed])
    PLAY.update(make=spec.make, tokenizer=tokenizer, max_turns=cfg.env.max_turns, stop=spec.stop_strings,
                turn_tokens=min(cfg.env.max_turn_tokens or params.max_new_tokens, params.max_new_tokens),
                turn_seed=turn_seed)
    agent = RolloutWorker(engine, tokenizer, env=environment_spec(dataclasses.replace(
        cfg.env, name="none", fn="fixtures_agents:plays_environment", format="agent")))
    outside = agent.rollout([example], params, seeds=[seed])
    return inside, outside


@needs_openai
@pytest.mark.parametrize("env", ["calculator", "echo"])
def test_the_turn_loop_and_the_same_loop_as_an_agent_give_the_same_rows(engine, tokenizer, env,
                                                                         agents_module):
    overrides = ["model.path=tiny", "rollout.max_new_tokens=24", "env.max_turn_tokens=8"]
    if env == "echo":  # stops at "e": the tiny model's turns end there, so episodes take several turns
        echo = REPO / "tests" / "fixtures" / "echo_env.py"
        overrides = [*overrides, "env.name=none", f"env.fn={echo}:Echo"]
    cfg = load_config(REPO / "configs" / "tool_calculator.yaml", overrides)
    examples = [Example("What is 347 * 29?", "10063", "calculator"),
                Example("What is 12 * 12?", "144", "calculator")]
    rows, turns = [], 0
    for k, example in enumerate(examples):
        inside, outside = play_through_agent(engine, tokenizer, cfg, example, seed=100 + k)
        assert outside.episodes.agent["chains"].tolist() == [1]
        assert outside.prompt_ids == inside.prompt_ids
        assert outside.completion_ids == inside.completion_ids
        assert outside.token_mask == inside.token_mask
        assert torch.equal(outside.sampler_logprobs[0], inside.sampler_logprobs[0])
        assert outside.texts == inside.texts
        # truncated: the last call ran out of tokens; the loop also marks an episode its turn limit
        # ended (an agent's own limits are its own, unknown to reasonrl)
        assert not outside.truncated[0] or inside.truncated[0]
        turns += len(inside.episodes.turns[0])
        rows.append((inside, outside))
    if env == "echo":
        assert turns > len(examples)  # several turns were compared, not only first turns
        return
    # the same rewards and advantages (the reward functions score the last answer of each)
    adv = []
    for which in (0, 1):
        rewards = torch.cat([with_env_reward(score_rollouts(r[which].texts, r[which].examples, cfg.reward),
                                             r[which]).total for r in rows])
        group = torch.zeros(len(rewards), dtype=torch.long)
        adv.append(estimate("grpo", AdvantageInputs(rewards, group, 1e-6))[0])
    assert torch.equal(adv[0], adv[1])

