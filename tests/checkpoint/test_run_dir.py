"""Checkpoints that prove themselves, one writer per run directory, errors a user can act on.

A checkpoint's manifest.json (sizes and sha256 of every file, written last) is checked before
a resume trusts it: a damaged newest checkpoint is passed over (named, with what is wrong) and
the run resumes, still bitwise exact, from the newest intact one; a damaged checkpoint named
explicitly is refused in one line naming the file. Unreadable files, non-finite weights and
pickled objects are refused by the reader itself. Steps with a non-finite update never push
the last good checkpoint out, and no checkpoint holds NaN weights. A full disk or a permission
problem names the path and the space needed and free. A run directory is locked (flock) for
the life of its run: a second trainer is refused, naming the holder; a dead holder's lock is
taken over.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import RESUME_STEPS, RESUME_TRAINS, assert_same_run, resume_cfg, run_child, run_metrics

from reasonrl.checkpoint import MANIFEST, list_checkpoints, read_checkpoint, verify_checkpoint
from reasonrl.cli import main
from reasonrl.errors import (
    CheckpointError,
    NonFiniteWeights,
    RunLocked,
    StorageError,
    TrainingAborted,
)
from reasonrl.train.run_dir import LOCK_FILE, RunLock
from reasonrl.train.trainer import Trainer

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """An uninterrupted 4-step run with a checkpoint after every step (step_1 ... step_4)."""
    out = tmp_path_factory.mktemp("saved")
    Trainer(resume_cfg(out, "r", "trainer.save_every=1", "trainer.keep_last=0")).fit()
    return out / "r"


def copy_run(saved: Path, tmp_path: Path) -> Path:
    run = tmp_path / "r"
    shutil.copytree(saved, run)
    return run


def weights_file(step: Path) -> Path:
    return step / "huggingface" / "model.safetensors"


def tensor_data_start(file: Path) -> int:
    """Where a safetensors file's tensor bytes begin (after its 8-byte length and JSON header)."""
    with open(file, "rb") as fh:
        return 8 + int.from_bytes(fh.read(8), "little")


def overwrite(file: Path, offset: int, data: bytes) -> None:
    with open(file, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def truncate(file: Path) -> None:
    with open(file, "r+b") as fh:
        fh.truncate(file.stat().st_size // 2)


def plausible_floats(step: Path) -> str:
    """64 KiB of finite, weight-like float32 values over the newest weights: loads silently."""
    f = weights_file(step)
    floats = (torch.randn(16384, generator=torch.Generator().manual_seed(0)) * 0.05).numpy().tobytes()
    overwrite(f, tensor_data_start(f) + 4096, floats)
    return "huggingface/model.safetensors does not match its sha256"


def random_bytes(step: Path) -> str:
    """64 KiB of random bytes over the weights: NaNs among them."""
    f = weights_file(step)
    overwrite(f, tensor_data_start(f) + 4096, os.urandom(65536))
    return "huggingface/model.safetensors does not match its sha256"


def truncated_weights(step: Path) -> str:
    truncate(weights_file(step))
    return "huggingface/model.safetensors is"  # ... N bytes, manifest.json says M (truncated ...)


def truncated_state(step: Path) -> str:
    truncate(step / "state.pt")
    return "state.pt is"


def garbled_json(step: Path) -> str:
    f = step / "trainer_state.json"
    text = f.read_text()
    f.write_text(text[:100] + "}{" + text[102:])  # the same size, not JSON
    return "trainer_state.json does not match its sha256"


def no_manifest(step: Path) -> str:
    (step / MANIFEST).unlink()
    return "manifest.json is missing"


DAMAGE = [plausible_floats, random_bytes, truncated_weights, truncated_state, garbled_json, no_manifest]


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_newest_checkpoint_is_refused_by_name_and_passed_over(saved, tmp_path, capsys, damage):
    """Issue cases 5 and 6: named explicitly, a damaged checkpoint is refused in one line naming
    the file; `--resume RUN` passes over it (printed), resumes from step_3 and ends bitwise where
    the undamaged run ended; the damaged folder is set aside, out of rotation."""
    run = copy_run(saved, tmp_path)
    step_4 = run / "checkpoints" / "step_4"
    why = damage(step_4)
    assert verify_checkpoint(run / "checkpoints" / "step_3") is None
    assert why in verify_checkpoint(step_4)

    capsys.readouterr()
    assert main(["train", "--resume", str(step_4), "trainer.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"reasonrl: error: checkpoint {step_4} cannot be resumed: {step_4}/")
    assert why in last

    assert main(["train", "--resume", str(run), "trainer.progress=false"]) == 0
    err = capsys.readouterr().err
    assert f"passing over damaged checkpoint {step_4}: {step_4}/" in err and why in err
    assert f"resuming from the newest intact checkpoint, {run / 'checkpoints' / 'step_3'}" in err
    assert_same_run(run, saved)
    assert [p.name for p in list_checkpoints(run)] == ["step_1", "step_2", "step_3", "step_4"]
    assert verify_checkpoint(step_4) is None  # written again
    assert why in verify_checkpoint(run / "checkpoints" / "step_4.damaged")


def test_auto_with_no_intact_checkpoint_names_them_all(saved, tmp_path):
    run = copy_run(saved, tmp_path)
    for step in list_checkpoints(run):
        truncate(step / "state.pt")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint \(step_4: .*state.pt is .*step_1: "):
        Trainer(resume_cfg(tmp_path, "r", "trainer.resume=auto"))
    RunLock.take(run).release()  # the refused trainer gave the lock back


def reseal(step: Path) -> None:
    """Rewrite a checkpoint's manifest for its files as they are now: only the reader's own
    checks stand between a damaged file and the trainer."""
    import hashlib

    files = {f.relative_to(step).as_posix(): {"size": f.stat().st_size,
                                             "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
             for f in sorted(step.rglob("*")) if f.is_file() and f.name != MANIFEST}
    (step / MANIFEST).write_text(json.dumps({"format": 1, "files": files}))


def nan_weights(step: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights_file(step))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, weights_file(step), metadata={"format": "pt"})


class Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def pickled_object(step: Path) -> None:
    state = torch.load(step / "state.pt", weights_only=True)
    torch.save({**state, "extra": Payload()}, step / "state.pt")


@pytest.mark.parametrize("damage, error, message", [
    (truncated_weights, CheckpointError, r"huggingface/model.safetensors cannot be read, truncated"),
    (truncated_state, CheckpointError, r"state.pt cannot be read, truncated or damaged"),
    (garbled_json, CheckpointError, r"trainer_state.json cannot be read \(JSONDecodeError"),
    (nan_weights, NonFiniteWeights, r"huggingface/model.safetensors: tensor .* holds NaN or inf"),
    (pickled_object, CheckpointError, r"state.pt holds objects other than tensors and plain data"),
], ids=["truncated_weights", "truncated_state", "garbled_json", "nan_weights", "pickled_object"])
def test_the_reader_refuses_what_it_cannot_trust_naming_the_file(saved, tmp_path, capsys, damage, error,
                                                                 message):
    """Past a manifest that agrees (resealed): truncated files, bad JSON, non-finite weights and
    pickled objects (`torch.load(weights_only=True)`) are each one error naming the file, from
    the reader and, as one line, from the CLI."""
    run = copy_run(saved, tmp_path)
    step = run / "checkpoints" / "step_4"
    damage(step)
    reseal(step)
    assert verify_checkpoint(step) is None
    with pytest.raises(error, match=f"{step}/{message}"):
        read_checkpoint(step)
    capsys.readouterr()
    assert main(["train", "--resume", str(step), "trainer.progress=false", "trainer.steps=5",
                 "--allow-config-change", "trainer.steps"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "pwned" not in err
    assert err.strip().splitlines()[-1].startswith(f"reasonrl: error: {step}/")


# ---- bad steps and non-finite weights -------------------------------------------------------


def test_bad_steps_never_rotate_out_the_last_good_checkpoint(tmp_path):
    """Issue case 5: steps 2-4 have a non-finite loss (update skipped); with keep_last=1 the
    checkpoints of steps 2 and 3 are written (an exact resume point each) but step_1, the last
    written after a good step, stays, and the abort names it."""
    trainer = Trainer(resume_cfg(tmp_path, "r", "trainer.max_bad_steps=3", "trainer.save_every=1",
                                "trainer.keep_last=1"))
    trainer.policy.model.get_decoder().norm.register_forward_hook(
        lambda module, args, out: out * float("nan") if module.training and trainer.step_count >= 1 else None)
    run = tmp_path / "r"
    with pytest.raises(TrainingAborted, match=f"3 bad steps in a row .* the last good checkpoint is "
                                              f"{run / 'checkpoints' / 'step_1'}$"):
        trainer.fit()
    assert [r.get("train/bad_steps") for r in run_metrics(run)[1:]] == [0.0, 1.0, 2.0, 3.0]
    assert [p.name for p in list_checkpoints(run)] == ["step_1", "step_3"]
    # the way back: resume from step_1 by name; step_3, of the abandoned steps, is set aside
    Trainer(resume_cfg(tmp_path, "r", f"trainer.resume={run / 'checkpoints' / 'step_1'}",
                      "trainer.save_every=1", "trainer.keep_last=1", "trainer.max_bad_steps=3")).fit()
    assert [r.get("train/bad_steps") for r in run_metrics(run)[1:]] == [0.0] * RESUME_STEPS
    assert [p.name for p in list_checkpoints(run)] == [f"step_{RESUME_STEPS}"]
    assert (run / "checkpoints" / "step_3.superseded").is_dir()


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    """Weights that became NaN (after the sync, so nothing else notices) end the run at the next
    save: no step_2, no temporary folder, step_1 kept (keep_last=1) and named."""
    trainer = Trainer(resume_cfg(tmp_path, "r", "trainer.save_every=1", "trainer.keep_last=1"))
    step = trainer.step

    def step_then_poison():
        out = step()
        if trainer.step_count == 2:
            with torch.no_grad():
                trainer.policy.model.get_decoder().norm.weight[0] = float("nan")
        return out

    trainer.step = step_then_poison
    run = tmp_path / "r"
    with pytest.raises(TrainingAborted, match=r"step 2: tensor model.norm.weight of huggingface/model."
                       rf"safetensors holds NaN or inf; no checkpoint written; .* last good checkpoint "
                       rf"is {run / 'checkpoints' / 'step_1'}$"):
        trainer.fit()
    assert [p.name for p in list_checkpoints(run)] == ["step_1"]
    assert not list((run / "checkpoints").glob(".*"))


# ---- a full disk, a folder that cannot be written ---------------------------------------------

UNEXPECTED_POS = "[enforce fail at inline_container.cc:672] unexpected pos 12864 vs 12758"
NO_SPACE = r"no space left on the device while writing checkpoint {target}: it needs about \d+\.\d MiB"


def full_disk(monkeypatch, trainer, step_dir: str):
    """torch.save fails as torch reports a full disk, and the disk has 1 KiB free."""
    save = torch.save
    usage = shutil.disk_usage

    def failing_save(obj, f, *args, **kwargs):
        if step_dir in str(f):
            raise RuntimeError(UNEXPECTED_POS)
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(p)._replace(free=1024))
    return NO_SPACE + r", 1.0 KiB free"


def oserror(code: int):
    def patch(monkeypatch, trainer, step_dir: str):
        write = trainer.policy.save_pretrained

        def failing(path, tokenizer=None):
            if step_dir in str(path):
                raise OSError(code, os.strerror(code), str(Path(path) / "model.safetensors"))
            return write(path, tokenizer)

        monkeypatch.setattr(trainer.policy, "save_pretrained", failing)
        if code == errno.ENOSPC:
            return NO_SPACE
        return r"cannot write checkpoint {target}: permission denied \(.*/\.step_2\.\w+/huggingface/model"
    patch.__name__ = errno.errorcode[code]
    return patch


FAILURES = [full_disk, oserror(errno.ENOSPC), oserror(errno.EACCES)]


@pytest.mark.parametrize("fail", FAILURES, ids=[f.__name__ for f in FAILURES])
def test_a_failed_checkpoint_write_names_the_path_and_the_space(tmp_path, saved, monkeypatch, fail):
    """Issue case 7: the write of step_2 fails (torch's `unexpected pos` on a full disk, ENOSPC,
    EACCES): a `StorageError` naming the checkpoint, the space it needs and the space free (or
    the file refused); step_1 is intact and resumes exactly."""
    trainer = Trainer(resume_cfg(tmp_path, "r", "trainer.save_every=1", "trainer.keep_last=1"))
    run = tmp_path / "r"
    pattern = fail(monkeypatch, trainer, f"{run}/checkpoints/.step_2.")
    with pytest.raises(StorageError, match=pattern.format(target=run / "checkpoints" / "step_2")):
        trainer.fit()
    assert [p.name for p in list_checkpoints(run)] == ["step_1"]
    assert not list((run / "checkpoints").glob(".*"))
    monkeypatch.undo()
    Trainer(resume_cfg(tmp_path, "r", "trainer.resume=auto", "trainer.save_every=1",
                      "trainer.keep_last=0")).fit()
    assert_same_run(run, saved)


@pytest.fixture
def tmpfs(tmp_path):
    """mount(kind, size): a tmpfs at tmp_path/disk (root only); unmounted after the test."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = []

    def mount(size: int, read_only: bool = False) -> Path:
        options = f"size={size}" + (",ro" if read_only else "")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip() or 'not root'})")
        mounted.append(where)
        return where

    yield mount
    for m in mounted:
        subprocess.run(["umount", str(m)], check=False)


def test_a_real_full_disk_stops_cleanly_and_the_run_resumes(saved, tmp_path, tmpfs, capsys):
    """Issue case 7 on a real file system: a tmpfs with room for one checkpoint and a half. The
    second write fails; the CLI says so in one line with the path, the size and the space
    free; step_1 is intact and the run, copied to a roomier disk, resumes exactly."""
    size = sum(f.stat().st_size for f in (saved / "checkpoints" / "step_1").rglob("*") if f.is_file())
    disk = tmpfs(size * 3 // 2)
    capsys.readouterr()
    code = main(["train", str(REPO / "configs" / "smoke.yaml"), f"trainer.output_dir={disk}",
                 "trainer.run_name=r", "trainer.progress=false", f"trainer.steps={RESUME_STEPS}",
                 "trainer.threads=1", "trainer.save_every=1", "trainer.keep_last=1", *RESUME_TRAINS])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"reasonrl: error: no space left on the device while writing checkpoint "
                           f"{disk}/r/checkpoints/step_2: it needs about "), last
    assert "MiB free on" in last and "the earlier checkpoints are intact" in last
    assert [p.name for p in list_checkpoints(disk / "r")] == ["step_1"]
    assert verify_checkpoint(disk / "r" / "checkpoints" / "step_1") is None
    run = tmp_path / "r"
    shutil.copytree(disk / "r", run)
    assert main(["train", "--resume", str(run), "trainer.progress=false", "trainer.keep_last=0"]) == 0
    assert_same_run(run, saved)


def test_a_read_only_output_dir_is_named(tmp_path, tmpfs):
    disk = tmpfs(1 << 20, read_only=True)
    with pytest.raises(StorageError, match=rf"cannot write the run directory {disk}/r: read-only file"):
        Trainer(resume_cfg(disk, "r")).fit()


# ---- one run per directory --------------------------------------------------------------------


def test_a_second_trainer_on_a_run_directory_is_refused(tmp_path):
    """Issue case 8 in one process: while a trainer trains runs/r (step_1 saved, step 2 under
    way), a new run of that name is refused when it starts, by the lock and not the existence
    check (nothing of it gets in), and a `resume=auto` before it reads a checkpoint, both
    naming the holder; after `fit` the lock is free again."""
    first = Trainer(resume_cfg(tmp_path, "r", "trainer.steps=2", "trainer.save_every=1"))
    run, step, refused = tmp_path / "r", first.step, []
    holder = f"pid {os.getpid()} on host {socket.gethostname()}"
    in_use = f"{run} is in use by another run \\({holder}, since"

    def step_while_others_start():
        if first.step_count == 1:
            assert (run / LOCK_FILE).read_text().startswith(holder)
            second = Trainer(resume_cfg(tmp_path, "r", "trainer.steps=2"))
            with pytest.raises(RunLocked, match=in_use):
                second.fit()
            with pytest.raises(RunLocked, match=in_use):
                Trainer(resume_cfg(tmp_path, "r", "trainer.steps=2", "trainer.resume=auto"))
            refused.append(run_metrics(run))
        return step()

    first.step = step_while_others_start
    first.fit()
    assert [[r["step"] for r in rows] for rows in refused] == [[0, 1]]
    assert [r["step"] for r in run_metrics(run)] == [0, 1, 2]  # each step logged once
    assert (run / LOCK_FILE).read_text() == ""  # given back
    with pytest.raises(FileExistsError):  # under the lock, the existence check still stands
        Trainer(resume_cfg(tmp_path, "r", "trainer.steps=2")).fit()
    Trainer(resume_cfg(tmp_path, "r", "trainer.resume=auto", "trainer.steps=3",
                      "trainer.allow_config_change=[trainer.steps]")).fit()
    assert [r["step"] for r in run_metrics(run)] == [0, 1, 2, 3]


def test_a_resume_while_the_run_trains_is_refused(tmp_path, capsys):
    """Issue case 8 across processes: while a child trains runs/r (waiting after step 2, with
    step_1 saved), `--resume` and a new run of that name exit 2 naming the child's pid; the
    child is undisturbed, stops on SIGTERM and its run resumes to the end."""
    refused = []

    def meanwhile(pid: int) -> None:
        capsys.readouterr()
        refused.append(main(["train", "--resume", str(tmp_path / "r"), "trainer.progress=false"]))
        refused.append(main(["train", str(REPO / "configs" / "smoke.yaml"), f"trainer.output_dir={tmp_path}",
                             "trainer.run_name=r", "trainer.progress=false"]))
        refused.append(capsys.readouterr().err)

    result = run_child(tmp_path, "term", signal.SIGTERM, "trainer.save_every=1", during=meanwhile)
    assert refused[:2] == [2, 2]
    lines = [line for line in refused[2].splitlines() if line.startswith("reasonrl: error:")]
    assert len(lines) == 2
    assert all(f"{tmp_path / 'r'} is in use by another run (pid " in line for line in lines)
    assert result.returncode == 143, result.stderr
    assert [r["step"] for r in run_metrics(tmp_path / "r")] == [0, 1, 2]  # logged once each
    assert main(["train", "--resume", str(tmp_path / "r"), "trainer.progress=false"]) == 0
    assert [r["step"] for r in run_metrics(tmp_path / "r")] == [0, 1, 2, 3, 4]


def test_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    """A process that dies holding the lock (kill -9) leaves the file with its pid; the kernel
    dropped the flock, so the next run takes it over and says whose it was."""
    code = ("import os, signal, sys\nfrom pathlib import Path\nfrom reasonrl.train.run_dir import RunLock\n"
            "lock = RunLock.take(Path(sys.argv[1]))\nprint(os.getpid(), flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], cwd=REPO, capture_output=True,
                           text=True)
    assert child.returncode == -signal.SIGKILL
    pid = int(child.stdout)
    assert (tmp_path / "r" / LOCK_FILE).read_text().startswith(f"pid {pid} on host ")
    lock = RunLock.take(tmp_path / "r")
    assert f"taking over the lock left by pid {pid} on host" in capsys.readouterr().err
    assert (tmp_path / "r" / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on host ")
    with pytest.raises(RunLocked):
        RunLock.take(tmp_path / "r")
    lock.release()
    RunLock.take(tmp_path / "r").release()
    assert "taking over" not in capsys.readouterr().err  # a clean release leaves nothing to take over
