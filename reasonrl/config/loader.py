"""Loading the config: YAML files (with `include:`) and dotted command-line overrides
(`trainer.steps=50`) into the schema's dataclasses (`schema.py`), then the rules across keys
(`rules.py`).

Unknown keys are refused naming the nearest one, and values of the wrong type, outside their
range or not among the allowed values, naming the key's full path (e.g. `trainer.stepz`) and
what is allowed, so a typo never surfaces an hour into a run. Every number is finite: a NaN or
an infinity (YAML `.nan`, `.inf`) is refused in any float key, list item or mapping value,
with the key's range. A file is read as UTF-8 (bytes that are not: an error naming the line,
column and byte), a key given twice in one mapping is an error naming both lines (YAML
parsers keep the last one silently; a `<<` merge key's values may be overridden, as YAML
means), and invalid YAML is reported on one line as file:line:column.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from reasonrl.config.rules import validate
from reasonrl.config.schema import Config
from reasonrl.errors import ConfigError


class _YamlLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-5` as a number (YAML 1.2); PyYAML's YAML 1.1 rules
    need a dot (`1.0e-5`) and would hand the string "1e-5" to a float key."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_MERGE = "tag:yaml.org,2002:merge"


def _duplicate_key(node: yaml.Node, path: str = "") -> tuple[int, str] | None:
    """(line, "key K given twice [in section S] (first on line M)") for the first mapping key of
    `node`'s tree that repeats within its mapping, else None."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if key.tag == _MERGE or not isinstance(key, yaml.ScalarNode):
                continue
            line = key.start_mark.line + 1
            first = seen.get((key.tag, key.value))
            if first is not None:
                where = f" in section {path}" if path else ""
                return line, f"key {key.value!r} given twice{where} (first on line {first})"
            seen[key.tag, key.value] = line
        children = [(f"{path}.{k.value}" if path else str(k.value), v) for k, v in node.value
                    if isinstance(k, yaml.ScalarNode)]
    elif isinstance(node, yaml.SequenceNode):
        children = [(f"{path}[{i}]", item) for i, item in enumerate(node.value)]
    else:
        return None
    for child_path, child in children:
        if (found := _duplicate_key(child, child_path)) is not None:
            return found
    return None


def _parse_yaml(text: str, source: str, invalid: str = "invalid YAML") -> Any:
    """`text` as YAML (`_YamlLoader`); ConfigError naming `source` for invalid YAML (on one line:
    `invalid`, the line and column, the parser's words) and for a key given twice in one
    mapping (source:line)."""
    loader = _YamlLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        duplicate = _duplicate_key(node)
        if duplicate is not None:
            line, what = duplicate
            at = source if source.startswith("override") else f"{source}:{line}"  # an override is one line
            raise ConfigError(f"{at}: {what}; YAML would keep the last one silently: keep one")
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        words = "; ".join(w for w in (err.context, err.problem) if w) or " ".join(str(err).split())
        raise ConfigError(f"{source}: {invalid}{at}: {words}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: {invalid}: {' '.join(str(err).split())}") from None
    finally:
        loader.dispose()


def _utf8(raw: bytes, path: Path) -> str:
    """A config file's bytes as text; ConfigError naming the line, column and byte that are not
    UTF-8. A leading byte-order mark is dropped."""
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start:err.start + 1].hex()} at "
                          f"column {column}); a config file must be UTF-8: convert it, e.g. with "
                          f"`iconv -f <its encoding> -t utf-8`") from None


def _coerce(value: Any, tp: Any, path: str, meta: Any = None) -> Any:
    """Check `value` against the annotation `tp` and convert int->float; raise ConfigError.
    A float must be finite; its message states the field's range from `meta` (a list's items
    are checked with the list's range)."""
    origin = typing.get_origin(tp)
    if tp is Any:  # as YAML gave it (plain data): algo.loss_kwargs, an out-of-tree loss's own keywords
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a section (mapping), got {value!r}")
        return _build(tp, value, path)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{path}: {value!r} is not allowed; allowed values: "
                              f"{', '.join(map(str, allowed))}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return [_coerce(v, item_tp, f"{path}[{i}]", meta) for i, v in enumerate(value)]
    if origin is dict:
        key_tp, item_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {_coerce(k, key_tp, path): _coerce(v, item_tp, f"{path}.{k}")
                for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        raise TypeError(f"{path}: union types are not supported in the config tree")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        if not math.isfinite(value):
            bounds = _range_text(meta).removeprefix("must be ") if meta and _has_range(meta) else ""
            rule = f"must be finite and {bounds}" if bounds else "must be a finite number"
            raise ConfigError(f"{path}: {rule}, got {float(value)!r}")
        return float(value)
    if tp is str:
        if value is None:
            return ""
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return str(value)
    raise TypeError(f"{path}: unsupported annotation {tp!r}")


def _has_range(meta: Any) -> bool:
    return any(k in meta for k in ("ge", "gt", "le", "lt"))


def _range_text(meta: dict) -> str:
    """"must be >= 1", "must be in (0, 1]", "must be > 0 (0 = no clipping)" from a field's bounds."""
    low = ("[", meta["ge"]) if "ge" in meta else ("(", meta["gt"]) if "gt" in meta else None
    high = (meta["le"], "]") if "le" in meta else (meta["lt"], ")") if "lt" in meta else None
    if low and high:
        return f"must be in {low[0]}{low[1]:g}, {high[0]:g}{high[1]}"
    if "zero" in meta and low == ("[", 0):
        return f"must be > 0, or 0 for {meta['zero']}"
    if low:
        return f"must be {'>=' if low[0] == '[' else '>'} {low[1]:g}"
    return f"must be {'<=' if high[1] == ']' else '<'} {high[0]:g}"


def _check(value: Any, meta: Any, path: str, siblings: dict | None = None) -> None:
    """A field's own constraint (`param`): its range, its allowed values or mapping keys (and
    the keys of the sibling mapping `also_keys` names, from the section's `siblings` as given)."""
    if not meta:
        return
    if isinstance(value, list) and _has_range(meta):  # a list's range holds for each item
        for i, item in enumerate(value):
            _check(item, meta, f"{path}[{i}]")
        return
    ok = all((("ge" not in meta or value >= meta["ge"]), ("gt" not in meta or value > meta["gt"]),
              ("le" not in meta or value <= meta["le"]), ("lt" not in meta or value < meta["lt"])))
    if not ok:
        raise ConfigError(f"{path}: {_range_text(meta)}, got {value!r}")
    if "choices" in meta and value not in meta["also"] and value not in meta["choices"]:
        allowed = (*meta["also"], *meta["choices"].names())
        close = difflib.get_close_matches(str(value), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        listed = ", ".join(a or '""' for a in allowed)
        raise ConfigError(f"{path}: {value!r} is not allowed{hint}; allowed values: {listed}")
    if "keys" in meta:
        allowed = meta["keys"] if isinstance(meta["keys"], tuple) else meta["keys"].names()
        sibling = (siblings or {}).get(meta.get("also_keys"))
        named = tuple(str(k) for k in sibling) if isinstance(sibling, dict) else ()
        section = path.rpartition(".")[0]
        also = f", or a name of {section}.{meta['also_keys']}: {', '.join(named)}" if named else ""
        for key in value:
            if key not in allowed and key not in named:
                raise ConfigError(f"{path}.{key}: unknown {meta['noun']}; allowed: {', '.join(allowed)}"
                                  f"{also}")


MOVED = {"rollout.eval_max_new_tokens": "eval.max_new_tokens"}  # keys that moved: old -> new


def _tis_cap(value: Any) -> str | None:
    """What replaces `algo.tis_cap` (truncated IS, now one of the off-policy corrections); None
    for 0, which was off as the default algo.importance_correction=none is: a run's saved
    config.yaml from before still loads (and resumes)."""
    if value == 0:
        return None
    return ("was replaced by the off-policy corrections (docs/algorithms.md): set "
            f"algo.importance_correction=tis algo.importance_cap={value!r}")


def _model_dtype(value: Any) -> str | None:
    """What replaces `model.dtype` (`model.precision`, docs/performance.md); None for float32,
    the default then and now: a run's saved config.yaml from before still loads (and resumes)."""
    if value == "float32":
        return None
    return ("was replaced by model.precision: set model.precision=bf16 (weights and optimizer in "
            "bf16, as model.dtype=bfloat16 was) or model.precision=bf16-mixed (fp32 master weights, "
            "bf16 compute)")


def _judge_placement(key: str, default: Any) -> Any:
    """What replaces a key of reward.model's own placement: the judge is a role like every other
    (placement.judge), placed by the run's placement.mode. None for the old default."""
    instead = {"placement": "placement.mode (the judge runs where the run's workers do: a process of its "
                            "own in local placement, an actor with placement.judge's resources in ray)",
               "num_cpus": "placement.judge.num_cpus", "num_gpus": "placement.judge.num_gpus",
               "device": "placement.device (local placement: the judge's process uses it)"}[key]
    return lambda value: None if value == default else f"was removed: set {instead}"


# keys that are gone: old -> the sentence saying what to set instead, from the old value (None:
# the old value is the new default, and the key is dropped)
REPLACED = {"algo.tis_cap": _tis_cap, "model.dtype": _model_dtype,
            **{f"reward.model.{key}": _judge_placement(key, default) for key, default in
               (("placement", "process"), ("num_cpus", 1.0), ("num_gpus", 0.0), ("device", "auto"))}}


def _build(cls: type, data: dict, path: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = f"{path}.{key}" if path else str(key)
        if full in MOVED:
            raise ConfigError(f"{full} is now {MOVED[full]} (with the other evaluation settings): "
                              f"set {MOVED[full]}={value!r}")
        if full in REPLACED:
            if (instead := REPLACED[full](value)) is None:
                continue
            raise ConfigError(f"{full} {instead}")
        if key not in hints:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {full!r}{hint}; allowed keys"
                              f"{' in ' + path if path else ''}: {', '.join(fields)}")
        kwargs[key] = _coerce(value, hints[key], full, fields[key].metadata)
        _check(kwargs[key], fields[key].metadata, full, data)
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{dotted}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`trainer.steps=50` -> ("trainer.steps", 50); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected dotted.key=value")
    key, raw = text.split("=", 1)
    value = _parse_yaml(raw, f"override {text!r}", "cannot parse value") if raw != "" else ""
    return key.strip(), value


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """Defaults <- YAML file (which may `include:` a base file) <- dotted overrides."""
    tree: dict = {}
    if path is not None:
        tree = _read_yaml(Path(path))
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    cfg = _build(Config, tree)
    validate(cfg)
    return cfg


def _read_yaml(path: Path, depth: int = 0) -> dict:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"config file {path} cannot be read: {err.strerror or err}") from None
    tree = _parse_yaml(_utf8(raw, path), str(path)) or {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    base = tree.pop("include", None)
    if base is not None:
        if depth > 8:
            raise ConfigError(f"{path}: include nesting too deep")
        tree = _merge(_read_yaml(path.parent / str(base), depth + 1), tree)
    return tree


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)
