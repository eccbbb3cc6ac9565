"""`reasonrl data traces` (`reasonrl.sft.traces`): a run's samples and an eval's completions that
scored at least R become SFT records that show the model the prompt `train` showed it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import keep_torch_threads  # noqa: F401

from reasonrl.cli import main
from reasonrl.config import DEFAULT_SYSTEM_PROMPT, dump_yaml, load_config
from reasonrl.errors import DataError
from reasonrl.sft.records import load_records
from reasonrl.sft.traces import collect_traces


def sample(prompt, completion, reward, truncated=False, **more) -> dict:
    return {"prompt": prompt, "ground_truth": "5", "completion": completion, "reward": reward,
            "components": {"correct": reward}, "advantage": 0.0, "truncated": truncated, **more}


def fake_run(tmp_path: Path, rows: list[dict], *overrides: str) -> Path:
    """A run directory as `train` writes one: its resolved config.yaml and samples.jsonl."""
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(dump_yaml(load_config(None, list(overrides))))
    (run / "samples.jsonl").write_text("".join(json.dumps({"step": 1, **r}) + "\n" for r in rows))
    return run


def test_a_runs_good_samples_become_records_with_the_runs_system_prompt(tmp_path):
    run = fake_run(tmp_path, [sample("What is 2 + 3?", "The answer is 5.", 1.0),
                              sample("What is 2 + 3?", "The answer is 6.", 0.0),
                              sample("What is 2 + 3?", "The answer is 5.", 1.0),  # a duplicate
                              sample("What is 1 + 1?", "The answer is", 1.0, truncated=True)])
    traces, _ = collect_traces([run], 1.0, dedupe=True)
    assert (traces.samples, traces.passed, traces.truncated, traces.duplicates) == (4, 2, 1, 1)
    (record,) = traces.records
    # arithmetic's system prompt (data.system_prompt=auto) first, as `train` rendered the prompt
    assert record["prompt"] == [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                                {"role": "user", "content": "What is 2 + 3?"}]
    assert record["completion"] == "The answer is 5." and record["origin"] == f"{run / 'samples.jsonl'}:1"
    assert record["ground_truth"] == "5" and record["reward"] == 1.0
    assert len(collect_traces([run], 1.0, dedupe=False)[0].records) == 2


def test_a_task_without_a_system_prompt_keeps_its_text_prompt(tmp_path):
    run = fake_run(tmp_path, [sample("Using the numbers [3, 5] ...", "<answer>3 + 5</answer>", 1.0)],
                   "data.task=countdown")
    (record,) = collect_traces([run], 1.0, dedupe=False)[0].records
    assert record["prompt"] == "Using the numbers [3, 5] ..."


def test_multi_turn_episodes_become_messages_only_with_chat_observations(tmp_path):
    turns = [{"model": "<calculator>347 * 29</calculator>", "call": "calculator: 347 * 29",
              "observation": "10063"}, {"model": "The answer is 10063.", "observation": None}]
    episode = sample("What is 347 * 29?", "The answer is 10063.", 1.0, turns=turns)
    chat = fake_run(tmp_path / "chat", [episode], "data.system_prompt=", "env.name=tool",
                    "env.observation_format=chat")
    (record,) = collect_traces([chat], 1.0, dedupe=False)[0].records
    assert record["messages"] == [{"role": "user", "content": "What is 347 * 29?"},
                                  {"role": "assistant", "content": "<calculator>347 * 29</calculator>"},
                                  {"role": "tool", "content": "10063"},
                                  {"role": "assistant", "content": "The answer is 10063."}]
    tagged = fake_run(tmp_path / "tagged", [sample("q", "a", 1.0, turns=turns)], "env.name=tool")
    with pytest.raises(DataError, match="samples.jsonl:1: a multi-turn episode whose observations were "
                                        "written inside the model's turn"):
        collect_traces([tagged], 1.0, dedupe=False)


def test_an_eval_output_gives_every_completion(tmp_path):
    report = {"command": "eval", "settings": {"system_prompt": "", "apply_chat_template": True},
              "prompts": [{"prompt": "p1", "ground_truth": "1", "data_source": "d",
                           "samples": [{"completion": "a", "reward": 1.0, "truncated": False},
                                       {"completion": "b", "reward": 0.5, "truncated": False}]},
                          {"prompt": "p2", "ground_truth": "2", "data_source": "d",
                           "samples": [{"completion": "c", "reward": 0.7, "truncated": False}]}]}
    path = tmp_path / "teacher.json"
    path.write_text(json.dumps(report))
    traces, _ = collect_traces([path], 0.6, dedupe=False)
    assert [(r["prompt"], r["completion"]) for r in traces.records] == [("p1", "a"), ("p2", "c")]
    assert traces.records[1]["origin"] == f"{path}: prompt 2 sample 1"


def test_the_command_writes_records_sft_reads_and_says_what_it_kept(tmp_path, capsys):
    run = fake_run(tmp_path, [sample("What is 2 + 3?", "The answer is 5.", 1.0),
                              sample("What is 2 + 3?", "The answer is 4.", 0.0)])
    out = tmp_path / "traces.jsonl"
    assert main(["data", "traces", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote 1 SFT records to {out}: 1 of 2 samples scored at least 1" in printed
    assert "holds trainer.log_samples completions a step" in printed  # what a run's samples are
    (record,) = load_records(str(out))  # what `reasonrl sft sft.train_path=...` reads
    assert record.completion == "The answer is 5." and record.prompt[0]["role"] == "system"
    assert main(["data", "traces", str(run), "--min-reward", "2"]) == 2
    assert capsys.readouterr().err.strip() == (f"reasonrl: error: no sample of {run} scored at least "
                                               "--min-reward=2 (2 read, 0 of those that did were cut at the "
                                               "token limit): nothing to write")


def test_an_sft_runs_samples_are_refused_and_a_real_eval_is_read(tmp_path, monkeypatch):
    """An SFT run's samples have no reward: refused by name. A real `reasonrl eval --output` on
    the tiny model (its answers run to the token limit) is read, its settings say how it rendered."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "s"
    run.mkdir(parents=True)
    logged = {"step": 1, "where": "f:1", "prompt": "p", "completion": "c", "trained": "c"}
    (run / "samples.jsonl").write_text(json.dumps(logged) + "\n")
    with pytest.raises(DataError, match="samples.jsonl:1: an SFT run's record"):
        collect_traces([run], 1.0, dedupe=False)
    smoke = str(Path(__file__).parents[2] / "configs" / "smoke.yaml")
    code = main(["eval", "--config", smoke, "--model", "tiny", "--limit", "2", "--n", "2", "--temperature",
                 "1", "--max-new-tokens", "4", "--no-progress", "--no-entropy", "--output", "e.json"])
    assert code == 0
    settings = json.loads((tmp_path / "e.json").read_text())["settings"]
    assert settings["system_prompt"] == DEFAULT_SYSTEM_PROMPT and settings["apply_chat_template"] is True
    traces, _ = collect_traces([tmp_path / "e.json"], -1.0, dedupe=False)
    assert traces.samples == 4 and traces.passed + traces.truncated == 4
