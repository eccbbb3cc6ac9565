"""Models by Hugging Face Hub id, offline: a Hub-cache layout built here from the tiny model
(`models--org--name/refs/main` + `snapshots/<commit>/`, named by huggingface_hub's own
`repo_folder_name`) loads by id with HF_HUB_OFFLINE, for training, `reasonrl eval` and the
vLLM engine; an id that is not cached gets one clear error naming it and the fetch command."""

from __future__ import annotations

import copy
import importlib
import importlib.util
from pathlib import Path

import pytest
import torch

from reasonrl.cli import main
from reasonrl.errors import ModelLoadError
from reasonrl.model.load import load_model_and_tokenizer, resolve_model_dir

REPO = Path(__file__).parents[2]
REPO_ID = "acme/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tmp_path, tiny, monkeypatch) -> Path:
    """An offline Hugging Face cache holding `acme/tiny-llama` (main -> COMMIT, and a tag v1)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    cache = tmp_path / "hf-cache"
    repo = cache / repo_folder_name(repo_id=REPO_ID, repo_type="model")
    snapshot = repo / "snapshots" / COMMIT
    copy.deepcopy(tiny[0]).save_pretrained(snapshot)  # saving fills the config's architectures and dtype
    tiny[1].save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_hub_id_resolves_to_the_cached_snapshot_and_loads(hub, tiny):
    assert resolve_model_dir(REPO_ID) == hub
    assert resolve_model_dir(REPO_ID, revision="v1") == hub
    model, tokenizer = load_model_and_tokenizer(REPO_ID)
    reference = dict(tiny[0].named_parameters())
    assert all(torch.equal(p, reference[n]) for n, p in model.named_parameters())
    assert tokenizer.eos_token == tiny[1].eos_token


def test_an_uncached_id_offline_names_the_id_and_the_command(hub):
    with pytest.raises(ModelLoadError, match=r"model.path=acme/other: not found; tried \(1\) a local "
                                             r"folder .*: none there; \(2\) the Hugging Face cache .*: "
                                             r"acme/other is not in it; \(3\) the Hub https://huggingface.co/"
                                             r"acme/other: not asked, HF_HUB_OFFLINE is set\. Fetch it once "
                                             r"with `hf download acme/other`.*model.path=./acme/other"):
        resolve_model_dir("acme/other")
    with pytest.raises(ModelLoadError, match=r"acme/tiny-llama at revision v2: not found; .*acme/tiny-llama "
                                             r"at revision v2 is not in it"):
        resolve_model_dir(REPO_ID, revision="v2")


def test_a_local_folder_wins_over_a_hub_id_of_the_same_name(hub, tmp_path, monkeypatch, tiny):
    monkeypatch.chdir(tmp_path)
    copy.deepcopy(tiny[0]).save_pretrained(tmp_path / "acme" / "tiny-llama")
    assert resolve_model_dir(REPO_ID) == Path("acme/tiny-llama")


def test_training_and_eval_by_hub_id(hub, tmp_path, capsys):
    assert main(["train", str(REPO / "configs" / "smoke.yaml"), f"model.path={REPO_ID}", "trainer.steps=1",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=hub", "trainer.progress=false",
                 "tracking.report=false"]) == 0
    assert (tmp_path / "hub" / "checkpoints" / "step_1" / "huggingface" / "model.safetensors").is_file()
    assert main(["eval", "--config", str(REPO / "configs" / "smoke.yaml"), "--model", REPO_ID, "--greedy",
                 "--no-entropy", "--no-progress", "--limit", "2"]) == 0
    assert f"eval of {REPO_ID}" in capsys.readouterr().out
    assert main(["eval", "--config", str(REPO / "configs" / "smoke.yaml"), "--model", "acme/nope",
                 "--no-progress"]) == 2
    assert "hf download acme/nope" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (make vllm)")
def test_the_vllm_engine_serves_a_model_loaded_by_hub_id(hub, tmp_path):
    """vLLM starts from the policy's weights (a folder written from the model loaded by id)."""
    from reasonrl.config import load_config
    from reasonrl.train.trainer import train

    cfg = load_config(REPO / "configs" / "smoke.yaml", [
        f"model.path={REPO_ID}", "rollout.engine=vllm", "trainer.steps=1", f"trainer.output_dir={tmp_path}",
        "trainer.run_name=v", "trainer.progress=false", "tracking.report=false"])
    assert train(cfg).run_dir == tmp_path / "v"


# ---- data by Hub id, offline --------------------------------------------------------------------

GSM8K = REPO / "tests" / "fixtures" / "gsm8k"


def cache_dataset(cache: Path, repo_id: str, subset: str, splits: dict[str, Path]) -> None:
    """Write what an online `load_dataset(repo_id, subset)` leaves in the datasets cache
    (`<org>___<name>/<subset>/0.0.0/<hash>/`), with `datasets`' own builder (JSON files in)."""
    from datasets.packaged_modules.json.json import Json

    builder = Json(cache_dir=str(cache), dataset_name=repo_id.split("/")[-1], config_name=subset,
                   config_id=subset, hash="0" * 16, data_files={k: str(v) for k, v in splits.items()})
    builder.repo_id = repo_id  # after the data files check: the cache folder is named for the Hub repo
    builder._cache_dir = builder._build_cache_dir()
    builder.download_and_prepare()


@pytest.fixture
def hub_data(tmp_path, monkeypatch) -> Path:
    import datasets

    cache = tmp_path / "datasets-cache"
    splits = {"train": GSM8K / "train.jsonl", "test": GSM8K / "test.jsonl"}
    cache_dataset(cache, "openai/gsm8k", "main", splits)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_dataset_loads_by_id_with_its_subset_split_and_format(hub_data):
    from reasonrl.data import load_file

    train = load_file("openai/gsm8k", subset="main", split="train", fmt="gsm8k")
    lines = (GSM8K / "train.jsonl").read_text().splitlines()
    assert len(train) == len(lines) and train[0].data_source == "gsm8k" and train[0].ground_truth == "72"
    assert train[0].meta["origin"] == "openai/gsm8k[main/train]:1"
    part = load_file("openai/gsm8k", subset="main", split="test[:50%]", fmt="gsm8k")
    assert len(part) == len((GSM8K / "test.jsonl").read_text().splitlines()) // 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(subset="main", split="validation"),
     r"openai/gsm8k\[main/validation\]: Unknown split \"validation\". Should be one of \['train', 'test'\]"),
    (dict(subset="socratic", split="train"), r"openai/gsm8k\[socratic/train\]: .*socratic"),
    (dict(subset="main", split="train", fmt="math"),
     r"openai/gsm8k\[main/train\]:1: missing field 'problem' for data.format=math \(it reads problem, "
     r"solution\); the record has answer, question; it fits data.format=gsm8k: add that override"),
    (dict(subset="main", split="train", fmt=""),
     r"openai/gsm8k\[main/train\]:1: missing field 'prompt' \(or 'messages'\); the record has answer, "
     r"question; it fits data.format=gsm8k"),
])
def test_a_missing_split_subset_or_field_names_it(hub_data, kwargs, message):
    from reasonrl.data import load_file
    from reasonrl.errors import DataError

    with pytest.raises(DataError, match=message):
        load_file("openai/gsm8k", **kwargs)


def test_an_uncached_dataset_offline_names_the_id(hub_data, monkeypatch):
    from reasonrl.data import load_file
    from reasonrl.errors import DataError

    with pytest.raises(DataError, match=r"openai/gsmk8\[train\]: not found; tried \(1\) a local file or "
                                       r"folder .*; \(2\) the datasets cache .*: not in it; \(3\) the Hub: "
                                       r"not asked, HF_HUB_OFFLINE is set\. Load it once online"):
        load_file("openai/gsmk8")


def test_the_issue_command_trains_offline_from_hub_caches(hub, hub_data, tmp_path, monkeypatch):
    """`reasonrl train configs/gsm8k.yaml model.path=Qwen/Qwen2.5-0.5B-Instruct
    data.train_path=openai/gsm8k data.train_subset=main` with both caches (the model's made from
    the tiny model, the dataset's from the repo's GSM8K fixture)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    source = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=REPO_ID, repo_type="model")
    qwen = repo_folder_name(repo_id="Qwen/Qwen2.5-0.5B-Instruct", repo_type="model")
    target = Path(constants.HF_HUB_CACHE) / qwen
    import shutil

    shutil.copytree(source, target)
    assert main(["train", str(REPO / "configs" / "gsm8k.yaml"), "model.path=Qwen/Qwen2.5-0.5B-Instruct",
                 "data.train_path=openai/gsm8k", "data.train_subset=main", "trainer.steps=1", "rollout.n=2",
                 "trainer.batch_size=4", "rollout.max_new_tokens=8", "data.val_size=2",
                 f"trainer.output_dir={tmp_path}", "trainer.run_name=qwen", "trainer.progress=false",
                 "tracking.report=false"]) == 0
    config = (tmp_path / "qwen" / "config.yaml").read_text()
    assert "path: Qwen/Qwen2.5-0.5B-Instruct" in config and "train_path: openai/gsm8k" in config


def test_a_csv_file_reads_through_datasets_and_names_its_rows(tmp_path):
    from reasonrl.data import load_file

    (tmp_path / "t.csv").write_text("prompt,ground_truth\nWhat is 2 + 2?,4\nWhat is 3 + 3?,6\n")
    rows = load_file(tmp_path / "t.csv")
    assert [(e.prompt, e.ground_truth) for e in rows] == [("What is 2 + 2?", "4"), ("What is 3 + 3?", "6")]
    assert rows[1].meta["origin"] == f"{tmp_path / 't.csv'}:2"


def test_eval_reads_a_hub_dataset_with_the_configs_held_out_subset_and_split(hub_data, capsys):
    assert main(["eval", "--config", str(REPO / "configs" / "gsm8k.yaml"), "--model", "tiny",
                 "--data", "openai/gsm8k", "--greedy", "--no-entropy", "--no-progress", "--limit", "2",
                 "--max-new-tokens", "4"]) == 0
    assert "on openai/gsm8k: 2 prompts" in capsys.readouterr().out


# ---- typos: named before anything loads --------------------------------------------------------

def _hub_error(cls):
    """A huggingface_hub HTTP error as the Hub's 404 gives it (no network here)."""
    from types import SimpleNamespace

    return cls("404 Client Error", response=SimpleNamespace(headers={}, request=None))


@pytest.mark.parametrize("error, message", [
    ("RepositoryNotFoundError", r"model.path=acme/tiny-lama: not found; tried \(1\) a local folder "
                                r"\S*acme/tiny-lama: none there; \(2\) the Hub https://huggingface.co/"
                                r"acme/tiny-lama: no such model \(or it is private: log in with `hf auth "
                                r"login`\)\. Check the id, or give a local folder as "
                                r"model.path=./acme/tiny-lama"),
    ("RevisionNotFoundError", r"model.revision=v9: acme/tiny-lama has no such revision"),
])
def test_a_typo_in_a_model_id_or_revision_is_named(monkeypatch, error, message):
    import huggingface_hub
    from huggingface_hub import errors

    def hub(*args, **kwargs):
        raise _hub_error(getattr(errors, error))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub)
    monkeypatch.setattr("reasonrl.cache.hub_unreachable", lambda: None)  # the Hub answers (404)
    with pytest.raises(ModelLoadError, match=message):
        resolve_model_dir("acme/tiny-lama", revision="v9")


def test_a_typo_in_a_dataset_id_stops_the_run_before_the_model_loads(hub_data, monkeypatch, tmp_path, capsys):
    """The held-out split (the config's openai/gsm8k, cached) loads; the training id has a typo."""
    import datasets

    import reasonrl.train.trainer

    load = datasets.load_dataset

    def hub(path, *args, **kwargs):
        if path != "openai/gsm8kk":
            return load(path, *args, **kwargs)
        raise datasets.exceptions.DatasetNotFoundError(
            "Dataset 'openai/gsm8kk' doesn't exist on the Hub or cannot be accessed.")

    monkeypatch.setattr(datasets, "load_dataset", hub)
    monkeypatch.setattr(reasonrl.train.trainer, "build_workers",
                        lambda cfg: pytest.fail("the workers (and the model) were built before the data"))
    assert main(["train", str(REPO / "configs" / "gsm8k.yaml"), "data.train_path=openai/gsm8kk",
                 f"trainer.output_dir={tmp_path}", "trainer.progress=false"]) == 2
    err = capsys.readouterr().err
    assert "openai/gsm8kk[main/train]: no such dataset on the Hugging Face Hub" in err, err
    assert f"and no local file or folder {Path('openai/gsm8kk').resolve()} either" in err, err


def test_an_empty_split_slice_is_named(hub_data):
    from reasonrl.data import load_file
    from reasonrl.errors import DataError

    message = r"openai/gsm8k\[main/test\[:0\]\]: Instruction \"test\[:0\]\" corresponds to no data"
    with pytest.raises(DataError, match=message):
        load_file("openai/gsm8k", subset="main", split="test[:0]", fmt="gsm8k")


def test_an_arrow_file_reads_through_datasets(tmp_path):
    import datasets

    from reasonrl.data import load_file

    records = [{"prompt": f"What is {n} + {n}?", "ground_truth": 2 * n} for n in (2, 3)]
    datasets.Dataset.from_list(records).save_to_disk(tmp_path / "saved")
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    rows = load_file(arrow)
    assert [(e.prompt, e.ground_truth) for e in rows] == [("What is 2 + 2?", "4"), ("What is 3 + 3?", "6")]
    assert rows[1].meta["origin"] == f"{arrow}:2"


# ---- without network: one short try, then the caches; every place named ----------------------


@pytest.fixture
def no_network(monkeypatch):
    """A machine whose name lookups fail (as on any machine without network): the probes of
    `cache.hub_unreachable` are counted, and a request huggingface_hub or datasets sends anyway
    (what retries) fails the test (huggingface_hub's own best-effort fetch of its agent registry
    swallows that failure, as it swallows a real one). HF_HUB_OFFLINE is not set."""
    import socket
    from types import SimpleNamespace

    from huggingface_hub import constants

    from reasonrl import cache

    probes = []

    def lookup_fails(address, timeout=None):
        probes.append(address)
        raise socket.gaierror(-2, "Name or service not known")

    def no_request(*args, **kwargs):
        raise AssertionError("a request was sent to the Hub")

    cache.hub_unreachable.cache_clear()
    monkeypatch.setattr(cache, "socket", SimpleNamespace(create_connection=lookup_fails))
    # huggingface_hub 1.x sends through httpx, 2.x through httpx2; a user's environment may hold
    # either or both (the dev extra pulls httpx in through other packages, a bare install not)
    clients = [importlib.import_module(name).Client for name in ("httpx", "httpx2")
               if importlib.util.find_spec(name)]
    assert clients, "huggingface_hub sends through httpx or httpx2, and neither is installed"
    for client in clients:
        monkeypatch.setattr(client, "send", no_request)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield probes
    cache.hub_unreachable.cache_clear()


def test_a_missing_hub_id_without_network_fails_at_once_naming_every_place(hub, no_network):
    import time

    from huggingface_hub import constants

    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir("acme/nope")
    assert time.perf_counter() - start < 10  # huggingface_hub's retries alone wait 23 s
    assert str(err.value) == (
        f"model.path=acme/nope: not found; tried (1) a local folder {Path('acme/nope').resolve()}: none "
        f"there; (2) the Hugging Face cache {constants.HF_HUB_CACHE}: acme/nope is not in it; (3) the Hub "
        "https://huggingface.co/acme/nope: the Hub (huggingface.co:443) cannot be reached ([Errno -2] Name "
        "or service not known; one try of 3 s). Fetch it once with `hf download acme/nope` on a machine "
        "with internet (same HF_HOME), or give a local folder as model.path=./acme/nope or "
        "model.path=/absolute/path (a path that exists is read as a folder, never as a Hub id); without "
        "network, set HF_HUB_OFFLINE=1 to go to the cache at once")
    assert no_network == [("huggingface.co", 443)]  # one try, once per process


def test_a_cached_hub_id_without_network_loads_from_the_cache(hub, no_network, capsys):
    from reasonrl.placement.preflight import model_positions

    assert resolve_model_dir(REPO_ID) == hub
    assert capsys.readouterr().err == ("[reasonrl] the Hub (huggingface.co:443) cannot be reached ([Errno "
                                       "-2] Name or service not known; one try of 3 s): model.path="
                                       f"{REPO_ID} from the Hugging Face cache ({hub})\n")
    model_positions.cache_clear()
    assert model_positions(REPO_ID) == (2048, f"max_position_embeddings in {hub / 'config.json'}")
    assert len(no_network) == 1


def test_a_hub_dataset_without_network_comes_from_the_cache_or_names_every_place(hub_data, no_network):
    import datasets

    from reasonrl.data import load_file
    from reasonrl.errors import DataError

    datasets.config.HF_HUB_OFFLINE = False  # undone by hub_data's monkeypatch
    assert load_file("openai/gsm8k", subset="main", split="train", fmt="gsm8k")[0].ground_truth == "72"
    with pytest.raises(DataError) as err:
        load_file("acme/nope", split="test")
    assert str(err.value) == (
        f"acme/nope[test]: not found; tried (1) a local file or folder {Path('acme/nope').resolve()}: none "
        f"there; (2) the datasets cache {hub_data}: not in it; (3) the Hub: the Hub (huggingface.co:443) "
        "cannot be reached ([Errno -2] Name or service not known; one try of 3 s). Load it once online with "
        "the same HF_HOME, or give a local file (a path that exists is read as a file, never as a Hub id); "
        "without network, set HF_HUB_OFFLINE=1 to go to the cache at once")
    assert datasets.config.HF_HUB_OFFLINE is False  # the offline switch was for those calls alone
    assert len(no_network) == 1


def test_the_hub_probe_goes_through_the_proxy_the_environment_names(monkeypatch):
    from types import SimpleNamespace

    from reasonrl import cache

    tried = []

    class Opened:
        def close(self):
            tried.append("closed")

    def connect(address, timeout=None):
        tried.append(address)
        return Opened()

    monkeypatch.setattr(cache, "socket", SimpleNamespace(create_connection=connect))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    cache.hub_unreachable.cache_clear()
    assert cache.hub_unreachable() is None and tried == [("proxy.example", 3128), "closed"]
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    cache.hub_unreachable.cache_clear()
    assert cache.hub_unreachable() is None and tried[-2] == ("huggingface.co", 443)
    cache.hub_unreachable.cache_clear()


def test_the_hub_probe_gives_up_after_its_timeout(monkeypatch):
    import threading
    from types import SimpleNamespace

    from reasonrl import cache

    release = threading.Event()

    def hang(address, timeout=None):  # a name lookup that does not answer
        release.wait(30)
        raise OSError("released at the end of the test")

    monkeypatch.setattr(cache, "socket", SimpleNamespace(create_connection=hang))
    try:
        assert cache._connect("huggingface.co", 443, 0.2) == "no answer within 0.2 s"
    finally:
        release.set()
