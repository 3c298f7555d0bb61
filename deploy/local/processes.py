"""Detached server processes tracked by pid files in a state directory.

A service ``name`` owns ``<state_dir>/<name>.pid`` (the pid, nothing else),
``<state_dir>/<name>.json`` (pid, url and argv, so ``status`` can report the
URL a service was really started with) and ``<state_dir>/<name>.log`` (its
stdout and stderr, truncated at each start). Processes run in their own
session so they outlive the command that started them and ignore its Ctrl-C.

A pid is trusted only while that process is alive, not a zombie, and its
command line is one the caller expects (so a recycled pid is never
signalled); otherwise the pid file is stale and is removed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from scorers.errors import ServiceError

LOCALHOST = "127.0.0.1"
LOG_TAIL_LINES = 20
LOG_MODE = 0o600  # process logs: owner only
STOP_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0
PROBE_INTERVAL_S = 0.1

# Popen objects of processes started by this Python process, so stopping one reaps it (no zombie, no ResourceWarning).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class StackError(ServiceError, RuntimeError):
    """A local-stack service could not be started, found or stopped; the message says why and what to do."""


@dataclass(frozen=True)
class Tracked:
    """What the state directory records about a running service."""

    pid: int
    url: str


def pid_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.pid"


def record_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.json"


def log_path(state_dir: Path, name: str) -> Path:
    return state_dir / f"{name}.log"


def open_log(path: Path, append: bool = False) -> BinaryIO:
    """A process log for writing, readable by its owner only (0600, also when it already existed): services log
    conversation text and settings, which other users of the machine must not read."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, LOG_MODE)
    os.fchmod(fd, LOG_MODE)
    return os.fdopen(fd, "ab" if append else "wb")


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (or a note that it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"({path} is empty)"


def port_in_use(port: int, host: str = LOCALHOST) -> bool:
    """True if a server could not bind ``host:port`` right now (SO_REUSEADDR, like the servers themselves)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def tcp_accepts(port: int, host: str = LOCALHOST, timeout_s: float = 1.0) -> bool:
    """True if a TCP connection to ``host:port`` succeeds right now."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _reap(pid: int) -> None:
    """Collect the exit status of a child of this process that has exited (so it is not a zombie)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        del _CHILDREN[pid]


def runs(argv: Sequence[str], executable: str) -> bool:
    """True if ``argv`` is a run of ``executable``: a basename, optionally followed by the arguments that must come
    next (``"java -Dconvowatch.service=kafka"``: any java is not enough)."""
    wanted = executable.split()
    return len(argv) >= len(wanted) and os.path.basename(argv[0]) == wanted[0] and list(argv[1 : len(wanted)]) == wanted[1:]


def _exists(pid: int) -> bool:
    """True if ``pid`` is a process that has not exited (a zombie has)."""
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists but belongs to another user
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no procfs (not Linux): existence is all we can check
    except OSError:
        return False
    return not stat[stat.rfind(")") + 2 :].startswith("Z")


def process_alive(pid: int, executables: Sequence[str]) -> bool:
    """True if ``pid`` runs and (where /proc exists) is not a zombie and runs one of ``executables`` (see `runs`)."""
    if not _exists(pid):
        return False
    if not Path("/proc/self").exists():
        return True
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(runs(argv, executable) for executable in executables)


def read_tracked(state_dir: Path, name: str, executables: Sequence[str]) -> Tracked | None:
    """The running service ``name`` recorded in ``state_dir``, or None; stale pid files are removed."""
    path = pid_path(state_dir, name)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        pid = int(text)
    except ValueError:
        raise StackError(f"{path} does not hold a pid (it reads {text[:40]!r}); remove it and retry") from None
    if not process_alive(pid, executables):
        forget(state_dir, name)
        return None
    url = ""
    try:
        url = str(json.loads(record_path(state_dir, name).read_text()).get("url", ""))
    except (OSError, ValueError, AttributeError):
        pass  # the pid file alone is enough to manage the process; the caller knows the configured URL
    return Tracked(pid, url)


def forget(state_dir: Path, name: str) -> None:
    """Remove the pid file and record of ``name``."""
    pid_path(state_dir, name).unlink(missing_ok=True)
    record_path(state_dir, name).unlink(missing_ok=True)


def launch(
    state_dir: Path, name: str, argv: Sequence[str], url: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached (own session), output to ``<name>.log``, and record its pid and URL."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # logs, pids and the services' data: owner only
    cwd.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open_log(log_path(state_dir, name)) as out:
        try:
            process = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            raise StackError(f"cannot start {name} ({argv[0]}): {e}") from e
    _CHILDREN[process.pid] = process
    _write_atomic(pid_path(state_dir, name), f"{process.pid}\n")
    _write_atomic(record_path(state_dir, name), json.dumps({"pid": process.pid, "url": url, "argv": list(argv)}, indent=2) + "\n")
    return process


def wait_ready(
    state_dir: Path,
    name: str,
    process: subprocess.Popen[bytes],
    ready: Callable[[], bool],
    timeout_s: float,
) -> None:
    """Return once ``ready()`` is true; if the process exits or the timeout passes, stop it and raise with its log tail."""
    log = log_path(state_dir, name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            forget(state_dir, name)
            _CHILDREN.pop(process.pid, None)
            raise StackError(
                f"{name} exited with code {process.returncode} while starting; last {LOG_TAIL_LINES} lines of {log}:\n"
                f"{log_tail(log)}"
            )
        if ready():
            return
        time.sleep(PROBE_INTERVAL_S)
    terminate(process.pid)
    forget(state_dir, name)
    raise StackError(f"{name} was not ready after {timeout_s:.0f} s; last {LOG_TAIL_LINES} lines of {log}:\n{log_tail(log)}")


def terminate(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM ``pid`` (a process known to be ours), wait up to ``timeout_s`` for it to exit, then SIGKILL; raise
    StackError if it still runs."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, KILL_TIMEOUT_S)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            _reap(pid)
            return
        if _wait_gone(pid, wait_s):
            return
    raise StackError(f"process {pid} survived SIGKILL for {KILL_TIMEOUT_S:.0f} s")


def _wait_gone(pid: int, timeout_s: float) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        try:
            child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        _CHILDREN.pop(pid, None)
        return True
    # The pid was ours when signalled: wait for it to exit, not to stop looking like ours (an exiting process's
    # command line is already empty while it still holds its files and ports).
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _exists(pid):
            return True
        time.sleep(PROBE_INTERVAL_S)
    return False


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
