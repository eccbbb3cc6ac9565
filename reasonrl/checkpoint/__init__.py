"""Checkpoints: written atomically, found again, checked against the config, rotated.

Layout of `runs/<name>/checkpoints/step_N/`:

    huggingface/         the policy as an HF folder (model dtype, loadable by transformers
                         and vLLM; it is also the exact copy the trainer resumes from)
    adapter/             LoRA only: the peft adapter, what a resume loads; huggingface/ then
                         holds the merged weights (absent with model.lora.save_merged=false)
    critic/              critic estimators (PPO) only: the value model (body and head)
    trainer_state.json   step, sampler position, resolved config + its hash, byte offsets of
                         metrics.jsonl and samples.jsonl, eval before training, bad-step count
    state.pt             optimizer, LR scheduler, policy step, RNG states (python, numpy,
                         torch CPU and CUDA), and the critic's optimizer state: tensors and
                         plain data only, read back with `torch.load(weights_only=True)`
    manifest.json        written last: every other file's size and sha256

A checkpoint is written into a hidden temporary folder beside it, every file fsynced,
then renamed into place: a folder named `step_N` is complete, a crash leaves at most a
`.step_N.*` temporary folder, which the next resume deletes. Its weights are checked finite
before the rename (`NonFiniteWeights`: no checkpoint). A resume verifies the manifest
(`verify_checkpoint`) before it trusts a checkpoint; `auto` passes over damaged ones to the
newest intact one. A write that fails for lack of space or permission is a `StorageError`
naming the path, the bytes needed and free.

One module per job:

    layout.py        the file names above; a run's step folders, complete or not
    manifest.py      manifest.json: written (sizes, sha256) and verified
    write.py         the atomic write of a folder, and of a checkpoint into it
    storage.py       a failed write for lack of space or permission, as a StorageError
    read.py          a checkpoint read back (weights-only unpickler, finite weights)
    rotation.py      which checkpoints stay: the newest keep_last and the last good one
    resume.py        which checkpoint a resume starts from; logs cut back to it
    config_check.py  the config a resume may not change, its hash
    records.py       step records as plain data (the batches in flight of asynchronous training)

`reasonrl.train.run_dir` (the run directory) is the one user of most of it; this package knows
nothing of runs beyond their `checkpoints/` folder.
"""

from reasonrl.checkpoint.config_check import (
    RESUME_SAFE_KEYS,
    check_config_changes,
    config_changes,
    config_hash,
    flatten,
)
from reasonrl.checkpoint.layout import (
    ADAPTER_DIR,
    CRITIC_DIR,
    FORMAT,
    MANIFEST,
    STATE_FILE,
    STEP_DIR,
    TENSOR_FILE,
    WEIGHT_SUFFIXES,
    list_checkpoints,
    remove_partial,
    step_folders,
)
from reasonrl.checkpoint.manifest import checkpoint_size, verify_checkpoint, write_manifest
from reasonrl.checkpoint.read import non_finite, numpy_rng, read_checkpoint
from reasonrl.checkpoint.records import from_plain, to_plain
from reasonrl.checkpoint.resume import (
    check_logs,
    find_resume_point,
    missing_logs,
    resume_target,
    truncate_log,
)
from reasonrl.checkpoint.rotation import is_good, rotate, set_aside
from reasonrl.checkpoint.storage import estimate_size, storage_error
from reasonrl.checkpoint.write import atomic_save, plain_rng, write_checkpoint

__all__ = [
    "ADAPTER_DIR", "CRITIC_DIR", "FORMAT", "MANIFEST", "RESUME_SAFE_KEYS", "STATE_FILE", "STEP_DIR",
    "TENSOR_FILE", "WEIGHT_SUFFIXES", "atomic_save", "check_config_changes", "check_logs", "checkpoint_size",
    "config_changes", "config_hash", "estimate_size", "find_resume_point", "flatten", "from_plain",
    "is_good", "list_checkpoints", "missing_logs", "non_finite", "numpy_rng", "plain_rng", "read_checkpoint",
    "remove_partial", "resume_target", "rotate", "set_aside", "step_folders", "storage_error", "to_plain",
    "truncate_log", "verify_checkpoint", "write_checkpoint",
    "write_manifest",
]
