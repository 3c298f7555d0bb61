"""Start and stop real local servers for tests.

Two kinds:
- `start_process` runs a real server binary (llama.cpp's OpenAI-compatible
  server here; Kafka, Prometheus, ... can be added the same way) on a free
  127.0.0.1 port, waits for a readiness probe with a bounded timeout, captures
  its output in a log file, and stops it (terminate, then kill) when done.
- `ScriptedServer` is a real HTTP server on 127.0.0.1 whose replies the test
  writes: for faults a real server cannot be made to produce on demand
  (rate limits, outages, slow replies, foreign error bodies). It can forward
  requests to a real upstream, and it records every request and the peak
  number of requests in flight.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from scorers.judges.local import default_model_path
from stream.judge_server import stop_process

LOCALHOST = "127.0.0.1"
STOP_TIMEOUT_S = 10.0
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 2.0
POLL_INTERVAL_S = 0.05  # how fast a ScriptedServer notices shutdown
LOG_TAIL_LINES = 40
LLAMA_READY_TIMEOUT_S = 120.0
CACHE_ENV = "CONVOWATCH_TEST_CACHE"


class ServerStartError(RuntimeError):
    """A server did not become ready; the message carries the tail of its log."""


def cache_dir() -> Path:
    """Where tests keep large derived files between runs (``$CONVOWATCH_TEST_CACHE`` or ~/.cache/convowatch-test)."""
    base = os.environ.get(CACHE_ENV)
    path = Path(base) if base else Path.home() / ".cache" / "convowatch-test"
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


def gemma_gguf_path(cache_root: Path | None = None) -> Path:
    """The packaged Gemma 3 270M Q4_K_M GGUF, materialised once into the test cache (the library's own way)."""
    return default_model_path(cache_root or cache_dir())


@dataclass
class RunningServer:
    """A server process started by a test, its base URL and its captured log."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    started_in_s: float = 0.0

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def assert_alive(self) -> None:
        """Fail with the log tail if the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise ServerStartError(f"{self.name} exited with code {code}; log tail:\n{self.log_tail()}")

    def stop(self) -> None:
        """Terminate the process (kill it if it ignores that) and wait for it."""
        stop_process(self.process, STOP_TIMEOUT_S)


def start_process(
    name: str,
    argv: Sequence[str],
    url: str,
    ready: Callable[[], bool],
    log_path: Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> RunningServer:
    """Start ``argv`` with output to ``log_path``; return once ``ready()`` is true, or stop it and raise."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else {**os.environ, **env},
        )
    server = RunningServer(name=name, process=process, url=url, log_path=log_path)
    deadline = started + timeout_s
    while time.perf_counter() < deadline:
        if process.poll() is not None:
            raise ServerStartError(f"{name} exited with code {process.returncode} while starting; log tail:\n{server.log_tail()}")
        if ready():
            server.started_in_s = time.perf_counter() - started
            return server
        time.sleep(PROBE_INTERVAL_S)
    server.stop()
    raise ServerStartError(f"{name} not ready after {timeout_s:.0f}s; log tail:\n{server.log_tail()}")


def http_ok(url: str, headers: Mapping[str, str] | None = None) -> bool:
    """True if GET ``url`` answers 2xx right now."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class LlamaServer(RunningServer):
    """A running llama_cpp.server: ``api_key`` it requires (None = any) and the ``model`` name it serves."""

    api_key: str | None = None
    model: str = ""


def start_llama_server(
    model_path: Path,
    log_dir: Path,
    *,
    api_key: str | None = None,
    model_alias: str | None = None,
    chat_format: str | None = None,
    n_ctx: int = 2048,
    timeout_s: float = LLAMA_READY_TIMEOUT_S,
) -> LlamaServer:
    """llama-cpp-python's OpenAI-compatible server on a free port; ``url`` is the API root (``.../v1``)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--n_ctx",
        str(n_ctx),
        "--host",
        LOCALHOST,
        "--port",
        str(port),
    ]
    if chat_format:
        argv += ["--chat_format", chat_format]
    if model_alias:
        argv += ["--model_alias", model_alias]
    if api_key:
        argv += ["--api_key", api_key]
    url = f"http://{LOCALHOST}:{port}/v1"
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    server = start_process(
        "llama_cpp.server",
        argv,
        url,
        lambda: http_ok(f"{url}/models", auth),
        log_dir / f"llama-server-{port}.log",
        timeout_s,
    )
    fields = {f.name: getattr(server, f.name) for f in dataclasses.fields(RunningServer)}
    return LlamaServer(**fields, api_key=api_key, model=model_alias or str(model_path))


# ---------------------------------------------------------------- scripted HTTP server


@dataclass(frozen=True)
class Received:
    """One request as the scripted server saw it."""

    method: str
    path: str
    headers: Mapping[str, str]  # names lower-cased
    body: bytes


@dataclass(frozen=True)
class Reply:
    """What the scripted server sends back, after ``delay_s`` seconds."""

    status: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    delay_s: float = 0.0


Responder = Callable[[int, Received], Reply]
"""Called with the request's 0-based arrival index and the request; returns the reply."""

# Per-connection headers, and Accept-Encoding so the upstream never compresses what we relay verbatim.
_NOT_FORWARDED = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "accept-encoding"}


def forward(upstream: str, request: Received, timeout_s: float = 300.0) -> Reply:
    """Send ``request`` to ``upstream`` (scheme://host:port) and return its real reply."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
    outgoing = urllib.request.Request(
        upstream.rstrip("/") + request.path, data=request.body or None, headers=headers, method=request.method
    )
    try:
        with urllib.request.urlopen(outgoing, timeout=timeout_s) as response:
            return Reply(response.status, response.read(), {"Content-Type": response.headers.get("Content-Type", "")})
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read(), {"Content-Type": e.headers.get("Content-Type", "")})


class ScriptedServer:
    """A real HTTP server on 127.0.0.1 answering every request with ``responder``; use as a context manager.

    ``received`` lists requests in arrival order, ``replies`` what was sent for
    each, ``max_in_flight`` the peak number of requests being handled at once.
    """

    def __init__(self, responder: Responder) -> None:
        self._responder = responder
        self._lock = threading.Lock()
        self.received: list[Received] = []
        self.replies: dict[int, Reply] = {}  # by arrival index, once sent
        self.in_flight = 0
        self.max_in_flight = 0
        self._httpd = ThreadingHTTPServer((LOCALHOST, 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(POLL_INTERVAL_S,), name="scripted-server", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=STOP_TIMEOUT_S)

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        headers = {k.lower(): v for k, v in handler.headers.items()}
        request = Received(handler.command, handler.path, headers, handler.rfile.read(length))
        with self._lock:
            index = len(self.received)
            self.received.append(request)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            reply = self._responder(index, request)
            if reply.delay_s:
                time.sleep(reply.delay_s)
            handler.send_response(reply.status)
            for k, v in reply.headers.items():
                handler.send_header(k, v)
            handler.send_header("Content-Length", str(len(reply.body)))
            handler.end_headers()
            handler.wfile.write(reply.body)
            with self._lock:
                self.replies[index] = reply
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (e.g. its timeout fired): that is the fault under test
        finally:
            with self._lock:
                self.in_flight -= 1

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: with Nagle on, the second waits for the client's delayed ACK
            # (about 40 ms a reply on Linux), which no real server (uvicorn, llama.cpp) makes its clients wait.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                server._serve(self)

            do_POST = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
