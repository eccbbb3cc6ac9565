"""SFT records as token rows: a prompt, a completion and the completion's loss mask, the layout
the learner's micro-batches already take (`reasonrl.model.forward.make_micro_batches`: the
prompt is context, the completion's tokens are targets where the mask is 1; a multi-turn
episode's environment tokens are masked the same way).

How a record becomes tokens, through the model's own chat template:

- a pair whose prompt is text, with `data.apply_chat_template` (the default): the prompt is the
  user turn after `data.system_prompt` (resolved as `reasonrl train` resolves it) and the tools
  (a record's own `tools`, else the run's environment's), exactly what `train` feeds the model
  (`reasonrl.data.render_prompt`: through the template's `tools=`, or in the system message for a
  template that ignores them), and the completion the assistant turn; the other cases below then
  apply to that conversation;
- a conversation (or a pair in messages): rendered turn by turn (prime-rl's SFT data and verl's
  multi-turn SFT dataset build their loss masks the same way): each turn's text is what the
  template adds for it, given the turns before; an assistant turn's text after the template's
  generation prompt (`add_generation_prompt=True` before it) is trained, up to and including its
  first stop token (the engine's: `generation_config.eos_token_id`, else the tokenizer's EOS),
  so a completion is trained exactly as the engine samples one; the role header, what the
  template writes after the stop token, and every system, user and tool turn are context
  (mask 0). A template that rewrites earlier turns when a later one is added (some drop
  earlier reasoning) cannot be cut this way: the record is refused, naming it;
- a text pair under `data.apply_chat_template=false`: the prompt verbatim, the completion
  verbatim with the stop token appended (TRL appends the EOS to non-conversational data).

Each piece is tokenised on its own (`add_special_tokens=False`, as `train` tokenises a rendered
prompt): the prompt's tokens are then the ones `train` would give the engine, and a completion's
the ones its text tokenises to on its own.

`sft.completion_only=false` trains on every token after the first (TRL's
`completion_only_loss=False`): prompts, system and user turns included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from reasonrl.data.prompts import tools_system_text
from reasonrl.errors import DataError
from reasonrl.sft.records import SFTRecord


@dataclass
class SFTRow:
    """One record's tokens: `prompt_ids` (context, never a target), `completion_ids` and their
    `token_mask` (1 on a trained token)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    token_mask: list[int]
    where: str

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def trained(self) -> int:
        return sum(self.token_mask)


@dataclass(frozen=True)
class RowSettings:
    """What turns records into rows besides the tokenizer: `data.apply_chat_template`, the
    resolved `data.system_prompt`, `sft.completion_only`, `sft.max_tokens`, `sft.truncate`, the
    engine's stop tokens, and the run's environment's tools (JSON schemas; a record's own win)."""

    apply_chat_template: bool = True
    system_prompt: str = ""
    completion_only: bool = True
    max_tokens: int = 1024
    truncate: str = "error"
    stop_ids: tuple[int, ...] = ()
    tools: tuple[dict, ...] = ()


def stop_token_ids(model, tokenizer) -> tuple[int, ...]:
    """The tokens generation stops at, as the engines read them: the model's
    `generation_config.eos_token_id` (one or several), else the tokenizer's EOS."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    return tuple(sorted(set(eos if isinstance(eos, list) else [eos])))


def conversation(record: SFTRecord, settings: RowSettings) -> list[dict]:
    """The record as one list of messages (a pair: prompt turns, then completion turns), with
    the system prompt first unless the record opens with its own (`render_prompt`'s rule)."""
    if record.messages is not None:
        messages = list(record.messages)
    else:
        prompt = (record.prompt if isinstance(record.prompt, list)
                  else [{"role": "user", "content": record.prompt}])
        completion = (record.completion if isinstance(record.completion, list)
                      else [{"role": "assistant", "content": record.completion}])
        messages = [*prompt, *completion]
    if settings.system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": settings.system_prompt}, *messages]
    return messages


def _render(tokenizer, messages: list[dict], tools: list[dict] | None, generation_prompt: bool, where: str,
            key: str) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    except Exception as err:  # jinja's TemplateError, a template's raise_exception, ...
        raise DataError(f"{where}: field '{key}': the model's chat template cannot render it "
                        f"({type(err).__name__}: {err})") from None


def with_tools(messages: list[dict], tools: list[dict] | None, tokenizer, where: str,
               key: str) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools for the template's `tools=`): as `render_prompt` renders tools, through
    `tools=` where the template renders them, else described in the system message
    (`tools_system_text`) and None."""
    if not tools:
        return messages, None
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = messages[:first]
    rendered = _render(tokenizer, prompt, tools, True, where, key)
    if rendered != _render(tokenizer, prompt, None, True, where, key):
        return messages, tools
    block = tools_system_text(tools)
    if messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}, *messages[1:]], None
    return [{"role": "system", "content": block}, *messages], None


def chat_tokens(record: SFTRecord, tokenizer, settings: RowSettings) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of the record's conversation through the chat template, turn by
    turn (module docstring)."""
    messages = conversation(record, settings)
    key = "messages" if record.messages is not None else "prompt"
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    if first == 0:
        raise DataError(f"{record.where}: field '{key}': the conversation opens with an assistant turn; "
                        "it needs a system or user turn before it (its prompt)")
    messages, tools = with_tools(messages, record.tools or list(settings.tools), tokenizer, record.where, key)
    stops = set(settings.stop_ids)
    context = 0 if settings.completion_only else 1

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            head = _render(tokenizer, messages[:i], tools, True, record.where, key)
        else:
            head = rendered
        full = _render(tokenizer, messages[: i + 1], tools, False, record.where, key)
        if not head.startswith(rendered) or not full.startswith(head):
            raise DataError(f"{record.where}: field '{key}': the model's chat template renders turn {i} "
                            f"({message['role']}) by changing the text of the turns before it, so its "
                            "tokens cannot be told apart; give the conversation up to that turn as its "
                            "own record, or use a model whose template appends turns")
        before = encode(head[len(rendered):])
        ids += before
        mask += [context] * len(before)
        turn = encode(full[len(head):])
        if message["role"] == "assistant":
            end = next((k + 1 for k, t in enumerate(turn) if t in stops), len(turn))
            mask += [1] * end + [context] * (len(turn) - end)  # after the stop: the template's, never sampled
        else:
            mask += [context] * len(turn)
        ids += turn
        rendered = full
    return ids, mask


def text_tokens(record: SFTRecord, tokenizer, settings: RowSettings) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a text pair without the chat template: the prompt verbatim
    (context), the completion verbatim and the first stop token (trained)."""
    prompt = tokenizer(record.prompt, add_special_tokens=False)["input_ids"]
    completion = tokenizer(record.completion, add_special_tokens=False)["input_ids"]
    completion += list(settings.stop_ids[:1])
    context = 0 if settings.completion_only else 1
    return prompt + completion, [context] * len(prompt) + [1] * len(completion)


def to_row(record: SFTRecord, tokenizer, settings: RowSettings) -> SFTRow:
    """One record's row (module docstring), cut to `settings.max_tokens` under
    `truncate=right`. The prompt is everything before the first trained token (at least one
    token: the hidden state that predicts it). A DataError when no token is left to train on."""
    raw = (record.messages is None and isinstance(record.prompt, str) and isinstance(record.completion, str)
           and not settings.apply_chat_template)
    ids, mask = (text_tokens if raw else chat_tokens)(record, tokenizer, settings)
    if settings.truncate == "right":
        ids, mask = ids[: settings.max_tokens], mask[: settings.max_tokens]
    start = next((k for k, m in enumerate(mask) if m and k > 0), None)
    if start is None:
        why = (f"its first {settings.max_tokens} tokens (sft.max_tokens) hold none of the completion"
               if settings.truncate == "right" else "no token of it is trained")
        raise DataError(f"{record.where}: nothing to train on: {why}")
    return SFTRow(ids[:start], ids[start:], mask[start:], record.where)


def to_rows(records: Sequence[SFTRecord], tokenizer, settings: RowSettings, what: str = "records",
            shown: int = 10) -> list[SFTRow]:
    """Every record's row; under `truncate=error` a DataError listing every record longer than
    `settings.max_tokens` (the first `shown` with their file:line and length, then how many
    more), so that a run stops at start-up with all of them rather than at the first."""
    rows = [to_row(r, tokenizer, settings) for r in records]
    longer = [row for row in rows if row.tokens > settings.max_tokens]
    if longer and settings.truncate == "error":
        listed = "; ".join(f"{row.where} ({row.tokens} tokens)" for row in longer[:shown])
        more = f"; and {len(longer) - shown} more" if len(longer) > shown else ""
        raise DataError(f"{len(longer)} {what} longer than sft.max_tokens={settings.max_tokens}: {listed}"
                        f"{more}. Raise sft.max_tokens, shorten them, or cut them at the end with "
                        "sft.truncate=right")
    return rows
