"""docs/architecture.md cannot drift from the code: the layers it draws are the import-linter
contract's in pyproject.toml, the stages of its step are the ones `Trainer.step` times and
the report plots, every Python excerpt on it is quoted from the source, its file tree is the
package's, its protocol and registry tables are the code's, and tests/ mirrors the package."""

from __future__ import annotations

import re
from pathlib import Path

from reasonrl.report import STAGES

REPO = Path(__file__).parent.parent
PAGE = REPO / "docs" / "architecture.md"
FENCE = re.compile(r"^```(\w*)\s*$")


def section(title: str) -> str:
    """The text of the page's `## title` section."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def code_blocks(text: str, lang: str) -> list[tuple[int, list[str]]]:
    """(line number, lines) of each fenced block of language `lang` in `text`."""
    blocks, current, start, inside = [], [], 0, None
    for lineno, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line.strip())
        if fence and inside is None:
            inside, current, start = fence.group(1), [], lineno
        elif fence:
            if inside == lang:
                blocks.append((start, current))
            inside = None
        elif inside is not None:
            current.append(line)
    return blocks


def declared_layers() -> list[list[str]]:
    """The layers of pyproject.toml's `layers` contract, top first, as module names under
    reasonrl (read by pattern: tomllib is not in Python 3.10)."""
    pyproject = (REPO / "pyproject.toml").read_text()
    (block,) = re.findall(r'type = "layers"\s*\nlayers = \[(.*?)\]', pyproject, re.S)
    return [[m.strip().removeprefix("reasonrl.") for m in layer.split("|")]
            for layer in re.findall(r'"([^"]+)"', block)]


def drawn_layers() -> list[list[str]]:
    """The layers the page's Layers section draws: each line's first column (before two spaces)."""
    (_, lines), = code_blocks(section("Layers"), "text")
    return [[m.strip() for m in re.split(r"\s{2,}", line.strip())[0].split("|")]
            for line in lines if line.strip()]


def test_the_page_draws_the_layers_pyproject_declares():
    assert drawn_layers() == declared_layers()


def step_stages() -> list[str]:
    """The stages a step times, in order: `collect_batch`'s (rollout, reward), then each
    `timed(times, "<stage>", ...)` call of `Trainer.step`."""
    collect = (REPO / "reasonrl" / "source" / "collect.py").read_text()
    (seconds,) = re.findall(r"seconds = \{(.*?)\}", collect)
    trainer = (REPO / "reasonrl" / "train" / "trainer.py").read_text()
    step = trainer[trainer.index("    def step(self)"):]
    step = step[: step.index("\n    def ", 1)]
    return re.findall(r'"(\w+)": 0\.0', seconds) + re.findall(r'timed\(times, "(\w+)"', step)


def test_the_page_the_report_and_the_step_name_the_same_stages():
    stages = step_stages()
    assert stages == ["rollout", "reward", "logprobs", "reference", "teacher", "values", "advantage",
                      "critic", "update", "sync"]
    assert [s for s in STAGES if s != "eval"] == stages  # the report's time/<stage> plot, in step order
    (_, lines), = code_blocks(section("One training step, top to bottom"), "text")
    drawn = [m.group(1) for line in lines if (m := re.match(r"\s*-> (\w+):", line))]
    assert drawn == stages


def source_lines() -> dict[str, list[str]]:
    """Each module of reasonrl/: its non-blank lines, indentation stripped."""
    return {str(path.relative_to(REPO)): [x.strip() for x in path.read_text(encoding="utf-8").splitlines()
                                          if x.strip()]
            for path in sorted((REPO / "reasonrl").rglob("*.py"))}


def quoted_in(excerpt: list[str], source: list[str]) -> bool:
    """Whether `excerpt`'s runs (its lines between `...` lines) appear in `source`, each as
    consecutive lines, in order."""
    runs, run = [], []
    for line in excerpt:
        if line == "...":
            runs.append(run)
            run = []
        elif line:
            run.append(line)
    runs.append(run)
    at = 0
    for run in filter(None, runs):
        found = next((i for i in range(at, len(source) - len(run) + 1) if source[i: i + len(run)] == run),
                     None)
        if found is None:
            return False
        at = found + len(run)
    return True


def test_every_python_excerpt_is_quoted_from_the_source():
    sources = source_lines()
    blocks = code_blocks(PAGE.read_text(encoding="utf-8"), "python")
    assert len(blocks) >= 2  # the step and the registry example at least
    for lineno, lines in blocks:
        excerpt = [x.strip() for x in lines]
        found = [path for path, source in sources.items() if quoted_in(excerpt, source)]
        assert found, f"docs/architecture.md:{lineno}: this python block is not in any module of reasonrl/"
    step = [lines for _, lines in blocks if any("timed(times" in x for x in lines)]
    assert step and quoted_in([x.strip() for x in step[0]], sources["reasonrl/train/trainer.py"])


def test_a_changed_line_is_caught():
    source = ["a = 1", "b = 2", "c = 3", "d = 4"]
    assert quoted_in(["a = 1", "b = 2", "...", "d = 4"], source)
    assert not quoted_in(["a = 1", "c = 3"], source)  # not consecutive without `...`
    assert not quoted_in(["c = 3", "...", "a = 1"], source)  # out of order
    assert not quoted_in(["b = 2", "c = 4"], source)


# ---- the page's file tree, protocol table and registry table against the code -------------------

def tree_entries(root: str) -> list[tuple[str, str]]:
    """(name, its description) of each entry the page's file tree lists under `root` (an entry:
    a line indented two spaces, its first column; continuation lines are indented further)."""
    (_, lines), = [b for b in code_blocks(section("Where things are"), "text") if b[1][0] == "reasonrl/"]
    entries, inside = [], False
    for line in lines:
        if not line.startswith(" "):
            inside = line.strip() == root
            continue
        if inside and line.startswith("  ") and not line.startswith("   "):
            name, _, rest = line.strip().partition(" ")
            entries.append((name, rest))
        elif inside and entries:
            entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
    return entries


def test_the_file_tree_is_the_package():
    """`ls reasonrl` and the page's tree name the same modules and packages, and every module a
    package's line names exists in that package (a move or a rename fails here until the page
    follows)."""
    listed = {name for name, _ in tree_entries("reasonrl/")}
    package = REPO / "reasonrl"
    present = {p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
               if p.name not in ("__init__.py", "__pycache__")}
    assert listed == present
    for name, text in tree_entries("reasonrl/"):
        if name.endswith("/"):
            for module in re.findall(r"\b(\w+\.py)\b", text):
                found = list((package / name).rglob(module))
                assert found, f"the tree's {name} names {module}, which is not in reasonrl/{name}"


def test_the_file_tree_lists_every_benchmark():
    assert {name for name, _ in tree_entries("bench/")} == {p.name for p in (REPO / "bench").glob("*.py")}


def markdown_table(text: str, header: str) -> list[list[str]]:
    """The rows (cells stripped) of the table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_protocol_table_is_every_method_of_every_worker_api():
    from reasonrl import worker_protocols

    rows = markdown_table(section("Workers and placement"), "| protocol | methods |")
    apis = {name: getattr(worker_protocols, name) for name in
            ("PolicyWorkerAPI", "CriticWorkerAPI", "TeacherWorkerAPI", "ReferenceWorkerAPI", "JudgeWorkerAPI",
             "RolloutWorkerAPI")}
    assert [ticked(r[0])[0] for r in rows] == list(apis)
    for protocol, methods in rows:
        assert ticked(methods) == list(worker_protocols.api_methods(apis[ticked(protocol)[0]])), protocol


def test_the_registry_table_is_every_registry_and_its_entries():
    """Every registry of registry.py has its row, with exactly its entries; each row names every
    field of its registry's entry dataclass (`Registry.kind`), the ENGINES row each as `field`:."""
    import dataclasses

    from reasonrl import registry

    rows = markdown_table(section("Registries: every choice is one entry"), "| config key | registry |")
    declared = {name for name, value in vars(registry).items() if isinstance(value, registry.Registry)}
    by_name = {ticked(r[1])[0]: r for r in rows}
    assert set(by_name) == declared
    for name, row in by_name.items():
        assert ticked(row[2]) == list(getattr(registry, name).names()), name
    common = {f.name for f in dataclasses.fields(registry.Entry)}  # name, fn, doc

    def fields(reg: registry.Registry) -> set[str]:
        return {f.name for f in dataclasses.fields(reg.kind)} - common

    for name, row in by_name.items():
        named = {re.sub(r"=.*", "", word) for word in ticked(row[3])}
        assert fields(getattr(registry, name)) <= named, (name, fields(getattr(registry, name)) - named)
    assert set(re.findall(r"`(\w+)`:", by_name["ENGINES"][3])) == fields(registry.ENGINES)


# ---- the tests mirror the package --------------------------------------------------------------

def layout_problems(tests: Path, package: Path) -> list[str]:
    """What in `tests` does not mirror `package`: tests/<package>/ holds the tests of
    reasonrl/<package>/ (one folder per package, none for anything else), tests/test_<module>.py
    those of a top-level module reasonrl/<module>.py (and test_architecture.py, the page's),
    tests/e2e/ the end-to-end runs, fixtures/ and golden/ their data. No __init__.py: a test
    module is imported by its base name, so no two share one; and none imports another (a test
    module of another folder imports only if pytest happened to collect that folder first)."""
    packages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    folders -= {"e2e", "fixtures", "golden"}
    problems = [f"tests/{name}/ tests no package of reasonrl/" for name in sorted(folders - packages)]
    problems += [f"reasonrl/{name}/ has no tests/{name}/" for name in sorted(packages - folders)]
    problems += [f"tests/{p.name} tests no module reasonrl/{p.name.removeprefix('test_')}"
                 for p in sorted(tests.glob("test_*.py"))
                 if p.stem.removeprefix("test_") not in modules | {"architecture"}]
    names = [p.name for p in tests.rglob("test_*.py")
             if p.relative_to(tests).parts[0] not in ("fixtures", "golden")]
    problems += [f"{name} twice" for name in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"{p.relative_to(tests.parent)}: no __init__.py in tests/"
                 for p in sorted(tests.rglob("__init__.py"))]
    problems += [f"{p.relative_to(tests.parent)} imports a test module: what tests share is in helpers.py"
                 for p in sorted(tests.rglob("test_*.py"))
                 if re.search(r"^\s*(from|import) test_\w+", p.read_text(encoding="utf-8"), re.M)]
    return problems


def test_the_tests_mirror_the_package():
    assert layout_problems(REPO / "tests", REPO / "reasonrl") == []
    e2e = {p.name for p in (REPO / "tests" / "e2e").glob("test_*.py")}
    assert {"test_e2e.py", "test_golden.py", "test_recipes.py", "test_docs.py", "test_algo_grid.py"} <= e2e


def test_a_test_out_of_place_is_caught(tmp_path):
    package, tests = tmp_path / "reasonrl", tmp_path / "tests"
    for path in ["algo/__init__.py", "data/__init__.py", "batch.py", "__init__.py"]:
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).touch()
    for path in ["algo/test_gae.py", "data/test_data.py", "e2e/test_e2e.py", "fixtures/x.py", "test_batch.py",
                 "test_architecture.py", "__pycache__/x.pyc"]:
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).touch()
    assert layout_problems(tests, package) == []
    for path in ["trainer/test_trainer.py", "test_gae.py", "test_rewards.py", "algo/__init__.py"]:
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).touch()
    (tests / "e2e" / "test_e2e.py").write_text("import torch\nfrom test_batch import RUNS\n")
    (tests / "data" / "test_data.py").rename(tests / "algo" / "test_data.py")
    (tests / "data").rmdir()
    assert layout_problems(tests, package) == [
        "tests/trainer/ tests no package of reasonrl/", "reasonrl/data/ has no tests/data/",
        "tests/test_gae.py tests no module reasonrl/gae.py",
        "tests/test_rewards.py tests no module reasonrl/rewards.py",
        "test_gae.py twice", "tests/algo/__init__.py: no __init__.py in tests/",
        "tests/e2e/test_e2e.py imports a test module: what tests share is in helpers.py"]


# ---- every [reasonrl] line goes through reasonrl/console.py -------------------------------------

def console_line_literals(package: Path) -> list[str]:
    """`path:line` of every string literal outside reasonrl/console.py that begins a `[reasonrl]`
    console line (a print, a message written by hand): each must be `console.info` /
    `console.warning` / `console.error`, so that the quiet and JSON modes reach it."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == "console.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.lstrip("\n").startswith("[reasonrl]")):
                found.append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return found


def test_no_module_but_console_writes_a_reasonrl_line():
    assert console_line_literals(REPO / "reasonrl") == []


def test_a_reasonrl_line_written_by_hand_is_caught(tmp_path):
    package = tmp_path / "reasonrl"
    (package / "train").mkdir(parents=True)
    (package / "console.py").write_text('PREFIX = "[reasonrl] "\n')
    (package / "train" / "loop.py").write_text(
        'import sys\nprint("[reasonrl] done", flush=True)\n'
        'print(f"\\n[reasonrl] {sys.argv[0]}: stopping", file=sys.stderr)\nsay("reasonrl: fine")\n')
    assert console_line_literals(package) == ["reasonrl/train/loop.py:2", "reasonrl/train/loop.py:3"]


def test_the_console_imports_nothing_from_reasonrl():
    text = (REPO / "reasonrl" / "console.py").read_text(encoding="utf-8")
    assert not re.search(r"^\s*(from|import) reasonrl", text, re.M)


# ---- the page's prose claims, as checks ------------------------------------------------------

EXTENSIONS = (".py", ".json", ".jsonl", ".yaml", ".md", ".html", ".toml", ".txt")


def _modules() -> set[str]:
    import pkgutil

    import reasonrl

    return {m.name.removeprefix("reasonrl.") for m in pkgutil.walk_packages(reasonrl.__path__, "reasonrl.")}


def _is_config_key(parts: list[str]) -> bool:
    import dataclasses
    import typing

    from reasonrl.config.schema import Config

    kind = Config
    for part in parts:
        if not dataclasses.is_dataclass(kind) or part not in {f.name for f in dataclasses.fields(kind)}:
            return False
        kind = typing.get_type_hints(kind)[part]
    return True


def _names_code(dotted: str, modules: set[str]) -> bool:
    """`dotted` is a module of the package (by its path's tail, as the page writes `collect` for
    `source.collect`), or a module's tail then attributes (`run_dir.RunDir`)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        for module in sorted(m for m in modules if m == head or m.endswith("." + head)):
            found = importlib.import_module(f"reasonrl.{module}")
            try:
                for attr in parts[cut:]:
                    found = getattr(found, attr)
                return True
            except AttributeError:
                continue
    return False


def dotted_names_not_in_code(text: str) -> list[str]:
    """The page's backquoted dotted names (`module.Name`, `module.function`) that name nothing in
    the package; config keys (`algo.beta`) and file names are not code names."""
    modules = _modules()
    names = sorted(set(re.findall(r"`([a-z_][a-z_0-9]*(?:\.[A-Za-z_][A-Za-z_0-9]*)+)(?:\(\))?`", text)))
    return [n for n in names if not n.endswith(EXTENSIONS) and not _is_config_key(n.split("."))
            and not _names_code(n, modules)]


def test_every_dotted_name_on_the_page_is_in_the_code():
    """A renamed module or class (`run.RunDir` once `run_dir.RunDir`) is caught on the page."""
    assert dotted_names_not_in_code(PAGE.read_text(encoding="utf-8")) == []


def test_a_dotted_name_that_drifted_is_caught():
    text = "`run_dir.RunDir`, `algo.beta`, `run.RunDir`, `advantage_stage.estimate_advantages`, `x.py`"
    assert dotted_names_not_in_code(text) == ["run.RunDir"]


def _imports(path: Path) -> set[str]:
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_only_placement_s_actors_and_proxies_import_ray():
    """What the page says (placement alone imports ray: its actors and their proxies), from every
    import statement of the package, lazy ones inside functions included."""
    package = REPO / "reasonrl"
    importers = sorted(str(p.relative_to(package)) for p in package.rglob("*.py") if "ray" in _imports(p))
    assert importers == ["placement/actors.py", "placement/proxies.py"]
    assert "(the only `import ray`)" in PAGE.read_text(encoding="utf-8")


def mode_branches(path: Path) -> list[int]:
    """Lines of `path` comparing something's `.mode` with a placement mode's name ("local", "ray"),
    but a refusal (`if ...: raise`: a command that runs in one mode only says so)."""
    import ast

    from reasonrl.placement import MODES

    lines = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    refusals = {id(node.test) for node in ast.walk(tree)
                if isinstance(node, ast.If) and len(node.body) == 1 and isinstance(node.body[0], ast.Raise)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and id(node) not in refusals:
            sides = [node.left, *node.comparators]
            reads_mode = any(isinstance(s, ast.Attribute) and s.attr == "mode" for s in sides)
            names_mode = any(isinstance(s, ast.Constant) and s.value in MODES for s in sides)
            if reads_mode and names_mode:
                lines.append(node.lineno)
    return lines


def test_no_module_but_placement_and_the_config_rules_branches_on_the_placement_mode(tmp_path):
    """Placement answers what depends on the mode (`MODES`: how to build, a role's device, whether
    the rollout side shares this machine's cores); modules above ask it instead of branching, and
    only the config's rules (which keys a mode allows) read the mode besides."""
    package = REPO / "reasonrl"
    branching = {str(p.relative_to(package)): mode_branches(p) for p in package.rglob("*.py")
                 if p.relative_to(package).parts[0] not in ("placement", "config")}
    assert {k: v for k, v in branching.items() if v} == {}
    (tmp_path / "m.py").write_text('def f(cfg):\n    if cfg.placement.mode != "local":\n'
                                   '        raise ValueError\n    return cfg.placement.mode == "ray"\n')
    assert mode_branches(tmp_path / "m.py") == [4]


def test_every_worker_call_of_the_step_is_a_timed_stage():
    """`Trainer.step` calls its workers (every model forward and update) only through
    `timed(times, "<stage>", ...)`, so each has its `time/<stage>`; the batch comes from the source
    (rollout and reward, timed inside it)."""
    import ast
    import inspect
    import textwrap

    from reasonrl.train.trainer import Trainer

    tree = ast.parse(textwrap.dedent(inspect.getsource(Trainer.step)))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    loose = []
    for node in ast.walk(tree):
        workers = ("policy", "teacher", "critic", "rollout", "judge")
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self" and node.attr in workers):
            continue
        up, inside = node, False
        while up in parents:
            up = parents[up]
            if isinstance(up, ast.Compare):  # `self.teacher is not None`
                inside = True
            if isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "timed":
                inside = up.args[1].value in STAGES if isinstance(up.args[1], ast.Constant) else False
            if inside:
                break
        if not inside:
            loose.append(f"line {node.lineno}: self.{node.attr}")
    assert loose == []
