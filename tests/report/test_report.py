"""`reasonrl report`: a self-contained report.html from a real run's files (tests/fixtures/run_arith,
20 steps of the default SmolLM2 run, samples trimmed to two per step)."""

from __future__ import annotations

import base64
import copy
import io
import json
import re
import shutil

import pytest
import yaml
from PIL import Image

from reasonrl.cli import main
from reasonrl.report import (
    PLOTS,
    async_numbers,
    load_run,
    render_html,
    sample_steps,
    stage_seconds,
    staleness_histogram,
    write_report,
)
from reasonrl.tracking import missing_extra

PNG = re.compile(r'<figure class="plot[^"]*" id="plot-([a-z_]+)"[^>]*data-logged="true">'
                 r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


@pytest.fixture
def run_dir(tmp_path, fixtures_dir):
    target = tmp_path / "arith"
    shutil.copytree(fixtures_dir / "run_arith", target)
    return target


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    from pathlib import Path

    target = tmp_path_factory.mktemp("report") / "arith"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "run_arith", target)
    path = write_report([target])
    return path, path.read_text(encoding="utf-8")


def test_report_has_every_plot_as_an_inline_png(report):
    path, text = report
    assert path.name == "report.html"
    images = dict(PNG.findall(text))
    expected = {p.id for p in PLOTS if p.id != "kl"} | {"time"}
    assert set(images) == expected
    for name, data in images.items():
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        assert image.format == "PNG" and image.width >= 500 and image.height >= 250, name
    # the fixture run had beta = 0: its KL plot says so instead of failing
    kl = re.search(r'<figure class="plot" id="plot-kl"[^>]*data-logged="false">(.*?)</figure>', text)
    assert kl and "not logged" in kl.group(1) and "algo.beta" in kl.group(1)


def test_report_is_self_contained(report):
    _, text = report
    assert "<script" not in text.lower()
    assert not re.search(r'(src|href)="(https?:)?//', text)  # no CDN, opens offline
    assert "@import" not in text and "url(" not in text


def test_report_values_match_the_fixture(report):
    _, text = report
    # summary: held-out accuracy 0.20 -> 0.62 (metrics.jsonl steps 0 and 20), 20 training steps
    assert "0.200 &rarr; 0.620 (steps 0 &rarr; 20)" in text
    assert re.search(r"training steps logged</th><td class=\"num\">20<", text)
    # reward/mean: first five steps average 0.237, last five 0.706 (from the fixture file)
    assert "0.237 &rarr; 0.706" in text
    # eval table rows for steps 0 and 20, summary.json before/after
    assert re.search(r'<tr><td class="num">20</td><td class="num">0.620</td>', text)
    assert "before training</th><th>after training" in text
    # samples at the first, middle and last step, with their rewards
    assert re.findall(r'<table class="samples" data-step="(\d+)"', text) == ["1", "11", "20"]
    assert "11 + 6 equals 17." in text  # a last-step completion
    # resolved config
    assert "max_operand: 19" in text and "beta: 0.0" in text


def test_run_loading_and_stage_seconds(run_dir):
    run = load_run(run_dir)
    assert sorted(run.metrics) == list(range(21))
    assert sample_steps(run) == [1, 11, 20]
    stages = stage_seconds(run)
    assert set(stages[0]) == {"eval"}  # step 0: the evaluation before training only
    assert set(stages[20]) >= {"rollout", "reward", "update", "sync", "eval"}
    m = run.metrics[20]
    assert stages[20]["rollout"] == pytest.approx(m["time/rollout"])
    named = sum(m[f"time/{s}"] for s in ("rollout", "reward", "update", "sync"))
    assert stages[20].get("other", 0.0) == pytest.approx(max(m["time/step"] - named, 0.0), abs=1e-3)


def test_model_output_is_escaped(run_dir):
    evil = "<script>alert('x')</script><img src=x onerror=alert(1)> & \"quoted\""
    with (run_dir / "samples.jsonl").open("a") as f:
        f.write(json.dumps({"step": 20, "prompt": evil, "ground_truth": evil, "completion": evil,
                            "reward": 0.0, "components": {evil: 0.0}, "advantage": 0.0,
                            "truncated": False}) + "\n")
    config = (run_dir / "config.yaml").read_text().replace("run_name: ''", "run_name: '</pre><b>x'")
    (run_dir / "config.yaml").write_text(config)
    text = write_report([run_dir]).read_text()
    assert "<script>" not in text and "<img src=x" not in text and "</pre><b>x" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in text
    assert "&amp; &quot;quoted&quot;" in text


def test_missing_metrics_and_a_torn_last_line(tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    lines = [{"step": 1, "reward/mean": 0.5, "time/step": 2.0, "time/rollout": 1.0},
             {"step": 2, "reward/mean": None, "time/step": 2.0, "time/rollout": 1.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 3, "rew')
    text = write_report([run]).read_text()
    logged = dict(re.findall(r'id="plot-([a-z_]+)"[^>]*data-logged="(true|false)"', text))
    assert logged["reward"] == "true" and logged["time"] == "true"
    for name in ("eval_accuracy", "entropy", "kl", "clip_frac", "grad_norm", "lr"):
        assert logged[name] == "false", name
    assert text.count("not logged") >= 6
    assert "unreadable lines skipped" in text
    assert "No samples.jsonl rows." in text and "No held-out evaluation" in text


def test_the_critic_panel_appears_only_with_a_critic(tmp_path):
    run = tmp_path / "ppo"
    run.mkdir()
    lines = [{"step": t, "reward/mean": 0.1 * t, "critic/vf_loss": 1.0 / t,
              "critic/explained_variance": 0.1 * t,
              "critic/value_mean": 0.05 * t, "critic/returns_mean": 0.1 * t, "critic/vf_clipfrac": 0.0,
              "critic/grad_norm": 2.0, "time/step": 2.0, "time/critic": 0.5} for t in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = write_report([run]).read_text()
    logged = dict(re.findall(r'id="plot-([a-z_]+)"[^>]*data-logged="(true|false)"', text))
    assert '<h2 id="critic">Critic</h2>' in text
    for name in ("critic_loss", "critic_ev", "critic_values", "critic_clip", "critic_grad_norm"):
        assert logged[name] == "true", name
    assert load_run(run).series("critic/vf_loss") == ([1, 2, 3], [1.0, 0.5, 1.0 / 3])
    other = tmp_path / "grpo"
    other.mkdir()
    (other / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert 'id="critic"' not in write_report([other]).read_text()


def test_a_step_logged_twice_keeps_the_last_values(tmp_path):
    run = tmp_path / "resumed"
    run.mkdir()
    lines = [{"step": 1, "reward/mean": 0.1}, {"step": 2, "reward/mean": 0.2},
             {"step": 2, "reward/mean": 0.9}, {"step": 3, "reward/mean": 0.3}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert load_run(run).series("reward/mean") == ([1, 2, 3], [0.1, 0.9, 0.3])


def test_compare_overlays_runs_and_lists_config_differences(run_dir, tmp_path):
    other = tmp_path / "lr1e-5"
    shutil.copytree(run_dir, other)
    config = yaml.safe_load((other / "config.yaml").read_text())
    config["optim"]["lr"] = 1e-5
    (other / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (other / "metrics.jsonl").write_text("".join(
        json.dumps({**json.loads(line), "train/kl": 0.01})  + "\n"
        for line in (other / "metrics.jsonl").read_text().splitlines()))
    out = tmp_path / "cmp.html"
    assert main(["report", str(run_dir), str(other), "-o", str(out)]) == 0
    text = out.read_text()
    assert "arith vs lr1e-5" in text
    diff = re.search(r'<table id="config-diff">(.*?)</table>', text).group(1)
    assert "optim.lr" in diff and "2e-05" in diff and "1e-05" in diff and "optim.n" not in diff
    assert set(dict(PNG.findall(text))) == {p.id for p in PLOTS} | {"time"}
    # KL was logged by one run only: plotted, with a note naming the other
    assert re.search(r'id="plot-kl".*?not logged in arith</figcaption>', text)


def test_cli_report_default_path_and_errors(run_dir, tmp_path, capsys):
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").is_file()
    assert f"wrote {run_dir / 'report.html'}" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a run directory (no metrics.jsonl)" in capsys.readouterr().err


def test_training_writes_the_report_and_tensorboard_events(tmp_path, capsys):
    backends = "[console,jsonl,tensorboard]" if missing_extra("tensorboard") is None else "[console,jsonl]"
    assert main(["train", "configs/smoke.yaml", f"trainer.output_dir={tmp_path}", "trainer.run_name=r",
                 "trainer.progress=false", f"tracking.backends={backends}"]) == 0
    run = tmp_path / "r"
    assert f"report: {run / 'report.html'}" in capsys.readouterr().out
    text = (run / "report.html").read_text()
    assert set(dict(PNG.findall(text))) >= {"reward", "eval_accuracy", "entropy", "grad_norm", "time"}
    assert re.findall(r'<table class="samples" data-step="(\d+)"', text) == ["1", "2"]
    if "tensorboard" in backends:
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))


# asynchronous training, trainer.max_staleness = K = 2: step 4 mixes two lags (a per-sample mean)
# (async/staleness, async/staleness_0..2, async/wait, time/step, async/producer_idle, time/rollout,
#  async/sync_pause) of steps 1..4
ASYNC_STEPS = [
    (0.0, (1.0, 0.0, 0.0), 2.0, 5.0, 0.5, 3.0, 0.2),
    (1.0, (0.0, 1.0, 0.0), 1.0, 4.0, 0.0, 3.5, 0.4),
    (2.0, (0.0, 0.0, 1.0), 0.0, 3.0, 1.0, 3.0, 0.3),
    (1.5, (0.0, 0.5, 0.5), 1.0, 4.0, 0.5, 2.5, 0.1),
]


def _async_run(path):
    path.mkdir()
    lines = [{"step": 0, "eval/accuracy": 0.2, "time/eval": 1.0}]
    for t, (lag, hist, wait, step, idle, rollout, pause) in enumerate(ASYNC_STEPS, 1):
        lines.append({"step": t, "reward/mean": 0.1 * t, "async/staleness": lag,
                      **{f"async/staleness_{k}": f for k, f in enumerate(hist)},
                      "async/wait": wait, "async/producer_idle": idle, "async/sync_pause": pause,
                      "time/step": step, "time/rollout": rollout, "time/reward": 0.1, "time/update": 1.5})
    (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _section(text, name):
    return re.search(rf'<h2 id="{name}">.*?(?=\n<h2 )', text, re.S).group(0)


def test_the_async_section_shows_staleness_and_idle_shares(tmp_path):
    run = load_run(_async_run(tmp_path / "async"))
    assert staleness_histogram(run) == ([0, 1, 2], {1: [1.0, 0.0, 0.0], 2: [0.0, 1.0, 0.0],
                                                    3: [0.0, 0.0, 1.0], 4: [0.0, 0.5, 0.5]})
    numbers = async_numbers(run)
    assert numbers["staleness_mean"] == pytest.approx(1.125)  # (0 + 1 + 2 + 1.5) / 4
    assert numbers["learner_idle"] == pytest.approx(0.25)  # 4 s waited of 16 s of steps
    assert numbers["generator_idle"] == pytest.approx(1 / 7)  # 2 s idle of 12 s generating + 2 s idle
    assert numbers["sync_pause_mean"] == pytest.approx(0.25)  # (0.2 + 0.4 + 0.3 + 0.1) / 4
    assert numbers["sync_pause_max"] == pytest.approx(0.4)
    text = write_report([tmp_path / "async"]).read_text()
    assert '<a href="#async">asynchronous training</a>' in text
    section = _section(text, "async")
    assert section.startswith('<h2 id="async">Asynchronous training</h2>')
    for label, value in [("staleness, mean (policy versions behind)", "1.125"),
                         ("learner idle (async/wait / time/step)", "25.0% (4.0 s of 16.0 s)"),
                         ("generator idle (async/producer_idle / (time/rollout + async/producer_idle))",
                          "14.3% (2.0 s of 14.0 s)"),
                         ("weight-sync pause, mean (async/sync_pause)", "0.250 s"),
                         ("weight-sync pause, max", "0.400 s")]:
        assert f'<tr><th>{label}</th><td class="num">{value}</td></tr>' in section, label
    images = dict(PNG.findall(section))
    assert set(images) == {"staleness"}
    assert "async/staleness_0 .. async/staleness_2" in section
    image = Image.open(io.BytesIO(base64.b64decode(images["staleness"]))).convert("RGB")
    assert image.width >= 1000 and image.height >= 300
    colors = {c for _, c in image.getcolors(1 << 20)}
    for lag_color in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E), (0x2C, 0xA0, 0x2C)):  # a bar colour per lag
        assert lag_color in colors


def test_a_run_without_async_metrics_renders_as_before(report, tmp_path):
    _, text = report  # the fixture run (synchronous): the sections and nav of before
    assert re.findall(r'<h2 id="([a-z]+)">', text) == ["summary", "plots", "eval", "samples", "config"]
    assert re.findall(r'<nav>.*?</nav>', text) == [
        '<nav><a href="#summary">summary</a><a href="#plots">plots</a><a href="#eval">held-out eval</a>'
        '<a href="#samples">samples</a><a href="#config">config</a></nav>']
    assert "Asynchronous training" not in text and 'id="plot-staleness' not in text
    # the section only adds: without its async/ metrics the same run renders as the async one less
    # its section and nav link
    run = load_run(_async_run(tmp_path / "async"))
    plain = copy.deepcopy(run)
    for metrics in plain.metrics.values():
        for key in [k for k in metrics if k.startswith("async/")]:
            del metrics[key]
    with_async, without = (re.sub(r"generated [^<]* by", "generated by", render_html([r]))
                           for r in (run, plain))
    assert 'id="async"' not in without and "Asynchronous training" not in without
    removed = with_async.replace("\n" + _section(with_async, "async"), "", 1)
    assert removed.replace('<a href="#async">asynchronous training</a>', "", 1) == without


def test_the_async_table_compares_with_a_synchronous_run(tmp_path):
    _async_run(tmp_path / "async")
    sync = tmp_path / "sync"
    sync.mkdir()
    (sync / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5, "time/step": 2.0}) + "\n")
    text = write_report([tmp_path / "async", sync], tmp_path / "cmp.html").read_text()
    section = _section(text, "async")
    assert "<tr><th></th><th>async</th><th>sync</th></tr>" in section
    assert ('<tr><th>staleness, mean (policy versions behind)</th><td class="num">1.125</td>'
            '<td class="num">not logged</td></tr>') in section
    assert re.findall(r'id="plot-(staleness[^"]*)" data-run="([^"]*)" data-logged="true"', section) == [
        ("staleness", "async")]
