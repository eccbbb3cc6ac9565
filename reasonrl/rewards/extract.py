"""Pull the final answer out of a model completion, as a string.

Three conventions, tried in priority order by `extract_answer`:
- `\\boxed{...}`: the MATH / Minerva convention (Hendrycks et al. 2021; Lewkowycz et al. 2022).
- `<answer>...</answer>`: the DeepSeek-R1 think/answer template (DeepSeek-AI 2025).
- the last number in the text: the GSM8K evaluation convention (Cobbe et al. 2021).

Model output is only ever scanned with linear-time regexes and string ops, never evaluated:
a policy in training produces arbitrary (and sometimes adversarial) strings.
"""

from __future__ import annotations

import bisect
import re

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)")
_SPACE_RE = re.compile(r"\s*")
_TOKEN_RE = re.compile(r"\s+([^\s${}]+)")  # `\boxed 5`: one whitespace-free token
_BRACE_RE = re.compile(r"[{}]")
_OPEN_TAG_RE = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG_RE = re.compile(r"</answer>", re.IGNORECASE)
# A minus only counts when it is not a binary operator ("10-3" ends in 3, not -3). The
# thousands-group branch needs a full `,ddd` group, so "1,2,3" is three numbers, not one.
_NUMBER_RE = re.compile(r"(?:(?<![\w.])-)?(?:\d+/\d+|(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?)")


def _matching_braces(text: str) -> dict[int, int]:
    """Map each `{` position to its matching `}` in one pass; unclosed `{` are left out.

    One pass over all braces (rather than one scan per `\\boxed`) keeps extraction linear
    even for inputs like "\\boxed{" * 20000. Like MATH's `last_boxed_only_string`, every
    brace counts, escaped `\\{` included.
    """
    stack: list[int] = []
    match: dict[int, int] = {}
    for m in _BRACE_RE.finditer(text):
        if m.group() == "{":
            stack.append(m.start())
        elif stack:
            match[stack.pop()] = m.start()
    return match


def extract_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}` / `\\fbox{...}` / `\\boxed 5`, stripped.

    "Last" is by start position, so `\\boxed{\\boxed{1}}` gives "1". A `\\boxed{` that is
    never closed is skipped and an earlier complete one is used; None if there is none.
    """
    starts = [m.end() for m in _BOXED_RE.finditer(text)]
    if not starts:
        return None
    braces = _matching_braces(text)
    for pos in reversed(starts):
        brace = _SPACE_RE.match(text, pos).end()
        if brace < len(text) and text[brace] == "{":
            if brace in braces:
                return text[brace + 1:braces[brace]].strip()
            continue
        token = _TOKEN_RE.match(text, pos)
        if token:
            return token.group(1).strip()
    return None


def extract_answer_tag(text: str) -> str | None:
    """Content of the last closed `<answer>...</answer>` pair (case-insensitive), stripped.

    The pair is the last `<answer>` that has a `</answer>` after it, closed by the first such
    `</answer>`. This equals the last match of a non-greedy `<answer>(.*?)</answer>` except
    that in "<answer>x<answer>y</answer>" the inner "y" wins. Tag positions are found once
    and paired with bisect, so an unclosed "<answer>" * 10**4 costs linear time, where the
    non-greedy regex would rescan the tail from every opening tag.
    """
    opens = [m.end() for m in _OPEN_TAG_RE.finditer(text)]
    closes = [m.start() for m in _CLOSE_TAG_RE.finditer(text)]
    if not opens or not closes:
        return None
    i = bisect.bisect_right(opens, closes[-1]) - 1  # last `<answer>` ending before a close
    if i < 0:
        return None
    start = opens[i]
    end = closes[bisect.bisect_left(closes, start)]
    return text[start:end].strip()


def first_between(text: str, open_tag: str, close_tag: str) -> str | None:
    """The group of the first match of `open(.*?)close` (re.DOTALL, case-sensitive), or None.

    The regex other systems search with (ReasonRL's and trl_GRPO's `<answer>(.*?)</answer>`,
    trl_GRPO's `\\boxed{.*?}`), in linear time: the first `open_tag` that has a `close_tag`
    after it is the first `open_tag` (when it has none, no later one has), closed by the first
    `close_tag` after it. The regex rescans the tail from every unclosed opening tag.
    """
    start = text.find(open_tag)
    if start < 0:
        return None
    start += len(open_tag)
    end = text.find(close_tag, start)
    return None if end < 0 else text[start:end]


def all_between(text: str, open_tag: str, close_tag: str) -> list[str]:
    """`re.findall` of `open(.*?)close` (re.DOTALL, case-sensitive), in linear time: the matches
    left to right, each search starting after the previous match (`first_between` each time)."""
    found: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return found
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return found
        found.append(text[start + len(open_tag):end])
        pos = end + len(close_tag)


def extract_last_number(text: str) -> str | None:
    """The last number in the text, as written ("-1,234.5", "3/4"); None if there is none.

    This is the GSM8K fallback: score the final number the model wrote. The match is
    returned verbatim; `parse_number` turns it into a float.
    """
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def extract_answer(text: str, fallback_last_number: bool = True) -> tuple[str | None, str]:
    """The answer string and where it came from: "boxed", "answer_tag", "last_number", "none".

    Priority: a `\\boxed{}` inside the last <answer> tag, else one anywhere (the model said
    which expression is final), then the bare <answer> content, then, if allowed, the last
    number. Turning the fallback off makes the reward demand an explicit answer format.
    """
    tag = extract_answer_tag(text)
    boxed = extract_boxed(tag) if tag is not None else None
    if boxed is None:
        boxed = extract_boxed(text)
    if boxed is not None:
        return boxed, "boxed"
    if tag is not None:
        return tag, "answer_tag"
    if fallback_last_number:
        number = extract_last_number(text)
        if number is not None:
            return number, "last_number"
    return None, "none"
