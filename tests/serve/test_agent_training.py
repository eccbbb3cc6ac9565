"""Training with agent episodes (env.format=agent, docs/agents.md) end to end on the tiny model:
asynchronous training tags every call with the policy version that served it (agent/staleness_*),
a run stopped and resumed is bitwise the straight run (on-policy and asynchronous), and the
pieces that make it so: the lockstep rounds, the episode-derived seeds, the ordered admission.

Rewards are given by the agent (`answers_scored`: by which of its prompt's episodes it is), never
read from what the tiny model samples."""

from __future__ import annotations

import importlib.util
import json
import threading
from pathlib import Path

import pytest
import torch
from helpers import Prompts, interrupt_after, keep_torch_threads  # noqa: F401 - an autouse fixture
from safetensors.torch import load_file

from reasonrl.config import load_config
from reasonrl.envs import run_calls
from reasonrl.envs.agent import agent_metrics
from reasonrl.errors import ConfigError, TrainingInterrupted
from reasonrl.rollout import SamplingParams
from reasonrl.rollout.base import Generation
from reasonrl.rollout.episodes import turn_seed

REPO = Path(__file__).parents[2]
AGENTS = REPO / "tests" / "fixtures" / "agents.py"
STEPS = 4
HAS_SERVER = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn", "openai"))
needs_server = pytest.mark.skipif(not HAS_SERVER, reason="fastapi, uvicorn (the `serve` extra) and openai "
                                                         "are not installed")


def cfg_for(out: Path, name: str, *overrides: str):
    """configs/agent.yaml on the tiny model, 4 steps of 2 prompts x 2 episodes, one thread a side,
    the held-out eval after steps 2 and 4; the agent is answer.py's loop scoring itself."""
    return load_config(REPO / "configs" / "agent.yaml", [
        "model.path=tiny", f"trainer.steps={STEPS}", "trainer.batch_size=4", "rollout.n=2",
        "rollout.max_new_tokens=8", "data.arithmetic.val_size=2", "eval.n=1", "trainer.eval_every=2",
        "trainer.progress=false", "trainer.threads=1", "tracking.report=false", "optim.lr=1e-3",
        f"env.fn={AGENTS}:answers_scored", f"trainer.output_dir={out}", f"trainer.run_name={name}",
        *overrides])


def staleness(k: int) -> list[str]:
    return [f"trainer.max_staleness={k}", "rollout.threads=1"] if k else []


def metrics(run: Path) -> list[dict]:
    """metrics.jsonl without wall-clock values (times, waits, idles, rates)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    timing = ("async/wait", "async/producer_idle", "async/sync_pause", "rollout/tokens_per_s")
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/")) and k not in timing}
            for r in rows]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{STEPS}" / "huggingface" / "model.safetensors")


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted 4-step runs, on-policy (K = 0) and asynchronous (K = 1)."""
    from reasonrl.train.trainer import Trainer

    out = tmp_path_factory.mktemp("agent_runs")
    for k in (0, 1):
        Trainer(cfg_for(out, f"k{k}", *staleness(k))).fit()
    return {k: out / f"k{k}" for k in (0, 1)}


@needs_server
@pytest.mark.parametrize("k, lags", [(0, [0, 0, 0, 0]), (1, [0, 1, 1, 1])])
def test_every_call_is_tagged_with_the_version_that_served_it(straight, k, lags):
    """Step t (0-based) trains on batch t, made by version max(0, t - K): each of its calls was
    served by that version (weights load between batches, never inside one), so every call's
    staleness is the batch's. The steps train (the agent's rewards 1, 0 in every group)."""
    rows = [r for r in metrics(straight[k]) if "train/loss" in r]
    assert [r["agent/staleness_mean"] for r in rows] == lags
    assert [r["agent/staleness_max"] for r in rows] == lags
    if k:
        assert [r["async/staleness"] for r in rows] == lags
    for r in rows:  # 2 calls by each of 4 episodes, none refused for its version
        assert (r["agent/episodes"], r["agent/calls_per_episode"], r["agent/failed"]) == (4, 2, 0)
        assert r["reward/mean"] == 0.5 and r["agent/failed_stale_version"] == 0
    assert all(r["train/grad_norm"] > 0 for r in rows)


@needs_server
@pytest.mark.parametrize("k", [0, 1])
def test_an_agent_run_stopped_and_resumed_is_bitwise_the_straight_run(straight, tmp_path, k):
    """Stopped by SIGINT after step 2 and resumed to step 4 (new endpoint, new threads, other
    timings; K = 1: the batch in flight kept): the same weights, metrics and samples."""
    from reasonrl.train.trainer import Trainer

    over = [*staleness(k), "trainer.save_every=2", "trainer.keep_last=0"]
    trainer = Trainer(cfg_for(tmp_path, "r", *over))
    interrupt_after(trainer, 2)
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    Trainer(cfg_for(tmp_path, "r", *over, "trainer.resume=auto")).fit()
    a, b = weights(tmp_path / "r"), weights(straight[k])
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), "final weights differ"
    assert metrics(tmp_path / "r") == metrics(straight[k])
    assert (tmp_path / "r" / "samples.jsonl").read_text() == (straight[k] / "samples.jsonl").read_text()


# ---- the pieces ---------------------------------------------------------------------------------

class Recording:
    """An engine that records each generate call's prompts and seeds and samples one token per
    row: its prompt's seed modulo 1000 (so a row's answer shows the seed it was given)."""

    def __init__(self):
        self.calls: list[tuple[list[list[int]], list[int] | None]] = []

    def generate(self, prompt_ids, params, seeds=None):
        self.calls.append(([list(p) for p in prompt_ids], None if seeds is None else list(seeds)))
        rows = [[(s or 0) % 1000] for s in (seeds or [0] * len(prompt_ids)) for _ in range(params.n)]
        return Generation(rows, [False] * len(rows), [torch.zeros(1) for _ in rows])


def job(prompt: list[int], episode: str, seed: int = 1):
    from reasonrl.serve.batcher import Job

    return Job(prompt, SamplingParams(n=1, max_new_tokens=1), seed, None, episode)


def test_a_round_waits_for_every_live_episode_and_orders_them_by_admission():
    """Episodes a, b, c live (admitted in that order): requests from c and a wait (b has none
    yet); b's starts the round, one generate call with a's, b's, c's prompts in that order,
    whatever order they came in. Then c ends: a round needs a and b only. A request of an
    episode that is over, or still waiting when it ends, is refused (EpisodeOver)."""
    from reasonrl.serve.batcher import EpisodeOver, Lockstep

    engine = Recording()
    batcher = Lockstep(engine, lambda: 0)
    try:
        for key in ("a", "b", "c"):
            batcher.start(key)
        late = [batcher.submit(job([3], "c")), batcher.submit(job([1], "a"))]
        assert batcher.rounds == 0 and not any(f.done() for f in late)  # b is live and has not asked
        first = batcher.submit(job([2], "b"))
        for f in [*late, first]:
            f.result(timeout=60)
        assert engine.calls == [([[1], [2], [3]], [1, 1, 1])] and batcher.rounds == 1
        waiting = batcher.submit(job([5], "c"))
        batcher.end("c")
        with pytest.raises(EpisodeOver):
            waiting.result(timeout=60)
        with pytest.raises(EpisodeOver):
            batcher.submit(job([6], "c")).result(timeout=60)
        both = [batcher.submit(job([8], "b", 7)), batcher.submit(job([7], "a", 9))]
        assert [f.result(timeout=60).completion_ids for f in both] == [[[7]], [[9]]]
        assert engine.calls[-1] == ([[7], [8]], [9, 7])
        batcher.end("a")
        batcher.end("b")
        batcher.drain()  # nothing live: returns, and no round can start
        assert batcher.rounds == 2
    finally:
        batcher.close()


def test_a_request_of_several_prompts_waits_as_one():
    """A completions request's prompts go in one round together (`submit_all`), rows of one
    generate call in their order."""
    from reasonrl.serve.batcher import Lockstep

    engine = Recording()
    batcher = Lockstep(engine, lambda: 0, max_rows=2)
    try:
        batcher.start("a")
        futures = batcher.submit_all([job([1], "a", 1), job([2], "a", 2), job([3], "a", 3)])
        assert [f.result(timeout=60).seed for f in futures] == [1, 2, 3]
        assert engine.calls == [([[1], [2]], [1, 2]), ([[3]], [3])]  # max_rows: 2 rows a call
    finally:
        batcher.close()


def test_calls_start_in_order_and_each_end_hands_its_slot_to_the_next():
    """One slot, three calls: start 0, end 0 and start 1 together, ...; a call past its timeout
    ends (its slot to the next) though its thread never returns."""
    events, hang = [], threading.Event()
    hooks = {"on_start": lambda i: events.append(("start", i)), "on_end": lambda i: events.append(("end", i))}
    out = run_calls([lambda: 1, lambda: 2, lambda: 3], timeout=60, workers=1, **hooks)
    assert [o.value for o in out] == [1, 2, 3]
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    events.clear()
    out = run_calls([hang.wait, lambda: 2], timeout=0.2, workers=1, **hooks)
    hang.set()
    assert out[0].timed_out and out[1].value == 2
    assert events == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]


def test_a_call_that_gives_no_seed_is_seeded_by_its_episode():
    """The k-th request of sample s of a prompt with seed S: turn_seed(S, s, k) (a function of
    the episode alone); a greedy rollout's episodes (no prompt seed) from their prompt's ids."""
    from reasonrl.serve.agent_episodes import call_seed, prompt_seed

    assert call_seed(123, 1, 2) == turn_seed(123, 1, 2)
    assert len({call_seed(123, s, k) for s in range(3) for k in range(1, 4)}) == 9
    assert prompt_seed([1, 2, 3]) == prompt_seed([1, 2, 3]) != prompt_seed([1, 2, 4])


@needs_server
def test_an_episode_is_live_from_its_start_to_its_end_and_its_seeds_are_its_own(tiny):
    """Through the endpoint (tiny model): an episode's two chat calls without a seed are sampled
    from call_seed(prompt seed, sample, 1) and (..., 2); with one slot (concurrency 1) the
    episodes run one after another, each round one episode's call."""
    import copy

    from reasonrl.batch import Example
    from reasonrl.envs import environment_spec
    from reasonrl.rollout import RolloutWorker
    from reasonrl.rollout.hf import HFEngine
    from reasonrl.serve import CallLog
    from reasonrl.serve.agent_episodes import call_seed, serving

    cfg = load_config(REPO / "configs" / "smoke.yaml", ["env.format=agent", f"env.fn={AGENTS}:answers_scored",
                                                        "env.agent.concurrency=1"])
    engine = HFEngine(copy.deepcopy(tiny[0]), tiny[1], decoder="modules", reuse_kv=False)
    worker = RolloutWorker(engine, tiny[1], env=environment_spec(cfg.env))
    log = CallLog()
    endpoint = serving(worker)[0]
    endpoint.on_call.append(log)
    r = worker.rollout([Example("What is 2 + 3?", "5")], SamplingParams(n=2, max_new_tokens=4), seeds=[41])
    assert r.episodes.agent["calls"].tolist()[:1] == [2] and not r.episodes.agent["failed_raised"].any()
    episodes = list(dict.fromkeys(x.episode for x in log.records))
    assert [x.episode for x in log.records] == [episodes[0]] * 2 + [episodes[1]] * 2  # one at a time
    assert [x.seed for x in log.records] == [call_seed(41, s, k) for s in (0, 1) for k in (1, 2)]
    assert endpoint.batcher.rounds == 4 and not endpoint.live


def test_staleness_of_the_calls_against_the_trained_version():
    """Hand-built: 3 episodes' first rows (a split episode's second row carries zeros): calls 2,
    1, 0 served by versions (3, 4), (2), (): trained version 5 -> staleness (2 + 1 + 3) / 3 = 2,
    max 5 - 2 = 3; the episode with no call counts in neither."""
    long = torch.long
    agent = {name: torch.zeros(4, dtype=long) for name in
             ("chains", "untrained_calls", "other_sampling", "given", "dropped")}
    agent.update({f"failed_{r}": torch.zeros(4, dtype=long) for r in
                  ("raised", "timeout", "no_call", "malformed", "stale_version", "bad_reward")})
    agent.update(calls=torch.tensor([2, 0, 1, 0]), version_sum=torch.tensor([7, 0, 2, 0]),
                 version_min=torch.tensor([3, 0, 2, 0]))
    m = agent_metrics(agent, trained_version=5)
    assert (m["agent/staleness_mean"], m["agent/staleness_max"]) == (2.0, 3.0)
    assert "agent/staleness_mean" not in agent_metrics(agent)  # no trained version: no staleness
    none = dict(agent, calls=torch.zeros(4, dtype=long))
    assert "agent/staleness_max" not in agent_metrics(none, trained_version=5)


def test_pin_version_false_needs_asynchronous_training():
    with pytest.raises(ConfigError, match=r"^env.agent.pin_version=false: on-policy .*trainer.max_staleness"):
        cfg_for(REPO / "runs", "x", "env.agent.pin_version=false")
    assert not cfg_for(REPO / "runs", "x", "env.agent.pin_version=false", *staleness(1)).env.agent.pin_version



# ---- split episodes (a harness that rewrites its history) with the other parts of a step -------

@needs_server
def test_dynamic_sampling_drops_and_refills_split_episodes_by_whole_groups(tiny):
    """DAPO's resampling over episodes of 2 sequences each: round 1 deals prompts 5 and 8; 8's
    episodes all score 1 (flat: dropped with its 4 rows), 5's score 1, 0; round 2 refills with 5
    again. The batch: 2 groups x 2 episodes x 2 rows, each row its episode's reward, and GRPO's
    advantages over the episodes given to each of their rows."""
    import copy

    from reasonrl.batch import Example
    from reasonrl.envs import environment_spec
    from reasonrl.rollout import RolloutWorker
    from reasonrl.rollout.hf import HFEngine
    from reasonrl.source.collect import collect_batch
    from reasonrl.train.advantage_stage import estimate_advantages

    cfg = load_config(REPO / "configs" / "smoke.yaml", [
        "env.format=agent", f"env.fn={AGENTS}:rewrites_history_flat_unless_five", "trainer.batch_size=4",
        "rollout.n=2", "algo.dynamic_sampling=true", "algo.max_resample=1"])
    engine = HFEngine(copy.deepcopy(tiny[0]), tiny[1], decoder="modules", reuse_kv=False)
    worker = RolloutWorker(engine, tiny[1], env=environment_spec(cfg.env))
    examples = [Example("What is 2 + 3?", "5"), Example("What is 4 + 4?", "8")]
    torch.manual_seed(0)
    batch = collect_batch(worker, Prompts(examples), SamplingParams(n=2, max_new_tokens=6), cfg)
    r = batch.rollouts
    assert len(r) == 8 and r.group.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert r.episode.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [e.ground_truth for e in r.examples] == ["5"] * 8  # prompt 8's group was dropped
    assert batch.stats["rollout/dropped_groups"] == 1 and batch.stats["rollout/resample_rounds"] == 1
    assert batch.stats["rollout/groups"] == 2 and batch.trainable.all()
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0] * 2 and len(batch.scores.total) == 8
    # before the filter: the 3 groups' 6 episodes (one reward each): (1 + 0 + 1 + 1 + 1 + 0) / 6
    assert batch.stats["reward/mean_before_filter"] == pytest.approx(4 / 6)
    advantages, _, _ = estimate_advantages(batch, None, None, batch.trainable, cfg.algo)
    a = 0.5 / (0.5 ** 0.5 + cfg.algo.std_eps)  # each group's 2 episodes: rewards 1, 0
    assert advantages.tolist() == pytest.approx([a, a, -a, -a] * 2, abs=1e-6)


def split_batch(rewards: list[float]):
    """Hand-built rows of one prompt's 3 episodes: episode 0 split in rows of 2 and 1 model
    tokens, episode 1 one row whose middle id is the environment's (mask 0), episode 2 split in
    rows of 1 and 2; `rewards` per episode, on each of its rows (`split_rows`)."""
    from reasonrl.batch import Example, Rollouts, Scores, StepBatch
    from reasonrl.source.collect import split_rows

    ex = Example("q", "a")
    full = Rollouts(prompt_ids=[[1]] * 5, completion_ids=[[2, 3], [4], [5, 6, 7], [8], [9, 10]],
                    texts=["x"] * 5, group=torch.zeros(5, dtype=torch.long),
                    truncated=torch.zeros(5, dtype=torch.bool), examples=[ex] * 5,
                    token_mask=[[1, 1], [1], [1, 0, 1], [1], [1, 1]], episode=torch.tensor([0, 0, 1, 2, 2]))
    first = full.episode_rows()[0]
    r = torch.tensor(rewards)
    return split_rows(StepBatch(full.take(first), Scores(r.clone(), {}), r, torch.ones(3, dtype=torch.bool)),
                      full)


def test_the_kl_in_the_reward_of_a_split_episode_is_summed_over_its_rows():
    """beta 0.5, token KL by hand (the environment's id's 9.0 masked out): episode KLs 0.1 + 0.2 +
    0.3 = 0.6, 0.5 + 0.5 = 1.0, 0 + 0.2 + 0.2 = 0.4; rewards 1, 0, 0.5 -> 0.7, -0.5, 0.3; GRPO over
    the 3 episodes, each row its episode's advantage; train/kl_in_reward the mean over episodes."""
    from reasonrl.config import AlgoConfig
    from reasonrl.train.advantage_stage import estimate_advantages

    batch = split_batch([1.0, 0.0, 0.5])
    kl = [torch.tensor(k) for k in ([0.1, 0.2], [0.3], [0.5, 9.0, 0.5], [0.0], [0.2, 0.2])]
    algo = AlgoConfig(beta=0.5, kl_in="reward")
    advantages, critic_batch, metrics = estimate_advantages(batch, kl, None, batch.trainable, algo)
    shaped = [0.7, -0.5, 0.3]
    mean = sum(shaped) / 3
    std = (sum((x - mean) ** 2 for x in shaped) / 2) ** 0.5
    a = [(x - mean) / (std + algo.std_eps) for x in shaped]
    assert advantages.tolist() == pytest.approx([a[0], a[0], a[1], a[2], a[2]], abs=1e-6)
    assert critic_batch is None and metrics["train/kl_in_reward"] == pytest.approx(2.0 / 3)


def test_a_critic_runs_over_each_row_of_a_split_episode_ending_with_its_reward():
    """GAE (gamma 1, lambda 0.5, no whitening) over each row's model tokens, its episode's reward
    at its end: row 0 values 0.2, 0.4, reward 1: deltas 0.2, 0.6 -> A = 0.2 + 0.5 x 0.6 = 0.5, 0.6;
    row 1 value 0.1: 0.9; row 2 values 0.3, (env), 0.5, reward 0: deltas 0.2, -0.5 -> -0.05, 0,
    -0.5; rows 3, 4 (reward 0.5) values 0.5 and 0.1, 0.3: 0; 0.2 + 0.5 x 0.2 = 0.3, 0.2. Returns
    A + V: the critic's targets, on the model tokens."""
    from reasonrl.config import AlgoConfig
    from reasonrl.train.advantage_stage import estimate_advantages

    batch = split_batch([1.0, 0.0, 0.5])
    values = [torch.tensor(v) for v in ([0.2, 0.4], [0.1], [0.3, 0.9, 0.5], [0.5], [0.1, 0.3])]
    algo = AlgoConfig(advantage="gae", lam=0.5, whiten_advantages=False)
    advantages, critic_batch, _ = estimate_advantages(batch, None, values, batch.trainable, algo)
    expected = [[0.5, 0.6, 0.0], [0.9, 0.0, 0.0], [-0.05, 0.0, -0.5], [0.0, 0.0, 0.0], [0.3, 0.2, 0.0]]
    assert advantages.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]
    returns = [[0.7, 1.0], [1.0], [0.25, 0.0, 0.0], [0.5], [0.4, 0.5]]
    assert [r.tolist() for r in critic_batch.returns] == [pytest.approx(row, abs=1e-6) for row in returns]


def test_a_critic_with_discount_or_kl_in_the_reward_is_refused_for_agents():
    """A split episode's earlier sequence ends before the episode: with gamma < 1 or the KL in the
    reward its returns would be wrong, so the combination is refused at start-up, naming the keys."""
    for over, why in ((["algo.gamma=0.9"], "algo.gamma=0.9"),
                      (["algo.beta=0.1", "algo.kl_in=reward"], "algo.beta > 0 with algo.kl_in=reward")):
        with pytest.raises(ConfigError, match=f"^algo.advantage=gae with env.format=agent and {why}: "):
            cfg_for(REPO / "runs", "x", "algo.advantage=gae", *over)
    assert cfg_for(REPO / "runs", "x", "algo.advantage=gae", "algo.beta=0.1").algo.kl_in == "loss"


def two_steps(tmp_path: Path, *overrides: str) -> list[tuple[dict, object, torch.Tensor]]:
    """Two training steps of configs/agent.yaml with the history-rewriting agent (4 episodes of 2
    sequences a step, rewards 1, 0 in each group): (metrics, batch, advantages) of each."""
    from reasonrl.train.trainer import Trainer

    trainer = Trainer(cfg_for(tmp_path, "s", "trainer.steps=2", "trainer.eval_every=0",
                              f"env.fn={AGENTS}:rewrites_history_scored", *overrides))
    try:
        return [trainer.step() for _ in range(2)]
    finally:
        trainer.workers.close()


def split_rows_of(batch) -> tuple[list[int], torch.Tensor]:
    """The episodes' first rows and each row's episode, checked: 4 episodes of 2 rows each."""
    first, of = batch.rollouts.episode_rows()
    assert len(batch.rollouts) == 8 and first == [0, 2, 4, 6] and of.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0] * 2
    return first, of


@needs_server
@pytest.mark.parametrize("combo", ["dynamic_sampling", "kl_in_reward"])
def test_split_episodes_train_with_dynamic_sampling_and_the_kl_in_the_reward(tmp_path, combo):
    """Two steps each: every row trains with its episode's advantage (one per episode: GRPO over
    each prompt's 2 episodes, plus the KL's share in the KL's run), and the metrics count episodes."""
    over = {"dynamic_sampling": ["algo.dynamic_sampling=true"],
            "kl_in_reward": ["algo.beta=0.5", "algo.kl_in=reward"]}[combo]
    steps = two_steps(tmp_path, *over)
    for metrics, batch, advantages in steps:
        first, of = split_rows_of(batch)
        assert batch.trainable.all() and torch.equal(advantages, advantages[first][of])
        assert (metrics["agent/episodes"], metrics["agent/split"], metrics["reward/mean"]) == (4, 4, 0.5)
        assert metrics["train/grad_norm"] > 0
    if combo == "dynamic_sampling":
        a = 0.5 / (0.5 ** 0.5 + 1e-4)  # nothing flat: nothing dropped, the plain GRPO advantages
        for metrics, _, advantages in steps:
            assert metrics["rollout/dropped_groups"] == 0 and metrics["rollout/groups"] == 2
            assert advantages.tolist() == pytest.approx([a, a, -a, -a] * 2, abs=1e-6)
    else:  # step 1: the policy is the reference (KL 0); step 2: it moved, and the KL is in the reward
        assert steps[0][0]["train/kl_in_reward"] == 0.0 and steps[1][0]["train/kl_in_reward"] > 0


@needs_server
def test_split_episodes_train_a_critic_on_every_row(tmp_path):
    """gae (gamma = lambda = 1): each row's return is its episode's reward at every model token, so
    the critic's returns_mean is the rows' rewards weighed by their model tokens; the advantages
    are per token [8, T]."""
    for metrics, batch, advantages in two_steps(tmp_path, "algo.advantage=gae"):
        split_rows_of(batch)
        tokens = batch.rollouts.model_lengths
        assert advantages.dim() == 2 and advantages.shape[0] == 8
        expected = (batch.rewards * tokens).sum().item() / tokens.sum().item()
        assert metrics["critic/returns_mean"] == pytest.approx(expected, abs=1e-6)
        assert metrics["agent/split"] == 4
