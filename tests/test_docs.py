"""The README's, the docs' and the configs' commands are ones that run: every `reasonrl ...`
line (and every `make train ARGS="..."`) in a shell code block or a config's header parses
with the CLI's own parser, and for `train`, `eval` and `probe` its config and overrides
resolve as `--print-config` resolves them (every key known, every value allowed, every config
file present). A command in a `text` block is an illustration and is not checked. The site
itself is checked by `mkdocs build --strict` in CI (`make docs`): links, anchors and the nav."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from reasonrl.cli import build_parser
from reasonrl.config import load_config
from reasonrl.errors import ConfigError

REPO = Path(__file__).parent.parent
SHELL = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^```(\w*)\s*$")
ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$")


def shell_lines(path: Path):
    """(line number, text) of the shell a reader would copy: in Markdown the lines of shell code
    blocks (None between blocks: a block's variables end with it), in a YAML config its
    comment lines (the headers' example commands)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix in (".yaml", ".yml"):
        for lineno, line in enumerate(lines, start=1):
            if line.startswith("#"):
                yield lineno, line.lstrip("#").strip()
        return
    lang = None
    for lineno, line in enumerate(lines, start=1):
        fence = FENCE.match(line.strip())
        if fence:
            lang = fence.group(1) if lang is None else None
            yield lineno, None
        elif lang in SHELL:
            yield lineno, line.strip().removeprefix("$ ")


def doc_commands(path: Path) -> list[tuple[str, str]]:
    """(file:line, command) for each `reasonrl` / `make train ARGS=` command of `shell_lines`,
    continuation lines joined and the block's `NAME="..."` variables expanded."""
    found, pending, start, names = [], "", 0, {}
    for lineno, text in shell_lines(path):
        if text is None:
            names = {}
            continue
        if pending:
            pending += " " + text
        elif text.startswith(("reasonrl ", "make train ARGS=")) or text == "reasonrl" or ASSIGN.match(text):
            pending, start = text, lineno
        else:
            continue
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        assign = ASSIGN.match(pending)
        if assign:
            names[assign.group(1)] = " ".join(shlex.split(assign.group(2)))
        else:
            for name, value in names.items():
                pending = re.sub(rf"\$\{{?{name}\b\}}?", lambda _, v=value: v, pending)
            found.append((f"{path.relative_to(REPO)}:{start}", pending))
        pending = ""
    return found


def all_commands() -> list[tuple[str, str]]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "configs").rglob("*.yaml"))]
    return [c for f in files for c in doc_commands(f)]


class NotACommand(Exception):
    """A documented command the CLI would refuse (other than by argparse or the config)."""


def check_command(command: str) -> None:
    """Parse `command` as the CLI would and resolve its config: SystemExit (argparse),
    ConfigError (a key, value or config file) or NotACommand on anything wrong."""
    words = shlex.split(command, comments=True)
    if words[:2] == ["make", "train"]:
        args = shlex.split(words[2].removeprefix("ARGS="))
        words = ["reasonrl", "train", "configs/default.yaml", *args]
    if words[0] != "reasonrl":
        raise NotACommand(command)
    parser = build_parser()
    if words[1:] in ([], ["--help"]) or "--help" in words or "-h" in words:
        return
    args, rest = parser.parse_known_args(words[1:])
    bad = [a for a in rest if "=" not in a or a.startswith("-")]
    if bad or (rest and args.command not in ("train", "eval", "probe")):
        raise NotACommand(f"unrecognized arguments: {' '.join(bad or rest)}")
    overrides = [*getattr(args, "overrides", []), *rest]
    if args.command == "train":
        config = args.config
        if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
            overrides, config = [config, *overrides], None
        if args.resume and config is None:
            return  # the run's own config.yaml: exists only after a run
        load_config(config and str(REPO / config), overrides)
    elif args.command in ("eval", "probe"):
        if args.model is not None:
            overrides.append(f"model.path={args.model}")
        if args.task is not None:
            overrides.append(f"reward.task={args.task}")
        load_config(args.config and str(REPO / args.config), overrides)


COMMANDS = all_commands()


def test_the_docs_hold_the_commands_a_user_copies():
    where = {w.split(":")[0] for w, _ in COMMANDS}
    assert len(COMMANDS) >= 60, len(COMMANDS)
    for page in ("README.md", "docs/usage.md", "docs/tasks.md", "docs/evaluation.md", "docs/checkpoints.md",
                 "docs/models.md", "docs/scaling.md", "docs/recipes.md"):
        assert page in where, f"no checked command in {page}"


@pytest.mark.parametrize("where, command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses(where, command):
    try:
        check_command(command)
    except SystemExit as stop:  # argparse's error exit
        pytest.fail(f"{where}: `{command}` does not parse (argparse exit {stop.code})")


@pytest.mark.parametrize("command", [
    "reasonrl train configs/default.yaml algo.no_such_key=1",
    "reasonrl train configs/default.yaml algo.advantage=grpoo",
    "reasonrl train configs/no_such.yaml",
    "reasonrl eval --config configs/default.yaml --no-such-option",
    "reasonrl data prepare gsm8k --inptu x.jsonl --output y.jsonl",
    "make train ARGS=\"optim.lr=fast\"",
])
def test_the_checker_refuses_a_command_that_would_fail(command):
    with pytest.raises((SystemExit, ConfigError, NotACommand)):
        check_command(command)


def test_commands_are_found_in_shell_blocks_only_with_continuations_joined(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    page = tmp_path / "p.md"
    page.write_text("```bash\nreasonrl eval --config c.yaml \\\n    --greedy   # note\nls\n```\n"
                    "```text\nreasonrl train PLACEHOLDER\n```\nreasonrl train prose\n"
                    "```\n$ make train ARGS=\"trainer.steps=2\"\n```\n"
                    "```sh\nC=\"a.b=1 \\\n   c.d=2\"\nreasonrl train x.yaml $C e.f=3\n```\n")
    assert doc_commands(page) == [("p.md:2", "reasonrl eval --config c.yaml --greedy   # note"),
                                  ("p.md:11", "make train ARGS=\"trainer.steps=2\""),
                                  ("p.md:16", "reasonrl train x.yaml a.b=1 c.d=2 e.f=3")]


def test_a_configs_header_commands_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("# Run it:\n#   reasonrl train c.yaml a.b=1 \\\n#     c.d=2   # why\n"
                      "model:\n  path: reasonrl x\n")
    assert doc_commands(config) == [("c.yaml:2", "reasonrl train c.yaml a.b=1 c.d=2   # why")]
    assert any(where.startswith("configs/recipes/") for where, _ in COMMANDS)
