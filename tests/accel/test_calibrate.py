"""reasonrl.accel.calibrate: measured choices cached per machine (the decoder of
`rollout.hf_decoder=auto`, the precision of `model.precision=auto`), the interleaved minimum
that survives a busy machine, when a cached entry is measured again, and `reasonrl calibrate`.

Every test but the two real measurements fakes the timing: the choice rules are tested on
hand-picked seconds, not on this machine's."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest
import torch

from reasonrl.accel import calibrate
from reasonrl.cli import main
from reasonrl.rollout.hf import HFEngine

FLAGS = ["amx_bf16", "avx512f"]


@pytest.fixture(autouse=True)
def calibration_home(tmp_path, monkeypatch):
    """Each test calibrates into its own $REASONRL_HOME, on a machine with FLAGS and no load."""
    monkeypatch.setenv("REASONRL_HOME", str(tmp_path))
    monkeypatch.setattr(calibrate, "cpu_flags", lambda: list(FLAGS))
    monkeypatch.setattr(calibrate, "load_per_core", lambda: 0.1)


def no_measuring(*args, **kwargs):
    raise AssertionError("measured, where the cached entry should have been used")


def write_cache(entries: dict) -> None:
    calibrate.cache_file().write_text(json.dumps(entries))


# ------------------------------------------------------------------ timing on a busy machine


def test_interleaved_minimum_keeps_each_candidates_least_kept_round():
    """Rounds A B A B ...; the warm-up round is not kept even where it is the fastest; each
    candidate keeps its least time over the kept rounds."""
    order = []

    def candidate(name, seconds):
        feed = iter(seconds)
        return lambda: order.append(name) or next(feed)

    found = calibrate.interleaved_minimum({"A": candidate("A", [0.1, 5.0, 3.0, 4.0]),
                                           "B": candidate("B", [0.01, 2.0, 6.0, 1.0])}, rounds=3, warmup=1)
    assert found == {"A": 3.0, "B": 1.0}
    assert order == ["A", "B"] * 4
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        calibrate.interleaved_minimum({"A": lambda: 1.0}, rounds=0)


def test_decoders_are_timed_in_interleaved_blocks(tiny, monkeypatch):
    """Each decoder that can run the model decodes DECODE_ROUNDS blocks, one block per decoder
    per round (A B C A B C), and keeps its least step; the fastest is chosen."""
    model, _ = tiny
    paths = [p for p in calibrate.CANDIDATES if calibrate.unavailable(model, p) is None]
    assert {"lean", "modules"} <= set(paths)
    times = {"lean_mkl": itertools.cycle([0.5, 0.3]), "lean": itertools.cycle([0.4, 0.1]),
             "modules": itertools.cycle([0.2, 0.9])}
    blocks = []

    def block(m, path, prompt, tokens):
        blocks.append((path, tuple(tokens.shape)))
        return next(times[path])

    monkeypatch.setattr(calibrate, "_decode_block", block)
    entry = calibrate.measure(model, 8)
    assert [p for p, _ in blocks] == paths * calibrate.DECODE_ROUNDS
    assert {shape for _, shape in blocks} == {(calibrate.WARMUP_STEPS + calibrate.TIMED_STEPS, 8)}
    assert entry == {"fastest": "lean", "seconds": {p: {"lean_mkl": 0.3, "lean": 0.1, "modules": 0.2}[p]
                                                    for p in paths}}


def test_auto_picks_the_fastest_measured_decoder_and_caches_it(tiny, monkeypatch, capsys):
    """`auto` keeps the fastest decoder measured, records the machine with it, and reads the
    answer from the cache afterwards (no second measurement)."""
    model, tokenizer = tiny
    measured = []
    monkeypatch.setattr(calibrate, "decoder_seconds",
                        lambda m, rows: measured.append(rows) or {"lean": 0.02, "modules": 0.01})
    engine = HFEngine(model, tokenizer)
    assert engine.decode_path(24) == ("modules", None)
    assert measured == [24]
    assert "-> modules" in capsys.readouterr().out
    assert engine.decode_path(17) == ("modules", None) and measured == [24]  # 17, 24 rows: the bucket of 32
    assert engine.decode_path(40)[0] == "modules" and measured == [24, 40]  # 64 rows: a new measurement
    entry = calibrate._read()[calibrate.calibration_key(model, 24)]
    assert entry["fastest"] == "modules" and entry["seconds"] == {"lean": 0.02, "modules": 0.01}
    assert entry["kind"] == "decoder" and entry["flags"] == FLAGS and entry["load"] == 0.1
    assert entry["measured"][:4].isdigit() and "T" in entry["measured"]


def test_auto_is_never_slower_than_the_modules_here(tiny):
    """The real measurement, on this machine: the decoder `auto` keeps is the fastest measured,
    so never slower than the transformers modules (`bench/rollout.py` shows it at full size)."""
    model, _ = tiny
    state = torch.get_rng_state()
    start = time.perf_counter()
    entry = calibrate.measure(model.eval(), 8)
    elapsed = time.perf_counter() - start
    assert torch.equal(torch.get_rng_state(), state)  # the run's random stream is untouched
    assert "modules" in entry["seconds"] and "lean" in entry["seconds"]
    assert ("lean_mkl" in entry["seconds"]) is (calibrate.unavailable(model, "lean_mkl") is None)
    assert entry["seconds"][entry["fastest"]] == min(entry["seconds"].values()) <= entry["seconds"]["modules"]
    # seconds of one step: each the least of that decoder's steps, all timed within the call (4 ms
    # here, where a fixed 1 s would be a guess at the machine); milliseconds would be ~1000x more
    assert all(0 < s < elapsed for s in entry["seconds"].values()), (entry, elapsed)


def test_calibration_key_names_the_machine_and_the_shapes(tiny):
    model, _ = tiny
    key = calibrate.calibration_key(model, 24)
    assert calibrate.cpu_model() in key and torch.__version__ in key and "rows 32" in key
    assert "h64 l2" in key and "torch.float32" in key
    assert calibrate.calibration_key(model, 32) == key != calibrate.calibration_key(model, 33)


def test_a_broken_cache_file_is_measured_again(tiny, monkeypatch):
    model, _ = tiny
    monkeypatch.setattr(calibrate, "decoder_seconds", lambda m, rows: {"lean": 0.01, "modules": 0.02})
    calibrate.cache_file().write_text("{not json")
    assert calibrate.fastest(model, 4) == "lean"
    assert calibrate._read()[calibrate.calibration_key(model, 4)]["fastest"] == "lean"


# ------------------------------------------------------------------ when a cached entry is measured again


def decoder_entry(**fields) -> dict:
    return {"kind": "decoder", "fastest": "modules", "seconds": {"lean": 0.02, "modules": 0.01},
            "flags": FLAGS, "load": 0.2, "measured": "2026-11-20T10:00:00+00:00", **fields}


def test_an_entry_with_the_same_flags_is_reused_and_one_with_other_flags_measured_again(tiny, monkeypatch,
                                                                                       capsys):
    model, _ = tiny
    key = calibrate.calibration_key(model, 16)
    write_cache({key: decoder_entry()})
    monkeypatch.setattr(calibrate, "decoder_seconds", no_measuring)
    assert calibrate.fastest(model, 16) == "modules"
    assert calibrate.fastest(model, 16) == "modules"  # deterministic for a given cache
    assert capsys.readouterr().out == ""
    # the same model name on another host: a container moved to an AVX2-only machine
    monkeypatch.setattr(calibrate, "cpu_flags", lambda: ["avx2", "fma"])
    monkeypatch.setattr(calibrate, "decoder_seconds", lambda m, rows: {"lean": 0.01, "modules": 0.03})
    assert calibrate.fastest(model, 16) == "lean"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("[reasonrl] decoder calibration: measured on a CPU with flags [amx_bf16 avx512f], "
                      "this one has [avx2 fma]: measuring again")
    entry = calibrate._read()[key]
    assert entry["fastest"] == "lean" and entry["flags"] == ["avx2", "fma"]


def test_an_entry_of_an_older_reasonrl_is_measured_again(tiny, monkeypatch, capsys):
    """The newcomer's cache: `modules` chosen at 16 rows, recorded without flags or load."""
    model, _ = tiny
    key = calibrate.calibration_key(model, 16)
    write_cache({key: {"fastest": "modules", "seconds": {"lean": 0.3, "modules": 0.2}}})
    monkeypatch.setattr(calibrate, "decoder_seconds", lambda m, rows: {"lean": 0.1, "modules": 0.2})
    assert calibrate.fastest(model, 16) == "lean"
    assert "recorded without the CPU flags and load (by an older reasonrl): measuring again" in \
        capsys.readouterr().out


@pytest.mark.parametrize("then, now, stale", [
    (1.5, 0.4, True),     # measured under load, quiet now
    (1.5, 0.5, False),    # not quiet yet: 0.5 is not below half of BUSY_LOAD
    (1.5, 1.2, False),    # still busy: measuring again would measure a busy machine again
    (1.0, 0.0, False),    # 1.0 per core is not above BUSY_LOAD
    (0.2, 3.0, False),    # measured quiet, busy now: the quiet measurement is the better one
    (1.5, None, False),   # no load average here
])
def test_the_load_rule(then, now, stale):
    why = calibrate.stale_reason(decoder_entry(load=then), FLAGS, now)
    assert (why is not None) is stale
    if stale:
        assert why == (f"measured under load ({then:.2f} per core), "
                       f"the machine is quiet now ({now:.2f} per core)")


def test_an_entry_measured_under_load_is_measured_again_when_quiet(tiny, monkeypatch, capsys):
    model, _ = tiny
    key = calibrate.calibration_key(model, 16)
    write_cache({key: decoder_entry(load=1.8)})
    monkeypatch.setattr(calibrate, "decoder_seconds", lambda m, rows: {"lean": 0.01, "modules": 0.02})
    monkeypatch.setattr(calibrate, "load_per_core", lambda: 0.3)
    assert calibrate.fastest(model, 16) == "lean"
    assert ("decoder calibration: measured under load (1.80 per core), the machine is quiet now (0.30 per "
            "core): measuring again") in capsys.readouterr().out
    assert calibrate._read()[key]["load"] == 0.3


# ------------------------------------------------------------------ the CPU's flags


def test_cpu_flags_are_read_from_the_cpuinfo_of_x86_and_arm_and_macos_sysctl():
    x86 = ("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma sha_ni\n\n"
           "flags\t: avx512f\n")
    assert calibrate.flags_in_cpuinfo(x86) == ["avx2", "fma"]  # the first processor's line only
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve bf16 i8mm\nCPU part\t: 0xd40\n"
    assert calibrate.flags_in_cpuinfo(arm) == ["asimd", "bf16", "sve"]
    assert calibrate.flags_in_cpuinfo("processor: 0\n") == []
    mac = ("hw.optional.arm.FEAT_BF16: 1\nhw.optional.AdvSIMD: 1\nhw.optional.arm.FEAT_SME: 0\n"
           "hw.optional.fma: 0\n")
    assert calibrate.flags_in_sysctl(mac) == ["asimd", "bf16"]


def test_cpu_flags_here_are_the_choice_flags_of_this_machines_cpuinfo(monkeypatch):
    monkeypatch.undo()  # the real cpu_flags, not the fixture's
    found = calibrate.cpu_flags()
    assert found == sorted(found) and set(found) <= set(calibrate.CHOICE_FLAGS)
    if Path("/proc/cpuinfo").is_file():
        assert found == calibrate.flags_in_cpuinfo(Path("/proc/cpuinfo").read_text())


# ------------------------------------------------------------------ model.precision=auto


def precision_entry(fp32: float, bf16: float, choice: str, **fields) -> dict:
    return {"kind": "precision", "choice": choice, "seconds": {"fp32": fp32, "bf16": bf16}, "flags": FLAGS,
            "load": 0.2, "measured": "2026-11-20T10:00:00+00:00", **fields}


def test_precision_choice_reads_a_hand_written_entry_without_measuring(monkeypatch):
    write_cache({calibrate.precision_key(576, 1536, 1024): precision_entry(0.2, 0.1, "bf16-mixed")})
    monkeypatch.setattr(calibrate, "precision_seconds", no_measuring)
    first = calibrate.precision_choice(576, 1536, 1024)
    assert first == calibrate.precision_choice(576, 1536, 700)  # 700 and 1024 tokens: the bucket of 1024
    assert first == calibrate.precision_choice(576, 1536, 1024, "cpu")
    choice, why = first
    assert choice == "bf16-mixed"
    assert why == ("a SwiGLU MLP forward+backward (hidden 576, intermediate 1536, 1024 tokens) took "
                   "fp32 0.2000 s, bf16 0.1000 s: 2.00x >= 1.3 (cached 2026-11-20T10:00:00+00:00 in "
                   f"{calibrate.cache_file()}; CPU flags [amx_bf16 avx512f])")


@pytest.mark.parametrize("fp32, bf16, choice", [
    (1.3, 1.0, "bf16-mixed"),   # exactly the margin
    (4.0, 1.0, "bf16-mixed"),   # AMX
    (1.29, 1.0, "fp32"),        # faster, but not by a clear margin
    (1.0, 2.5, "fp32"),         # bf16 emulated (no bf16 units)
])
def test_the_margin_rule(fp32, bf16, choice, monkeypatch):
    assert calibrate.precision_verdict({"fp32": fp32, "bf16": bf16}) == choice
    monkeypatch.setattr(calibrate, "precision_seconds", lambda h, i, t: {"fp32": fp32, "bf16": bf16})
    found, why = calibrate.precision_choice(64, 128, 100)
    assert found == choice
    assert f"{fp32 / bf16:.2f}x {'>=' if choice == 'bf16-mixed' else '<'} 1.3 (measured now, load 0.1" in why
    entry = calibrate._read()[calibrate.precision_key(64, 128, 128)]
    assert entry["choice"] == choice and entry["seconds"] == {"fp32": fp32, "bf16": bf16}
    assert entry["flags"] == FLAGS and entry["load"] == 0.1


def test_a_precision_entry_with_other_flags_or_measured_under_load_is_measured_again(monkeypatch, capsys):
    key = calibrate.precision_key(64, 128, 128)
    monkeypatch.setattr(calibrate, "precision_seconds", lambda h, i, t: {"fp32": 1.0, "bf16": 3.0})
    write_cache({key: precision_entry(3.0, 1.0, "bf16-mixed", flags=["amx_bf16", "avx512_bf16", "avx512f"])})
    assert calibrate.precision_choice(64, 128, 128)[0] == "fp32"
    assert "precision calibration: measured on a CPU with flags [amx_bf16 avx512_bf16 avx512f]" in \
        capsys.readouterr().out
    write_cache({key: precision_entry(3.0, 1.0, "bf16-mixed", load=2.0)})
    assert calibrate.precision_choice(64, 128, 128)[0] == "fp32"
    assert "measured under load (2.00 per core)" in capsys.readouterr().out


def test_on_a_gpu_precision_follows_torchs_bf16_support_without_measuring(monkeypatch):
    monkeypatch.setattr(calibrate, "precision_seconds", no_measuring)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert calibrate.precision_choice(576, 1536, 1024, "cuda") == (
        "bf16-mixed", "Test GPU supports bf16 (not measured)")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert calibrate.precision_choice(576, 1536, 1024, torch.device("cuda:0"))[0] == "fp32"
    assert not calibrate.cache_file().exists()


def test_the_real_precision_measurement_on_tiny_shapes():
    choice, why = calibrate.precision_choice(32, 64, 16)
    assert choice in ("bf16-mixed", "fp32") and "measured now" in why
    entry = calibrate._read()[calibrate.precision_key(32, 64, 16)]
    assert entry["choice"] == choice == calibrate.precision_verdict(entry["seconds"])
    assert set(entry["seconds"]) == {"fp32", "bf16"} and all(s > 0 for s in entry["seconds"].values())
    assert entry["flags"] == FLAGS and entry["kind"] == "precision"


# ------------------------------------------------------------------ reasonrl calibrate


def test_the_calibrate_command_lists_resets_and_measures(monkeypatch, capsys):
    path = calibrate.cache_file()
    assert main(["calibrate"]) == 0
    assert capsys.readouterr().out == f"{path}: none yet\n"
    decoder_key = "Some CPU | torch 2 x2 | cpu | llama h64 l2 v49152 torch.float32 | rows 16"
    write_cache({decoder_key: decoder_entry(), calibrate.precision_key(64, 128, 128): precision_entry(
        0.3, 0.1, "bf16-mixed")})
    assert main(["calibrate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: 2 entries"
    assert lines[1] == (f"{decoder_key}: modules: lean 20.0 ms, modules 10.0 ms per step; flags [amx_bf16 "
                        "avx512f]; load 0.20 per core; measured 2026-11-20T10:00:00+00:00")
    assert lines[2].startswith("precision | ") and lines[2].endswith(
        ": bf16-mixed: fp32 0.3000 s, bf16 0.1000 s (3.00x); flags [amx_bf16 avx512f]; load 0.20 per core; "
        "measured 2026-11-20T10:00:00+00:00")
    # --precision: the default model's shapes, measured now whatever the cache holds
    write_cache({calibrate.precision_key(576, 1536, 1024): precision_entry(0.3, 0.1, "bf16-mixed")})
    monkeypatch.setattr(calibrate, "precision_seconds", lambda h, i, t: (h, i, t) == (576, 1536, 1024) and {
        "fp32": 1.0, "bf16": 2.0})
    assert main(["calibrate", "--precision"]) == 0
    assert capsys.readouterr().out.startswith(
        "model.precision=auto -> fp32: a SwiGLU MLP forward+backward (hidden 576, intermediate 1536, "
        "1024 tokens) took fp32 1.0000 s")
    assert calibrate._read()[calibrate.precision_key(576, 1536, 1024)]["choice"] == "fp32"
    assert main(["calibrate", "--reset"]) == 0
    assert capsys.readouterr().out == f"deleted {path} (1 entry)\n"
    assert not path.exists()
    assert main(["calibrate", "--reset"]) == 0
    assert capsys.readouterr().out == f"no calibration cache at {path}: nothing to delete\n"


@pytest.mark.parametrize("argv", [["calibrate", "--reset", "--precision"], ["calibrate", "--now"],
                                  ["calibrate", "x"]])
def test_the_calibrate_command_refuses_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "reasonrl" in capsys.readouterr().err
