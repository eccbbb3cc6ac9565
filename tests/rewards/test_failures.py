"""Failures a user can see: a reward function that fails on every call is printed (once per
kind, naming the function), recorded with the samples, and ends the run after
`trainer.max_bad_steps` steps in a row quoting the error -- not a silent `reward=0.000`."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import RESUME_STEPS, RESUME_TRAINS, assert_same_run, final_weights, resume_cfg, run_metrics

from reasonrl.cli import main
from reasonrl.config import load_config
from reasonrl.errors import DataError, TrainingAborted
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parents[2]
FAILING = f"{REPO / 'tests' / 'fixtures' / 'custom_reward.py'}:always_fails"


@pytest.mark.parametrize("isolate", ["false", "true"])
def test_a_reward_that_always_fails_is_seen_and_stops_the_run(tmp_path, capsys, isolate):
    cfg = load_config(REPO / "configs" / "smoke.yaml", [
        f"trainer.output_dir={tmp_path}", "trainer.run_name=r", "trainer.progress=false", "trainer.steps=5",
        "trainer.threads=1", "trainer.max_bad_steps=3", f"reward.fn={FAILING}",
        f"reward.isolate_fn={isolate}"])
    with pytest.raises(TrainingAborted, match=rf"3 bad steps in a row \(to step 3\), the last: every reward "
                                              rf"call failed, e.g. reward.fn {FAILING}: KeyError: "):
        Trainer(cfg).fit()
    err = capsys.readouterr().err
    first = f"a reward failed and scored 0: reward.fn {FAILING}: KeyError"
    assert err.count(first) == 1  # the first of its kind, once; the rest are counted
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/errors"] for r in rows if "reward/errors" in r] == [8.0, 8.0, 8.0]
    assert [r["train/bad_steps"] for r in rows if "train/bad_steps" in r] == [1.0, 2.0, 3.0]
    samples = [json.loads(line) for line in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["reward_error"].startswith(f"reward.fn {FAILING}: KeyError") for s in samples)
    # the report shows why those samples scored 0
    from reasonrl.report import _samples_html, load_run

    assert f"(reward failed: reward.fn {FAILING}: KeyError" in _samples_html(load_run(tmp_path / "r"))


# ---- issue 34: every fault ends in one line that names the fix --------------------------------
# (a hostile case per row: the message a user sees, its exit code, no traceback unless asked for)

HOSTILE = REPO / "tests" / "fixtures" / "hostile_rewards.py"
SMOKE = str(REPO / "configs" / "smoke.yaml")


def last_line(capsys) -> str:
    """The last line the command printed on stderr; no traceback before it."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return err.strip().splitlines()[-1]


# a reward that is not finite, or so large that float32 training cannot take it

@pytest.mark.parametrize("name, why", [
    ("huge", "reward 1e+308 is beyond +-1e+09, the most float32 training takes safely (it squares rewards "
             "and gradients); scale the reward down"),
    ("infinite", "reward is inf"),
    ("not_a_number", "reward is nan"),
    ("too_big_for_a_float", "reward is too large for a float (int too large to convert to float)")])
@pytest.mark.parametrize("isolated", [False, True])
def test_a_reward_not_finite_or_past_the_bound_is_a_counted_failure(name, why, isolated):
    from reasonrl.rewards.scoring import score
    from reasonrl.rewards.verifiers import Verifier

    bad = Verifier("custom", f"{HOSTILE}:{name}", (), isolated, 5.0, 1)
    good = Verifier("custom", f"{HOSTILE}:one", (), isolated, 5.0, 1)
    scores = score(["a", "b", "c"], ["1", "1", "1"], {"correct": 1.0}, verifiers=[bad, good, bad],
                   dtype=torch.float32)
    assert scores.total.tolist() == [0.0, 1.0, 0.0] and scores.errors == 2 and scores.timeouts == 0
    assert scores.failures == [f"reward.fn {HOSTILE}:{name}: ValueError: {why}", None,
                               f"reward.fn {HOSTILE}:{name}: ValueError: {why}"]
    assert scores.total.mean().item() == pytest.approx(1 / 3)  # finite: reward/mean is never null


def test_a_batch_reward_past_the_bound_fails_its_batch():
    from reasonrl.rewards.scoring import score
    from reasonrl.rewards.verifiers import Verifier

    batch = Verifier("batch", f"{HOSTILE}:huge_batch", (), False, 5.0, 1, batch=True)
    scores = score(["a", "b"], ["1", "1"], {"correct": 1.0}, verifiers=[batch, batch], dtype=torch.float32)
    assert scores.total.tolist() == [0.0, 0.0] and scores.errors == 2
    assert scores.failures[0] == (f"reward.batch_fn {HOSTILE}:huge_batch: ValueError: reward 1e+308 is "
                                  "beyond +-1e+09, the most float32 training takes safely (it squares "
                                  "rewards and gradients); scale the reward down")


def test_a_weighted_total_past_the_bound_is_a_counted_failure():
    """Each score is bounded; a huge weight is not: its row fails, counted, naming the weights."""
    from reasonrl.rewards.scoring import score
    from reasonrl.rewards.verifiers import Verifier

    good = Verifier("custom", f"{HOSTILE}:one", (), False, 5.0, 1)
    scores = score(["a", "b"], ["1", "1"], {"correct": 1e300, "format": 1.0}, verifiers=[good, good],
                   dtype=torch.float32)
    assert scores.total.tolist() == [0.0, 0.0] and scores.errors == 2
    assert scores.failures[0] == ("reward.weights: ValueError: the weighted total 1e+300 is beyond +-1e+09 "
                                  "(weights {'correct': 1e+300, 'format': 1.0}); lower the weights")


def test_an_environment_reward_past_the_bound_is_a_bad_step():
    from reasonrl.envs.base import BadStep, EnvStep, as_step

    with pytest.raises(BadStep, match=r"^the reward is 1e\+308, beyond \+-1e\+09, the most float32 training "
                                      r"takes safely; scale it down$"):
        as_step(EnvStep(reward=1e308))
    assert as_step(EnvStep(reward=-1e9)).reward == -1e9  # the bound itself is allowed


def test_a_reward_of_1e308_is_seen_and_reward_mean_is_never_null(tmp_path, capsys):
    """The issue's case: reward/mean was null at every step, with no word. Now each call is a
    counted failure, printed once, reward/mean is a number, and the run stops after
    trainer.max_bad_steps in one line, exit 1."""
    code = main(["train", SMOKE, f"trainer.output_dir={tmp_path}", "trainer.run_name=r",
                 "trainer.progress=false", "trainer.steps=4", "trainer.threads=1", "trainer.max_bad_steps=2",
                 f"reward.fn={HOSTILE}:huge", "reward.isolate_fn=false"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    why = "ValueError: reward 1e+308 is beyond +-1e+09"
    assert err.count(f"a reward failed and scored 0: reward.fn {HOSTILE}:huge: {why}") == 1
    assert err.strip().splitlines()[-1].startswith(
        f"reasonrl: error: 2 bad steps in a row (to step 2), the last: every reward call failed, e.g. "
        f"reward.fn {HOSTILE}:huge: {why}")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/mean"] for r in rows if "reward/errors" in r] == [0.0, 0.0]


# a reward that raises KeyboardInterrupt or SystemExit in a reward worker (issue 40)

def test_a_pooled_reward_raising_keyboard_interrupt_or_exit_is_an_error_like_any_other(capfd, monkeypatch):
    """Each worker printed its traceback and died (~40 tracebacks in a 3-step run); now either
    is a failure like any other: scored 0, counted, one line each, and the workers live on."""
    from reasonrl.rewards import pool
    from reasonrl.rewards.scoring import score
    from reasonrl.rewards.verifiers import Verifier

    monkeypatch.setattr(pool, "_POOLS", {})  # workers started in this test: their stderr is captured
    try:
        def custom(name: str) -> Verifier:
            return Verifier("custom", f"{HOSTILE}:{name}", (), True, 5.0, 2)

        assert score(["a", "b"], ["1", "1"], {"correct": 1.0}, verifiers=[custom("one")] * 2).errors == 0
        workers = pool.get_pool(2)
        started = sorted(w.proc.pid for w in workers._idle)
        names = ["interrupts", "exits", "one", "interrupts", "exits"]
        scores = score(["a"] * 5, ["1"] * 5, {"correct": 1.0}, verifiers=[custom(n) for n in names],
                       dtype=torch.float32)
        assert scores.total.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
        assert (scores.errors, scores.timeouts) == (4, 0)
        interrupted, exited = (f"reward.fn {HOSTILE}:interrupts: KeyboardInterrupt",
                               f"reward.fn {HOSTILE}:exits: called sys.exit(3)")
        assert scores.failures == [interrupted, exited, None, interrupted, exited]
        assert workers.killed == 0 and sorted(w.proc.pid for w in workers._idle) == started  # none replaced
        assert all(w.proc.poll() is None for w in workers._idle)
    finally:
        for workers in pool._POOLS.values():
            workers.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_run_whose_reward_raises_keyboard_interrupt_prints_one_line_and_no_traceback(tmp_path, capfd,
                                                                                       monkeypatch):
    """The issue's run: every call of reward.fn raises KeyboardInterrupt in the reward workers.
    The console holds the one summarised line of that failure and no traceback; the metrics
    count every call in reward/errors, and the run ends as a run whose reward always fails."""
    from reasonrl.rewards import pool

    monkeypatch.setattr(pool, "_POOLS", {})  # workers started in this test: their stderr is captured
    try:
        code = main(["train", SMOKE, f"trainer.output_dir={tmp_path}", "trainer.run_name=r",
                     "trainer.progress=false", "trainer.steps=3", "trainer.threads=1",
                     "trainer.max_bad_steps=2", f"reward.fn={HOSTILE}:interrupts"])
    finally:
        for workers in pool._POOLS.values():
            workers.close()
    err = capfd.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    first = f"a reward failed and scored 0: reward.fn {HOSTILE}:interrupts: KeyboardInterrupt (first of its"
    assert err.count(first) == 1
    # that line, one per bad step and the run's last: no worker's traceback or own message
    assert err.count("KeyboardInterrupt") == 4
    assert err.strip().splitlines()[-1].startswith(
        f"reasonrl: error: 2 bad steps in a row (to step 2), the last: every reward call failed, e.g. "
        f"reward.fn {HOSTILE}:interrupts: KeyboardInterrupt; stopping")
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/errors"] for r in rows if "reward/errors" in r] == [8.0, 8.0]


# a reward worker's memory: bounded by reward.max_memory_mb (issue 40)

def test_a_reward_past_its_workers_memory_bound_is_out_of_memory_and_the_worker_lives_on(monkeypatch):
    """A reward worker grew to whatever its function took (~4 GiB each). Now each is bounded
    (RLIMIT_DATA, set in the worker at start): a call past the bound gets a MemoryError, scores
    0 and is counted as "out of memory", the worker answers the next call. The hogs allocate 3x
    the bound they read from the worker and refuse to run without one, so none can take the
    machine's memory; the verdict is the kernel's refusal, not a race against the clock."""
    from reasonrl.rewards import pool
    from reasonrl.rewards.scoring import score
    from reasonrl.rewards.verifiers import Verifier

    monkeypatch.setattr(pool, "_POOLS", {})
    try:
        def custom(name: str, batch: bool = False) -> Verifier:
            return Verifier("batch" if batch else "custom", f"{HOSTILE}:{name}", (), True, 30.0, 1, batch,
                            max_memory_mb=512)

        bound = score(["a"], ["1"], {"correct": 1.0}, verifiers=[custom("memory_bound_mb")])
        assert bound.total.tolist() == [512.0]  # the worker's own RLIMIT_DATA
        workers = pool.get_pool(1, 512)
        started = [w.proc.pid for w in workers._idle]
        names = ["hog", "one", "grower", "one"]
        scores = score(["a"] * 4, ["1"] * 4, {"correct": 1.0}, verifiers=[custom(n) for n in names],
                       dtype=torch.float32)
        assert scores.total.tolist() == [0.0, 1.0, 0.0, 1.0]
        assert (scores.errors, scores.timeouts) == (2, 0)
        why = f"reward.fn {HOSTILE}:{{}}: out of memory (reward.max_memory_mb: 512 MB): MemoryError"
        assert scores.failures[0] == why.format("hog") and scores.failures[2] == why.format("grower")
        assert scores.failures[1] is None and scores.failures[3] is None
        from reasonrl.rewards.failures import failure_kind

        assert failure_kind(scores.failures[0]) == f"reward.fn {HOSTILE}:hog: out of memory"
        assert [w.proc.pid for w in workers._idle] == started and workers.killed == 0  # the same worker
    finally:
        for each in pool._POOLS.values():
            each.close()


def test_a_reward_worker_that_dies_is_counted_and_replaced(monkeypatch):
    """A worker ended from outside (SIGKILL, as the out-of-memory killer sends) scores its call
    0, counted, with the signal named; the next call gets a new worker."""
    from reasonrl.rewards import pool
    from reasonrl.rewards.scoring import score
    from reasonrl.rewards.verifiers import Verifier

    monkeypatch.setattr(pool, "_POOLS", {})
    try:
        def custom(name: str) -> Verifier:
            return Verifier("custom", f"{HOSTILE}:{name}", (), True, 30.0, 1, max_memory_mb=512)

        assert score(["a"], ["1"], {"correct": 1.0}, verifiers=[custom("one")]).errors == 0
        workers = pool.get_pool(1, 512)
        first = workers._idle[0].proc.pid
        scores = score(["a", "b"], ["1", "1"], {"correct": 1.0}, verifiers=[custom("killed"), custom("one")])
        assert scores.total.tolist() == [0.0, 1.0] and (scores.errors, scores.timeouts) == (1, 0)
        assert scores.failures[0] == (f"reward.fn {HOSTILE}:killed: reward worker exited (code -9, SIGKILL: "
                                      "the out-of-memory killer, or another process)")
        assert [w.proc.pid for w in workers._idle] != [first] and len(workers._idle) == 1  # replaced
    finally:
        for each in pool._POOLS.values():
            each.close()


def test_the_memory_bound_is_a_config_key_and_a_models_worker_has_none(monkeypatch):
    import resource

    from reasonrl.errors import ConfigError
    from reasonrl.placement import build_workers
    from reasonrl.rewards.verifiers import verifier_for

    cfg = load_config(SMOKE, [f"reward.fn={HOSTILE}:one", "reward.max_memory_mb=1024"])  # imported: a real fn
    assert verifier_for("arithmetic", cfg.reward).max_memory_mb == 1024
    assert verifier_for("math", load_config(SMOKE, ["reward.max_memory_mb=0"]).reward).max_memory_mb == 0
    assert load_config(SMOKE).reward.max_memory_mb == 2048
    with pytest.raises(ConfigError, match=r"^reward.max_memory_mb: 100 MB is too little for a reward worker, "
                                          r"whose interpreter and imports take ~300 MB before the reward "
                                          r"function runs: give >= 512, or 0 for no bound$"):
        load_config(SMOKE, ["reward.max_memory_mb=100"])
    with pytest.raises(ConfigError, match=r"^reward.max_memory_mb: must be > 0, or 0 for no bound, got -1$"):
        load_config(SMOKE, ["reward.max_memory_mb=-1"])
    # a judge's process loads a model: reward.max_memory_mb bounds the reward workers, never it
    judge_cfg = load_config(REPO / "configs" / "judge.yaml", ["model.path=tiny", "reward.model.path=tiny",
                                                               "reward.max_memory_mb=1024"])
    workers = build_workers(judge_cfg, roles=("judge",))
    try:
        pid = workers.judge.proc.pid
        assert resource.prlimit(pid, resource.RLIMIT_DATA)[0] == resource.RLIM_INFINITY
    finally:
        workers.close()


# data: one enormous line

def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_prompt_longer_than_its_byte_budget_is_refused_before_it_is_tokenised(tmp_path, capsys,
                                                                                 monkeypatch):
    from reasonrl.rollout.worker import RolloutWorker

    def no_tokenising(self, example):
        raise AssertionError("a prompt was tokenised")

    monkeypatch.setattr(RolloutWorker, "encode", no_tokenising)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "What is 1 + 1?", "ground_truth": "2"},
                                              {"prompt": "x" * 2049, "ground_truth": "1"}])
    run = ["train", SMOKE, "data.task=file", f"data.train_path={data}", "data.max_prompt_tokens=16",
           f"trainer.output_dir={tmp_path}"]
    assert main(run) == 2
    assert last_line(capsys) == (
        f"reasonrl: error: {data}:2: field 'prompt' is 2,049 bytes, more than data.max_prompt_tokens=16 "
        f"tokens can hold (at most 2,048 bytes: 128 bytes per token at most); refused before it is "
        f"tokenised. Shorten or drop the record, or raise data.max_prompt_tokens")
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "system", "content": "é" * 600},
                                                               {"role": "user", "content": "ü" * 500}],
                                                  "ground_truth": "1"}])  # 2 bytes a character
    from reasonrl.data import load_files

    with pytest.raises(DataError, match=rf"^{chat}:1: field 'messages' is 2,200 bytes, more than "):
        load_files(str(chat), max_prompt_tokens=16)
    assert len(load_files(str(chat), max_prompt_tokens=18)) == 1  # 2,304 bytes allowed
    assert len(load_files(str(data))) == 2  # no budget given (truncate_prompts=left): read as before


def test_a_line_past_the_read_bound_is_refused_as_it_is_read(tmp_path, monkeypatch):
    """A line longer than MAX_LINE_BYTES is never held whole: refused after that many bytes,
    naming the field it was in there."""
    from reasonrl.data import readers
    from reasonrl.data.readers import iter_records

    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 1000)
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "fine", "ground_truth": "1"},
        {"ground_truth": "1", "messages": [{"role": "user", "content": "a \" quote"},
                                           {"role": "user", "content": "y" * 5000}]}])
    reads = []
    real_open = Path.open

    def counting_open(self, *args, **kwargs):
        f = real_open(self, *args, **kwargs)
        real_readline = f.readline
        f.readline = lambda size=-1: reads.append(size) or real_readline(size)  # noqa: B023
        return f

    monkeypatch.setattr(Path, "open", counting_open)
    with pytest.raises(DataError) as refused:
        list(iter_records(path))
    assert str(refused.value) == (f"{path}:2: line longer than 1,000 bytes (field 'messages[1].content' "
                                  "passes that bound); refused before it is read whole. A record that long "
                                  "cannot be trained on: shorten or drop it")
    assert reads == [1001, 1001]  # never a read of the whole line


def test_a_50_mb_line_is_refused_without_gigabytes(tmp_path):
    """The issue's case, measured: `reasonrl train` on a file with one 50 MB prompt peaked past
    5 GB (7.0 GB here) tokenising it before the length check refused it; now the byte budget
    refuses it as the file is read: the whole command peaks at about 0.5 GB."""
    data = tmp_path / "big.jsonl"
    with data.open("w") as f:
        f.write(json.dumps({"prompt": "What is 1 + 1?", "ground_truth": "2"}) + "\n")
        f.write(json.dumps({"prompt": "word " * (10 << 20), "ground_truth": "1"}) + "\n")
    assert data.stat().st_size > 50 << 20
    # the peak of the command's own memory: /proc's VmHWM (kB), which starts anew at exec. Not
    # getrusage's ru_maxrss: Linux carries the forking process's high-water mark across the exec
    # into it, so under a pytest grown to 3.7 GB by earlier tests it read 3771 MB here
    script = ("import re, sys\nfrom reasonrl.cli import main\ncode = main(sys.argv[1:])\n"
              "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
              "print('peak', hwm, file=sys.stderr)\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "train", SMOKE, "data.task=file",
                           f"data.train_path={data}", f"trainer.output_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines[-2].startswith(f"reasonrl: error: {data}:2: field 'prompt' is 52,428,800 bytes, more than "
                                "data.max_prompt_tokens=256 tokens can hold (at most 32,768 bytes")
    peak_mb = int(lines[-1].split()[1]) >> 10
    assert peak_mb < 1500, f"peak RSS {peak_mb} MB"


# config files: bytes that are not UTF-8, a key given twice

def test_a_config_that_is_not_utf8_names_the_line(tmp_path, capsys):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"trainer:\n  steps: 2\n  run_name: caf\xe9\n")
    assert main(["train", str(path)]) == 2
    assert last_line(capsys) == (f"reasonrl: config error: {path}:3: not UTF-8 text (byte 0xe9 at column "
                                 "16); a config file must be UTF-8: convert it, e.g. with `iconv -f <its "
                                 "encoding> -t utf-8`")


@pytest.mark.parametrize("text, line, what", [
    ("optim:\n  lr: 1e-5\n  micro_batch_size: 2\n  lr: 1e-6\n", 4, "key 'lr' given twice in section optim "
                                                                     "(first on line 2)"),
    ("trainer:\n  steps: 2\ntrainer:\n  seed: 1\n", 3, "key 'trainer' given twice (first on line 1)"),
    ("reward:\n  weights: {correct: 1.0, correct: 0.5}\n", 2, "key 'correct' given twice in section "
                                                              "reward.weights (first on line 2)"),
])
def test_a_config_key_given_twice_names_both_lines(tmp_path, capsys, text, line, what):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    assert main(["train", str(path)]) == 2
    assert last_line(capsys) == (f"reasonrl: config error: {path}:{line}: {what}; YAML would keep the last "
                                 "one silently: keep one")


def test_a_yaml_merge_key_may_still_be_overridden(tmp_path):
    """`<<: *base` then a key of the base: YAML's override, not a key given twice."""
    path = tmp_path / "merge.yaml"
    path.write_text("base: &base {steps: 2, seed: 3}\ntrainer:\n  <<: *base\n  steps: 5\n")
    from reasonrl.config.loader import _read_yaml

    assert _read_yaml(path)["trainer"] == {"steps": 5, "seed": 3}


# the run directory: a log shorter than at the checkpoint; a full disk while writing a log

@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 4-step run with a checkpoint after every step."""
    out = tmp_path_factory.mktemp("reference")
    Trainer(resume_cfg(out, "r", "trainer.save_every=1", "trainer.keep_last=0")).fit()
    return out / "r"


def test_a_log_shorter_than_at_the_checkpoint_is_one_line_and_moving_it_aside_resumes(
        reference, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(reference, run)
    step = run / "checkpoints" / "step_2"
    (run / "metrics.jsonl").write_bytes((run / "metrics.jsonl").read_bytes()[:100])  # cut since then
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert main(["train", "--resume", str(step), "trainer.progress=false"]) == 2
    line = last_line(capsys)
    offset = json.loads((step / "trainer_state.json").read_text())["offsets"]["metrics.jsonl"]
    assert line == (f"reasonrl: error: cannot resume: {run}/metrics.jsonl is shorter (100 bytes) than when "
                    f"checkpoint {step} was written ({offset} bytes), so some of its lines up to that step "
                    f"are gone (the file was cut or replaced since). Restore it from a copy, or move it "
                    f"aside (mv {run}/metrics.jsonl {run}/metrics.jsonl.old) to resume with a metrics.jsonl "
                    f"that starts after that step")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # nothing changed
    (run / "metrics.jsonl").rename(run / "metrics.jsonl.old")  # the fix the line names
    assert main(["train", "--resume", str(step), "trainer.progress=false", "trainer.keep_last=0"]) == 0
    assert run_metrics(run) == run_metrics(reference)[-2:]  # steps 3 and 4, as the straight run logged them
    assert final_weights(run).keys() == final_weights(reference).keys()
    assert all(torch.equal(final_weights(run)[k], final_weights(reference)[k]) for k in final_weights(run))


def test_a_log_cut_to_nothing_is_refused_as_a_shorter_one(reference, tmp_path, capsys):
    """Emptied in place (`: > metrics.jsonl`) is a log that lost lines, like one cut to 100 bytes."""
    run = tmp_path / "r"
    shutil.copytree(reference, run)
    step = run / "checkpoints" / "step_2"
    (run / "metrics.jsonl").write_bytes(b"")
    assert main(["train", "--resume", str(step), "trainer.progress=false"]) == 2
    assert last_line(capsys).startswith(f"reasonrl: error: cannot resume: {run}/metrics.jsonl is shorter "
                                        f"(0 bytes) than when checkpoint {step} was written (")


def test_a_deleted_log_is_said_and_the_run_goes_on_with_a_new_one(reference, tmp_path, capsys):
    """Issue 40: a resume whose metrics.jsonl (or samples.jsonl) was deleted went on without a
    word, writing a log that lacks the earlier rows. It still goes on (moving a log aside is
    `check_logs`' own way on), and says so, once per missing log, with both lengths."""
    run = tmp_path / "r"
    shutil.copytree(reference, run)
    step = run / "checkpoints" / "step_2"
    offsets = json.loads((step / "trainer_state.json").read_text())["offsets"]
    assert offsets["metrics.jsonl"] > 0 and offsets["samples.jsonl"] > 0
    (run / "metrics.jsonl").unlink()
    (run / "samples.jsonl").rename(run / "samples.jsonl.old")
    assert main(["train", "--resume", str(step), "trainer.progress=false", "trainer.keep_last=0"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for name in ("metrics.jsonl", "samples.jsonl"):
        line = (f"[reasonrl] warning: {run}/{name} is missing: it held {offsets[name]} bytes when checkpoint "
                f"{step} was written, 0 are there now. The run goes on and writes a new {name} that starts "
                f"after step 2, without the earlier rows; to keep them, stop the run, put the file back and "
                f"resume again")
        assert err.count(line) == 1, err
    assert run_metrics(run) == run_metrics(reference)[-2:]  # steps 3 and 4, as the straight run logged them
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == [3, 4]


def test_a_resume_with_its_logs_in_place_says_nothing_of_them(reference, tmp_path):
    from reasonrl.checkpoint import missing_logs

    step = reference / "checkpoints" / "step_2"
    offsets = json.loads((step / "trainer_state.json").read_text())["offsets"]
    assert missing_logs(reference, offsets, step, 2) == []
    assert missing_logs(tmp_path, {"metrics.jsonl": 0, "samples.jsonl": 0}) == []  # nothing was lost


def fail_log_write(monkeypatch, name: str, nth: int) -> None:
    """The `nth` write to the log `name` writes half its bytes, then the disk is full: the rest
    of it fails with ENOSPC, 1 KiB free. Every other write goes through."""
    import reasonrl.tracking as tracking

    real_write, usage = os.write, shutil.disk_usage
    seen = {"writes": 0, "full": False}

    def write(fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").endswith("/" + name):
            return real_write(fd, data)
        if seen["full"]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        seen["writes"] += 1
        if seen["writes"] < nth:
            return real_write(fd, data)
        seen["full"] = True
        monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(p)._replace(free=1024))
        return real_write(fd, bytes(data[:len(data) // 2]))

    monkeypatch.setattr(tracking.os, "write", write)


@pytest.mark.parametrize("log", ["metrics.jsonl", "samples.jsonl"])
def test_a_full_disk_while_writing_a_log_leaves_it_whole_and_the_run_resumes(
        reference, tmp_path, capsys, monkeypatch, log):
    """The write of step 3's line fails half-way (ENOSPC): the line is cut back (no torn line),
    the run stops with the StorageError's one line saying where it resumes from, and the
    resume ends bitwise where the uninterrupted run ends."""
    nth = 4 if log == "metrics.jsonl" else 3  # metrics.jsonl's first line is the eval before step 1
    fail_log_write(monkeypatch, log, nth)
    run = tmp_path / "r"
    code = main(["train", SMOKE, f"trainer.output_dir={tmp_path}", "trainer.run_name=r",
                 "trainer.progress=false", f"trainer.steps={RESUME_STEPS}", "trainer.threads=1",
                 "trainer.save_every=1", "trainer.keep_last=0", *RESUME_TRAINS])
    monkeypatch.undo()
    assert code == 2
    line = last_line(capsys)
    assert re.fullmatch(
        rf"reasonrl: error: no space left on the device while writing the run's log {run}/{log}: it needs "
        rf"about \d+(\.\d)?( bytes| KiB), 1\.0 KiB free on {run}\. Free some space or point "
        rf"trainer\.output_dir at a larger disk; {log} is left whole \(no torn line\) and the run stopped: "
        rf"resume is bitwise from the last checkpoint, {run}/checkpoints/step_2, so nothing is lost: "
        rf"reasonrl train --resume {run}",
        line), line
    text = (run / log).read_text()
    assert text.endswith("\n") and all(json.loads(x) for x in text.splitlines())  # every line whole
    assert max(json.loads(x)["step"] for x in text.splitlines()) == 2
    assert main(["train", "--resume", str(run), "trainer.progress=false", "trainer.keep_last=0"]) == 0
    assert_same_run(run, reference)


def test_a_log_write_that_fails_otherwise_is_cut_back_too(tmp_path, monkeypatch):
    """Not a storage failure (EIO): the file is left whole all the same and the OSError goes up."""
    import reasonrl.tracking as tracking

    log = tracking.LogFile(tmp_path / "metrics.jsonl")
    log.append('{"step": 1}\n')
    real_write = os.write
    state = {"n": 0}

    def write(fd, data):
        state["n"] += 1
        if state["n"] == 1:
            return real_write(fd, bytes(data[:3]))
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(tracking.os, "write", write)
    with pytest.raises(OSError, match="Input/output error"):
        log.append('{"step": 2}\n')
    monkeypatch.undo()
    log.close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


# the sandbox: auto where no mode hides the host's files

def test_auto_sandbox_where_no_mode_works_is_one_line(tmp_path, capsys, monkeypatch):
    from reasonrl.tools.sandbox import modes

    real_which = shutil.which
    monkeypatch.setattr(modes.shutil, "which", lambda n: None if n in ("bwrap", "unshare") else real_which(n))
    monkeypatch.setattr(modes, "_PLANS", {})
    code = main(["train", SMOKE, "env.name=tool", "env.tools=[python]", f"trainer.output_dir={tmp_path}"])
    assert code == 2
    line = last_line(capsys)
    assert line.startswith("reasonrl: error: tool sandbox 'auto': no mode that hides the host's files works "
                           "here (bwrap not found (Debian/Ubuntu: apt-get install bubblewrap); unshare "
                           "(util-linux) not found). To fix: install bubblewrap")
    assert line.endswith("Or set the sandbox to rlimit (config env.sandbox=rlimit) to run the code with "
                         "resource limits only: it can then read the host's world-readable files and "
                         "write /tmp")


# --debug / REASONRL_DEBUG: the traceback when asked for, the same line and exit code

@pytest.mark.parametrize("how", ["flag", "flag first", "env"])
def test_debug_adds_the_traceback_before_the_same_line(tmp_path, capsys, monkeypatch, how):
    path = tmp_path / "twice.yaml"
    path.write_text("trainer:\n  steps: 2\n  steps: 3\n")
    assert main(["train", str(path)]) == 2
    plain = last_line(capsys)
    argv = {"flag": ["train", str(path), "--debug"], "flag first": ["--debug", "train", str(path)],
            "env": ["train", str(path)]}[how]
    if how == "env":
        monkeypatch.setenv("REASONRL_DEBUG", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "ConfigError" in err
    assert err.strip().splitlines()[-1] == plain
    monkeypatch.setenv("REASONRL_DEBUG", "0")  # off
    assert main(["train", str(path)]) == 2 and last_line(capsys) == plain


def test_an_unexpected_error_is_one_line_with_exit_code_1(tmp_path, capsys, monkeypatch):
    import reasonrl.commands.report as report_command

    def broken(args):
        raise RuntimeError("the first line\nand a second")

    monkeypatch.setattr(report_command, "report_command", broken)
    assert main(["report", str(tmp_path)]) == 1
    assert last_line(capsys) == ("reasonrl: error: RuntimeError: the first line | and a second (unexpected: "
                                 "rerun with --debug, or REASONRL_DEBUG=1, for the traceback)")
    assert main(["report", str(tmp_path), "--debug"]) == 1
    assert 'raise RuntimeError("the first line' in capsys.readouterr().err
