"""The teacher of on-policy distillation (reasonrl/workers/teacher.py): its log-probs by hand and
as the policy computes them, the model sources teacher.path takes (a reasonrl checkpoint
folder included), and the start-up refusal of a teacher with another tokenizer."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import grouped_rows, policy_settings

from reasonrl.config import load_config
from reasonrl.errors import ConfigError, ModelLoadError
from reasonrl.model.load import build_tiny_model
from reasonrl.workers.policy import PolicyWorker
from reasonrl.workers.teacher import (
    TeacherSettings,
    TeacherWorker,
    check_tokenizers,
    teacher_model,
    teacher_source,
)


def naive_logprobs(model, prompt: list[int], completion: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / T) of each completion token, from one plain HF forward of the row."""
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float() / temperature
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(completion)])


def save_model(folder, model, tokenizer) -> str:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def other():
    """A tiny model of another seed than the student's (`tiny`, seed 0). Copy it before use."""
    return build_tiny_model(seed=1)[0].eval()


def test_the_teachers_log_probs_are_a_plain_forwards_at_the_rollout_temperature(other, tokenizer):
    """Per row, log softmax(logits / T) of the completion tokens, within float32 rounding of the
    lean kernels' sums (1e-5 on the tiny model's ~-11 log-probs), shared prompts and
    micro-batches of two rows with padding included; T = 0.5 scales the logits first."""
    prompts, completions = grouped_rows()
    reference = copy.deepcopy(other)
    for temperature in (1.0, 0.5):
        model = copy.deepcopy(other)
        teacher = TeacherWorker(model, tokenizer.pad_token_id, TeacherSettings(micro_batch_size=2,
                                                                               temperature=temperature))
        found = teacher.logprobs(prompts, completions)
        assert [len(x) for x in found] == [len(c) for c in completions]
        for p, c, logp in zip(prompts, completions, found, strict=True):
            assert logp.dtype == torch.float32
            torch.testing.assert_close(logp, naive_logprobs(reference, p, c, temperature), rtol=0, atol=1e-5)
    assert teacher.logprobs([], []) == []
    assert not any(p.requires_grad for p in model.parameters())  # nothing to train, nothing to sync


def test_a_teacher_that_is_the_student_scores_every_token_bitwise_as_the_policy_does(tiny):
    """Same weights, same layout settings, same kernels: the teacher's and the policy's log-probs
    are equal bit for bit, so the reverse KL (and the distillation advantage) is exactly 0."""
    prompts, completions = grouped_rows(seed=4)
    model, tokenizer = tiny
    policy = PolicyWorker(copy.deepcopy(model).train(), tokenizer.pad_token_id,
                          policy_settings(micro_batch_size=4))
    teacher = TeacherWorker(copy.deepcopy(model), tokenizer.pad_token_id, TeacherSettings(micro_batch_size=4))
    for ours, theirs in zip(policy.logprobs(prompts, completions), teacher.logprobs(prompts, completions),
                            strict=True):
        assert torch.equal(ours, theirs)
    checksum = teacher.weights_checksum()
    teacher.logprobs(prompts, completions)
    assert teacher.weights_checksum() == checksum


def test_teacher_path_takes_a_reasonrl_checkpoint_folder_and_names_itself_in_errors(tmp_path, other,
                                                                                      tokenizer):
    """runs/<name>/checkpoints/step_N (its huggingface/ folder) loads as the teacher; embedded is
    the default model; a missing folder's error names teacher.path, not model.path."""
    model = other
    step = tmp_path / "runs" / "t" / "checkpoints" / "step_3"
    save_model(step / "huggingface", model, tokenizer)
    cfg = load_config(None, ["model.path=tiny", f"teacher.path={step}"])
    loaded, _ = teacher_model(cfg)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(),
                                                 strict=True))
    assert teacher_source("embedded") == "" and teacher_source("tiny") == "tiny"
    with pytest.raises(ModelLoadError, match=r"^teacher\.path=.*nowhere: no such folder .* or embedded "
                                             "for the default model"):
        teacher_model(load_config(None, ["model.path=tiny", f"teacher.path={tmp_path / 'nowhere'}"]))


def test_a_teacher_with_another_vocabulary_or_eos_is_refused_in_one_line(tmp_path, tiny):
    """check_tokenizers (the preflight's): a tokenizer with one token more, or another EOS, is a
    ConfigError naming teacher.path, model.path and the first difference; the same tokenizer
    passes (every run with a teacher in tests/e2e/test_distill_runs.py); a model whose embeddings
    do not cover the vocabulary is refused when loaded. (The check reads tokenizers alone: the
    folders hold a config.json and a tokenizer.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    model, student = tiny

    bigger = tmp_path / "bigger"
    tokenizer = copy.deepcopy(student)
    tokenizer.add_tokens(["<|distill_extra|>"])
    model.config.save_pretrained(bigger)
    tokenizer.save_pretrained(bigger)
    cfg = load_config(None, ["model.path=tiny", f"teacher.path={bigger}"])
    with pytest.raises(ConfigError) as err:
        check_tokenizers(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"teacher.path={bigger}: its tokenizer is not the student's (model.path=tiny): "
                              "a vocabulary of 49153 tokens against the student's 49152 "
                              "('<|distill_extra|>' (id 49152) is not in the student's)")

    tokenizer = copy.deepcopy(student)
    tokenizer.eos_token = "<|endoftext|>"
    other_eos = save_model(tmp_path / "eos", model.config, tokenizer)  # a config.json, no weights
    with pytest.raises(ConfigError, match=r"eos_token is '<\|endoftext\|>', the student's '<\|im_end\|>'"):
        check_tokenizers(load_config(None, ["model.path=tiny", f"teacher.path={other_eos}"]))

    tokenizer = student
    small = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    narrow = save_model(tmp_path / "narrow", small, tokenizer)
    with pytest.raises(ConfigError, match="its model has 1000 embedding rows for a vocabulary of 49152"):
        teacher_model(load_config(None, ["model.path=tiny", f"teacher.path={narrow}"]))


def test_teacher_settings_need_a_teacher():
    with pytest.raises(ConfigError, match="^teacher.coef, placement.teacher.num_cpus: set, but teacher.path "
                                          "is empty"):
        load_config(None, ["teacher.coef=2", "placement.teacher.num_cpus=2"])
    with pytest.raises(ConfigError, match="placement.policy/rollout/critic/teacher.num_gpus: only used with "
                                          "placement.mode=ray"):
        load_config(None, ["teacher.path=tiny", "placement.teacher.num_gpus=1"])
    cfg = load_config(None, ["teacher.path=tiny", "teacher.coef=0.5", "teacher.task_weight=0"])
    assert (cfg.teacher.coef, cfg.teacher.task_weight) == (0.5, 0.0)
