"""The embedded local stack (deploy/local/stack.py) with Apache Kafka, Prometheus and Alertmanager."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from deploy.local import stack
from deploy.local.processes import open_log, process_alive, tcp_accepts
from deploy.local.stack import StackConfig, StackError
from tests.infra import (  # noqa: F401  (fixtures; the conftest registers them for other modules)
    alertmanager,
    free_ports,
    kafka_broker,
    prometheus_factory,
    prometheus_query,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **overrides: object) -> StackConfig:
    kafka_port, prometheus_port, alertmanager_port = free_ports(3)
    values: dict[str, object] = {
        "kafka_port": kafka_port,
        "prometheus_port": prometheus_port,
        "alertmanager_port": alertmanager_port,
        "scrape_interval_s": 1,
        "evaluation_interval_s": 1,
    }
    values.update(overrides)
    return StackConfig(state_dir=tmp_path / "stack", **values)  # type: ignore[arg-type]


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_kafka_start_is_idempotent_status_reports_it_and_stop_ends_it(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    service = stack.start_kafka(cfg)
    try:
        assert service.url == f"127.0.0.1:{cfg.kafka_port}" and not service.already_running
        assert (cfg.state_dir / "kafka.pid").read_text().strip() == str(service.pid)
        assert "Kafka Server started" in service.log.read_text()
        assert service.log.stat().st_mode & 0o777 == 0o600  # logs carry conversation text: owner only
        assert all(d.stat().st_mode & 0o777 == 0o700 for d in (cfg.state_dir, cfg.state_dir / "kafka"))
        assert (cfg.state_dir / "kafka" / "data" / "meta.properties").is_file()  # formatted KRaft storage

        again = stack.start_kafka(cfg)
        assert again.already_running and again.pid == service.pid

        st = stack.status(cfg)
        assert st["kafka"].running and st["kafka"].pid == service.pid and st["kafka"].url == service.url
        assert "Apache Kafka" in st["kafka"].note
        assert not st["prometheus"].running and st["prometheus"].pid is None
    finally:
        stack.stop(cfg, ["kafka"])
    assert not process_alive(service.pid, stack.EXECUTABLES["kafka"])
    assert not tcp_accepts(cfg.kafka_port)
    assert not (cfg.state_dir / "kafka.pid").exists()
    assert not stack.status(cfg)["kafka"].running
    stack.stop(cfg)  # stopping a stopped stack is a no-op


def test_kafka_python_produces_and_consumes_on_the_broker(kafka_broker: str) -> None:
    topic = f"stack-test-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=kafka_broker)
    producer.send(topic, key=b"conv-1", value=b'{"hello": "broker"}').get(timeout=10)
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=kafka_broker, consumer_timeout_ms=10_000)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        record = next(iter(consumer))
    finally:
        consumer.close()
    assert (record.key, record.value, record.offset) == (b"conv-1", b'{"hello": "broker"}', 0)


def test_a_log_is_owner_only_even_when_it_existed_readable(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("earlier run\n")
    log.chmod(0o644)
    with open_log(log, append=True) as out:
        out.write(b"next run\n")
    assert log.stat().st_mode & 0o777 == 0o600 and log.read_text() == "earlier run\nnext run\n"
    with open_log(log) as out:
        out.write(b"fresh\n")
    assert log.read_text() == "fresh\n" and log.stat().st_mode & 0o777 == 0o600


def test_port_in_use_is_refused_with_the_port_named(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", cfg.kafka_port))
        squatter.listen()
        with pytest.raises(StackError, match=rf"port {cfg.kafka_port} is already in use .*another broker.*stack status"):
            stack.start_kafka(cfg)
    assert not (cfg.state_dir / "kafka.pid").exists()


def test_missing_prometheus_binary_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apt_get = shutil.which("apt-get")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    cfg = _config(tmp_path)
    with pytest.raises(StackError) as no_apt:
        stack.start_prometheus(cfg)
    assert "prometheus was not found on PATH" in str(no_apt.value)
    assert "apt-get install -y --no-install-recommends prometheus prometheus-alertmanager" in str(no_apt.value)
    assert "apt-get is not available" in str(no_apt.value)

    if apt_get:  # a PATH with apt-get but no prometheus: the install line alone
        with_apt = tmp_path / "apt-bin"
        with_apt.mkdir()
        (with_apt / "apt-get").symlink_to(apt_get)
        monkeypatch.setenv("PATH", str(with_apt))
        with pytest.raises(StackError) as apt:
            stack.start_alertmanager(cfg)
        assert "apt-get install -y" in str(apt.value) and "not available" not in str(apt.value)
    assert not (cfg.state_dir / "prometheus.pid").exists()


def test_no_java_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(StackError, match=r"no Java found \(Apache Kafka needs Java 17 or later\).*openjdk-17"):
        stack.start_kafka(_config(tmp_path))
    assert not (tmp_path / "stack" / "kafka.pid").exists()


def test_storage_that_is_not_a_kafka_log_directory_is_refused_untouched(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    data = cfg.state_dir / "kafka" / "data"
    data.mkdir(parents=True)
    (data / "orders-0").write_text("not a Kafka log")  # files, but no meta.properties
    with pytest.raises(StackError, match=r"holds files but no meta.properties: it is not a formatted Kafka log directory"):
        stack.start_kafka(cfg)
    assert [p.name for p in data.iterdir()] == ["orders-0"]
    assert not (cfg.state_dir / "kafka.pid").exists()


def test_stale_and_foreign_pid_files_are_cleaned_and_never_signalled(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    cfg.state_dir.mkdir(parents=True)
    exited = subprocess.Popen(["true"])
    exited.wait()
    (cfg.state_dir / "kafka.pid").write_text(f"{exited.pid}\n")  # a process that has exited
    (cfg.state_dir / "prometheus.pid").write_text(f"{os.getpid()}\n")  # alive, but not prometheus (this test)
    st = stack.status(cfg)
    assert not st["kafka"].running and not st["prometheus"].running
    assert not (cfg.state_dir / "kafka.pid").exists() and not (cfg.state_dir / "prometheus.pid").exists()
    stack.stop(cfg)  # would SIGTERM this very test if it trusted the foreign pid

    (cfg.state_dir / "alertmanager.pid").write_text("not a pid\n")
    with pytest.raises(StackError, match=r"alertmanager\.pid does not hold a pid"):
        stack.status(cfg)


def test_prometheus_scrapes_a_real_exporter(prometheus_factory) -> None:
    registry = CollectorRegistry()
    Gauge("stack_test_answer", "A value the test reads back through Prometheus.", registry=registry).set(42)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = prometheus_factory.start([f"127.0.0.1:{server.server_port}"])
        samples = wait_for(lambda: prometheus_query(url, 'stack_test_answer{job="convowatch"}'), timeout=20)
        assert [s["value"][1] for s in samples] == ["42"]
        assert samples[0]["metric"]["instance"] == f"127.0.0.1:{server.server_port}"
        with urllib.request.urlopen(urllib.request.Request(f"{url}/-/reload", method="POST"), timeout=10) as reply:
            assert reply.status == 200  # --web.enable-lifecycle
        with pytest.raises(ValueError, match="rejected"):
            prometheus_query(url, "sum(")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_alertmanager_accepts_and_lists_an_alert(alertmanager) -> None:
    url = alertmanager.start()
    status = _get_json(f"{url}/api/v2/status")
    assert "receiver: default" in status["config"]["original"]
    assert status["cluster"]["status"] == "disabled"
    ends = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    alert = [{"labels": {"alertname": "StackTest", "severity": "page"}, "endsAt": ends}]
    request = urllib.request.Request(
        f"{url}/api/v2/alerts", data=json.dumps(alert).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    listed = _get_json(f"{url}/api/v2/alerts")
    assert [a["labels"]["alertname"] for a in listed] == ["StackTest"]


def test_failed_start_quotes_the_log(tmp_path: Path) -> None:
    bad_rules = tmp_path / "bad-rules.yml"
    bad_rules.write_text("groups:\n- name: broken\n  rules:\n  - alert: Broken\n    expr: sum(\n")
    cfg = _config(tmp_path, rule_files=[bad_rules])
    with pytest.raises(StackError, match=r"prometheus exited with code \d+ while starting; last 20 lines") as failed:
        stack.start_prometheus(cfg)
    assert "bad-rules.yml" in str(failed.value)
    assert not stack.status(cfg)["prometheus"].running and not (cfg.state_dir / "prometheus.pid").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploy.local.stack", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_starts_the_whole_stack_and_a_rule_alert_reaches_alertmanager(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n- name: always\n  rules:\n  - alert: AlwaysFiring\n    expr: vector(1)\n")
    cfg = _config(tmp_path, rule_files=[rules])
    ports = [
        "--state-dir",
        str(cfg.state_dir),
        "--kafka-port",
        str(cfg.kafka_port),
        "--prometheus-port",
        str(cfg.prometheus_port),
        "--alertmanager-port",
        str(cfg.alertmanager_port),
    ]
    started = _cli(
        "start",
        *ports,
        "--scrape-interval",
        "1",
        "--evaluation-interval",
        "1",
        "--rule-file",
        str(rules),
        "--scrape-target",
        "127.0.0.1:1",
    )
    try:
        assert started.returncode == 0, started.stderr
        for url in (
            f"127.0.0.1:{cfg.kafka_port}",
            f"http://127.0.0.1:{cfg.prometheus_port}",
            f"http://127.0.0.1:{cfg.alertmanager_port}",
        ):
            assert url in started.stdout
        assert all(s.running for s in stack.status(cfg).values())

        # Prometheus evaluates the rule and sends the alert to the Alertmanager the stack started.
        alerts_url = f"http://127.0.0.1:{cfg.alertmanager_port}/api/v2/alerts"
        wait_for(lambda: [a for a in _get_json(alerts_url) if a["labels"]["alertname"] == "AlwaysFiring"], timeout=20)

        again = _cli("start", *ports, "--only", "kafka")
        assert again.returncode == 0 and "already running" in again.stdout

        clash = _cli("start", "--state-dir", str(tmp_path / "other"), "--only", "kafka", "--kafka-port", str(cfg.kafka_port))
        assert clash.returncode == 2
        assert clash.stderr.startswith(f"stack: error: port {cfg.kafka_port} is already in use")

        status = _cli("status", *ports)
        assert status.returncode == 0 and status.stdout.count("running (pid") == 3
    finally:
        stopped = _cli("stop", *ports)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(s.running for s in stack.status(cfg).values())
    assert not any(tcp_accepts(p) for p in (cfg.kafka_port, cfg.prometheus_port, cfg.alertmanager_port))


def test_bad_configuration_is_named() -> None:
    with pytest.raises(StackError, match="scrape target 'localhost' is not HOST:PORT"):
        StackConfig(state_dir=Path("x"), scrape_targets=["localhost"])
    with pytest.raises(StackError, match="ports must differ"):
        StackConfig(state_dir=Path("x"), kafka_port=9090)
    with pytest.raises(StackError, match="rule file .*missing.yml does not exist"):
        StackConfig(state_dir=Path("x"), rule_files=[Path("missing.yml")])
    with pytest.raises(StackError, match="unknown component"):
        stack.start_all(StackConfig(state_dir=Path("x")), ["kafka", "zookeeper"])
