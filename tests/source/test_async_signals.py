"""Asynchronous training (trainer.max_staleness = K) stops on Ctrl-C or SIGTERM as the on-policy
loop does: the step in progress finishes, the checkpoint keeps the batches in flight, the
command line prints the one line the on-policy loop prints (`reasonrl: stopped by SIGINT after
step N: checkpoint ...; resume with: reasonrl train --resume RUN`) with its exit code (130,
143), no process of the run is left, and the resume is bitwise the run that was not stopped.

The signal goes to the run's whole process group, as a terminal's Ctrl-C does (and systemd or
Slurm's SIGTERM to a job): the rollout process (local mode) and Ray's processes (ray mode) get it
too, and must leave the stopping to the trainer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, TRAINS, keep_torch_threads, smoke_cfg  # noqa: F401 - an autouse fixture
from safetensors.torch import load_file

from reasonrl.train.trainer import Trainer

STEPS = 4
RUN = [f"trainer.steps={STEPS}", "rollout.threads=1", "trainer.keep_last=0",
       "rollout.hf_decoder=lean"]  # pinned: the same decoder in the test's process and the run's
HAS_RAY = importlib.util.find_spec("ray") is not None


def comparable(run: Path) -> list[dict]:
    """metrics.jsonl without wall-clock values (times, waits, idles, throughput, memory)."""
    timing = ("async/wait", "async/producer_idle", "async/sync_pause", "rollout/tokens_per_s")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/")) and k not in timing}
            for r in rows]


def assert_same_run(run: Path, reference: Path) -> None:
    final = f"checkpoints/step_{STEPS}/huggingface/model.safetensors"
    a, b = load_file(run / final), load_file(reference / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "final weights differ"
    assert comparable(run) == comparable(reference)
    assert (run / "samples.jsonl").read_text() == (reference / "samples.jsonl").read_text()


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, Path]:
    """Uninterrupted runs with K = 1 and K = 2 (ray mode's K = 1 is local mode's, bitwise:
    tests/source/test_async.py)."""
    out = tmp_path_factory.mktemp("straight")
    for k in (1, 2):
        Trainer(smoke_cfg(out, f"k{k}", *RUN, f"trainer.max_staleness={k}")).fit()
    return {k: out / f"k{k}" for k in (1, 2)}


def descendants(root: int) -> dict[int, str]:
    """{pid: start time} of every process below `root` (from /proc)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = (int(fields[1]), fields[19])  # ppid, start time
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        for child, (ppid, start) in parents.items():
            if ppid == pid and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def alive(processes: dict[int, str]) -> list[str]:
    """Those of `processes` still running (the same pid and start time, not a zombie), with
    their command lines."""
    running = []
    for pid, start in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            running.append(f"{pid} {cmd[:120]}")
    return running


def stop_by_signal(out: Path, name: str, sig: signal.Signals, *overrides: str) -> tuple[int, str, list[str]]:
    """`reasonrl train` in a session of its own, its whole process group sent `sig` once step 1
    is logged: (exit code, stderr, the processes it had started that still run 20 s after it
    exited)."""
    args = [f"{REPO / 'configs' / 'smoke.yaml'}", f"trainer.output_dir={out}", f"trainer.run_name={name}",
            "trainer.progress=false", "trainer.threads=1", "tracking.report=false", *TRAINS, *RUN, *overrides]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "reasonrl", "train", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    log, started = out / name / "metrics.jsonl", time.monotonic()
    try:
        while not (log.is_file() and any(json.loads(x)["step"] >= 1 for x in log.read_text().splitlines())):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() - started < 300, "step 1 took over 300 s"
            time.sleep(0.2)
        children = descendants(proc.pid)
        assert children, "the run started no process"  # the rollout process (local), Ray's (ray)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 20
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.5)
    return proc.returncode, err, alive(children)


def check_stopped(run: Path, sig: signal.Signals, code: int, err: str, left: list[str]) -> int:
    """The on-policy loop's stop: its line, last on stderr, with its exit code; no traceback;
    nothing left running. Returns the step it stopped after."""
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"reasonrl: stopped by {sig.name} after step "), err[-3000:]
    step = int(last.split(" after step ")[1].split(":")[0])
    assert last == (f"reasonrl: stopped by {sig.name} after step {step}: checkpoint {run}/checkpoints/"
                    f"step_{step}; resume with: reasonrl train --resume {run}")
    assert code == 128 + sig.value
    for word in ("Traceback", "ProducerError", "EOFError", "KeyboardInterrupt", "rollout process"):
        assert word not in err, err[-3000:]
    assert f"[reasonrl] {sig.name}: finishing step" in err
    assert left == [], f"still running after the run ended: {left}"
    assert 1 <= step < STEPS
    return step


# Each signal once and each K once: the stop is one code path for both signals (their name and
# exit code are what differ, both checked), and K sets only how many batches are in flight
@pytest.mark.parametrize("k, sig", [(1, signal.SIGINT), (2, signal.SIGTERM)], ids=["K1-SIGINT", "K2-SIGTERM"])
def test_a_signal_to_an_asynchronous_run_stops_it_as_an_on_policy_run(straight, tmp_path, k, sig):
    code, err, left = stop_by_signal(tmp_path, "r", sig, f"trainer.max_staleness={k}")
    run = tmp_path / "r"
    step = check_stopped(run, sig, code, err, left)
    state = torch.load(run / "checkpoints" / f"step_{step}" / "state.pt", weights_only=True)
    ahead = k + 1 if step < STEPS else k  # the final version makes none (reasonrl.source.schedule)
    assert sorted(state["in_flight"]["batches"]) == [str(b) for b in range(step, step + ahead)]
    Trainer(smoke_cfg(tmp_path, "r", *RUN, f"trainer.max_staleness={k}", "trainer.resume=auto")).fit()
    assert_same_run(run, straight[k])


@pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'reasonrl[ray]'): ray mode's "
                                        "rollout replicas cannot be started")
def test_ctrl_c_stops_an_asynchronous_ray_mode_run_as_an_on_policy_run(straight, tmp_path):
    """Ray mode, K = 1: Ray's own processes (its head, the policy and rollout actors) get the
    Ctrl-C too; the run stops the same way, Ray's processes end with it, and the resume (in local
    mode: placement.mode, allowed, and placement.num_cpus, free, change nothing computed) is
    bitwise the straight run."""
    ray = ["placement.mode=ray", "placement.num_cpus=2", "trainer.max_staleness=1"]
    code, err, left = stop_by_signal(tmp_path, "r", signal.SIGINT, *ray)
    run = tmp_path / "r"
    check_stopped(run, signal.SIGINT, code, err, left)
    Trainer(smoke_cfg(tmp_path, "r", *RUN, "trainer.max_staleness=1", "trainer.resume=auto",
                      "trainer.allow_config_change=[placement.mode]")).fit()
    assert_same_run(run, straight[1])


def test_ctrl_c_while_the_rollout_process_ends_kills_it_at_once(tmp_path):
    """The second Ctrl-C of a stop ("stop at once") may land while the trainer waits for the
    rollout process to end (`Ahead.close`, after the checkpoint): the wait ends, the process is
    killed now, and the stop under way goes on (no KeyboardInterrupt out of `close`, which would
    replace the stop's line with "reasonrl: interrupted")."""
    trainer = Trainer(smoke_cfg(tmp_path, "r", *RUN, "trainer.max_staleness=1"))
    try:
        source = trainer.source
        source.start(trainer.step_count)  # still importing: it would take seconds to stop
        process = source.worker
        join = process.join

        def interrupted(timeout=None):
            process.join = join  # the wait after the kill runs
            raise KeyboardInterrupt

        process.join = interrupted
        started = time.monotonic()
        try:
            source.close()
        except KeyboardInterrupt:  # caught here: pytest would take it for the user's and stop
            pytest.fail("Ahead.close let the KeyboardInterrupt out")
        # killed at once, not after the 10 s wait (`Ahead.close`'s join(10)), whose end would
        # also find it killed: on any machine the kill and its reaping (join(5)) end before 10 s,
        # the wait does not
        assert time.monotonic() - started < 10
        assert process.exitcode == -signal.SIGKILL and source.worker is None
    finally:
        trainer.source.close()
        trainer.run.release()
