"""CMake flags for compiling llama.cpp (llama-cpp-python) for *this* host's CPU.

llama-cpp-python has no wheel on PyPI, so it is compiled at install time. Two
builds are known to break on machines of this kind:

- ggml's default native build (``-march=native``) turns on AMX on Intel hosts
  that have it, and crashes in the AMX kernels;
- a build forced to AVX-512 dies with SIGILL on AMD hosts without AVX-512.

So the build is never native and never hard-coded: this script reads the CPU
flags the kernel reports (``/proc/cpuinfo``) and turns on each ggml ISA option
only where the host has every instruction set extension it needs. AMX is always
off. Usage: ``CMAKE_ARGS="$(python3 deploy/llama_build.py)" pip install llama-cpp-python``;
``--explain`` prints the chosen variant in words.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# ggml option -> the /proc/cpuinfo flags that must all be present for it.
# (GGML_AVX512 compiles with -mavx512f/cd/vl/dq/bw, so it needs all five.)
ISA_OPTIONS: dict[str, tuple[str, ...]] = {
    "GGML_SSE42": ("sse4_2",),
    "GGML_AVX": ("avx",),
    "GGML_AVX2": ("avx2",),
    "GGML_FMA": ("fma",),
    "GGML_F16C": ("f16c",),
    "GGML_BMI2": ("bmi2",),
    "GGML_AVX_VNNI": ("avx_vnni",),
    "GGML_AVX512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "GGML_AVX512_VBMI": ("avx512f", "avx512vbmi"),
    "GGML_AVX512_VNNI": ("avx512f", "avx512_vnni"),
    "GGML_AVX512_BF16": ("avx512f", "avx512_bf16"),
}
# Always off: AMX crashes here; the native build would pick it (and everything else) by itself.
ALWAYS_OFF = ("GGML_NATIVE", "GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# Not built: llama-cpp-python's multimodal library (mtmd, ~50 of the ~320 files compiled). The judges read text only,
# and the package loads that library only for an image chat handler.
NOT_BUILT = ("LLAVA_BUILD",)


def host_cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The CPU feature flags of the first processor in ``cpuinfo`` (empty if the file says none)."""
    for line in cpuinfo.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cmake_options(flags: frozenset[str]) -> dict[str, bool]:
    """Each ggml CPU option, on exactly where the host has every flag it needs."""
    options = {name: False for name in ALWAYS_OFF}
    options.update({name: all(f in flags for f in needed) for name, needed in ISA_OPTIONS.items()})
    return options


def cmake_args(flags: frozenset[str]) -> str:
    """The ``CMAKE_ARGS`` string for ``flags``."""
    options = {**cmake_options(flags), **dict.fromkeys(NOT_BUILT, False)}
    return " ".join(f"-D{name}={'ON' if on else 'OFF'}" for name, on in options.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpuinfo", type=Path, default=CPUINFO, help="file to read the CPU flags from")
    parser.add_argument("--explain", action="store_true", help="print the chosen ISA variant in words")
    args = parser.parse_args(argv)
    if not args.cpuinfo.exists():
        print(f"llama_build: {args.cpuinfo} not found; this build script supports Linux x86-64 only", file=sys.stderr)
        return 2
    flags = host_cpu_flags(args.cpuinfo)
    if "avx2" not in flags:
        print("llama_build: this host has no AVX2; the judge build needs an x86-64 CPU with AVX2", file=sys.stderr)
        return 2
    if args.explain:
        on = [name.removeprefix("GGML_") for name, enabled in cmake_options(flags).items() if enabled]
        print("llama.cpp CPU variant for this host: " + ", ".join(on) + " (AMX off, not native)")
    else:
        print(cmake_args(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
