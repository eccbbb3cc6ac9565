"""`placement/isolated.py`: a worker in a process of its own speaks typed messages over its pipe
(`Call` / `Close` one way; `Ready` / `NotBuilt`, then `Reply` / `Failure` the other), each a frozen
dataclass dispatched by its type; a message of another type is an error naming it, on either
end. One process (the process reward model stub of tests/fixtures/prm_stub.py) for the whole
exchange: it costs seconds to start."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path

import pytest

from reasonrl.config import load_config
from reasonrl.errors import WorkerCallError, WorkerTimeout
from reasonrl.placement.isolated import (
    ANSWERS,
    MESSAGES,
    Call,
    Close,
    Failure,
    NotBuilt,
    ProcessWorker,
    Ready,
    Reply,
    read_answer,
)
from reasonrl.placement.roles import Host

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
from prm_stub import PRMStub, PRMWorkerAPI  # noqa: E402


def test_the_messages_are_frozen_dataclasses_that_pickle():
    examples = [Call("score", (1, [2]), {"k": 3}, 1.5), Close(5.0), Ready(), NotBuilt(ValueError("x")),
                Reply([0.5]), Failure("RuntimeError: boom"), Failure(timed_out=True)]
    assert {type(m) for m in examples} == set(MESSAGES) | set(ANSWERS)
    for message in examples:
        assert dataclasses.is_dataclass(message) and type(message).__dataclass_params__.frozen
        back = pickle.loads(pickle.dumps(message))
        assert type(back) is type(message)
        if not isinstance(message, NotBuilt):  # an exception compares by identity
            assert back == message


def test_an_answer_is_read_by_its_type():
    assert read_answer(Reply([0.25, 1.0]), "judge", "score", 2.0) == [0.25, 1.0]
    with pytest.raises(WorkerCallError, match=r"^RuntimeError: boom$"):
        read_answer(Failure("RuntimeError: boom"), "judge", "score", 2.0)
    with pytest.raises(WorkerTimeout, match=r"^the judge worker did not finish score\(\) within 2 s$"):
        read_answer(Failure(timed_out=True), "judge", "score", 2.0)
    with pytest.raises(WorkerCallError) as err:
        read_answer(("value", 3), "judge", "score", 2.0)  # the bare tuple of the old protocol
    assert str(err.value) == ("the judge worker answered score() with an unknown message ('value', 3) (a "
                              "tuple; the messages: Ready, NotBuilt, Reply, Failure)")


def test_a_process_worker_answers_calls_failures_and_unknown_messages():
    cfg = load_config(None, ["rollout.max_new_tokens=4"])
    worker = ProcessWorker("prm", PRMStub.from_config, PRMWorkerAPI, cfg, Host(), 120.0, 30.0)
    try:
        pid = worker.pid()
        assert worker.step_scores(["ab\nc", "abcd"]) == [[0.5, 0.25], [1.0]]
        with pytest.raises(WorkerCallError, match=r"^AttributeError: 'NoneType' object has no attribute"):
            worker.step_scores([None])
        worker.conn.send(("step_scores", (["ab"],), {}, 5.0))  # not a Call: answered by a Failure
        assert worker.conn.poll(30.0)
        answer = worker.conn.recv()
        assert isinstance(answer, Failure) and not answer.timed_out
        assert answer.error == ("TypeError: the worker's process got an unknown message ('step_scores', "
                                "(['ab'],), {}, 5.0) (a tuple; the messages: Call, Close)")
        assert worker.step_scores(["abcd"]) == [[1.0]] and worker.pid() == pid  # the same process serves on
        assert worker.killed == 0
    finally:
        proc = worker.proc
        worker.close()
    assert worker.proc is None and not proc.is_alive()
