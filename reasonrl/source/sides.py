"""The rollout side of `Ahead`: what runs the channel's commands (`channel.run_commands`), one
class per placement (`SIDES`, keyed by placement.mode), each built from the parts `placement/`
builds and nothing else:

- `ProcessSide` (local): the rollout process, with its own model and engine (the rollout role
  built there: `placement.build_here`) and the roles only it uses (the judge, in a process of
  its own: `placement.side_workers`; the trainer's process builds none), its own torch threads,
  and torch's global RNG seeded `trainer.seed + 1` for the prompt seeds; weights arrive through
  shared memory.
- `RaySide` (ray): a thread of the trainer's process driving the rollout replicas' actors;
  the prompt seeds come from a generator of its own seeded `trainer.seed + 1` (torch's global
  RNG is the trainer thread's), so both placements draw the same seeds; weights arrive as the
  streamed buckets' snapshot in Ray's object store.

Both load a version with `placement.receive` (the checks of every push) and run the held-out
eval with `held_out_metrics`, in the stream's order, so it sees exactly the version asked for.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, replace

import torch
import torch.multiprocessing as mp

from reasonrl.batch import Example
from reasonrl.checkpoint import numpy_rng, plain_rng
from reasonrl.config import Config
from reasonrl.data import PromptSampler
from reasonrl.evaluate import EvalSettings
from reasonrl.placement import SharedMemory, build_here, receive, side_workers
from reasonrl.rng import rng_state, seed_everything, set_rng_state
from reasonrl.rollout import prompt_seeds
from reasonrl.source.channel import Stop, queue_pipe, serve, to_bytes
from reasonrl.source.held_out import held_out_metrics


@dataclass
class SideParts:
    """What a rollout side needs beside the config: the training prompts, the held-out set and
    its eval settings, and (ray) the rollout replicas and the transport whose snapshots they
    load, or (local) the rollout process's torch threads."""

    examples: list[Example]
    held_out: list[Example]
    eval_settings: EvalSettings
    threads: int = 1
    rollout: object = None
    transport: object = None
    judge: object = None  # the judge role's worker (ray: the trainer's proxy; local: the process's own)


class Side:
    """The part both sides share: the prompt sampler, the checked load, the held-out eval.
    Each side also says what it takes of the trainer's workers (`given`) and how it is started
    (`launch`: its channel's trainer end, the process or thread running it, its name); `close`
    frees what it built for itself when its command loop ends."""

    rollout: object
    transport: object

    def __init__(self, cfg: Config, parts: SideParts):
        self.cfg, self.parts = cfg, parts
        self.sampler = PromptSampler(parts.examples, cfg.trainer.seed, cfg.data.shuffle)
        self.eval_settings = replace(parts.eval_settings, progress=False)  # beside the trainer's bar

    def load(self, payload, checks: dict) -> None:
        receive(self.transport, self.rollout, payload, checks, self.cfg.rollout.engine)

    def evaluate(self) -> dict[str, float]:
        return held_out_metrics(self.rollout, self.parts.held_out, self.eval_settings, self.cfg.reward,
                                self.parts.judge)

    def close(self) -> None:
        """Nothing: the workers it drives are the trainer's."""


# Ctrl-C in a terminal signals the whole process group, and systemd, Slurm or `kill -- -PGID`
# send SIGTERM to every process of a job: the trainer finishes its step, waits for the batches in
# flight, saves them and stops the rollout process itself (`Ahead.close`), which must not die
# of the signal meanwhile (the reward workers ignore SIGINT for the same reason).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def serve_process(conn, side, cfg: Config, sampling) -> None:
    """The rollout process's life: `serve`, deaf to `STOP_SIGNALS`. It starts with them blocked
    (the trainer blocks them while it starts the process, which inherits its signal mask through
    fork and exec), so none lands while it imports; here they are ignored, then unblocked (the
    ones that came meanwhile are dropped), and its own children (reward workers) inherit the
    ignoring. The trainer's `close`, or the end of the pipe, stops it."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    serve(conn, side, cfg, sampling)


class ProcessSide(Side):
    """The rollout process of placement.mode=local (see the module docstring)."""

    @staticmethod
    def given(rollout, transport) -> dict:
        return {}  # it builds its own engine and its end of the transport

    @classmethod
    def launch(cls, cfg: Config, parts: SideParts, sampling) -> tuple[object, object, str]:
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        worker = ctx.Process(target=serve_process, args=(child, Build(cls, cfg, parts), cfg, sampling),
                             name="reasonrl-rollout", daemon=False)
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # held for this process
        try:
            worker.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held meanwhile lands now
        child.close()
        return conn, worker, "the rollout process"

    @staticmethod
    def stop(conn, worker) -> None:
        """After `Stop` was sent: the process's wait, then a kill (a Ctrl-C meanwhile ends the wait)."""
        try:
            worker.join(10)
        except KeyboardInterrupt:
            pass
        if worker.is_alive():
            worker.kill()
            worker.join(5)

    @staticmethod
    def ended(worker) -> str:
        """Why the channel ended, said of the process."""
        worker.join(1)
        return f"exited (exit code {worker.exitcode})"

    def __init__(self, cfg: Config, parts: SideParts):
        torch.set_num_threads(parts.threads)
        self.rollout = build_here(cfg, "rollout")
        self.transport = SharedMemory(rollout=self.rollout)
        self.own = side_workers(cfg)  # the judge, in a process of its own: built here alone
        seed_everything(cfg.trainer.seed + 1)  # the process's own stream (prompt seeds)
        super().__init__(cfg, replace(parts, judge=self.own.judge))

    def close(self) -> None:
        """Stop the judge's process it started."""
        self.own.close()

    def state(self) -> dict:
        """What a resumed process needs to continue as this one: the sampler and every RNG."""
        return {"sampler": self.sampler.state_dict(), "rng": plain_rng(rng_state())}

    def set_state(self, state: dict) -> None:
        """This side's state, or the ray side's (a run resumed with placement.mode changed: its
        generator's state is what torch's global RNG draws the prompt seeds from here); a
        checkpoint with no batch in flight has the sampler's alone."""
        self.sampler.load_state_dict(state["sampler"])
        if "rng" in state:
            set_rng_state(numpy_rng(state["rng"]))
        elif "generator" in state:
            torch.set_rng_state(state["generator"])

    @staticmethod
    def pack(payload: dict) -> bytes:  # what crosses the pipe: plain data, loaded weights-only
        return to_bytes(payload)


class SeededRollout:
    """A rollout worker whose prompt seeds come from `generator` rather than torch's global
    RNG (which the trainer's own thread also uses); every other call passes through."""

    def __init__(self, rollout, generator: torch.Generator):
        self.worker, self.generator = rollout, generator

    def rollout(self, examples, params, seeds: list[int] | None = None):
        if seeds is None and not params.greedy:
            seeds = prompt_seeds(len(examples), self.generator)
        return self.worker.rollout(examples, params, seeds)

    def __getattr__(self, name):
        return getattr(self.worker, name)


class RaySide(Side):
    """The producer of placement.mode=ray, a thread of the trainer's process (see the module
    docstring)."""

    @staticmethod
    def given(rollout, transport) -> dict:
        return {"rollout": rollout, "transport": transport}  # the replicas, the streamed buckets

    @classmethod
    def launch(cls, cfg: Config, parts: SideParts, sampling) -> tuple[object, object, str]:
        conn, child = queue_pipe()
        worker = threading.Thread(target=serve, args=(child, Build(cls, cfg, parts), cfg, sampling),
                                  name="reasonrl-rollout-producer", daemon=True)
        worker.start()
        return conn, worker, "the rollout producer (a thread driving the rollout replicas)"

    @staticmethod
    def stop(conn, worker) -> None:
        """After `Stop` was sent: the commands not started yet are dropped, `Stop` sent again
        ahead of them, and the thread waited for (a thread cannot be killed)."""
        conn.drop_unread()
        conn.send(Stop())
        try:
            worker.join(10)
        except KeyboardInterrupt:
            pass

    @staticmethod
    def ended(worker) -> str:
        return "ended"

    def __init__(self, cfg: Config, parts: SideParts):
        self.generator = torch.Generator().manual_seed(cfg.trainer.seed + 1)
        self.rollout = SeededRollout(parts.rollout, self.generator)
        self.transport = parts.transport
        super().__init__(cfg, parts)

    def state(self) -> dict:
        return {"sampler": self.sampler.state_dict(), "generator": self.generator.get_state()}

    def set_state(self, state: dict) -> None:
        """This side's state, or the local process's (its torch RNG drew the prompt seeds); a
        checkpoint with no batch in flight has the sampler's alone."""
        self.sampler.load_state_dict(state["sampler"])
        if "generator" in state or "rng" in state:
            self.generator.set_state(state["generator"] if "generator" in state else state["rng"]["torch"])

    @staticmethod
    def pack(payload: dict) -> dict:  # same process: handed over as it is
        return payload


class Build:
    """`side(cfg, parts)` called on the side's own thread or process (picklable for a spawned
    process)."""

    def __init__(self, side: type[Side], cfg: Config, parts: SideParts):
        self.side, self.cfg, self.parts = side, cfg, parts

    def __call__(self) -> Side:
        return self.side(self.cfg, self.parts)


SIDES: dict[str, type[Side]] = {"local": ProcessSide, "ray": RaySide}  # by placement.mode
