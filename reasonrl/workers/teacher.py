"""The teacher of on-policy distillation (`teacher.path`, docs/teachers.md): a fixed model that
scores the student's samples, token by token.

`TeacherWorker` holds the teacher model: a `reasonrl.workers.frozen.FrozenModel`, the kind of
worker the reference model is too. It is never trained and never given a weight sync: scoring is
its one job (`logprobs`: each completion's token log-probs under the teacher), done with the
policy's own forward code (`reasonrl.model.forward`: micro-batches cut by rows and the
token budget, a GRPO group's prompt run once, the chunked LM head), laid out as the policy lays out
its rows (`optim.micro_batch_size`, `optim.max_tokens_per_micro_batch`, `optim.share_prompt`),
with the policy's kernels (`optim.lean_kernels`), in the run's compute precision (`model.precision`:
bf16 where the student computes in bf16, as the reference model does) and at rollout.temperature,
the temperature of the student's log-probs. So the two are compared like with like, and a teacher
that is the student scores every token exactly as the student does (reverse KL 0, advantage 0).
verl instead asks its teacher server for log-probs at temperature 1 whatever the rollout's
(docs/algo/opd.md, "Temperature is always forced to 1.0"): the same where rollout.temperature = 1.

The teacher must read the student's token ids: `check_tokenizers` (run by the preflight, before
any model loads) refuses a teacher whose tokenizer differs from the student's (vocabulary, BOS,
EOS, UNK), and `teacher_model` one whose embeddings do not cover that vocabulary. Distilling
across tokenizers would need the two tokenizations aligned (re-tokenizing the student's text for
the teacher and mapping log-probs between token spans, as Universal Logit Distillation (Boizard et
al. 2024) and TRL's GOLD trainer do): not built.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from reasonrl.accel import TrainingAccel
from reasonrl.config import Config
from reasonrl.errors import ConfigError, ModelLoadError
from reasonrl.model.budget import token_budget
from reasonrl.model.forward import make_micro_batches
from reasonrl.model.load import load_model_and_tokenizer, load_tokenizer
from reasonrl.model.precision import cast_for_compute, load_dtype
from reasonrl.workers.frozen import FrozenModel

EMBEDDED = "embedded"  # teacher.path for the embedded default model ("" is: no teacher)


@dataclass(frozen=True)
class TeacherSettings:
    """How the teacher lays out and computes its forwards: the policy's own settings."""

    micro_batch_size: int = 8  # optim.micro_batch_size
    max_tokens_per_micro_batch: int = 0  # optim.max_tokens_per_micro_batch (0 = auto)
    share_prompt: bool = True  # optim.share_prompt, off with optim.gradient_checkpointing as the policy's
    lean_kernels: bool = True  # optim.lean_kernels
    temperature: float = 1.0  # rollout.temperature
    precision: str = "fp32"  # model.precision, resolved

    @classmethod
    def from_config(cls, cfg: Config) -> TeacherSettings:
        o = cfg.optim
        return cls(o.micro_batch_size, o.max_tokens_per_micro_batch,
                   o.share_prompt and not o.gradient_checkpointing, o.lean_kernels, cfg.rollout.temperature,
                   cfg.model.precision)


class TeacherWorker(FrozenModel):
    """The teacher model and the one forward the trainer asks of it, `logprobs` (see the module
    docstring)."""

    @classmethod
    def from_config(cls, cfg: Config, host) -> TeacherWorker:
        """The teacher role (teacher.path): its model on `host.device`, scoring in the run's
        compute precision; nothing trains it or syncs to it."""
        model, tokenizer = teacher_model(cfg, host.device)
        return cls(model, tokenizer.pad_token_id, TeacherSettings.from_config(cfg))

    def __init__(self, model, pad_id: int, settings: TeacherSettings):
        cast_for_compute(model, settings.precision)
        model.requires_grad_(False)
        self.accel = TrainingAccel(model, kernels=settings.lean_kernels)  # the policy's forward kernels
        model.eval()
        self.pad_id, self.settings = pad_id, settings
        device = next(model.parameters()).device
        self.max_tokens = token_budget(model, device, settings.max_tokens_per_micro_batch)
        # its micro-batches: the policy's function and settings, its own token budget
        layout = functools.partial(_layout, settings, pad_id, self.max_tokens)
        super().__init__(model, layout, device, settings.temperature)


def _layout(s: TeacherSettings, pad_id: int, max_tokens: int, prompt_ids: list[list[int]],
            completion_ids: list[list[int]]):
    """The teacher's micro-batches of these rows (`make_micro_batches`, as the policy cuts them)."""
    return make_micro_batches(prompt_ids, completion_ids, s.micro_batch_size, pad_id, s.share_prompt, None,
                              max_tokens)


def teacher_source(path: str) -> str:
    """The model source `load_model_and_tokenizer` reads for `teacher.path` (`embedded` is the
    embedded default model, which model.path names by "")."""
    return "" if path == EMBEDDED else path


def teacher_error(err: ModelLoadError) -> ModelLoadError:
    """A loading error about the teacher, naming teacher.path / teacher.revision and `embedded`
    (the loader's message names the student's keys, model.path / model.revision, and "")."""
    text = str(err).replace("model.path=", "teacher.path=").replace("model.revision=", "teacher.revision=")
    return ModelLoadError(text.replace("or empty for the default", f"or {EMBEDDED} for the default"))


def teacher_model(cfg: Config, device: str = "cpu"):
    """(model, tokenizer) of `teacher.path` on `device`, in the dtype `model.precision` loads in;
    ConfigError when its embeddings do not cover the vocabulary it shares with the student
    (`check_tokenizers`)."""
    t = cfg.teacher
    try:
        model, tokenizer = load_model_and_tokenizer(teacher_source(t.path), load_dtype(cfg.model.precision),
                                                    seed=cfg.trainer.seed, revision=t.revision)
    except ModelLoadError as err:
        raise teacher_error(err) from None
    rows = model.get_input_embeddings().weight.size(0)
    if rows < len(tokenizer):
        raise ConfigError(f"teacher.path={t.path}: its model has {rows} embedding rows for a vocabulary of "
                          f"{len(tokenizer)} tokens; it cannot score every token id the student samples")
    return model.to(device), tokenizer


def check_tokenizers(cfg: Config) -> None:
    """ConfigError (one line, naming teacher.path and model.path) unless the teacher's tokenizer
    is the student's: the same vocabulary (every token to the same id) and the same BOS, EOS and
    UNK tokens. On-policy distillation compares two models' log-probs of the same token ids."""
    t = cfg.teacher
    student = load_tokenizer(cfg.model.path, cfg.model.revision)
    try:
        teacher = load_tokenizer(teacher_source(t.path), t.revision)
    except ModelLoadError as err:
        raise teacher_error(err) from None
    problem = tokenizer_difference(student, teacher)
    if problem is not None:
        raise ConfigError(f"teacher.path={t.path}: its tokenizer is not the student's (model.path="
                          f"{cfg.model.path or 'the embedded model'}): {problem}; on-policy distillation "
                          "compares the two models' log-probs of the same token ids, so they must share "
                          "one tokenizer (distilling across tokenizers is not built: docs/teachers.md)")


def tokenizer_difference(student, teacher) -> str | None:
    """What first differs between two tokenizers (the vocabulary, then the BOS, EOS and UNK
    tokens), said for the error; None when they agree."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if ours != theirs:
        extra = sorted(set(theirs) - set(ours), key=theirs.get)
        missing = sorted(set(ours) - set(theirs), key=ours.get)
        moved = sorted((tok for tok in set(ours) & set(theirs) if ours[tok] != theirs[tok]), key=ours.get)
        detail = (f"{extra[0]!r} (id {theirs[extra[0]]}) is not in the student's" if extra else
                  f"the student's {missing[0]!r} (id {ours[missing[0]]}) is not in it" if missing else
                  f"{moved[0]!r} is id {theirs[moved[0]]} in it and {ours[moved[0]]} in the student's")
        return f"a vocabulary of {len(theirs)} tokens against the student's {len(ours)} ({detail})"
    for name in ("bos_token", "eos_token", "unk_token"):
        a, b = getattr(student, name, None), getattr(teacher, name, None)
        if a != b:
            return f"its {name} is {b!r}, the student's {a!r}"
    return None
