"""Asynchronous off-policy training (trainer.max_staleness = K > 0, `reasonrl.source.Ahead`): the
fixed schedule, staleness in the metrics, runs that repeat, resume and extend bitwise with
batches in flight, the rollout process's failures raised with its traceback, and the pieces
(records as plain data, weights through shared memory)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import helpers
import pytest
import torch
from helpers import assert_metrics_close, interrupt_after, keep_torch_threads, smoke_cfg  # noqa: F401 - an autouse fixture
from safetensors.torch import load_file

from reasonrl.batch import EpisodeStats, Example, Rollouts, Scores, StepBatch, Turn
from reasonrl.checkpoint import from_plain, plain_rng, to_plain
from reasonrl.errors import CheckpointError, ProducerError, TrainingInterrupted, WeightSyncError
from reasonrl.evaluate import eval_settings
from reasonrl.placement import share_weights, unshare_weights
from reasonrl.rng import rng_state
from reasonrl.rollout import prompt_seeds
from reasonrl.source import RaySide, SideParts, batches_allowed, split_threads, version_for
from reasonrl.source.channel import Produce, Stop, queue_pipe
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parents[2]
STEPS = 4
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vllm is not installed (make vllm)")


def cfg_for(out: Path, name: str, *overrides: str):
    """The smoke run of tests/helpers, 4 steps, one thread on each side, the held-out eval
    after steps 2 and 4 (besides before step 1)."""
    return smoke_cfg(out, name, f"trainer.steps={STEPS}", "rollout.threads=1", "optim.lr=1e-4",
                     "trainer.eval_every=2", *overrides)


def metrics(run: Path) -> list[dict]:
    """metrics.jsonl without timings (wall clock: `time/`, and the waits and idles of `async/`)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    timing = ("async/wait", "async/producer_idle", "async/sync_pause", "rollout/tokens_per_s")
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/")) and k not in timing}
            for r in rows]


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{STEPS}" / "huggingface" / "model.safetensors")


def assert_same_run(run: Path, reference: Path) -> None:
    a, b = final_weights(run), final_weights(reference)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "final weights differ"
    assert metrics(run) == metrics(reference)
    samples = [(run / "samples.jsonl").read_text(), (reference / "samples.jsonl").read_text()]
    assert samples[0] == samples[1]


def test_the_schedule_is_fixed_by_k():
    """Batch b comes from version max(0, b - K): K = 0 is on-policy; K = 1 is verl's one-step-off
    (batches 0 and 1 from version 0, then b from b - 1); K = 2 lags two versions."""
    assert [version_for(b, 0) for b in range(5)] == [0, 1, 2, 3, 4]
    assert [version_for(b, 1) for b in range(5)] == [0, 0, 1, 2, 3]
    assert [version_for(b, 2) for b in range(5)] == [0, 0, 0, 1, 2]


@pytest.mark.parametrize("k", [1, 2])
def test_the_schedule_does_not_depend_on_the_runs_length(k):
    """Each version asks for the batches up to its own + K, past the run's last step too (the
    last checkpoint keeps them for a run extended later), except the final version, whose
    weights the last checkpoint holds: a 4-step run asks for what the first 4 versions of a
    6-step run ask for, and nothing more."""
    def asked(steps: int, versions: int) -> list[list[int]]:
        first, out = 0, []
        for v in range(versions):
            todo = batches_allowed(v, first, k, steps)
            out.append(todo)
            first = todo[-1] + 1 if todo else first
        return out

    assert asked(4, 5)[:4] == asked(6, 4)
    assert asked(4, 5)[4] == []  # the final version makes no batch
    assert asked(4, 5)[0] == list(range(k + 1)) and asked(4, 5)[3] == [3 + k]
    for steps in (4, 6):
        assert all(version_for(b, k) == v for v, todo in enumerate(asked(steps, steps + 1)) for b in todo
                   if b > k)


def test_threads_are_shared_out_between_the_two_sides():
    """The trainer keeps every core, the rollout process gets half (oversubscribed: it idles while
    it waits for weights, tools and rewards); each side's own setting wins."""
    assert split_threads(0, 0, cores=2) == (2, 1)
    assert split_threads(0, 0, cores=64) == (64, 32)
    assert split_threads(0, 0, cores=1) == (1, 1)  # both sides still run: they take turns
    assert split_threads(0, 16, cores=64) == (64, 16)
    assert split_threads(8, 0, cores=64) == (8, 32)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted 4-step runs with K = 1 and K = 2."""
    out = tmp_path_factory.mktemp("async")
    runs = {}
    for k in (1, 2):
        Trainer(cfg_for(out, f"k{k}", f"trainer.max_staleness={k}")).fit()
        runs[k] = out / f"k{k}"
    return runs


@pytest.mark.parametrize("k, lags", [(1, [0, 1, 1, 1]), (2, [0, 1, 2, 2])])
def test_staleness_follows_the_schedule(straight, k, lags):
    """Step t (1-based) trains on batch t - 1 of version max(0, t - 1 - K): its lag in
    async/staleness, one-hot over 0..K in async/staleness_<k> (the report's histogram), and
    the times each side waited."""
    rows = [r for line in (straight[k] / "metrics.jsonl").read_text().splitlines()
            if "train/loss" in (r := json.loads(line))]
    assert [r["async/staleness"] for r in rows] == lags
    for r, lag in zip(rows, lags, strict=True):
        assert [r[f"async/staleness_{j}"] for j in range(k + 1)] == [float(j == lag) for j in range(k + 1)]
        assert r["async/wait"] >= 0 and r["async/producer_idle"] >= 0 and r["async/sync_pause"] >= 0
    # the runs train: a gradient, not a loss. On-policy (the old log-probs are recomputed, rho = 1)
    # the loss is -mean(A) over full-length rows, a rounding residue of GRPO's zero-sum
    # advantages: exactly 0 in 3 of 4 steps here, in all 4 on another CPU. The gradient is 0 only
    # in a step whose every group is flat (the length reward: 1/125 a group)
    assert any(r["train/grad_norm"] > 0 for r in rows)


@pytest.mark.parametrize("k", [1, 2])
def test_a_run_with_batches_in_flight_resumes_bitwise(straight, tmp_path, k):
    """Stopped after step 2 (K batches in flight, made by versions the checkpoint does not hold)
    and resumed to step 4 in new processes: the same weights, metrics and samples as the
    straight run, which is also what shows that a second run with the same seed repeats it."""
    stop_and_resume(tmp_path, k)
    assert_same_run(tmp_path / "r", straight[k])


def stop_and_resume(tmp_path: Path, k: int, *overrides: str) -> None:
    """Run r stopped by SIGINT after step 2 (checked: the batches in flight kept), then resumed."""
    over = [f"trainer.max_staleness={k}", "trainer.keep_last=0", *overrides]
    trainer = Trainer(cfg_for(tmp_path, "r", *over))
    interrupt_after(trainer, 2)  # the handler lets step 2 finish and save
    with pytest.raises(TrainingInterrupted):
        trainer.fit()
    assert trainer.source.worker is None  # the rollout process stopped with the run
    kept = torch.load(tmp_path / "r" / "checkpoints" / "step_2" / "state.pt", weights_only=True)["in_flight"]
    # asked for after step 2's sync: batches 2 .. 2 + K, versions 1 .. 2
    assert sorted(kept["batches"]) == [str(b) for b in range(2, 3 + k)]
    Trainer(cfg_for(tmp_path, "r", *over, "trainer.resume=auto")).fit()


@pytest.mark.parametrize("k", [1, 2])
def test_a_finished_run_extended_is_the_longer_run(straight, tmp_path, k):
    """A finished 2-step run, resumed with trainer.steps raised to 4: its last checkpoint kept
    the K batches made ahead by versions it trained past, so the extension is bitwise the
    straight 4-step run (weights, metrics, samples)."""
    extend(tmp_path, k, f"trainer.max_staleness={k}")
    assert_same_run(tmp_path / "x", straight[k])


def extend(tmp_path: Path, k: int, *overrides: str) -> None:
    """Run x trained to step 2 (its eval then as the 4-step run's), then extended to step 4."""
    Trainer(cfg_for(tmp_path, "x", *overrides, "trainer.steps=2", "trainer.keep_last=0")).fit()
    kept = torch.load(tmp_path / "x" / "checkpoints" / "step_2" / "state.pt", weights_only=True)["in_flight"]
    assert sorted(int(b) for b in kept["batches"]) == list(range(2, 2 + k))
    Trainer(cfg_for(tmp_path, "x", *overrides, "trainer.resume=auto",
                    "trainer.allow_config_change=[trainer.steps]")).fit()


# ---- ray mode: a thread of the trainer drives the rollout replicas ---------------------------

RAY = ["placement.mode=ray", "trainer.max_staleness=1"]


def test_ray_mode_trains_as_local_mode_does(ray_session, straight, tmp_path):
    """K = 1 with the policy and the rollout replica in Ray actors: each version snapshotted into
    the object store when it exists and loaded by the replica when the schedule reaches it, the
    prompt seeds from the producer's own generator (seeded as the local process's RNG), the
    held-out evals (before, after steps 2 and 4) on the replica in the stream's order. Every
    metric and sample equals local mode's K = 1 run; so do the final weights."""
    Trainer(cfg_for(tmp_path, "ray", *RAY)).fit()
    assert_same_run(tmp_path / "ray", straight[1])
    rows = metrics(tmp_path / "ray")
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2, 4]


def test_ray_mode_resumes_bitwise_with_a_batch_in_flight(ray_session, straight, tmp_path):
    stop_and_resume(tmp_path, 1, "placement.mode=ray")
    assert_same_run(tmp_path / "r", straight[1])


def test_ray_mode_with_two_ranks_and_two_replicas(ray_session, straight, tmp_path):
    """The snapshot gathered by two FSDP2 policy ranks, loaded by two rollout replicas (each
    half of the prompts): local mode's metrics to rel 1e-4 (float32 sums in another order)."""
    Trainer(cfg_for(tmp_path, "dp", *RAY, "placement.policy.ranks=2", "placement.rollout.replicas=2")).fit()
    assert_metrics_close(placement_metrics(tmp_path / "dp"), placement_metrics(straight[1]), rel=1e-4)


def test_a_finished_ray_run_extended_is_the_longer_run(ray_session, straight, tmp_path):
    """The extension of a finished run in ray mode, K = 2 (two batches kept in flight; K = 1's
    one batch is the resume above): bitwise the straight 4-step run (ray mode's runs are local
    mode's, bitwise: `test_ray_mode_trains_as_local_mode_does`)."""
    extend(tmp_path, 2, "placement.mode=ray", "trainer.max_staleness=2")
    assert_same_run(tmp_path / "x", straight[2])


def placement_metrics(run: Path) -> list[dict]:
    timing = ("async/wait", "async/producer_idle", "async/sync_pause")
    return [{k: v for k, v in r.items() if k not in timing} for r in helpers.metrics(run)]


def ray_side(rollout, transport) -> RaySide:
    cfg = smoke_cfg(Path("/unused"), "x")
    return RaySide(cfg, SideParts([], [], eval_settings(cfg), 1, rollout, transport))


class FakeReplicas:
    """The parts a ray-mode producer drives, recording what reaches the replicas."""

    def __init__(self, due):
        self.due, self.loaded = due, []

    def probe_due(self):
        return self.due

    def load(self, refs, checks):
        self.loaded.append((refs, checks))


@pytest.mark.parametrize("due", [None, [5, 6]])
def test_a_probe_computed_at_publish_goes_only_with_a_push_the_engine_probes(due):
    """The policy's probe log-probs are computed when a version is published (the replicas are
    busy then); the producer's thread passes them on only when the replicas want that push
    probed."""
    fake = FakeReplicas(due)
    side = ray_side(fake, fake)
    probe = torch.tensor([-0.5])
    side.load(["ref"], dict(version=3, expected_checksum=1.0, expected_probe=probe))
    (refs, checks), = fake.loaded
    assert refs == ["ref"] and checks["version"] == 3 and checks["expected_checksum"] == 1.0
    assert checks["expected_probe"] is (probe if due else None)


def test_a_push_the_replicas_want_probed_without_a_probe_is_an_error():
    """An engine whose registry entry says it never probes, whose replicas ask for a probe: the
    load fails rather than skipping the check."""
    fake = FakeReplicas([5, 6])
    side = ray_side(fake, fake)
    with pytest.raises(WeightSyncError, match="version 3: the rollout engine wants this push checked"):
        side.load(["ref"], dict(version=3, expected_checksum=1.0, expected_probe=None))
    assert fake.loaded == []


@needs_vllm
def test_vllm_replicas_train_asynchronously_with_every_push_probed(ray_session, tmp_path):
    """K = 1 in ray mode with a vLLM engine in the rollout actor: every version is checked there
    by checksum and by the probe log-probs the policy computed when it published it
    (rollout.vllm.probe_every=1); the schedule holds and vLLM's log-probs are the policy's."""
    Trainer(cfg_for(tmp_path, "v", *RAY, "rollout.engine=vllm", "rollout.vllm.probe_every=1",
                    "algo.importance_correction=tis")).fit()
    rows = [r for r in metrics(tmp_path / "v") if "train/loss" in r]
    assert [r["async/staleness"] for r in rows] == [0, 1, 1, 1]
    assert rows[0]["train/logprob_diff_max"] < 1e-3  # on-policy batch: engine and policy agree
    assert [r["step"] for r in metrics(tmp_path / "v") if "eval/accuracy" in r] == [0, 2, 4]


def test_the_ray_producers_seeds_are_the_local_processs():
    """Local mode's process seeds torch's global RNG with trainer.seed + 1; the ray producer's
    generator, seeded the same, draws the same prompt seeds; its state round-trips."""
    cfg = smoke_cfg(Path("/unused"), "x")
    side = ray_side(None, None)
    state = side.state()
    torch.manual_seed(cfg.trainer.seed + 1)
    expected = prompt_seeds(4)
    assert prompt_seeds(4, side.generator) == expected
    side.set_state(state)
    assert prompt_seeds(4, side.generator) == expected


def test_either_sides_state_continues_the_other_s_seeds():
    """A run resumed with placement.mode changed (--allow-config-change placement.mode): the ray
    side takes the local process's state (its torch RNG) and continues its prompt seeds."""
    with torch.random.fork_rng():
        torch.manual_seed(123)
        local_state = {"sampler": {}, "rng": plain_rng(rng_state())}
        expected = prompt_seeds(4)
    side = ray_side(None, None)
    side.sampler.load_state_dict = lambda state: None  # the sampler's own round trip is tested elsewhere
    side.set_state(local_state)
    assert prompt_seeds(4, side.generator) == expected


def test_the_queue_channel_ends_like_a_pipe():
    a, b = queue_pipe()
    a.send(Produce(1))
    a.send(Produce(2))
    assert b.recv() == Produce(1)
    a.drop_unread()  # what b did not read yet is gone
    a.close()
    for _ in range(2):  # every later recv sees the end
        with pytest.raises(EOFError):
            b.recv()
    with pytest.raises(OSError):
        a.send(Stop())


def test_a_dead_rollout_process_is_an_error_naming_it(tmp_path):
    trainer = Trainer(cfg_for(tmp_path, "dead", "trainer.max_staleness=1"))
    try:
        trainer.step()
        trainer.source.worker.kill()
        with pytest.raises(ProducerError, match="rollout process (exited|failed)"):
            for _ in range(3):
                trainer.step()
    finally:
        trainer.source.close()
        trainer.run.release()


def test_a_failure_in_the_rollout_process_comes_back_with_its_traceback(tmp_path):
    """The rollout process builds its own engine: a model it cannot load (here: moved away after
    the trainer loaded it) fails there, and the step raises it with the process's traceback."""
    import dataclasses

    cfg = cfg_for(tmp_path, "bad", "trainer.max_staleness=1")
    trainer = Trainer(cfg)
    gone = dataclasses.replace(cfg.model, path=str(tmp_path / "gone"))
    trainer.source.cfg = dataclasses.replace(cfg, model=gone)
    try:
        with pytest.raises(ProducerError, match="(?s)rollout process failed while producing batch 0.*"
                                                "Traceback.*gone"):
            trainer.step()
    finally:
        trainer.source.close()
        trainer.run.release()


def step_batch() -> StepBatch:
    ex = Example("What is 2+2?", "4", "arith", {"origin": "f.jsonl:3", "pair": (1, "a")})
    episodes = EpisodeStats("tool", [[Turn("x", "calc: 1", "1", None, 0.5)], [Turn("y")]],
                            torch.tensor([1, 0]), torch.tensor([0, 0]), torch.tensor([0, 0]),
                            torch.tensor([0, 0]), torch.tensor([0, 0]), torch.tensor([0.5, 0.0]), 1.25)
    rollouts = Rollouts([[1, 2], [1, 2]], [[3, 4], [5]], ["a", "b"], torch.tensor([0, 0]),
                        torch.tensor([False, True]), [ex, ex],
                        [torch.tensor([-0.5, -1.0]), torch.tensor([-2.0])],
                        policy_version=3, token_mask=[[1, 0], [1]], episodes=episodes)
    scores = Scores(torch.tensor([1.0, 0.0]), {"correct": torch.tensor([1.0, 0.0])}, failures=[None, "boom"])
    return StepBatch(rollouts, scores, torch.tensor([1.0, 0.0]), torch.tensor([True, True]),
                     {"rollout/groups": 1.0}, {"rollout": 0.5})


def test_step_records_round_trip_through_plain_data(tmp_path):
    """What a checkpoint keeps of a batch in flight reads back through torch's weights-only
    unpickler as the same records (tuples stay tuples)."""
    path = tmp_path / "s.pt"
    torch.save(to_plain(step_batch()), path)
    back = from_plain(torch.load(path, weights_only=True))
    want = step_batch()
    assert back.rollouts.examples == want.rollouts.examples
    assert back.rollouts.examples[0].meta["pair"] == (1, "a")
    assert back.rollouts.episodes.turns == want.rollouts.episodes.turns
    assert back.rollouts.policy_version == 3 and back.rollouts.token_mask == [[1, 0], [1]]
    pairs = zip(back.rollouts.sampler_logprobs, want.rollouts.sampler_logprobs, strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    assert back.scores.failures == [None, "boom"]
    assert back.stats == want.stats and back.seconds == want.seconds
    assert torch.equal(back.scores.components["correct"], want.scores.components["correct"])


def test_plain_data_names_no_other_class():
    with pytest.raises(CheckpointError, match="unknown record 'Evil'"):
        from_plain({"__record__": "Evil", "x": 1}, "state.pt")
    with pytest.raises(TypeError, match="not a step record"):
        import dataclasses

        @dataclasses.dataclass
        class Other:
            x: int = 1

        to_plain(Other())


def test_weights_cross_in_one_shared_buffer_per_dtype():
    named = [("a", torch.arange(6.0).view(2, 3)), ("b", torch.tensor([1.5], dtype=torch.bfloat16)),
             ("c", torch.ones(4).t())]
    buffers, layout = share_weights(named)
    assert sorted(buffers) == ["bfloat16", "float32"] and all(b.is_shared() for b in buffers.values())
    back = unshare_weights(buffers, layout)
    assert [n for n, _ in back] == ["a", "b", "c"]
    assert all(torch.equal(x, y) and x.dtype == y.dtype for (_, x), (_, y) in zip(back, named, strict=True))
