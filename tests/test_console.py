"""reasonrl/console.py: each mode's lines for info, warning and error, by value; the mode from
REASONRL_CONSOLE and from trainer.console (`using`), inherited by a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from reasonrl import console


def say_everything() -> None:
    console.info("run directory: runs/x", run_dir="runs/x")
    console.info("the sandbox is fine", err=True)
    console.info("runs/a.jsonl: 3 rows", label="note: ")
    console.warning("report.html not written", step=3)
    console.warning("step 2: a reward failed", label="")
    console.warning("stopping", label="", lead="\n")
    console.error("the tracker failed")


def test_text_mode_writes_the_lines_as_they_always_were(monkeypatch, capsys):
    monkeypatch.delenv(console.ENV, raising=False)
    say_everything()
    out, err = capsys.readouterr()
    assert out == "[reasonrl] run directory: runs/x\n[reasonrl] note: runs/a.jsonl: 3 rows\n"
    assert err == ("[reasonrl] the sandbox is fine\n"
                   "[reasonrl] warning: report.html not written\n"
                   "[reasonrl] step 2: a reward failed\n"
                   "\n[reasonrl] stopping\n"
                   "[reasonrl] error: the tracker failed\n")
    monkeypatch.setenv(console.ENV, "nonsense")  # an unknown mode: text
    console.info("x")
    assert capsys.readouterr().out == "[reasonrl] x\n"


def test_quiet_mode_writes_warnings_and_errors_alone(monkeypatch, capsys):
    monkeypatch.setenv(console.ENV, "quiet")
    say_everything()
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("[reasonrl] warning: report.html not written\n"
                   "[reasonrl] step 2: a reward failed\n"
                   "\n[reasonrl] stopping\n"
                   "[reasonrl] error: the tracker failed\n")


def test_json_mode_writes_one_object_per_line(monkeypatch, capsys):
    monkeypatch.setenv(console.ENV, "json")
    say_everything()
    out, err = capsys.readouterr()
    assert [json.loads(x) for x in out.splitlines()] == [
        {"level": "info", "message": "run directory: runs/x", "fields": {"run_dir": "runs/x"}},
        {"level": "info", "message": "runs/a.jsonl: 3 rows", "fields": {}}]
    assert [json.loads(x) for x in err.splitlines()] == [
        {"level": "info", "message": "the sandbox is fine", "fields": {}},
        {"level": "warning", "message": "report.html not written", "fields": {"step": 3}},
        {"level": "warning", "message": "step 2: a reward failed", "fields": {}},
        {"level": "warning", "message": "stopping", "fields": {}},
        {"level": "error", "message": "the tracker failed", "fields": {}}]


def test_a_writer_takes_the_line_in_every_mode(monkeypatch):
    written = []
    for mode in ("text", "quiet", "json"):
        monkeypatch.setenv(console.ENV, mode)
        console.info("steps 1-3", write=written.append)
        console.warning("steps 1-3: every reward was 0", write=written.append, first=1)
    assert written == [
        "[reasonrl] steps 1-3", "[reasonrl] warning: steps 1-3: every reward was 0",
        "[reasonrl] warning: steps 1-3: every reward was 0",
        '{"level": "info", "message": "steps 1-3", "fields": {}}',
        '{"level": "warning", "message": "steps 1-3: every reward was 0", "fields": {"first": 1}}']


def test_using_sets_the_mode_for_the_block_and_the_processes_it_starts(monkeypatch):
    monkeypatch.setenv(console.ENV, "quiet")
    with console.using(""):  # trainer.console="": the environment's
        assert console.mode() == "quiet"
    with console.using("json"):
        assert console.mode() == "json" and console.inherited_env() == {console.ENV: "json"}
        child = subprocess.run(
            [sys.executable, "-c", "from reasonrl import console; console.info('from a child', pid=1)"],
            capture_output=True, text=True, check=True, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
        assert json.loads(child.stdout) == {"level": "info", "message": "from a child", "fields": {"pid": 1}}
    assert console.mode() == "quiet"
    monkeypatch.delenv(console.ENV)
    with console.using("text"):
        assert console.mode() == "text"
    assert console.ENV not in os.environ and console.inherited_env() == {}
    with pytest.raises(ValueError, match="console mode must be one of text, quiet, json, got 'loud'"):
        with console.using("loud"):
            pass


def test_trainer_console_is_a_key_whose_change_a_resume_accepts():
    from reasonrl.checkpoint.config_check import RESUME_SAFE_KEYS
    from reasonrl.config import load_config
    from reasonrl.errors import ConfigError

    assert load_config(None, []).trainer.console == ""
    assert load_config(None, ["trainer.console=json"]).trainer.console == "json"
    with pytest.raises(ConfigError, match="trainer.console"):
        load_config(None, ["trainer.console=loud"])
    assert "trainer.console" in RESUME_SAFE_KEYS  # how a run talks changes nothing it computes
