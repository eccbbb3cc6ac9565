"""What the console says is true and names the way on (issue 33, "a console that tells the
truth"): a record in another layout than data.format, a run folder already taken, a resume of a
finished run, a run whose every reward is 0, the report's held-out plot title, the probe's
summary and verdict, counts in the right number, progress bars, and the CPU text of
docs/performance.md. Every test asserts the values or the exact line."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from reasonrl.cli import main
from reasonrl.evaluate import PromptResult, format_verdict, probe_metrics, probe_report, summarize
from reasonrl.evaluate.metrics import ProbeThresholds, mean_share_correct, pass_at_k, probe_verdict
from reasonrl.report import Plot, eval_description, load_run, plot_title
from reasonrl.tracking import counted, ticking
from reasonrl.train import run_dir as run_dir_module
from reasonrl.train.run_dir import existing_run_message, fresh_run_dir, run_state
from reasonrl.train.step_metrics import ZeroRewardWatch, zero_reward_warning

REPO = Path(__file__).parents[2]
SMOKE = str(REPO / "configs" / "smoke.yaml")


def train(tmp_path: Path, *extra: str) -> int:
    return main(["train", SMOKE, f"trainer.output_dir={tmp_path}", "tracking.report=false", *extra])


def forbid_model_loading(monkeypatch) -> None:
    """A command that must stop before any model loads fails the test if one is built."""
    def refuse(*args, **kwargs):
        raise AssertionError("the workers were built")
    monkeypatch.setattr("reasonrl.train.trainer.build_workers", refuse)


# ---- a record in another layout than data.format ---------------------------------------------


@pytest.mark.parametrize("record, fits", [
    ({"question": "q", "answer": "#### 1"}, ["gsm8k"]),
    ({"problem": "p", "solution": "\\boxed{1}"}, ["math", "numina"]),
    ({"target": 3, "nums": [1, 2]}, ["countdown"]),
    ({"prompt": "p", "ground_truth": "1", "data_source": "gsm8k", "extra_info": {}}, [""]),
    ({"messages": [], "reward_model": {"ground_truth": "1"}}, [""]),  # verl's layout
    ({"prompt": "p"}, []),  # no ground truth: no layout
    ({"q": "q", "a": "1"}, []),
])
def test_the_formats_a_record_fits_are_read_from_its_keys(record, fits):
    from reasonrl.data.formats import fitting_formats

    assert fitting_formats(record) == fits


def test_eval_of_a_prepared_file_under_a_format_names_file_line_field_and_the_override(tmp_path, capsys):
    """The issue's command: configs/gsm8k.yaml maps openai/gsm8k's question/answer layout
    (data.format=gsm8k); a file `reasonrl data prepare` wrote is already in reasonrl's layout."""
    prepared = tmp_path / "test.jsonl"
    assert main(["data", "prepare", "gsm8k", "--input", str(REPO / "tests/fixtures/gsm8k/test.jsonl"),
                 "--output", str(prepared), "--limit", "3"]) == 0
    capsys.readouterr()
    command = ["eval", "--config", str(REPO / "configs/gsm8k.yaml"), "--data", str(prepared),
               "--model", "tiny", "--greedy", "--no-entropy", "--max-new-tokens", "4", "--limit", "2"]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err == (f"reasonrl: error: {prepared}:1: missing field 'question' for data.format=gsm8k (it "
                   "reads question, answer); the record has data_source, extra_info, ground_truth, prompt; "
                   "it fits data.format= (empty: reasonrl's own layout, as `reasonrl data prepare` writes "
                   "it): add that override to the command\n")
    # the fix the line names works, and the evaluation shows its progress (samples done / total)
    assert main([*command, "data.format="]) == 0
    out, err = capsys.readouterr()
    assert "eval of tiny on " in out and "2 prompts x 1 greedy" in out
    assert "eval: 100%" in err and "2/2 [" in err and "batch 1/1: generating 2" in err


def test_raw_records_without_a_format_name_the_format_that_fits(tmp_path):
    from reasonrl.data import load_file
    from reasonrl.errors import DataError

    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"question": "q", "answer": "#### 3"}\n')
    with pytest.raises(DataError) as err:
        load_file(raw)
    assert str(err.value) == (f"{raw}:1: missing field 'prompt' (or 'messages'); the record has answer, "
                              "question; it fits data.format=gsm8k: add that override to the command")
    assert load_file(raw, fmt="gsm8k")[0].ground_truth == "3"
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"q": "q", "a": "3"}\n')
    with pytest.raises(DataError, match=r"no known layout fits it \(reasonrl's: prompt, ground_truth; gsm8k: "
                                        r"question, answer; .*\): name its fields with data.fields"):
        load_file(odd)


# ---- a run folder already taken; a resume of a finished run ----------------------------------


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """configs/smoke.yaml trained to its end (2 steps) in runs/smoke of a folder of its own."""
    out = tmp_path_factory.mktemp("runs")
    assert train(out, "trainer.progress=false") == 0
    return out / "smoke"


def test_the_readme_command_typed_twice_names_the_ways_on_in_one_line(finished_run, capsys, monkeypatch):
    forbid_model_loading(monkeypatch)  # refused before any model loads
    capsys.readouterr()
    assert train(finished_run.parent, "trainer.progress=false") == 2
    run = finished_run
    assert capsys.readouterr().err == (
        f"reasonrl: error: {run} already holds a run (finished: step 2 of 2): train it further with "
        f"`reasonrl train --resume {run} trainer.steps=N --allow-config-change trainer.steps (N > 2)`, "
        f"start another beside it with trainer.run_name=NAME, or start this one over with --overwrite "
        f"(deletes {run})\n")
    assert main(["train", "--resume", str(run), "--overwrite"]) == 2
    assert "--overwrite starts the run over and --resume continues it" in capsys.readouterr().err


def test_a_stopped_run_and_a_run_without_checkpoint_are_described(tmp_path):
    run = tmp_path / "r"
    step = run / "checkpoints" / "step_1"
    (step / "huggingface").mkdir(parents=True)
    (step / "trainer_state.json").write_text(json.dumps({"step": 1}))
    (step / "state.pt").write_bytes(b"")
    (run / "config.yaml").write_text("trainer:\n  steps: 5\n")
    assert run_state(run) == ("stopped at step 1 of 5", 1, 5)
    assert existing_run_message(run).startswith(
        f"{run} already holds a run (stopped at step 1 of 5): continue it with `reasonrl train --resume "
        f"{run}`, start another beside it")
    (step / "state.pt").unlink()  # an incomplete checkpoint is none
    assert run_state(run) == ("no checkpoint", None, 5)
    assert existing_run_message(run) == (f"{run} already holds a run (no checkpoint): start another beside "
                                         "it with trainer.run_name=NAME, or start this one over with "
                                         f"--overwrite (deletes {run})")


def test_unnamed_runs_started_in_one_second_get_folders_of_their_own(tmp_path, monkeypatch):
    """An empty trainer.run_name is the start time; a second run in the same second (a script,
    the docs' commands back to back) must not land on the first's folder (CI stop 38)."""
    class Frozen:
        @staticmethod
        def now():
            import datetime
            return datetime.datetime(2026, 11, 26, 16, 51, 24)
    monkeypatch.setattr(run_dir_module, "datetime", Frozen)
    first, lock1 = fresh_run_dir(tmp_path)
    (first / "metrics.jsonl").write_text("")
    second, lock2 = fresh_run_dir(tmp_path)  # the first still running: its lock
    lock1.release()
    third, lock3 = fresh_run_dir(tmp_path)  # the first finished: its folder holds a run
    assert [first.name, second.name, third.name] == ["20261126-165124", "20261126-165124-2",
                                                     "20261126-165124-3"]
    lock2.release()
    lock3.release()


def test_a_resume_of_a_finished_run_says_so_and_leaves_its_files_alone(finished_run, capsys, monkeypatch):
    summary = finished_run / "summary.json"
    record = json.loads(summary.read_text())
    record["eval_before"]["eval/accuracy"], record["eval_after"]["eval/accuracy"] = 0.25, 0.5
    summary.write_text(json.dumps(record, indent=2))
    files = {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file() and p.name != "run.lock"}
    forbid_model_loading(monkeypatch)
    capsys.readouterr()
    assert main(["train", "--resume", str(finished_run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        f"[reasonrl] {finished_run} is finished: its checkpoint step_2 is at step 2 of trainer.steps=2, "
        "nothing to train; held-out accuracy 0.250 before -> 0.500 after 2 steps (its summary.json). To "
        f"train it further: reasonrl train --resume {finished_run} trainer.steps=N --allow-config-change "
        "trainer.steps (N > 2)")
    assert {p: p.read_bytes() for p in files} == files  # summary.json, logs, checkpoints: as they were


def test_overwrite_starts_over_and_a_run_of_zero_rewards_says_so_once(tmp_path, capsys):
    """--overwrite replaces the run; a run whose every reward is 0 (the tiny random model never
    answers arithmetic) warns once, after 3 steps; counts take their number ("1 step")."""
    assert train(tmp_path, "trainer.steps=1", "trainer.progress=false") == 0
    assert "0.000 after 1 step\n" in capsys.readouterr().out
    (tmp_path / "smoke" / "notes.txt").write_text("left from the old run")
    assert train(tmp_path, "trainer.steps=4", "--overwrite") == 0
    out, err = capsys.readouterr()
    run = tmp_path / "smoke"
    assert f"[reasonrl] --overwrite: deleted the run that was in {run} (finished: step 1 of 1)" in err
    assert not (run / "notes.txt").exists() and not (run / "checkpoints" / "step_1").exists()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3, 4]  # the new run's alone
    assert all(x["reward/mean"] == 0 and x["reward/std"] == 0 for x in lines[1:])
    warnings = [x[x.index("[reasonrl] warning"):] for x in err.splitlines() if "[reasonrl] warning" in x]
    assert warnings == ["[reasonrl] warning: " + zero_reward_warning(1, 3, lines[3], 16, "auto", str(run))]
    assert "steps 1-3: every reward was 0 and the gradient norm 0: no sample was right" in warnings[0]
    assert f"reasonrl probe --config {run}/config.yaml" in warnings[0]
    assert "held-out eval" in err and "8/8 [" in err  # the held-out eval's bar (trainer.progress on)
    assert "after 4 steps" in out


def test_a_run_in_json_mode_writes_objects_and_in_quiet_mode_its_warnings_alone(tmp_path, capsys,
                                                                                monkeypatch):
    """trainer.console=json: every [reasonrl] line of a run is one JSON object (the run directory
    with its field; the zero-reward warning on stderr); quiet: no information line, the warning
    as text writes it. The mode is the run's alone: REASONRL_CONSOLE is as it was after."""
    monkeypatch.delenv("REASONRL_CONSOLE", raising=False)
    assert train(tmp_path, "trainer.steps=3", "trainer.progress=false", "trainer.console=json") == 0
    out, err = capsys.readouterr()
    run = tmp_path / "smoke"
    said = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert "[reasonrl]" not in out and "[reasonrl]" not in err
    assert {"level": "info", "message": f"run directory: {run}", "fields": {"run_dir": str(run)}} in said
    wrote = f"wrote {run}/ (config.yaml, metrics.jsonl, samples.jsonl, checkpoints/step_3/huggingface)"
    assert said[-1] == {"level": "info", "message": wrote, "fields": {"run_dir": str(run), "step": 3}}
    warned = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
    assert [w["level"] for w in warned] == ["warning"]
    assert warned[0]["message"].startswith("steps 1-3: every reward")
    assert "REASONRL_CONSOLE" not in __import__("os").environ
    assert train(tmp_path, "trainer.steps=3", "trainer.progress=false", "trainer.console=quiet",
                 "--overwrite") == 0
    out, err = capsys.readouterr()
    assert "[reasonrl]" not in out
    assert [x for x in err.splitlines() if x.startswith("[reasonrl]")] == [
        f"[reasonrl] --overwrite: deleted the run that was in {run} (finished: step 3 of 3)",
        "[reasonrl] warning: " + warned[0]["message"]]


def test_the_zero_reward_watch_warns_once_after_three_steps_in_a_row():
    zero, some = {"reward/mean": 0.0, "reward/std": 0.0}, {"reward/mean": 0.25, "reward/std": 0.4}
    watch = ZeroRewardWatch()
    steps = [zero, zero, some, zero, zero, zero, zero, zero]
    said = [watch.update(step, m) for step, m in enumerate(steps, start=1)]
    assert said == [False, False, False, False, False, True, False, False]  # steps 4-6, then never again
    assert watch.first == 4 and watch.streak == 5
    env = ZeroRewardWatch(after=1)  # an environment's reward is a signal too
    assert env.update(1, {**zero, "env/reward_mean": 0.5}) is False and env.update(2, zero) is True


def test_the_zero_reward_warning_puts_the_likely_cause_first():
    step = {"rollout/truncated_frac": 0.75, "train/grad_norm": 0.0}
    cut = zero_reward_warning(3, 5, step, 256, "gsm8k", "runs/x")
    assert cut == (
        "steps 3-5: every reward was 0 and the gradient norm 0: no sample was right, "
        "so the policy has no reward to learn from (a group's advantages are all 0). Likely: "
        "rollout.max_new_tokens=256 cuts the completions off before their answer (75% of step 5's hit it); "
        "or the task is too hard for this model (SFT first, or easier data); or the completions do not give "
        "the answer in the form the reward reads (reward.task=gsm8k). Check the task with `reasonrl probe "
        "--config runs/x/config.yaml` and read the completions in runs/x/samples.jsonl")
    short = zero_reward_warning(1, 3, {"rollout/truncated_frac": 0.1}, 256, "gsm8k", "runs/x")
    assert "steps 1-3: every reward was 0: no sample" in short  # no update logged: no gradient norm
    assert short.index("too hard") < short.index("reward.task=gsm8k") < short.index("max_new_tokens=256")


# ---- counts, progress ---------------------------------------------------------------------------


def test_counted_takes_the_number_of_its_count():
    assert [counted(n, "step") for n in (0, 1, 2, 1.0)] == ["0 steps", "1 step", "2 steps", "1 step"]


class FakeBar:
    disable = False

    def __init__(self):
        self.refreshed = threading.Event()

    def refresh(self):
        self.refreshed.set()


def test_ticking_redraws_the_bar_while_a_call_runs_and_stops_after():
    bar = FakeBar()
    with ticking(bar, interval=0.01):
        assert bar.refreshed.wait(10)  # the block waits; the bar moves on its own
    bar.refreshed.clear()
    assert not bar.refreshed.wait(0.1)  # the thread has stopped
    off = FakeBar()
    off.disable = True
    with ticking(off, interval=0.01):
        assert not off.refreshed.wait(0.1)  # a disabled bar: no thread at all
    assert not any(t.name == "progress-ticker" for t in threading.enumerate())


def test_the_probe_shows_samples_done_of_the_total(capsys):
    assert main(["probe", "--config", SMOKE, "--limit", "2", "--no-entropy"]) == 0
    out, err = capsys.readouterr()
    assert "2 prompts x 4 samples at T=1" in out  # rollout.n = 4 of configs/smoke.yaml
    assert "probe: 100%" in err and "8/8 [" in err and "batch 1/1: generating 8" in err


# ---- the report's held-out plot title ----------------------------------------------------------


def test_the_held_out_title_says_how_the_eval_sampled(fixtures_dir):
    assert eval_description({}) == "greedy, 1 sample per prompt, up to 64 new tokens"
    sampled = {"eval": {"n": 4, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 1024},
               "rollout": {"max_new_tokens": 512}}
    assert eval_description(sampled) == ("4 samples per prompt at T=0.6, top-p 0.95, top-k 20, up to 1024 "
                                         "new tokens")
    assert eval_description({"eval": {"n": 1, "temperature": 1.0}, "rollout": {"max_new_tokens": 16}}) == (
        "1 sample per prompt at T=1, up to 16 new tokens")
    run = load_run(fixtures_dir / "run_arith")  # a config from before the eval section: its defaults
    plot = Plot("eval_accuracy", "Held-out accuracy", [("eval/accuracy", "accuracy")], eval_settings=True)
    assert plot_title(plot, [run]) == ("Held-out accuracy (greedy, 1 sample per prompt, up to 40 new tokens)",
                                       {})
    other = load_run(fixtures_dir / "run_arith")
    other.name, other.config = "b", {**run.config, "eval": sampled["eval"]}
    title, legend = plot_title(plot, [run, other])
    assert title == "Held-out accuracy (eval settings differ by run)"
    assert legend == {run.name: " (greedy, 1 sample per prompt, up to 40 new tokens)",
                      "b": " (4 samples per prompt at T=0.6, top-p 0.95, top-k 20, up to 1024 new tokens)"}
    assert plot_title(Plot("reward", "Training reward", []), [run]) == ("Training reward", {})


# ---- the probe's summary and verdict, accuracy and pass@1 ---------------------------------------


def prompt(rewards: list[float], correct: list[bool], entropy: float = 0.5) -> PromptResult:
    n = len(rewards)
    return PromptResult("s", rewards, correct, ["1"] * n, [10] * n, [False] * n, [10 * entropy] * n)


def test_the_probe_summary_adds_up_when_a_format_reward_varies_within_wrong_prompts():
    """The issue's "zero-variance 0.75 (all right 0.00, all wrong 1.00)": four prompts, no sample
    right, a format component that rewards one sample of the last prompt."""
    results = [prompt([0.0] * 4, [False] * 4)] * 3 + [prompt([0.1, 0.0, 0.0, 0.0], [False] * 4)]
    m = probe_metrics(results)
    assert (m["zero_variance_frac"], m["zero_variance_all_correct_frac"], m["zero_variance_all_wrong_frac"],
            m["zero_variance_other_frac"]) == (0.75, 0.0, 0.75, 0.0)
    assert (m["all_correct_frac"], m["all_wrong_frac"]) == (0.0, 1.0)
    lines = format_verdict(probe_report(results, {"prompts": []})).splitlines()
    assert lines[2] == "zero-variance prompts 0.75 (all right 0.00 + all wrong 0.75)"
    assert lines[3] == ("no sample right in 1.00 of the prompts, every sample right in 0.00 (some of them "
                        "with rewards that differ through other components: reward.weights)")
    # equal rewards over a right and a wrong sample (correct 1 + format 0 = wrong 0 + format 1)
    mixed = probe_metrics([prompt([1.0, 1.0], [True, False]), prompt([1.0, 1.0], [True, True])])
    assert (mixed["zero_variance_frac"], mixed["zero_variance_all_correct_frac"],
            mixed["zero_variance_other_frac"]) == (1.0, 0.5, 0.5)
    text = format_verdict(probe_report([prompt([1.0, 1.0], [True, False])] * 2, {"prompts": []}))
    assert text.splitlines()[2] == ("zero-variance prompts 1.00 (all right 0.00 + all wrong 0.00 + equal "
                                    "rewards over right and wrong samples 1.00)")


def test_a_task_that_trains_is_fine_whatever_its_entropy():
    """docs/evaluation.md's arithmetic probe (accuracy 0.174, variance 0.115, entropy 1.670 at
    T = 1) trained 0.20 -> 0.82: fine, with the entropy as a note, never "close to random"."""
    verdict = probe_verdict(0.174, 0.115, 1.670)
    assert verdict.status == "fine" and verdict.checks["entropy"] is False
    assert verdict.notes == ["entropy 1.670 nats/token is above 0.8, usual for a small model at T = 1; it "
                             "decides nothing while accuracy and variance are in range"]
    low = probe_verdict(0.5, 0.01, 0.05)  # samples that barely differ show as low variance
    assert low.status == "low_variance" and "raise rollout.temperature" in low.notes[0]
    assert probe_verdict(0.5, 0.2, 0.5).notes == [] and probe_verdict(0.5, 0.2, None).notes == []
    text = format_verdict(probe_report([prompt([1.0, 0.0], [True, False], entropy=1.67)] * 4, {"prompts": []},
                                       ProbeThresholds()))
    assert "close to random" not in text
    assert text.splitlines()[-1] == "verdict: fine: fine: train with RL as is"
    assert "note: entropy 1.670 nats/token is above 0.8" in text


def test_accuracy_is_pass_at_1_when_prompts_have_their_own_n():
    """EasyRL-style records: 3 prompts of 1 sample, 3 of 4; one right sample among the 4s. The
    issue's "pass@1 0.042 beside accuracy 0.067": both are now 0.25 / 6 = 0.0417 (the mean over
    prompts of each one's share of right samples; 1 of 15 samples counted each sample once)."""
    results = ([prompt([0.0], [False])] * 3 + [prompt([1.0, 0.0, 0.0, 0.0], [True, False, False, False])]
               + [prompt([0.0] * 4, [False] * 4)] * 2)
    m = summarize(results, ks=(1,))
    assert m["accuracy"] == m["pass@1"] == pytest.approx(0.25 / 6, abs=1e-15)
    # equal n: the share of right samples, one quotient to the last bit
    equal = [prompt([1.0, 0.0, 0.0], [True, False, False]), prompt([1.0, 1.0, 0.0], [True, True, False]),
             prompt([0.0] * 3, [False] * 3)]
    assert mean_share_correct(equal) == 3 / 9 and summarize(equal, ks=(1, 3))["pass@1"] == 3 / 9
    assert pass_at_k(8, 3, 1) == 3 / 8 and pass_at_k(3, 0, 1) == 0.0


# ---- docs/performance.md: CPU features by flags ---------------------------------------------------


def test_performance_page_states_cpu_features_by_flags_not_by_vendor():
    text = (REPO / "docs" / "performance.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    machines = [h for h in headings if re.search(r"AMD|Intel|EPYC|Xeon", h)]
    assert len(machines) == 2 and all(re.search(r"AVX2|bf16 units", h) for h in machines), machines
    # no feature stated of a vendor: "AMD EPYC (..., no AVX-512)" was wrong (Zen 4 EPYCs have it)
    assert not re.search(r"(AMD|EPYC|Intel|Xeon)[^.\n]{0,40}\bno AVX-?512\b(?! flag)", text)
    assert "no `avx512_bf16`, no `amx_bf16` (no bf16 units)" in text
    assert "`avx512_bf16` and/or `amx_bf16`" in text
    assert "on a CPU without bf16 units (no `avx512_bf16` / `amx_bf16` flag" in text
