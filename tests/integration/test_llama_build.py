"""The llama.cpp build is portable: deploy/llama_build.py turns on only what the host has, never AMX.

The first tests feed it the real CPU flag lines of the three kinds of host
machines of this kind run on (Intel with AVX-512 + AMX, AMD EPYC Zen 3 with
AVX2 only, AMD EPYC Zen 4 with AVX-512). The last ones check the llama.cpp
that `make install` compiled on *this* host: every instruction set extension
it reports using is one the host's CPU has, and the real server answers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.llama_build import cmake_args, cmake_options, host_cpu_flags, main
from tests.servers import LlamaServer

REPO = Path(__file__).resolve().parents[2]

# The "flags" lines (ISA part) of /proc/cpuinfo on the three kinds of host.
AMD_AVX2_ONLY = (
    "fpu sse sse2 ssse3 pni fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand "
    "hypervisor lahf_lm abm sse4a bmi1 avx2 smep bmi2 erms rdseed adx sha_ni clwb vaes vpclmulqdq"
)
AMD_ZEN4 = (
    "fpu sse sse2 ssse3 pni fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c bmi1 avx2 bmi2 avx512f "
    "avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 gfni avx512_vnni "
    "avx512_bitalg avx512_vpopcntdq"
)
INTEL_AMX = (
    "fpu sse sse2 ssse3 pni fma cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c bmi1 avx2 bmi2 avx512f "
    "avx512dq avx512cd avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vnni amx_bf16 amx_tile amx_int8"
)
ISA_OPTIONS_ON = re.compile(r"-D(GGML_\w+)=ON")


def _flags(line: str) -> frozenset[str]:
    return frozenset(line.split())


def _on(line: str) -> set[str]:
    return {name for name, on in cmake_options(_flags(line)).items() if on}


def test_an_avx2_only_host_gets_no_avx512() -> None:
    assert _on(AMD_AVX2_ONLY) == {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_FMA", "GGML_F16C", "GGML_BMI2"}


def test_an_intel_host_gets_avx512_but_never_amx_nor_native() -> None:
    on = _on(INTEL_AMX)
    assert {"GGML_AVX512", "GGML_AVX512_VNNI", "GGML_AVX512_BF16", "GGML_AVX_VNNI"} <= on
    assert not {"GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_NATIVE"} & on
    assert "-DGGML_AMX_INT8=OFF" in cmake_args(_flags(INTEL_AMX))
    assert "-DGGML_NATIVE=OFF" in cmake_args(_flags(INTEL_AMX))


def test_the_multimodal_library_is_never_built() -> None:
    for host in (AMD_AVX2_ONLY, INTEL_AMX):
        assert "-DLLAVA_BUILD=OFF" in cmake_args(_flags(host))


def test_a_zen4_host_gets_avx512_without_avx_vnni() -> None:
    on = _on(AMD_ZEN4)
    assert {"GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"} <= on
    assert "GGML_AVX_VNNI" not in on


def test_avx512_needs_all_five_subsets() -> None:
    partial = AMD_ZEN4.replace("avx512bw ", "")
    assert "GGML_AVX512" not in _on(partial)


def test_flags_are_read_from_a_cpuinfo_file(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {AMD_AVX2_ONLY}\n\nprocessor\t: 1\n")
    assert host_cpu_flags(cpuinfo) == _flags(AMD_AVX2_ONLY)


def test_a_host_without_avx2_is_refused_with_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx\n")
    assert main(["--cpuinfo", str(cpuinfo)]) == 2
    assert "no AVX2" in capsys.readouterr().err


# ---------------------------------------------------------------- the build on this host

# llama.cpp's system-info names -> the /proc/cpuinfo flag each needs (other names, e.g. OPENMP, are not ISA).
SYSTEM_INFO_ISA = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX_VNNI": "avx_vnni",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


def _compiled_features() -> set[str]:
    """The CPU features the installed llama.cpp reports as compiled in (``NAME = 1``)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    return {name for name, value in re.findall(r"(\w+) = (\d+)", info) if value == "1"}


@pytest.mark.slow
def test_the_compiled_llama_cpp_uses_only_what_this_host_has() -> None:
    host = host_cpu_flags()
    compiled = _compiled_features()
    assert "AVX2" in compiled, compiled  # it is a real, optimised build
    missing = {name for name in compiled & SYSTEM_INFO_ISA.keys() if SYSTEM_INFO_ISA[name] not in host}
    assert not missing, f"llama.cpp was compiled with {sorted(missing)}, which this CPU lacks"
    assert "AMX_INT8" not in compiled
    print("llama.cpp CPU variant on this host:", ", ".join(sorted(compiled & SYSTEM_INFO_ISA.keys())))


@pytest.mark.slow
def test_the_build_matches_what_the_script_chooses_for_this_host() -> None:
    """The venv's llama.cpp is the build the Makefile asks for, not a cached one for another CPU."""
    wanted = {m.removeprefix("GGML_") for m in ISA_OPTIONS_ON.findall(cmake_args(host_cpu_flags()))}
    compiled = _compiled_features() & SYSTEM_INFO_ISA.keys()
    for name in ("AVX512", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI", "AVX2", "FMA", "F16C"):
        assert (name in compiled) == (name in wanted), (name, sorted(compiled), sorted(wanted))


@pytest.mark.slow
def test_the_server_built_here_answers_a_chat_request(llama_server: LlamaServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=llama_server.url, api_key=llama_server.api_key)
    reply = client.chat.completions.create(
        model=llama_server.model,
        messages=[{"role": "user", "content": "Count: 1, 2, 3,"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    choice = reply.choices[0]
    assert reply.usage.completion_tokens >= 1
    assert choice.logprobs is not None and choice.logprobs.content
    assert len(choice.logprobs.content[0].top_logprobs) == 5


def test_the_script_runs_as_the_makefile_calls_it() -> None:
    done = subprocess.run([sys.executable, str(REPO / "deploy" / "llama_build.py")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "-DGGML_NATIVE=OFF" in done.stdout and "-DGGML_AMX_TILE=OFF" in done.stdout
