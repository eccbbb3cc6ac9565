"""reasonrl/source/channel.py: the typed messages between the trainer and the rollout side, their
dispatch by type, and a message of no known type an error naming it."""

from __future__ import annotations

import dataclasses
import pickle
import threading
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

from reasonrl.source.ahead import Ahead
from reasonrl.source.channel import (
    ANSWERS,
    COMMANDS,
    BatchReady,
    EvalReady,
    Evaluate,
    Failed,
    Loaded,
    LoadWeights,
    Produce,
    SetState,
    Stop,
    queue_pipe,
    run_commands,
    serve,
)

MESSAGES = [SetState({"sampler": {"epoch": 1}}), LoadWeights(3, {"w": torch.arange(4.0)}, {"probe": 1.0}),
            Produce(2), Evaluate(3), Stop(), Loaded(3), BatchReady(2, b"packed"),
            EvalReady(3, {"eval/acc": 0.5}), Failed("Traceback ...")]


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(same(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    return a == b


def test_every_message_is_a_frozen_dataclass_that_pickles():
    assert {type(m) for m in MESSAGES} == set(COMMANDS) | set(ANSWERS)
    for message in MESSAGES:
        with pytest.raises(dataclasses.FrozenInstanceError):
            message.x = 1  # type: ignore[attr-defined]
        assert same(pickle.loads(pickle.dumps(message)), message)  # Ray's (cloud)pickle: the same protocol
        # torch.multiprocessing's pickler (its reductions registered: a tensor goes as shared memory)
        assert same(pickle.loads(bytes(ForkingPickler.dumps(message))), message)


def test_a_message_crosses_a_torch_multiprocessing_pipe():
    a, b = mp.get_context("spawn").Pipe()
    try:
        for message in MESSAGES:
            a.send(message)
            assert same(b.recv(), message)
    finally:
        a.close()
        b.close()


class FakeSide:
    def __init__(self):
        self.calls = []

    def set_state(self, state):
        self.calls.append(("state", state))

    def load(self, payload, checks):
        self.calls.append(("load", payload, checks))

    def evaluate(self):
        return {"eval/accuracy": 1.0}

    def close(self):
        CLOSED.append(self)


CLOSED: list[FakeSide] = []  # the sides `serve` closed


def test_the_side_runs_the_commands_in_order_and_answers_by_type():
    trainer, side_end = queue_pipe()
    side = FakeSide()
    for command in (SetState({"sampler": {}}), LoadWeights(1, "payload", {}), Evaluate(1), Stop(),
                    Produce(0)):  # not run: after Stop
        trainer.send(command)
    run_commands(side_end, side, None, None)
    assert side.calls == [("state", {"sampler": {}}), ("load", "payload", {})]
    assert trainer.recv() == Loaded(1)
    assert trainer.recv() == EvalReady(1, {"eval/accuracy": 1.0})


def test_an_unknown_command_is_an_error_naming_it():
    trainer, side_end = queue_pipe()
    trainer.send(("produce", 1))  # the old bare tuple
    CLOSED.clear()
    serve(side_end, FakeSide, None, None)
    failed = trainer.recv()
    assert isinstance(failed, Failed) and len(CLOSED) == 1  # the side it built is closed all the same
    assert ("TypeError: rollout side: unknown command ('produce', 1) (a tuple; the commands: SetState, "
            "LoadWeights, Produce, Evaluate, Stop)") in failed.traceback


def test_the_trainer_takes_an_unknown_answer_as_the_side_s_error():
    ahead = object.__new__(Ahead)  # only what the receiving thread reads
    ahead.conn, side_end = queue_pipe()
    ahead.cond, ahead.error, ahead.what = threading.Condition(), None, "the rollout side"
    ahead.shared, ahead.batches, ahead.evals, ahead.worker = {1: "snapshot"}, {}, {}, None
    side_end.send(Loaded(1))
    side_end.send(EvalReady(1, {"eval/accuracy": 0.5}))
    side_end.send(("batch", 0, {}))
    side_end.close()
    ahead._receive()
    assert ahead.shared == {} and ahead.evals == {1: {"eval/accuracy": 0.5}}
    assert ahead.error == ("the rollout side sent an unknown message ('batch', 0, {}) (a tuple; the answers: "
                           "Loaded, BatchReady, EvalReady, Failed)")
