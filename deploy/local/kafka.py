"""Apache Kafka for the embedded stack: where its jars are, and a KRaft node's configuration and storage.

A node is a combined broker and controller (``process.roles=broker,controller``, no ZooKeeper) on 127.0.0.1.
One node is the local stack's broker; several make a cluster whose controllers form one static quorum
(``controller.quorum.voters``), as the fault suite runs it. The jars come from Maven Central through
``deploy/kafka/pom.xml`` (``make install`` copies them to ``.convowatch/kafka/libs``) or from the user's own
distribution (``KAFKA_HOME``, its ``libs/``).

The broker settings are Kafka's own defaults but for what a one-machine stack must say (listeners, node ids, log
directory, replication of the internal topics on a one-node cluster) and the one line Kafka's own sample
``config/server.properties`` sets for development, ``group.initial.rebalance.delay.ms=0``.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deploy.local.processes import LOCALHOST, StackError

REPO_ROOT = Path(__file__).resolve().parents[2]
POM = REPO_ROOT / "deploy" / "kafka" / "pom.xml"
CACHED_LIBS = REPO_ROOT / ".convowatch" / "kafka" / "libs"
# The first arguments of every broker this stack starts: how a tracked pid is recognised as ours (processes.runs).
JAVA_MARK = "-Dconvowatch.service=kafka"
# What Kafka's bin/kafka-server-start.sh and kafka-run-class.sh pass the JVM by default.
HEAP_OPTS = ("-Xmx1G", "-Xms1G")
JVM_OPTS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)
FORMAT_TIMEOUT_S = 60.0
META_PROPERTIES = "meta.properties"
# Broker lines Kafka logs at INFO that say nothing to a local user, kept at WARN (everything else logs at INFO).
LOG4J2_PROPERTIES = """\
# Written by deploy/local/kafka.py at each start; edits are overwritten.
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.raft.name = org.apache.kafka.raft
logger.raft.level = WARN
"""


@dataclass(frozen=True)
class KafkaNode:
    """One KRaft node: its id, client port, controller port and home (config, ``data/``)."""

    node_id: int
    port: int
    controller_port: int
    home: Path

    @property
    def bootstrap(self) -> str:
        return f"{LOCALHOST}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.home / "data"


def java_binary() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH (Kafka 4 needs Java 17 or later), or a StackError saying how."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
        raise StackError(f"JAVA_HOME is {java_home}, but {candidate} is not an executable; point it at a Java 17+ JDK")
    on_path = shutil.which("java")
    if on_path is None:
        raise StackError(
            "no Java found (Apache Kafka needs Java 17 or later): install it, e.g. "
            "`apt-get install -y openjdk-17-jre-headless`, or set JAVA_HOME"
        )
    return on_path


def kafka_libs() -> Path:
    """The folder of Kafka's jars: ``$KAFKA_HOME/libs``, else the copy ``make install`` made from deploy/kafka/pom.xml."""
    kafka_home = os.environ.get("KAFKA_HOME")
    libs = Path(kafka_home) / "libs" if kafka_home else CACHED_LIBS
    if not any(libs.glob("kafka_2.13-*.jar")):
        if kafka_home:
            raise StackError(f"KAFKA_HOME is {kafka_home}, but {libs} holds no kafka_2.13-*.jar: is it a Kafka distribution?")
        raise StackError(
            f"Apache Kafka's jars are not in {libs}: run `make install` "
            f"(or `mvn -q -B -f {POM} dependency:copy-dependencies -DoutputDirectory={libs}`), or set KAFKA_HOME"
        )
    return libs


def kafka_version() -> str:
    """The version of the Kafka jars in use (from the broker jar's name, ``kafka_2.13-4.1.1.jar``)."""
    jar = sorted(kafka_libs().glob("kafka_2.13-*.jar"))[0]
    return jar.stem.removeprefix("kafka_2.13-")


def quorum_voters(nodes: Sequence[KafkaNode]) -> str:
    return ",".join(f"{n.node_id}@{LOCALHOST}:{n.controller_port}" for n in nodes)


def server_properties(
    node: KafkaNode, cluster: Sequence[KafkaNode], overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The broker configuration of ``node`` in ``cluster``: Kafka's defaults but for what a local cluster must say.

    Internal topics (consumer offsets, transaction state) get the replication Kafka's defaults ask for, capped at
    the cluster's size: 3 replicas and ``min.insync.replicas`` 2 on three nodes, 1 on one.
    """
    internal_replicas = str(min(3, len(cluster)))
    properties = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": quorum_voters(cluster),
        "listeners": f"PLAINTEXT://{LOCALHOST}:{node.port},CONTROLLER://{LOCALHOST}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOCALHOST}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(node.data_dir),
        "offsets.topic.replication.factor": internal_replicas,
        "transaction.state.log.replication.factor": internal_replicas,
        "transaction.state.log.min.isr": str(min(2, len(cluster))),
        "share.coordinator.state.topic.replication.factor": internal_replicas,
        "share.coordinator.state.topic.min.isr": str(min(2, len(cluster))),
        "group.initial.rebalance.delay.ms": "0",
    }
    properties.update(overrides or {})
    return properties


def write_config(node: KafkaNode, cluster: Sequence[KafkaNode], overrides: Mapping[str, str] | None = None) -> Path:
    """Write ``server.properties`` and ``log4j2.properties`` into the node's home; returns the former."""
    node.home.mkdir(exist_ok=True, mode=0o700)
    (node.home / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    config = node.home / "server.properties"
    lines = "".join(f"{key}={value}\n" for key, value in server_properties(node, cluster, overrides).items())
    config.write_text("# Written by deploy/local/kafka.py at each start; edits are overwritten.\n" + lines)
    return config


def java_argv(node: KafkaNode, main_class: str, *args: str) -> list[str]:
    """The command line that runs ``main_class`` of Kafka's jars with the node's logging."""
    return [
        java_binary(),
        JAVA_MARK,
        *HEAP_OPTS,
        *JVM_OPTS,
        f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}",
        "-cp",
        str(kafka_libs() / "*"),
        main_class,
        *args,
    ]


def broker_argv(node: KafkaNode, config: Path) -> list[str]:
    return java_argv(node, "kafka.Kafka", str(config))


def format_storage(node: KafkaNode, config: Path, cluster_id: str) -> None:
    """Format the node's log directory for ``cluster_id`` unless it is formatted already (its data is kept).

    A directory that holds files but no ``meta.properties`` is not a Kafka log directory: refused, not overwritten.
    """
    meta = node.data_dir / META_PROPERTIES
    if meta.is_file():
        return
    if node.data_dir.is_dir() and any(node.data_dir.iterdir()):
        raise StackError(
            f"{node.data_dir} holds files but no {META_PROPERTIES}: it is not a formatted Kafka log directory "
            "(corrupt or foreign); move it away, or remove it to start the broker empty"
        )
    argv = java_argv(node, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "--config", str(config))
    # The format command is short: it runs with a small heap (Kafka's 1 GB broker heap is not needed).
    argv = [a for a in argv if a not in HEAP_OPTS]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=FORMAT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StackError(f"formatting Kafka storage in {node.data_dir} failed: {e}") from e
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise StackError(f"formatting Kafka storage in {node.data_dir} failed: {' / '.join(detail)}")


def read_cluster_id(node: KafkaNode) -> str | None:
    """The cluster id a formatted log directory belongs to, or None if it is not formatted."""
    try:
        text = (node.data_dir / META_PROPERTIES).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "cluster.id":
            return value.strip()
    raise StackError(f"{node.data_dir / META_PROPERTIES} names no cluster.id: the storage is corrupt; move it away")


def new_cluster_id() -> str:
    """A random cluster id in Kafka's form: a UUID's 16 bytes, URL-safe base64 without padding, never starting with
    ``-`` (as Kafka's own ``Uuid.randomUuid``: a leading dash reads as an option on the command line)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
