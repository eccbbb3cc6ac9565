"""Multi-turn episodes train on the ids the engine sampled, whatever the chat template does to
earlier turns: with a Qwen3-style template (earlier assistant messages lose their
`<think>...</think>`, the last one is rendered with its think block), set on a copy of the real
tokenizer, turn 1's trained ids are exactly its sampled ids after turn 2 was rendered, and an
observation's ids are only the template's new messages (reasonrl/rollout/episodes.py,
`ObservationEncoder`: append-only, the conversation is never rendered again)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import ScriptedEngine, check_token_in_token_out, spy_on

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.envs import EnvStep, environment_spec
from reasonrl.model.forward import make_micro_batches
from reasonrl.rollout import RolloutWorker, SamplingParams
from reasonrl.rollout.episodes import ObservationEncoder
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.worker import check_chat_observations

# Qwen3's rule, in a few lines: an assistant message after the last user message keeps its
# reasoning in a <think> block (an empty one when it has none); an earlier one is rendered
# without it. So appending a user message re-renders the turn before it differently.
QWEN3_STYLE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- set content = m.content %}{%- set reasoning = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_user %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TURN_1 = "<think>\nSeven, I think.\n</think>\n\nIt is 7.<|im_end|>"
TURN_2 = "<think>\nLower, so 5.\n</think>\n\nIt is 5.<|im_end|>"


@pytest.fixture
def qwen3_tokenizer(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = QWEN3_STYLE
    return tok


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_the_template_rewrites_earlier_turns(qwen3_tokenizer):
    """The template is not prefix-preserving: the model's message rendered last, then with a
    user message after it, differ before the new message (what an encoder comparing the two,
    as reasonrl's did before, refuses; what re-rendering the conversation would train on)."""
    tok = qwen3_tokenizer
    chat = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": TURN_1[:-10]}]
    alone = tok.apply_chat_template(chat, tokenize=False)
    followed = tok.apply_chat_template([*chat, {"role": "user", "content": "Too high."}], tokenize=False)
    assert alone.endswith("<|im_start|>assistant\n<think>\nSeven, I think.\n</think>\n\nIt is 7.<|im_end|>\n")
    assert "<|im_start|>assistant\nIt is 7.<|im_end|>\n<|im_start|>user\nToo high." in followed
    assert not followed.startswith(alone)
    check_chat_observations(tok, "user")  # accepted: only the new messages are rendered
    assert ObservationEncoder(tok).chat_text({"role": "user", "content": "Too high."}, tok.eos_token_id) == \
        "\n<|im_start|>user\nToo high.<|im_end|>\n<|im_start|>assistant\n"


def test_turn_one_trains_on_its_sampled_ids_after_turn_two(qwen3_tokenizer):
    """The feedback game with chat observations: turn 1 thinks and answers 7, the environment
    says "Too high." as a user message, turn 2 thinks and answers 5. The row's ids are turn 1's
    sampled ids (think block included), the template's user message, turn 2's sampled ids; the
    policy's micro-batches train on exactly those; re-rendering the conversation would not."""
    tok = qwen3_tokenizer
    engine = ScriptedEngine(tok, [[TURN_1], [TURN_2]])
    cfg = load_config("configs/smoke.yaml", ["env.name=feedback", "env.observation_format=chat",
                                             "env.max_turns=3", "rollout.max_new_tokens=64"]).env
    worker = RolloutWorker(engine, tok, env=environment_spec(cfg))
    r = worker.rollout([Example("What is 2 + 3?", "5")], SamplingParams(n=1, max_new_tokens=64), seeds=[4])
    t1, t2 = engine.sampled[0][0], engine.sampled[1][0]
    obs = ids_of(tok, "\n<|im_start|>user\nToo high.<|im_end|>\n<|im_start|>assistant\n")
    assert t1 == ids_of(tok, TURN_1) and r.completion_ids[0] == t1 + obs + t2
    assert r.token_mask[0] == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)
    assert engine.calls[1][0] == [r.prompt_ids[0] + t1 + obs]  # turn 2 was sampled after exactly these
    for mb in make_micro_batches(r.prompt_ids, r.completion_ids, 1, tok.pad_token_id, False, r.token_mask):
        n = len(r.completion_ids[0])
        assert mb.targets[0, :n].tolist() == t1 + obs + t2
        assert mb.mask[0, :n].tolist() == [1.0] * len(t1) + [0.0] * len(obs) + [1.0] * len(t2)
    # the conversation rendered again drops turn 1's thinking: those ids are not what was sampled
    chat = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": TURN_1[:-10]},
            {"role": "user", "content": "Too high."}, {"role": "assistant", "content": TURN_2[:-10]}]
    rendered = ids_of(tok, tok.apply_chat_template(chat, tokenize=False))
    trained = r.prompt_ids[0] + r.completion_ids[0]
    assert rendered != trained[: len(rendered)]
    assert tok.decode(trained).count("Seven, I think.") == 1
    assert "Seven, I think." not in tok.decode(rendered)


class ChatEcho:
    """Each turn (ended at any "e" the random model writes) gets a user message back."""

    stop_strings = ("e",)

    def reset(self, example):
        self.turns = 0

    def step(self, turn):
        self.turns += 1
        return EnvStep(observation={"role": "user", "content": f"obs {self.turns}"})


def test_token_in_token_out_with_the_hf_engine(tiny):
    """The tiny model's own samples under the Qwen3-style template: each model run of the
    trained ids equals what the engine sampled, environment ids are the template's new
    messages, the micro-batches train on them (helpers.check_token_in_token_out)."""
    model, tokenizer = copy.deepcopy(tiny[0]), copy.deepcopy(tiny[1])
    tokenizer.chat_template = QWEN3_STYLE
    engine = HFEngine(model, tokenizer, decoder="modules")
    sampled = spy_on(engine)
    cfg = load_config("configs/smoke.yaml", [f"env.fn={__name__}:ChatEcho", "env.max_turns=3",
                                             "env.max_turn_tokens=6", "rollout.max_new_tokens=16"]).env
    torch.manual_seed(0)
    r = RolloutWorker(engine, tokenizer, env=environment_spec(cfg)).rollout(
        [Example("What is 2 + 3?", "5"), Example("What is 4 + 4?", "8")],
        SamplingParams(n=2, max_new_tokens=16))
    check_token_in_token_out(r, sampled, tokenizer, tokenizer.pad_token_id)
    for ids, mask in zip(r.completion_ids, r.token_mask, strict=True):
        env_ids = [i for i, bit in zip(ids, mask, strict=True) if bit == 0]
        assert "<|im_start|>assistant\n<think>" not in tokenizer.decode(env_ids)  # only new messages
