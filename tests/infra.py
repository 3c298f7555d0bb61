"""Real infrastructure for end-to-end tests: Apache Kafka, Prometheus and Alertmanager via deploy/local/stack.py.

Register the fixtures in a conftest with ``from tests.infra import kafka_broker, prometheus_factory, alertmanager``.

- ``kafka_broker`` (session): the stack's Apache Kafka (one KRaft node) on a free port; yields its bootstrap
  string ``"127.0.0.1:PORT"``.
  Topics are shared across tests, so give each test its own topic names.
- ``prometheus_factory`` (per test): ``start(scrape_targets, rule_files=[],
  alertmanager_url=None) -> url``; scrapes and evaluates every second, but the
  first sample appears ~5 s after start (Prometheus applies new targets at most
  every 5 s). Every Prometheus it started is stopped at teardown.
- ``alertmanager`` (per test): ``start(config=None) -> url``; None = one receiver
  that delivers nowhere (alerts are still visible in ``/api/v2/alerts``).

Helpers: ``free_port()``, ``free_ports(n)``, ``restartable_port()``, ``own_broker(state_dir)`` (a broker of a
test's own) and ``crash_and_restart(cfg)``, ``kafka_cluster(state_dir, n)`` (a `KafkaCluster` of ``n`` nodes: its leaders, its controller, its crashes), ``wait_for(predicate, timeout, interval)``,
``prometheus_query(url, promql)``, ``WebhookReceiver`` (records what Alertmanager delivers).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kafka import KafkaAdminClient

from deploy.local.kafka import KafkaNode
from deploy.local.processes import port_in_use, read_tracked
from deploy.local.stack import (
    EXECUTABLES,
    StackConfig,
    start_alertmanager,
    start_kafka,
    start_kafka_cluster,
    start_kafka_node,
    start_prometheus,
    status,
    stop,
    stop_kafka_cluster,
)

LOCALHOST = "127.0.0.1"
TEST_SCRAPE_INTERVAL_S = 1.0
TEST_EVALUATION_INTERVAL_S = 1.0
HTTP_TIMEOUT_S = 10.0


def convowatch(*args: str | Path, env: Mapping[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the command line as a user would: a new process in the checkout, with no CONVOWATCH_* settings but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONVOWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "stream.commands.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[1],
    )


T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server binds it next)."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that were free a moment ago (held open together, so they differ)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in sockets:
            s.bind((LOCALHOST, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def restartable_port() -> int:
    """A free TCP port on 127.0.0.1 below the kernel's ephemeral range, for a server a test stops and starts again.

    While a server on an ephemeral port is down, a client reconnecting to it can be handed that very port as its
    own local port (a TCP self-connect) and hold it, so the server cannot bind it again.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12_000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((LOCALHOST, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port below the ephemeral range (from {low})")


def restartable_ports(n: int) -> list[int]:
    """``n`` distinct ports as ``restartable_port`` draws them."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(restartable_port())
    return sorted(ports)


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.2, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy and return that; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what or getattr(predicate, '__name__', 'condition')} not true after {timeout:.1f} s")
        time.sleep(interval)


def prometheus_query(url: str, promql: str, **params: float) -> list[dict[str, Any]]:
    """The ``result`` list of an instant query (GET /api/v1/query); raises on a Prometheus error.

    With ``start``, ``end`` and ``step`` (seconds) it is a range query (/api/v1/query_range) instead.
    """
    endpoint = "query_range" if params else "query"
    query = urllib.parse.urlencode({"query": promql, **params})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{endpoint}?{query}", timeout=HTTP_TIMEOUT_S) as response:
            body = json.load(response)
    except urllib.error.HTTPError as e:  # Prometheus answers 400/422 with a JSON error body for bad PromQL
        body = json.loads(e.read() or b"{}")
    if body.get("status") != "success":
        raise ValueError(f"Prometheus at {url} rejected {promql!r}: {body.get('errorType')}: {body.get('error')}")
    return list(body["data"]["result"])


class WebhookReceiver:
    """A local HTTP endpoint that records every JSON body POSTed to it: Alertmanager's webhook deliveries."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        received = self.payloads

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((LOCALHOST, 0), Handler)
        self.url = f"http://{LOCALHOST}:{self._server.server_address[1]}/"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def alerts(self, status: str | None = None) -> list[dict[str, Any]]:
        """Every alert delivered so far (optionally only ``firing`` or ``resolved`` ones)."""
        return [a for p in self.payloads for a in p.get("alerts", []) if status is None or a.get("status") == status]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _port_of(url: str) -> int:
    port = urllib.parse.urlsplit(url if "//" in url else f"//{url}").port
    if port is None:
        raise ValueError(f"{url!r} names no port")
    return port


class PrometheusFactory:
    """Starts Prometheus servers, each in its own state directory under ``root``; ``close()`` stops them all."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._configs: list[StackConfig] = []

    def start(
        self,
        scrape_targets: Sequence[str],
        rule_files: Sequence[Path] = (),
        alertmanager_url: str | None = None,
        scrape_interval_s: float = TEST_SCRAPE_INTERVAL_S,
        evaluation_interval_s: float = TEST_EVALUATION_INTERVAL_S,
    ) -> str:
        """Start a Prometheus scraping ``scrape_targets`` (job ``convowatch``); returns its base URL."""
        prometheus_port, idle_port, unused_port = free_ports(3)
        cfg = StackConfig(
            state_dir=self._root / f"prometheus-{len(self._configs)}",
            prometheus_port=prometheus_port,
            # No Alertmanager given: point at a port nothing listens on, never at a default one.
            alertmanager_port=_port_of(alertmanager_url) if alertmanager_url else idle_port,
            kafka_port=unused_port,  # unused; must only differ from the other two
            scrape_targets=list(scrape_targets),
            scrape_interval_s=scrape_interval_s,
            rule_files=list(rule_files),
            evaluation_interval_s=evaluation_interval_s,
        )
        self._configs.append(cfg)
        return start_prometheus(cfg).url

    def close(self) -> None:
        for cfg in self._configs:
            stop(cfg, ["prometheus"])


class AlertmanagerFactory:
    """Starts Alertmanagers, each in its own state directory under ``root``; ``close()`` stops them all."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._configs: list[StackConfig] = []

    def start(self, config: Path | None = None) -> str:
        """Start an Alertmanager with ``config`` (None = one no-op receiver); returns its base URL."""
        port, unused_1, unused_2 = free_ports(3)
        cfg = StackConfig(
            state_dir=self._root / f"alertmanager-{len(self._configs)}",
            alertmanager_port=port,
            kafka_port=unused_1,  # unused; must only differ
            prometheus_port=unused_2,  # unused; must only differ
            alertmanager_config=config,
        )
        self._configs.append(cfg)
        return start_alertmanager(cfg).url

    def close(self) -> None:
        for cfg in self._configs:
            stop(cfg, ["alertmanager"])


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Apache Kafka (one node) for the whole session; yields the bootstrap string ``127.0.0.1:PORT``."""
    port, unused_1, unused_2 = free_ports(3)
    cfg = StackConfig(
        state_dir=tmp_path_factory.mktemp("kafka-stack"),
        kafka_port=port,
        prometheus_port=unused_1,
        alertmanager_port=unused_2,  # unused; must only differ
    )
    service = start_kafka(cfg)
    try:
        yield service.url
    finally:
        stop(cfg, ["kafka"])


@contextlib.contextmanager
def own_broker(state_dir: Path, overrides: Mapping[str, str] | None = None) -> Iterator[StackConfig]:
    """A broker of a test's own (not the session's), on ports it can be restarted on; stopped afterwards.

    ``overrides``: broker properties (deploy/local/kafka.py), for a test that says why it needs them."""
    (port, controller_port), (unused_1, unused_2) = restartable_ports(2), free_ports(2)
    cfg = StackConfig(
        state_dir=state_dir,
        kafka_port=port,
        kafka_controller_port=controller_port,
        prometheus_port=unused_1,
        alertmanager_port=unused_2,
    )
    start_kafka(cfg, overrides)
    try:
        yield cfg
    finally:
        stop(cfg, ["kafka"])


@dataclass(frozen=True)
class KafkaCluster:
    """A KRaft cluster of combined broker+controller nodes started by `kafka_cluster`, and the faults that hit it.

    Iterating it yields its nodes."""

    state_dir: Path
    nodes: tuple[KafkaNode, ...]
    overrides: Mapping[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[KafkaNode]:
        return iter(self.nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    def leader_of(self, topic: str, partition: int) -> KafkaNode:
        """The node that leads ``partition`` of ``topic`` now (the brokers' metadata)."""
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            [described] = admin.describe_topics([topic])
        finally:
            admin.close()
        [p] = [p for p in described["partitions"] if p["partition_index"] == partition]
        return self.node(p["leader_id"])

    def active_controller(self) -> KafkaNode:
        """The leader of the controller quorum, as the voters last recorded it (``quorum-state``: the highest
        epoch's leader). Clients cannot ask: since KIP-590 a broker names a random broker as "controller"."""
        states = []
        for n in self.nodes:
            path = n.data_dir / "__cluster_metadata-0" / "quorum-state"
            with contextlib.suppress(OSError, ValueError):
                states.append(json.loads(path.read_text()))
        _, leader = max((s["leaderEpoch"], s["leaderId"]) for s in states if s.get("leaderId", -1) >= 0)
        return self.node(leader)

    def crash_and_restart(self, node: KafkaNode, before_restart: Callable[[], object] = lambda: None) -> None:
        """Kill one node (-9), call ``before_restart`` while it is down, start it again on its files."""
        self._kill(node)
        before_restart()
        stop_kafka_cluster(self.state_dir, [node])  # reaps it and forgets its pid file
        start_kafka_node(self.state_dir.resolve(), f"kafka-{node.node_id}", node, self.nodes, self.overrides)

    def crash_and_restart_all(self) -> None:
        """Kill every node (-9, as a power cut would) and start the cluster again on its files."""
        for node in self.nodes:
            self._kill(node)
        stop_kafka_cluster(self.state_dir, self.nodes)
        start_kafka_cluster(self.state_dir, self.nodes, self.overrides)

    def _kill(self, node: KafkaNode) -> None:
        name = f"kafka-{node.node_id}"
        tracked = read_tracked(self.state_dir.resolve(), name, EXECUTABLES["kafka"])
        assert tracked is not None, f"{name} does not run in {self.state_dir}"
        os.kill(tracked.pid, signal.SIGKILL)
        # A process being killed can look gone (its command line already empty) while it still holds its ports: the
        # node starts again only once both are free.
        ports = (node.port, node.controller_port)
        wait_for(lambda: not any(map(port_in_use, ports)), timeout=30, interval=0.05, what=f"the killed {name}'s ports free")


@contextlib.contextmanager
def kafka_cluster(state_dir: Path, size: int = 3, overrides: Mapping[str, str] | None = None) -> Iterator[KafkaCluster]:
    """A KRaft cluster of ``size`` combined broker+controller nodes on restartable ports; stopped afterwards.

    ``overrides``: broker properties of every node (kept across its restarts)."""
    ports = restartable_ports(2 * size)
    nodes = tuple(KafkaNode(i + 1, ports[2 * i], ports[2 * i + 1], state_dir / f"kafka-{i + 1}") for i in range(size))
    cluster = KafkaCluster(state_dir, nodes, dict(overrides or {}))
    start_kafka_cluster(state_dir, nodes, cluster.overrides)
    try:
        yield cluster
    finally:
        stop_kafka_cluster(state_dir, nodes)


def crash_and_restart(cfg: StackConfig) -> None:
    """Kill the broker of ``cfg`` (-9, as a crash would) and start it again on the same state directory."""
    pid = status(cfg)["kafka"].pid
    assert pid is not None, f"no broker runs in {cfg.state_dir}"
    os.kill(pid, signal.SIGKILL)
    ports = [p for p in (cfg.kafka_port, cfg.kafka_controller_port) if p is not None]
    wait_for(lambda: not any(map(port_in_use, ports)), timeout=30, interval=0.05, what="the killed broker's ports free")
    stop(cfg, ["kafka"])  # reaps it and forgets its pid file
    start_kafka(cfg)


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """``prometheus_factory.start(scrape_targets, rule_files=[], alertmanager_url=None) -> url``."""
    factory = PrometheusFactory(tmp_path / "prometheus-stack")
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[AlertmanagerFactory]:
    """``alertmanager.start(config=None) -> url``."""
    factory = AlertmanagerFactory(tmp_path / "alertmanager-stack")
    try:
        yield factory
    finally:
        factory.close()
