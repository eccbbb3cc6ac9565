"""What kind of machine this is, as far as floating-point rounding goes (`host_kind`).

Two machines give bitwise equal float32 results for the same program only when the same kernels
run: torch picks its CPU kernels by the instruction sets it finds (`torch.backends.cpu.
get_cpu_capability()`), MKL and oneDNN pick theirs by the CPU's vendor, family, model and
stepping, its flags and its cache sizes (blocking), and their own versions. Two machines that
`lscpu` names alike ("AMD EPYC") can differ in every one of these: a Zen 3 EPYC without
AVX-512 and a Zen 4 EPYC with it round the same matrix product differently. A record that claims
"bitwise" (the golden runs, a run's saved choices) is only comparable on a machine whose
`host_kind` is equal.

The environment variables that steer those libraries' kernel choice are part of the kind too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import subprocess
from pathlib import Path

# environment variables that change which kernels torch, MKL or oneDNN run (and so the rounding)
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE",
              "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OPENBLAS_CORETYPE")
# the CPU flags that decide the choices: the x86 vector and matrix units (AMX, AVX512-BF16,
# AVX-512, AVX2, FMA: bf16's speed and MKL's kernels) and ARM's (bf16, SVE, Advanced SIMD)
CHOICE_FLAGS = ("amx_bf16", "amx_tile", "asimd", "avx2", "avx512_bf16", "avx512f", "bf16", "fma", "sve")
# macOS has no /proc/cpuinfo: `sysctl hw.optional` names the same features
SYSCTL_FLAGS = {"hw.optional.arm.FEAT_BF16": "bf16", "hw.optional.AdvSIMD": "asimd",
                "hw.optional.neon": "asimd", "hw.optional.avx2_0": "avx2", "hw.optional.avx512f": "avx512f",
                "hw.optional.fma": "fma"}
CPUINFO_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
                  "model name": "model_name", "CPU implementer": "vendor", "CPU architecture": "family",
                  "CPU variant": "model", "CPU part": "model_name", "CPU revision": "stepping"}


def cpu_model() -> str:
    """The CPU's model name as `lscpu` prints it ("AMD EPYC", "Intel(R) Xeon(R) ...")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def flags_in_cpuinfo(text: str) -> list[str]:
    """CHOICE_FLAGS present on the first processor's `flags` (x86) or `Features` (ARM) line of
    a /proc/cpuinfo text, sorted."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return sorted(set(value.split()) & set(CHOICE_FLAGS))
    return []


def flags_in_sysctl(text: str) -> list[str]:
    """CHOICE_FLAGS that macOS's `sysctl hw.optional` output ("hw.optional.avx2_0: 1") sets to 1."""
    found = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if value.strip() == "1" and name.strip() in SYSCTL_FLAGS:
            found.add(SYSCTL_FLAGS[name.strip()])
    return sorted(found)


def cpu_flags() -> list[str]:
    """The CPU flags that decide the measured choices (CHOICE_FLAGS present here), sorted: from
    /proc/cpuinfo on Linux, `sysctl hw.optional` on macOS; [] where neither says. Read once
    per process."""
    return list(_cpu_flags())


@functools.cache
def _cpu_flags() -> tuple[str, ...]:
    try:
        return tuple(flags_in_cpuinfo(Path("/proc/cpuinfo").read_text()))
    except OSError:
        pass
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["sysctl", "hw.optional"], capture_output=True, text=True, timeout=5).stdout
            return tuple(flags_in_sysctl(out))
    return ()


def load_per_core() -> float | None:
    """The 1-minute load average per core (os.getloadavg over os.cpu_count); None where the
    system has no load average."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (OSError, AttributeError):
        return None


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor's identity in a /proc/cpuinfo text: vendor, family, model, stepping,
    model name (x86; ARM's implementer, architecture, variant, part and revision map onto the
    same names), and `flags`: a digest of its whole flags (x86) or features (ARM) line, sorted
    (a flag that only some kernels use still changes which run)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep:
            if found:
                break  # the end of the first processor's block
            continue
        if key in CPUINFO_FIELDS and CPUINFO_FIELDS[key] not in found:
            found[CPUINFO_FIELDS[key]] = value.strip()
        elif key.lower() in ("flags", "features") and "flags" not in found:
            found["flags"] = hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:12]
    return found


def cache_sizes() -> str:
    """The first CPU's caches as "L1d 32K L1i 32K L2 1024K L3 32768K" (Linux sysfs); "" elsewhere."""
    parts = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        parts.append(f"L{level}{suffix} {size}")
    return " ".join(parts)


def blas_versions() -> str:
    """The BLAS and oneDNN builds torch computes with, from `torch.__config__.show()`."""
    import torch

    lines = []
    for line in torch.__config__.show().splitlines():
        text = line.strip(" -")
        if text.startswith(("Intel(R) oneAPI Math Kernel Library", "Intel(R) MKL-DNN", "OpenBLAS")):
            lines.append(text.split(" for ")[0].split(" (Git Hash")[0])
    return "; ".join(lines) or "unknown"


@functools.cache
def _host_kind() -> tuple[tuple[str, str], ...]:
    import torch

    try:
        kind = cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    except OSError:
        kind = {"model_name": platform.processor() or "unknown"}
    kind.update(arch=platform.machine(), caches=cache_sizes(), torch=torch.__version__,
                capability=torch.backends.cpu.get_cpu_capability(), blas=blas_versions())
    kind.update({name: os.environ[name] for name in KERNEL_ENV if name in os.environ})
    return tuple(sorted(kind.items()))


def host_kind() -> dict[str, str]:
    """This machine's kind for rounding (module docstring): the CPU's vendor, family, model,
    stepping, model name and a digest of its flags, its cache sizes, the architecture, torch's
    version and CPU capability, the BLAS / oneDNN versions and the kernel-steering environment
    variables that are set. Read once per process."""
    return dict(_host_kind())


def host_id(kind: dict[str, str] | None = None) -> str:
    """A short digest of `host_kind()` (or of `kind`): equal ids, equal kinds."""
    kind = host_kind() if kind is None else kind
    text = "\n".join(f"{k}={v}" for k, v in sorted(kind.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def describe_host(kind: dict[str, str] | None = None) -> str:
    """One line: "AMD EPYC (AuthenticAMD 25/17/1, flags 1a2b..., L1d 32K ..., torch 2.13.0+cpu AVX512)"."""
    k = host_kind() if kind is None else kind
    ident = "/".join(k.get(f, "?") for f in ("family", "model", "stepping"))
    return (f"{k.get('model_name', '?')} ({k.get('vendor', '?')} {ident}, flags {k.get('flags', '?')}, "
            f"{k.get('caches') or 'caches unknown'}, torch {k.get('torch', '?')} {k.get('capability', '?')}, "
            f"{k.get('blas', '?')})")
