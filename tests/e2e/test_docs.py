"""The README's, the docs' and the configs' commands are ones that run: every `reasonrl ...`
line (and every `make train ARGS="..."`) in a shell code block or a config's header parses
with the CLI's own parser, and for `train`, `eval` and `probe` its config and overrides
resolve as `--print-config` resolves them (every key known, every value allowed, every config
file present). A command in a `text` block is an illustration and is not checked. The site
itself is checked by `mkdocs build --strict` in CI (`make docs`): links, anchors and the nav."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import resource
import shlex
import shutil
import sys
import time
from pathlib import Path

import pytest

from reasonrl.cli import build_parser
from reasonrl.config import load_config
from reasonrl.errors import ConfigError

REPO = Path(__file__).parents[2]
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
        elif lang == "console" and not line.strip().startswith("$ "):
            continue  # a console block's output
        elif lang in SHELL:
            yield lineno, line.strip().removeprefix("$ ")


def is_cli_command(text: str) -> bool:
    return text.startswith(("reasonrl ", "make train ARGS=")) or text == "reasonrl"


def doc_commands(path: Path, every: bool = False) -> list[tuple[str, str]]:
    """(file:line, command) for each `reasonrl` / `make train ARGS=` command of `shell_lines`
    (`every`: each command a reader types, whatever the program; not comment lines),
    continuation lines joined and the block's `NAME="..."` variables expanded."""
    found, pending, start, names = [], "", 0, {}
    for lineno, text in shell_lines(path):
        if text is None:
            names = {}
            continue
        if pending:
            pending += " " + text
        elif (is_cli_command(text) or ASSIGN.match(text)
              or (every and text and not text.startswith("#"))):
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
    if bad or (rest and args.command not in ("train", "sft", "eval", "probe", "serve")):
        raise NotACommand(f"unrecognized arguments: {' '.join(bad or rest)}")
    command_config(args, rest, REPO)


def command_config(args, rest: list[str], root: Path):
    """The config a parsed `train` / `eval` / `probe` command resolves, its config file and a
    resumed run's config.yaml read from `root` (None for the other commands)."""
    overrides = [*getattr(args, "overrides", []), *rest]
    if args.command in ("train", "sft"):
        config = args.config
        if config is not None and "=" in config and not config.endswith((".yaml", ".yml")):
            overrides, config = [config, *overrides], None
        if args.resume and config is None:
            run = root / args.resume
            run = run.parent.parent if run.parent.name == "checkpoints" else run
            if not (run / "config.yaml").is_file():
                return None  # the run's own config.yaml: exists only after a run
            config = str(run / "config.yaml")
        return load_config(config and str(root / config), overrides)
    if args.command in ("eval", "probe"):
        if args.model is not None:
            overrides.append(f"model.path={args.model}")
        if args.task is not None:
            overrides.append(f"reward.task={args.task}")
        return load_config(args.config and str(root / args.config), overrides)
    if args.command == "serve":  # CHECKPOINT may be a key=value (no checkpoint) or a run not trained here
        checkpoint = args.checkpoint
        overrides = [checkpoint, *overrides] if checkpoint and "=" in checkpoint else overrides
        return load_config(args.config and str(root / args.config), overrides)
    return None


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
    # every command a reader types (not only reasonrl's), comments left out; a console block's
    # output is not a command
    page.write_text("```bash\n# a comment\npip install x   # why\nreasonrl --help\n```\n```console\n"
                    "$ reasonrl tool calculator '1 + 1'\n{\"output\": \"2\"}\nreasonrl output\n```\n")
    assert doc_commands(page, every=True) == [("p.md:3", "pip install x   # why"),
                                              ("p.md:4", "reasonrl --help"),
                                              ("p.md:7", "reasonrl tool calculator '1 + 1'")]


def test_a_configs_header_commands_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text("# Run it:\n#   reasonrl train c.yaml a.b=1 \\\n#     c.d=2   # why\n"
                      "model:\n  path: reasonrl x\n")
    assert doc_commands(config) == [("c.yaml:2", "reasonrl train c.yaml a.b=1 c.d=2   # why")]
    assert any(where.startswith("configs/recipes/") for where, _ in COMMANDS)


# ---- every page's commands run in order, as a new user types them ----------------------------
#
# Each page (README.md, docs/*.md) gets a fresh working directory holding a copy of configs/ (and
# tests/, which a clone has and docs/scaling.md names), what the page says the reader brings
# (GIVEN_FILES: the data a user downloads, in its own layout; GIVEN_RUNS: runs the page names as
# the reader's own) and the page's `<!-- example: NAME -->` code blocks saved as NAME. Then its
# shell blocks' commands run one after the other through `reasonrl.cli.main`, the function the
# `reasonrl` script calls, in this process (a fresh interpreter per command would cost ~10 s of
# imports each). What differs from the page is written here, in these tables, and nowhere else:
# SKIPS (what cannot run here, and why), MAKE (make targets as the Makefile runs them), REWRITES
# (text replaced in a command), SMALL (overrides appended to each train / eval / probe command
# that does not set that key itself), HUB_DATASETS (Hub dataset ids served from local files).
# EXPECT holds what a page says a command prints or leaves, checked.

RUN_PAGES = ["README.md", *(f"docs/{p.name}" for p in sorted((REPO / "docs").glob("*.md")))]

SKIPS = [  # (regex on the command as the page writes it, why it does not run here)
    (r"^make test\b", "runs the test suite this test is part of"),
    (r"^make vllm\b", "installs vLLM into .venv (tests/rollout/test_vllm.py runs the engine where it is "
                      "installed)"),
    (r"^make bench\b|^python bench/", "a benchmark: minutes of runs on the real model, and bench/vs_trl.py's "
                                      "own TRL environment"),
    (r"^pip install\b", "installs packages: the test runs in the environment it is given"),
    (r"^ray (start|stop)\b", "starts or stops a Ray cluster's daemons on its machines"),
    (r"placement\.mode=ray", "needs a running Ray cluster (placement.address=auto) of GPU machines and their "
                             "shared model folder"),
    (r"rollout\.engine=vllm", "vLLM: its engine start-up takes minutes on a CPU and needs `make vllm` "
                              "(tests/rollout/test_vllm.py runs the engine where it is installed)"),
    (r"model\.path=rand135", "a GPU measurement: rand135 is a random-weight 135M model folder the page "
                             "built by hand on the H100 machine"),
    (r"^cat fourteen_children_of_400_mb\.py\b", "the page does not give the program "
                                                "(tests/tools/test_tools.py runs its like)"),
    (r"^reasonrl serve\b", "a server: it runs until stopped (tests/commands/test_serve_command.py starts "
                           "it, asks it with the openai client and stops it with SIGTERM)"),
    (r"^curl .*127\.0\.0\.1:8000/v1/", "asks the server docs/serve.md started (tests/serve/test_endpoint.py "
                                       "sends such requests)"),
]

MAKE = {  # the Makefile's targets that train: its install step (`venv`) left out
    "train": ["reasonrl", "train", "configs/default.yaml"],
}

# (regex, replacement, why): applied to the command's text in this order
REWRITES = [
    (r"(model\.path=|--model )(?!runs/)[A-Za-z][\w.-]*/[\w.-]+(?=\s|$)", r"\1tiny",
     "a Hub model id: the tiny model, no download"),
    (r"(checkpoints/step_)20\b", r"\g<1>2", "a 20-step run's last checkpoint: runs here are 2 steps (SMALL)"),
    (r"runs/R/checkpoints/step_N", "{newest_checkpoint}",
     "R and N: the page's names for the run it has just trained and its last step"),
    (r"--(limit|skip) 327680\b", r"--\1 8",
     "TinyZero's Countdown windows (the first 327,680 records train, the 1,024 after them test) on the "
     "12-record stand-in: 8 train, 4 test"),
    (r"train\[:327680\]", "train[:8]", "the same windows of the Hub stand-in"),
    (r"train\[327680:328704\]", "train[8:12]", "the same windows of the Hub stand-in"),
    (r"train\[:-1000\]", "train[:-4]", "the last 1,000 records held out: the stand-in's last 4 of 12"),
    (r"train\[-1000:\]", "train[-4:]", "the last 1,000 records held out: the stand-in's last 4 of 12"),
    (r"trainer\.steps=200\b", "trainer.steps=4", "a run extended from 20 to 200 steps: from 2 to 4 here"),
]

def tokens(cfg) -> str:
    """8 new tokens, or more where the config asks for more: an overlong buffer below the limit
    (algorithms.md's DAPO line: 16), turns of env.max_turn_tokens (configs/tool_calculator.yaml: 24)."""
    return str(max(8, cfg.algo.overlong_buffer + 1, cfg.env.max_turn_tokens))


def judge_path(cfg) -> str:
    """The tiny random model as reward.model where reward.weights names `judge` or `classifier`
    (the embedded judge: ~35 s to convert and seconds per batch), else the path as it is."""
    from reasonrl.rewards.model_reward import is_model_component

    return "tiny" if any(is_model_component(k) for k in cfg.reward.weights) else cfg.reward.model.path


# appended to every train / eval / probe command that does not set the key itself (a resumed
# run got the same ones when it started, so its config is unchanged); a function of the
# command's config where the least value depends on it
SMALL = [
    ("model.path", "tiny"),              # the embedded 135M model: ~35 s to convert, minutes per run
    ("trainer.steps", "2"),
    ("trainer.epochs", "0"),             # the recipes' passes over the data: trainer.steps counts instead
    ("trainer.batch_size", "8"),         # 2 prompts x 4 samples
    ("rollout.n", "4"),
    ("rollout.max_new_tokens", tokens),  # 8, or the fewest the command's own settings allow
    ("eval.max_new_tokens", tokens),
    ("data.val_size", "4"),              # held-out problems
    ("data.arithmetic.train_size", "64"),  # generated problems (5,000: 2 s a run)
    ("data.arithmetic.val_size", "4"),
    ("data.countdown.train_size", "64"),
    ("data.countdown.val_size", "4"),
    ("trainer.progress", "false"),
    ("tracking.report", "false"),        # 2 s of plots per run; the pages' `reasonrl report` draws them
    ("reward.model.path", judge_path),   # the tiny judge / reward model where the weights name one
]

GSM8K, RECIPES = "tests/fixtures/gsm8k", "tests/fixtures/recipes"
# Hub dataset id -> {subset: {split: repository files}}: what `datasets.load_dataset` returns for it
# here (split slicing as datasets does it); the records are in the dataset's own layout
HUB_DATASETS = {
    "openai/gsm8k": {"main": {"train": [f"{GSM8K}/train.jsonl"],
                              "test": [f"{GSM8K}/test.jsonl", f"{GSM8K}/train.jsonl"]}},  # 30: test[:5%] is 2
    "Jiayi-Pan/Countdown-Tasks-3to4": {"": {"train": [f"{RECIPES}/countdown_3to4.parquet"]}},
    "DigitalLearningGmbH/MATH-lighteval": {"": {"train": ["tests/fixtures/math_style.jsonl"],
                                                "test": ["tests/fixtures/math_style.jsonl"]}},
    "HuggingFaceH4/MATH-500": {"": {"test": ["tests/fixtures/math_style.jsonl"]}},
}


def math_folder(dest: Path) -> None:
    """The official MATH layout: one problem per JSON file, a folder per subject."""
    for i, line in enumerate((REPO / "tests/fixtures/math_style.jsonl").read_text().splitlines()):
        record = json.loads(line)
        folder = dest / record["type"].lower().replace(" ", "_")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.json").write_text(json.dumps(record))


def completions(dest: Path) -> None:
    """`reasonrl reward --file`'s records, as docs/tasks.md describes them."""
    records = [{"completion": "So the sum is \\boxed{\\frac{1}{2}}.", "ground_truth": "\\frac{1}{2}"},
               {"completion": "x = 3", "ground_truth": "(1,3)", "task": "math"},
               {"completion": "<answer>7</answer>", "ground_truth": "7", "data_source": "gsm8k"}]
    dest.write_text("".join(json.dumps(r) + "\n" for r in records))


# what a page says the reader has downloaded, where it says it goes: page -> {path: source}
GIVEN_FILES = {
    "docs/recipes.md": {"gsm8k/train.jsonl": f"{GSM8K}/train.jsonl",       # GSM8K's official files
                        "gsm8k/test.jsonl": f"{GSM8K}/test.jsonl",
                        "countdown/train.parquet": f"{RECIPES}/countdown_3to4.parquet",  # TinyZero's layout
                        "train.parquet": f"{RECIPES}/easyrl_train.parquet",  # EasyRL's Parquet
                        "valid.parquet": f"{RECIPES}/easyrl_valid.parquet"},
    "docs/tasks.md": {"train.jsonl": f"{GSM8K}/train.jsonl", "MATH/train": math_folder,
                      "countdown.parquet": f"{RECIPES}/countdown_3to4.parquet",
                      "completions.jsonl": completions},
    "docs/evaluation.md": {"gsm8k/test.jsonl": f"{GSM8K}/test.jsonl"},
}
# runs a page names as the reader's own (`runs/r`, `runs/a`): trained first, with SMALL
GIVEN_RUNS = {
    "README.md": [f"reasonrl train configs/smoke.yaml trainer.run_name={name}" for name in "rab"],
    "docs/tracking.md": [f"reasonrl train configs/smoke.yaml trainer.run_name={name}" for name in "rab"],
    "docs/evaluation.md": ["reasonrl train configs/smoke.yaml trainer.run_name=r"],
}


def _json_line(out: str, key: str = "score") -> dict:
    return next(json.loads(line) for line in out.splitlines() if line.startswith("{") and f'"{key}"' in line)


def _summaries(cwd: Path) -> dict[str, str]:
    return {str(p.relative_to(cwd)): p.read_text() for p in sorted(cwd.glob("runs/*/summary.json"))}


# page -> [(regex on the page's command, comment left out, check(stdout, working dir, summary.json
# files before))]: what the page says it prints or leaves; each must match a command of its page
EXPECT = {
    "docs/sft.md": [
        (r"^reasonrl data traces sampled\.json",
         lambda out, cwd, before: "wrote 2 SFT records to good.jsonl" in out),
    ],
    "docs/reward-functions.md": [
        (r"^reasonrl reward --fn my_verl_reward\.py", lambda out, cwd, before: _json_line(out)["parts"] == {
            "acc": 1.0} and _json_line(out)["score"] == 1.0),
    ],
    "docs/usage.md": [
        (r"^reasonrl --help$", lambda out, cwd, before: all(
            c in out for c in ("train", "eval", "probe", "report", "reward", "data", "tool", "calibrate"))),
        (r"--print-config$", lambda out, cwd, before: "trainer:" in out and "steps: 2" in out),
        (r"^reasonrl calibrate --precision$", lambda out, cwd, before: out.startswith(
            "model.precision=auto -> ") and "precision | " in (cwd / "calibration.json").read_text()),
        (r"^reasonrl calibrate --reset$", lambda out, cwd, before: not (cwd / "calibration.json").exists())],
    "docs/tasks.md": [
        (r"^reasonrl reward --task countdown", lambda out, cwd, before: _json_line(out) == {
            "task": "countdown", "score": 1.0, "components": {"correct": 1.0},
            "parts": {"format": 1.0, "valid": 1.0, "equals_target": 1.0}, "timeout": False, "error": None}),
        (r"^reasonrl reward --file",
         lambda out, cwd, before: _json_line(out, "summary")["summary"]["records"] == 3),
        (r"--skip 327680 --limit 1024", lambda out, cwd, before: "wrote 4 countdown records" in out)],
    "docs/recipes.md": [
        (r"^reasonrl reward --config configs/recipes/trl_grpo_format\.yaml",
         lambda out, cwd, before: _json_line(out)["score"] == 2.0),
        (r"--skip 327680 --limit 1024", lambda out, cwd, before: "wrote 4 countdown records" in out)],
    "docs/tools.md": [
        (r"^reasonrl tool calculator '347 \* 29'$",
         lambda out, cwd, before: _json_line(out, "tool")["output"] == "10063")],
    "docs/checkpoints.md": [  # resuming a finished run trains nothing and leaves its summary.json as it was
        (r"^reasonrl train --resume runs/r$", lambda out, cwd, before: _summaries(cwd) == before)],
}


def page_examples(page: Path) -> dict[str, str]:
    """The page's `<!-- example: NAME -->` code blocks: NAME -> the code (the reader saves them)."""
    text = page.read_text(encoding="utf-8")
    return {m.group(1): m.group(2)
            for m in re.finditer(r"<!-- example: (\S+) -->\s*```\w*\n(.*?)```", text, re.S)}


def skip_reason(command: str) -> str | None:
    return next((why for pattern, why in SKIPS if re.search(pattern, command)), None)


def rewrite(command: str, cwd: Path) -> str:
    for pattern, replacement, _ in REWRITES:
        if replacement == "{newest_checkpoint}":
            if re.search(pattern, command):
                run = max(cwd.glob("runs/*/checkpoints/step_*"), key=lambda p: p.stat().st_mtime)
                command = re.sub(pattern, str(run.relative_to(cwd)), command)
        else:
            command = re.sub(pattern, replacement, command)
    return command


def typed_argv(command: str) -> tuple[list[str], str | None]:
    """The `reasonrl` argv (without the program) a command runs, and its standard input (from
    `echo '...' | reasonrl ...`); a command that is not a reasonrl one fails the test."""
    stdin = None
    pipe = re.fullmatch(r"echo (.+?) \| (reasonrl .*)", command)
    if pipe:
        stdin, command = shlex.split(pipe.group(1))[0] + "\n", pipe.group(2)
    words = shlex.split(command, comments=True)
    if words[:1] == ["make"] and words[1] in MAKE:
        args = [w.removeprefix("ARGS=") for w in words[2:]]
        words = [*MAKE[words[1]], *(a for arg in args for a in shlex.split(arg))]
    assert words[:1] == ["reasonrl"], f"`{command}`: not a reasonrl command; run it here or add it to SKIPS"
    return words[1:], stdin


def with_small(argv: list[str], cwd: Path) -> list[str]:
    if argv[:1] not in (["train"], ["sft"], ["eval"], ["probe"]) or "--help" in argv:
        return argv
    unset = [(key, value) for key, value in SMALL if not any(a.startswith(f"{key}=") for a in argv)]
    if any(callable(value) for _, value in unset):
        cfg = command_config(*build_parser().parse_known_args(argv), cwd)
        unset = [(key, value(cfg) if callable(value) else value) for key, value in unset]
    return [*argv, *(f"{key}={value}" for key, value in unset)]


def missing_extra(argv: list[str], cwd: Path) -> str | None:
    """The extra a command's config needs that is not installed (`make test-bare` has none)."""
    if argv[:1] == ["reward"] and "reasoning_gym" in argv and not importlib.util.find_spec("reasoning_gym"):
        return "needs reasoning_gym, which is not installed"
    if argv[:1] not in (["train"], ["sft"], ["eval"], ["probe"]):
        return None
    args, rest = build_parser().parse_known_args(argv)
    cfg = command_config(args, rest, cwd)
    needs = {"peft": cfg and cfg.model.lora.rank > 0,
             **{name: cfg and name in cfg.tracking.backends for name in ("tensorboard", "wandb")},
             "openenv": cfg and "openenv_echo.py" in cfg.env.fn,  # the real OpenEnv package's class
             "verifiers": cfg and cfg.data.task == "verifiers",
             "reasoning_gym": cfg and cfg.data.task == "reasoning_gym",
             # an agent episode talks to the endpoint (the serve extra); a function agent, through openai
             **{name: cfg and cfg.env.format == "agent" for name in ("fastapi", "uvicorn")},
             "openai": cfg and cfg.env.format == "agent" and not cfg.env.agent.command}
    return next((f"needs {module}, which is not installed" for module, needed in needs.items()
                 if needed and importlib.util.find_spec(module) is None), None)


def cpu_seconds() -> float:
    """CPU time of this process and its children that ended (reward workers, the rollout process)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def invoke(argv: list[str], stdin: str | None, monkeypatch, capsys) -> tuple[int, str, str]:
    from reasonrl.cli import main

    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's --help and its errors
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """`datasets.load_dataset` of a HUB_DATASETS id reads its local files; every call caches
    under tmp_path; the Hub itself is off (an id not in the table fails at once, not after
    retries)."""
    datasets = pytest.importorskip("datasets")
    import huggingface_hub

    real, cache = datasets.load_dataset, str(tmp_path / "datasets-cache")

    def load_dataset(path, name=None, split=None, **kwargs):
        kwargs.setdefault("cache_dir", cache)
        if path not in HUB_DATASETS:
            return real(path, name, split=split, **kwargs)
        subsets = HUB_DATASETS[path]
        if (name or "") not in subsets:
            raise ValueError(f"BuilderConfig '{name}' not found. Available: {list(subsets)}")
        files = {s: [str(REPO / f) for f in fs] for s, fs in subsets[name or ""].items()}
        kind = "parquet" if files[next(iter(files))][0].endswith(".parquet") else "json"
        return real(kind, data_files=files, split=split, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def run_page(page: str, cwd: Path, monkeypatch, capsys) -> list[tuple[str, str, str]]:
    """Run `page`'s commands in order in `cwd`; (where, command, what happened) for each."""
    cwd.mkdir()
    shutil.copytree(REPO / "configs", cwd / "configs")
    (cwd / "tests").symlink_to(REPO / "tests")
    monkeypatch.chdir(cwd)
    # the page's own copy of the calibration cache: `reasonrl calibrate --reset` and `--precision`
    # change it, not the reader's (whose entries spare the page's runs their measurements)
    from reasonrl.accel import calibrate

    if calibrate.cache_file().is_file():
        shutil.copy(calibrate.cache_file(), cwd / "calibration.json")
    monkeypatch.setattr(calibrate, "cache_file", lambda: cwd / "calibration.json")
    for dest, source in GIVEN_FILES.get(page, {}).items():
        (cwd / dest).parent.mkdir(parents=True, exist_ok=True)
        if callable(source):
            source(cwd / dest)
        else:
            shutil.copy(REPO / source, cwd / dest)
    for name, code in page_examples(REPO / page).items():
        (cwd / name).write_text(code)
    given = [(f"given ({page})", c) for c in GIVEN_RUNS.get(page, [])]
    expect, checked, log = EXPECT.get(page, []), set(), []
    for where, command in [*given, *doc_commands(REPO / page, every=True)]:
        why = skip_reason(command)
        if why:
            log.append((where, command, f"skipped: {why}"))
            continue
        argv, stdin = typed_argv(rewrite(command, cwd))
        argv = with_small(argv, cwd)
        why = missing_extra(argv, cwd)
        if why:
            log.append((where, command, f"skipped: {why}"))
            continue
        before = _summaries(cwd)
        start, cpu = time.perf_counter(), cpu_seconds()
        code, out, err = invoke(argv, stdin, monkeypatch, capsys)
        ran = " ".join(shlex.quote(a) for a in ["reasonrl", *argv])
        assert code == 0, f"{where}: `{command}` exited {code}\nran: {ran}\n{err[-3000:]}"
        typed = " ".join(shlex.quote(w) for w in shlex.split(command, comments=True))
        for i, (pattern, check) in enumerate(expect):
            if re.search(pattern, typed):
                assert check(out, cwd, before), f"{where}: `{command}` not as the page says:\n{out[-2000:]}"
                checked.add(i)
        log.append((where, command, f"ran in {time.perf_counter() - start:.1f} s "
                                    f"({cpu_seconds() - cpu:.1f} s of CPU): {ran}"))
    assert checked == set(range(len(expect))), f"{page}: EXPECT entries that match no command: " + ", ".join(
        expect[i][0] for i in range(len(expect)) if i not in checked)
    return log


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_a_pages_commands_run_in_order(page, tmp_path, monkeypatch, capsys, offline_hub):
    log = run_page(page, tmp_path / "clone", monkeypatch, capsys)
    with capsys.disabled():
        print(f"\n{page}:", *(f"  {where}: {what}" for where, _, what in log), sep="\n")


def test_the_run_tables_name_what_the_pages_hold():
    """Every skip, rewrite and Hub stand-in matches a command of the pages, every page given
    files or runs is a page: an entry left behind by a page's edit fails here, not silently."""
    commands = [c for page in RUN_PAGES for _, c in doc_commands(REPO / page, every=True)]
    for pattern, why in SKIPS:
        assert any(re.search(pattern, c) for c in commands), f"SKIPS: {pattern} ({why}) matches no command"
    for pattern, _, why in REWRITES:
        assert any(re.search(pattern, c) for c in commands), f"REWRITES: {pattern} ({why}) matches no command"
    for name in HUB_DATASETS:
        assert any(name in c for c in commands), f"HUB_DATASETS: no page reads {name}"
    assert {*GIVEN_FILES, *GIVEN_RUNS, *EXPECT} <= set(RUN_PAGES)
    assert "my_envs.py" in page_examples(REPO / "docs/environments.md")


def test_a_typed_command_becomes_the_argv_the_cli_gets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert typed_argv('make train ARGS="trainer.steps=40 optim.lr=1e-5"') == (
        ["train", "configs/default.yaml", "trainer.steps=40", "optim.lr=1e-5"], None)
    assert typed_argv("echo 'x = bytearray(600 << 20)' | reasonrl tool python -") == (
        ["tool", "python", "-"], "x = bytearray(600 << 20)\n")
    assert typed_argv("reasonrl train c.yaml a.b=1   # why") == (["train", "c.yaml", "a.b=1"], None)
    with pytest.raises(AssertionError, match="not a reasonrl command"):
        typed_argv("ls -la")
    assert skip_reason("reasonrl train configs/default.yaml rollout.engine=vllm").startswith("vLLM")
    assert skip_reason("reasonrl train configs/default.yaml") is None
    assert rewrite("reasonrl eval --model Qwen/Qwen2.5-0.5B-Instruct x.path=runs/r/checkpoints/step_20",
                   tmp_path) == "reasonrl eval --model tiny x.path=runs/r/checkpoints/step_2"
    # SMALL fills in what the command leaves out, never what it sets; the tokens follow its config
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    argv = with_small(["train", "configs/default.yaml", "rollout.n=2", "algo.overlong_buffer=16"], tmp_path)
    assert argv.count("rollout.n=2") == 1 and not any(a.startswith("rollout.n=4") for a in argv)
    assert "model.path=tiny" in argv and "rollout.max_new_tokens=17" in argv
    assert "rollout.max_new_tokens=24" in with_small(["train", "configs/tool_calculator.yaml"], tmp_path)
    assert with_small(["report", "runs/a"], tmp_path) == ["report", "runs/a"]
