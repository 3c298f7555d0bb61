"""The embedded local stack: Apache Kafka, Prometheus and Alertmanager as plain processes on 127.0.0.1.

No Docker. Each service writes its configuration under ``<state_dir>/<name>/``,
runs detached with its output in ``<state_dir>/<name>.log`` and its pid in
``<state_dir>/<name>.pid``, and is reported started only once it answers
(Kafka: a metadata request lists topics; Prometheus and Alertmanager:
``GET /-/ready`` is 200). Starting a running service is a no-op.

The broker is Apache Kafka in KRaft mode, one combined broker and controller
(deploy/local/kafka.py): its log directory ``<state_dir>/kafka/data`` is
formatted on the first start and kept across restarts. ``start_kafka_cluster``
starts several such nodes as one cluster (the fault suite's three brokers).

Command line (from the repository root)::

    python -m deploy.local.stack start|stop|status [--state-dir DIR] [--only kafka,prometheus] ...
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from deploy.local import kafka
from deploy.local.processes import (
    LOCALHOST,
    StackError,
    forget,
    launch,
    log_path,
    port_in_use,
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
    "start_kafka_cluster",
    "start_prometheus",
    "status",
    "stop",
    "stop_kafka_cluster",
]

COMPONENTS = ("kafka", "prometheus", "alertmanager")
START_ORDER = ("kafka", "alertmanager", "prometheus")  # Alertmanager first: Prometheus sends alerts to it
DEFAULT_STATE_DIR = Path(".convowatch/stack")
SCRAPE_JOB = "convowatch"
DEFAULT_SCRAPE_TARGETS = ("127.0.0.1:9464", "127.0.0.1:9465")  # metrics.port (stream/settings.py) and the next one
KAFKA_NOTE = "Apache Kafka (KRaft): topics, records and committed offsets survive a restart (kafka/data)"

APT_INSTALL = "apt-get install -y --no-install-recommends prometheus prometheus-alertmanager"

# Executables per service (basenames, and the arguments that must follow): a pid running none of these is not ours.
EXECUTABLES = {
    "kafka": (f"java {kafka.JAVA_MARK}",),
    "prometheus": ("prometheus",),
    "alertmanager": ("alertmanager", "prometheus-alertmanager"),  # Debian names it prometheus-alertmanager
}
READY_TIMEOUT_S = {"kafka": 60.0, "prometheus": 60.0, "alertmanager": 30.0}
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
    kafka_port: int = 9092
    # The broker's KRaft controller listener (local to the stack): None = the one of the last start in this state
    # directory, else a free port.
    kafka_controller_port: int | None = None
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    scrape_targets: list[str] = field(default_factory=lambda: list(DEFAULT_SCRAPE_TARGETS))
    scrape_interval_s: float = 5
    rule_files: list[Path] = field(default_factory=list)
    alertmanager_config: Path | None = None  # None: DEFAULT_ALERTMANAGER_CONFIG (one no-op receiver)
    evaluation_interval_s: float = 5

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).resolve()
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
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

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


def start_kafka(cfg: StackConfig, overrides: Mapping[str, str] | None = None) -> Service:
    """Start Apache Kafka (one node) on 127.0.0.1:``cfg.kafka_port``; the Service url is the bootstrap server.

    ``overrides``: broker properties over the stack's (deploy/local/kafka.py), e.g. a test's short log-cleaner
    intervals."""
    running = _already_running(cfg, "kafka")
    if running:
        return running
    home = cfg.state_dir / "kafka"
    controller_port = cfg.kafka_controller_port or _last_controller_port(home) or _free_port()
    node = kafka.KafkaNode(node_id=1, port=cfg.kafka_port, controller_port=controller_port, home=home)
    return start_kafka_node(cfg.state_dir, "kafka", node, [node], overrides)


def start_kafka_cluster(
    state_dir: Path, nodes: Sequence[kafka.KafkaNode], overrides: Mapping[str, str] | None = None
) -> dict[str, Service]:
    """Start ``nodes`` as one KRaft cluster (services ``kafka-<node id>``, homes as the nodes say); all or none.

    Every node is launched before any is waited for: a controller quorum elects its leader only once a majority
    of the voters runs."""
    state_dir = Path(state_dir).resolve()
    cluster_id = next(filter(None, map(kafka.read_cluster_id, nodes)), None) or kafka.new_cluster_id()
    launched: dict[str, tuple[kafka.KafkaNode, subprocess.Popen[bytes] | None]] = {}
    try:
        for node in nodes:
            launched[f"kafka-{node.node_id}"] = (
                node,
                _launch_kafka_node(state_dir, f"kafka-{node.node_id}", node, nodes, overrides, cluster_id),
            )
        services = {}
        for name, (node, process) in launched.items():
            services[name] = _wait_kafka_node(state_dir, name, node, process)
        return services
    except BaseException:
        for name, (_, process) in launched.items():
            if process is not None:
                terminate(process.pid)
            forget(state_dir, name)
        raise


def start_kafka_node(
    state_dir: Path,
    name: str,
    node: kafka.KafkaNode,
    cluster: Sequence[kafka.KafkaNode],
    overrides: Mapping[str, str] | None = None,
) -> Service:
    """Start one node of ``cluster`` as service ``name`` (formatting its storage first if it is new)."""
    cluster_id = next(filter(None, map(kafka.read_cluster_id, cluster)), None) or kafka.new_cluster_id()
    process = _launch_kafka_node(state_dir, name, node, cluster, overrides, cluster_id)
    return _wait_kafka_node(state_dir, name, node, process)


def _launch_kafka_node(
    state_dir: Path,
    name: str,
    node: kafka.KafkaNode,
    cluster: Sequence[kafka.KafkaNode],
    overrides: Mapping[str, str] | None,
    cluster_id: str,
) -> subprocess.Popen[bytes] | None:
    """Launch the node (None if it already runs); it is not ready until `_wait_kafka_node` says so."""
    if read_tracked(state_dir, name, EXECUTABLES["kafka"]) is not None:
        return None
    _require_free_port(node.port, "broker")
    _require_free_port(node.controller_port, "Kafka controller")
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # logs, pids and the broker's data: owner only
    config = kafka.write_config(node, cluster, overrides)
    kafka.format_storage(node, config, cluster_id)
    return launch(state_dir, name, kafka.broker_argv(node, config), node.bootstrap, cwd=node.home)


def _wait_kafka_node(state_dir: Path, name: str, node: kafka.KafkaNode, process: subprocess.Popen[bytes] | None) -> Service:
    if process is None:
        tracked = read_tracked(state_dir, name, EXECUTABLES["kafka"])
        pid = tracked.pid if tracked else -1
        return Service(name, pid, node.bootstrap, log_path(state_dir, name), already_running=True)
    wait_ready(state_dir, name, process, lambda: _kafka_ready(node.port), READY_TIMEOUT_S["kafka"])
    return Service(name, process.pid, node.bootstrap, log_path(state_dir, name))


def _last_controller_port(home: Path) -> int | None:
    """The controller port the broker in ``home`` was last started with (its written server.properties)."""
    try:
        text = (home / "server.properties").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "listeners":
            for listener in value.split(","):
                if listener.startswith("CONTROLLER://"):
                    return int(listener.rpartition(":")[2])
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


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
        result[name] = ServiceStatus(
            name=name,
            running=tracked is not None,
            pid=tracked.pid if tracked else None,
            url=(tracked.url if tracked and tracked.url else _configured_url(cfg, name)),
            log=log_path(cfg.state_dir, name),
            note=KAFKA_NOTE if name == "kafka" else "",
        )
    return result


def stop_kafka_cluster(state_dir: Path, nodes: Sequence[kafka.KafkaNode]) -> None:
    """Stop the nodes ``start_kafka_cluster`` started (SIGTERM, then SIGKILL), as ``stop`` does."""
    for node in nodes:
        name = f"kafka-{node.node_id}"
        tracked = read_tracked(Path(state_dir).resolve(), name, EXECUTABLES["kafka"])
        if tracked is not None:
            terminate(tracked.pid)
        forget(Path(state_dir).resolve(), name)


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
) -> Service:
    process = launch(cfg.state_dir, name, argv, url, cwd=cfg.state_dir / name)
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
        prog="stack", description="Start, stop or inspect the embedded local stack (Apache Kafka, Prometheus, Alertmanager)."
    )
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help="configs, pid files, logs (default: %(default)s)"
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
                    print(f"{'':<13} {KAFKA_NOTE}")
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
