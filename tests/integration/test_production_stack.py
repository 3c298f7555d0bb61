"""deploy/production run as written on a local three-broker Apache Kafka cluster.

Everything below is read from the files of deploy/production (no value is copied into this test, so it fails when
a file goes wrong):

* ``convowatch.env``: its KEY=VALUE lines, installed at ``/etc/convowatch/convowatch.env`` under a temporary root;
* ``convowatch-worker@.service`` and ``convowatch-sink.service``: ``WorkingDirectory=``, ``Environment=`` (``%i``
  the instance name, here a metrics port, ``%H`` this host's name, as systemd expands them), ``EnvironmentFile=``
  (read after ``Environment=`` and in order, so they win, as in systemd; ``-`` = optional) and ``ExecStart=``.
  Two workers (``convowatch-worker@P1``, ``@P2``) and the sink run at once, as at boot; convowatch creates its
  topics itself when they start (``stream/topics.py``, replication factor and partitions from the env file);
* ``prometheus.yml``: its global intervals, rule files, Alertmanager and scrape job as written but for the
  addresses below; ``promtool check config`` on the file as written and as run here;
* ``alertmanager.yml`` as written: ``amtool check-config``, and the Alertmanager that Prometheus sends alerts to
  runs on it.

Also checked on the files alone: every ``CONVOWATCH_*`` key names a setting (settings ignore unknown variables, so a
misspelt one would silently keep the default), no key is both in the env file and a unit's ``Environment=`` (the
file would win), the three static member ids differ.

Then 40 real LLM-Rubric conversations are replayed (``convowatch replay jsonl``), both workers score them, the
sink writes them, and each is read back exactly once from the store once the sink has stopped (in another
process: an embedded chDB directory opens in one process only).

What differs from production, and why:

* Paths under ``/etc/convowatch``, ``/var/lib/convowatch`` and ``/etc/prometheus`` (in the env file, the units and
  prometheus.yml) are the same paths under a temporary root: the test has no root and must not touch the host.
  At the env file's ``/etc/convowatch/rubric-set.json``, ``calibrator`` and ``questions.json`` it installs the
  scoring-core rubric set and calibrator of ``scoring_artifacts`` (tests/conftest.py) and LLM-Rubric's questions.
* ``ExecStart``'s ``/opt/convowatch/.venv/bin/convowatch`` is this checkout's ``.venv/bin/convowatch``, with the
  unit's arguments.
* ``CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS``: the cluster's three loopback brokers (``tests.infra.kafka_cluster``, with
  ``min.insync.replicas=2`` as deploy/production/README.md recommends) instead of ``kafka-N.example.internal``.
* ``CONVOWATCH_JUDGE__BASE_URL``: a ``RecordedJudgeServer`` on loopback (recorded GPT-3.5 answers over the
  OpenAI-compatible API, tests/recorded_judge_server.py) instead of ``llm.example.internal``; the env file's
  ``BACKEND=openai`` and ``MODEL`` are kept, so the worker's HTTP judge runs as in production.
* ``/etc/convowatch/secrets.env``, the units' optional second environment file, is written here with what
  production keeps in it: a judge API key (random) and ``CONVOWATCH_STORE__DSN``, which is
  ``chdb://<root>/var/lib/convowatch/clickhouse``: the embedded chDB store, because no ClickHouse server can be
  installed on this host. The sink's code is the same for both (``stream/store.py``).
* ``CONVOWATCH_METRICS__HOST``: 127.0.0.1 instead of 0.0.0.0 (Prometheus runs on this host).
* Metrics ports: the workers' instance names and the sink's ``CONVOWATCH_METRICS__PORT`` (9470 in its unit) are
  free ports, since the production ones may be taken on a shared test host.
* The processes get systemd's environment for a service with ``User=`` (PATH, HOME = the working directory as for
  a system user, USER, LANG), not the test's; systemd itself does not run them, so the units' sandboxing
  (``User=``, ``ProtectSystem=``, ``ProtectHome=``, ``ReadWritePaths=``) and ``Restart=`` are not exercised.
* prometheus.yml: the worker targets are the two workers' loopback ports (label ``role: worker`` kept) and the sink
  target the sink's (``role: sink``), the Alertmanager the one started here; Prometheus listens on loopback.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

from deploy.local.kafka import KafkaNode
from deploy.local.stack import prometheus_binary
from stream.records import ScoreRecord
from stream.replay.sources import llm_rubric_events
from stream.settings import Settings
from stream.topics import service_topics
from tests.fault_suite import judge_server
from tests.infra import AlertmanagerFactory, free_ports, kafka_cluster, prometheus_query, wait_for
from tests.pipeline import LLM_RUBRIC_DATA, REPO, Process
from tests.recorded_judge_server import RecordedJudgeServer

pytestmark = pytest.mark.slow

PRODUCTION = REPO / "deploy" / "production"
ENV_FILE = PRODUCTION / "convowatch.env"
WORKER_UNIT = PRODUCTION / "convowatch-worker@.service"
SINK_UNIT = PRODUCTION / "convowatch-sink.service"
PROMETHEUS_YML = PRODUCTION / "prometheus.yml"
ALERTMANAGER_YML = PRODUCTION / "alertmanager.yml"
RULES = REPO / "dashboards" / "alerts" / "convowatch.rules.yml"
# Where the README installs convowatch.env, and the prefixes whose paths live under the test's root instead.
INSTALLED_ENV_FILE = "/etc/convowatch/convowatch.env"
REROOTED = ("/etc/convowatch", "/var/lib/convowatch", "/etc/prometheus")
PRODUCTION_BINARY = "/opt/convowatch/.venv/bin/convowatch"
CONVOWATCH = Path(sys.prefix) / "bin" / "convowatch"  # this checkout's venv (.venv) runs the test
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"  # systemd's PATH for system services
BROKER_OVERRIDES = {"min.insync.replicas": "2"}
N_CONVERSATIONS = 40
TOOL_TIMEOUT_S = 120
HTTP_TIMEOUT_S = 10


# ------------------------------------------------------------------ reading the files as systemd does


def read_env_file(path: Path) -> dict[str, str]:
    """A systemd ``EnvironmentFile=``: KEY=VALUE lines, ``#``/``;`` comments, blank lines, optional quotes."""
    out: dict[str, str] = {}
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        assert sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key), f"{path}:{n} is not KEY=VALUE: {raw!r}"
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def read_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file: section -> key -> every value given (``Environment=`` and ``EnvironmentFile=`` repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        assert not line.endswith("\\"), f"{path}:{n}: continuation lines are not emulated here"
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path}:{n} is not Key=Value in a section: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def expand(value: str, instance: str | None) -> str:
    """systemd's specifiers that the units use: ``%i``/``%I`` (instance), ``%H`` (host name), ``%%``."""

    def one(m: re.Match[str]) -> str:
        c = m.group(1)
        if c == "%":
            return "%"
        if c in "iI":
            assert instance is not None, f"{value!r} names the instance, but the unit is not a template"
            return instance
        if c == "H":
            return socket.gethostname()
        raise AssertionError(f"specifier %{c} in {value!r} is not emulated by this test")

    return re.sub(r"%(.)", one, value)


def reroot(root: Path, value: str) -> str:
    """``value`` under ``root`` if it is a path below one of `REROOTED`, else unchanged."""
    for prefix in REROOTED:
        if value == prefix or value.startswith(prefix + "/"):
            return f"{root}{value}"
    return value


def only(values: Sequence[str], what: str) -> str:
    assert len(values) == 1, f"{what}: expected one value, got {values}"
    return values[0]


@dataclass(frozen=True)
class Unit:
    path: Path
    service: dict[str, list[str]]

    @classmethod
    def read(cls, path: Path) -> Unit:
        return cls(path, read_unit(path)["Service"])

    def working_directory(self, root: Path) -> Path:
        return Path(reroot(root, only(self.service["WorkingDirectory"], f"{self.path.name} WorkingDirectory")))

    def argv(self, instance: str | None) -> list[str]:
        """``ExecStart=`` split as systemd splits it, the production venv's convowatch replaced by this one's."""
        argv = shlex.split(expand(only(self.service["ExecStart"], f"{self.path.name} ExecStart"), instance))
        assert argv[0] == PRODUCTION_BINARY, f"{self.path.name} runs {argv[0]}, not {PRODUCTION_BINARY}"
        return [str(CONVOWATCH), *argv[1:]]

    def assignments(self, instance: str | None) -> dict[str, str]:
        """The unit's ``Environment=`` assignments, specifiers expanded."""
        out = {}
        for line in self.service.get("Environment", []):
            for assignment in shlex.split(expand(line, instance)):
                key, sep, value = assignment.partition("=")
                assert sep, f"{self.path.name}: Environment={line} holds {assignment!r}, not KEY=VALUE"
                out[key] = value
        return out

    def environment(self, root: Path, instance: str | None) -> dict[str, str]:
        """What systemd gives the process: a service's base variables, ``Environment=``, then each
        ``EnvironmentFile=`` in order (a later one overrides; a missing ``-`` file is skipped)."""
        workdir = self.working_directory(root)
        user = only(self.service["User"], f"{self.path.name} User")
        env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", "HOME": str(workdir), "USER": user, "LOGNAME": user}
        env.update(self.assignments(instance))
        for entry in self.service.get("EnvironmentFile", []):
            optional = entry.startswith("-")
            path = Path(reroot(root, expand(entry.removeprefix("-"), instance)))
            if path.is_file():
                env.update(read_env_file(path))
            else:
                assert optional, f"{self.path.name}: EnvironmentFile={entry} does not exist at {path}"
        return {key: reroot(root, value) for key, value in env.items()}


def host_overrides(env: Mapping[str, str], nodes: Sequence[KafkaNode], judge: RecordedJudgeServer) -> dict[str, str]:
    """What must differ on this host (the module docstring says why); each key is one the env file sets."""
    overrides = {
        "CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS": ",".join(n.bootstrap for n in nodes),
        "CONVOWATCH_JUDGE__BASE_URL": f"http://127.0.0.1:{judge.port}/v1",
        "CONVOWATCH_METRICS__HOST": "127.0.0.1",
    }
    missing = sorted(set(overrides) - set(env))
    assert not missing, f"{ENV_FILE.name} no longer sets {missing}: the production settings changed, check this test"
    return overrides


def known_setting(key: str) -> bool:
    """Whether ``CONVOWATCH_A__B`` names a field of `Settings` (unknown variables are ignored when settings load,
    so a misspelt one would silently leave the default)."""
    model: Any = Settings
    for part in key.removeprefix("CONVOWATCH_").lower().split("__"):
        fields = getattr(model, "model_fields", None)
        if not key.startswith("CONVOWATCH_") or not fields or part not in fields:
            return False
        model = fields[part].annotation
    return True


def settings_of(env: Mapping[str, str]) -> Settings:
    """The settings a process with environment ``env`` reads (the same loader, this process's environment swapped)."""
    with mock.patch.dict(os.environ, env, clear=True):
        return Settings()


def prometheus_config(root: Path, workers: Sequence[str], sink: str, alertmanager: str) -> dict[str, Any]:
    """prometheus.yml with this host's addresses: worker and sink targets, Alertmanager, rule files re-rooted."""
    config = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
    config["rule_files"] = [reroot(root, pattern) for pattern in config["rule_files"]]
    [am] = config["alerting"]["alertmanagers"]
    [am_static] = am["static_configs"]
    assert len(am_static["targets"]) == 1, am_static
    am_static["targets"] = [alertmanager]
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "convowatch"]
    roles = {group["labels"]["role"]: group for group in job["static_configs"]}
    assert sorted(roles) == ["sink", "worker"] and len(job["static_configs"]) == 2, job
    roles["worker"]["targets"] = list(workers)
    roles["sink"]["targets"] = [sink]
    return config


# ------------------------------------------------------------------ the stack


@dataclass
class Stack:
    root: Path
    bootstrap: str
    env_file: dict[str, str]
    worker_envs: list[dict[str, str]]
    sink_env: dict[str, str]
    settings: Settings
    workers: list[Process]
    sink: Process
    prometheus: str
    prometheus_yml: Path
    alertmanager: str
    judge: RecordedJudgeServer
    conversation_ids: set[str]
    replay_stdout: str


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        return json.load(response)


def _ok(argv: Sequence[str]) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, cwd=REPO)
    assert done.returncode == 0, f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: `make stack-deps` (deploy/local/install-deps.sh) installs it")
    return path


def _install(root: Path, env_file: Mapping[str, str], rubric_set: Path, calibrator: Path, store_dir: Path) -> None:
    """Put the files where the env file and the units look for them, under ``root``."""
    etc = root / "etc" / "convowatch"
    etc.mkdir(parents=True)
    shutil.copyfile(ENV_FILE, reroot(root, INSTALLED_ENV_FILE))
    shutil.copyfile(rubric_set, reroot(root, env_file["CONVOWATCH_RUBRIC_SET"]))
    shutil.copytree(calibrator, reroot(root, env_file["CONVOWATCH_CALIBRATOR"]))
    shutil.copyfile(LLM_RUBRIC_DATA / "questions.json", reroot(root, env_file["CONVOWATCH_SCORING__QUESTIONS"]))
    # What production keeps in secrets.env (convowatch.env's header): the judge's key and the store's DSN.
    secrets_env = etc / "secrets.env"
    secrets_env.write_text(
        f"CONVOWATCH_JUDGE__API_KEY={secrets.token_hex(16)}\nCONVOWATCH_STORE__DSN=chdb://{store_dir}\n", encoding="utf-8"
    )
    secrets_env.chmod(0o600)
    rules = Path(reroot(root, "/etc/prometheus/rules")) / RULES.name
    rules.parent.mkdir(parents=True)
    shutil.copyfile(RULES, rules)


def _launch(name: str, argv: list[str], cwd: Path, env: Mapping[str, str], port: int, logs: Path) -> Process:
    log = logs / f"{name}.log"
    with log.open("ab") as out:
        popen = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Process(name, popen, log, port)


def _wait_up(proc: Process, timeout: float = 90) -> None:
    def up() -> bool:
        if proc.popen.poll() is not None:
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
        try:
            proc.metrics()
            return True
        except OSError:
            return False

    wait_for(up, timeout=timeout, interval=0.5, what=f"{proc.name}'s /metrics")


def _member_partitions(member: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The (topic, partition) pairs a group member owns, from DescribeGroups."""
    assignment = member.get("member_assignment") or {}
    return [(t["topic"], p) for t in assignment.get("assigned_partitions", []) for p in t["partitions"]]


def _whole_topics(owned: Sequence[Sequence[tuple[str, int]]], partitions: int) -> bool:
    """Every topic the members own is owned whole (each of its ``partitions`` by exactly one member)."""
    pairs = [pair for member in owned for pair in member]
    topics = {topic for topic, _ in pairs}
    return bool(topics) and sorted(pairs) == sorted((t, p) for t in topics for p in range(partitions))


def _groups_settled(nodes: Sequence[KafkaNode], settings: Settings, instance_ids: set[str]) -> bool:
    """Both stage groups Stable, their members ``instance_ids``, each owning partitions, all partitions owned."""
    groups = [f"{settings.kafka.app_id}-assemble", f"{settings.kafka.app_id}-score"]
    admin = KafkaAdminClient(bootstrap_servers=[n.bootstrap for n in nodes])
    try:
        described = admin.describe_groups(groups)
    finally:
        admin.close()
    for group in groups:
        members = described[group]["members"]
        owned = [_member_partitions(m) for m in members]
        if (
            described[group]["group_state"] != "Stable"
            or {m["group_instance_id"] for m in members} != instance_ids
            or not all(owned)
            or not _whole_topics(owned, settings.kafka.partitions)
        ):
            return False
    return True


def _conversations_file(path: Path) -> set[str]:
    """The first `N_CONVERSATIONS` real LLM-Rubric conversations (by id) as contract events, one a line."""
    items = [i for i in llm_rubric_events() if i.event is not None]
    ids = set(sorted({i.event.conversation_id for i in items if i.event is not None})[:N_CONVERSATIONS])
    path.write_bytes(b"".join(i.raw + b"\n" for i in items if i.event is not None and i.event.conversation_id in ids))
    return ids


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, scoring_artifacts: tuple[Path, Path]) -> Iterator[Stack]:
    assert CONVOWATCH.is_file() and os.access(CONVOWATCH, os.X_OK), f"no convowatch entry point at {CONVOWATCH}"
    root = tmp_path_factory.mktemp("production")
    logs = root / "logs"
    logs.mkdir()
    rubric_set, calibrator = scoring_artifacts
    env_file = read_env_file(ENV_FILE)
    worker_unit, sink_unit = Unit.read(WORKER_UNIT), Unit.read(SINK_UNIT)
    store_dir = Path(reroot(root, "/var/lib/convowatch/clickhouse"))
    _install(root, env_file, rubric_set, calibrator, store_dir)
    workdir = worker_unit.working_directory(root)
    assert sink_unit.working_directory(root) == workdir
    workdir.mkdir(parents=True, exist_ok=True)

    processes: list[Process] = []
    prometheus: subprocess.Popen[bytes] | None = None
    alertmanagers = AlertmanagerFactory(root / "alertmanager")
    with kafka_cluster(root / "kafka", 3, BROKER_OVERRIDES) as cluster, judge_server(rubric_set) as judge:
        nodes: list[KafkaNode] = list(cluster)
        try:
            am_url = alertmanagers.start(ALERTMANAGER_YML)
            worker_ports = free_ports(2)
            sink_port, prometheus_port = free_ports(2)
            worker_envs = []
            for port in worker_ports:
                env = worker_unit.environment(root, str(port))
                worker_envs.append({**env, **host_overrides(env, nodes, judge)})
            env = sink_unit.environment(root, None)
            sink_env = {**env, **host_overrides(env, nodes, judge), "CONVOWATCH_METRICS__PORT": str(sink_port)}
            # Started together, as at boot: each creates the topics that are missing.
            for port, env in zip(worker_ports, worker_envs, strict=True):
                processes.append(_launch(f"convowatch-worker@{port}", worker_unit.argv(str(port)), workdir, env, port, logs))
            sink = _launch("convowatch-sink", sink_unit.argv(None), workdir, sink_env, sink_port, logs)
            processes.append(sink)
            for proc in processes:
                _wait_up(proc)
            workers = processes[:2]

            prometheus_yml = Path(reroot(root, "/etc/prometheus/prometheus.yml"))
            config = prometheus_config(
                root, [f"127.0.0.1:{p}" for p in worker_ports], f"127.0.0.1:{sink_port}", am_url.removeprefix("http://")
            )
            prometheus_yml.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
            prom_url = f"http://127.0.0.1:{prometheus_port}"
            with (logs / "prometheus.log").open("ab") as out:
                prometheus = subprocess.Popen(
                    [
                        prometheus_binary(),
                        f"--config.file={prometheus_yml}",
                        f"--storage.tsdb.path={root / 'prometheus-data'}",
                        f"--web.listen-address=127.0.0.1:{prometheus_port}",
                    ],
                    cwd=root,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )

            def prometheus_ready() -> bool:
                assert prometheus is not None
                if prometheus.poll() is not None:
                    raise AssertionError(f"Prometheus exited with {prometheus.returncode}: see {logs / 'prometheus.log'}")
                try:
                    with urllib.request.urlopen(f"{prom_url}/-/ready", timeout=2) as r:
                        return bool(r.status == 200)
                except OSError:
                    return False

            wait_for(prometheus_ready, timeout=60, interval=0.5, what="Prometheus ready")

            settings = settings_of(worker_envs[0])

            def balanced() -> bool:
                owned = [w.metric_sum("convowatch_assigned_partitions") for w in workers]
                return sum(owned) == settings.kafka.partitions and min(owned) >= 1

            wait_for(balanced, timeout=120, interval=0.5, what="both workers own events partitions")
            # and both stages' groups have settled, so no rebalance moves a conversation while it is scored
            worker_ids = {env["CONVOWATCH_KAFKA__GROUP_INSTANCE_ID"] for env in worker_envs}
            wait_for(
                lambda: _groups_settled(nodes, settings, worker_ids),
                timeout=120,
                interval=0.5,
                what="the workers' groups stable, each worker owning partitions",
            )

            conversations = root / "conversations.jsonl"
            ids = _conversations_file(conversations)
            replay_env = {k: v for k, v in sink_env.items() if k not in sink_unit.assignments(None)}
            replay = subprocess.run(
                [str(CONVOWATCH), "replay", "jsonl", str(conversations)],
                cwd=workdir,
                env=replay_env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert replay.returncode == 0, f"replay failed ({replay.returncode}):\n{replay.stdout}\n{replay.stderr}"
            wait_for(
                lambda: sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") >= len(ids),
                timeout=180,
                interval=0.5,
                what="every replayed conversation written by the sink",
            )
            yield Stack(
                root=root,
                bootstrap=",".join(n.bootstrap for n in nodes),
                env_file=env_file,
                worker_envs=worker_envs,
                sink_env=sink_env,
                settings=settings,
                workers=workers,
                sink=sink,
                prometheus=prom_url,
                prometheus_yml=prometheus_yml,
                alertmanager=am_url,
                judge=judge,
                conversation_ids=ids,
                replay_stdout=replay.stdout,
            )
        finally:
            _stop(processes)
            if prometheus is not None:
                prometheus.terminate()
                try:
                    prometheus.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    prometheus.kill()
                    prometheus.wait()
            alertmanagers.close()


# ------------------------------------------------------------------ the files


def test_the_units_and_the_env_file_read_as_systemd_reads_them(tmp_path: Path) -> None:
    env_file = read_env_file(ENV_FILE)
    installed = Path(reroot(tmp_path, INSTALLED_ENV_FILE))
    installed.parent.mkdir(parents=True)
    shutil.copyfile(ENV_FILE, installed)
    assert env_file and all(key.startswith("CONVOWATCH_") for key in env_file), sorted(env_file)
    worker, sink = Unit.read(WORKER_UNIT), Unit.read(SINK_UNIT)
    for unit in (worker, sink):
        # The units' EnvironmentFile= lines name the installed env file (read first) and the optional secrets.
        files = unit.service["EnvironmentFile"]
        assert files[0] == INSTALLED_ENV_FILE and all(f.startswith("-") for f in files[1:]), files
        # An env file wins over Environment=: a key in both would silently drop the unit's per-process value.
        assert not set(unit.assignments("9464")) & set(env_file), f"{unit.path.name} and {ENV_FILE.name} both set a key"
        assert Path(unit.argv("9464")[0]) == CONVOWATCH
    # Each process has its own static member id: two workers on one host and the sink never share one.
    ids = [worker.assignments(p)["CONVOWATCH_KAFKA__GROUP_INSTANCE_ID"] for p in ("9464", "9465")]
    ids.append(sink.assignments(None)["CONVOWATCH_KAFKA__GROUP_INSTANCE_ID"])
    assert len(set(ids)) == 3 and all(socket.gethostname() in i for i in ids), ids
    assert worker.assignments("9465")["CONVOWATCH_METRICS__PORT"] == "9465"
    unit_keys = {k for k in [*worker.assignments("9464"), *sink.assignments(None)] if k.startswith("CONVOWATCH_")}
    unknown = sorted(k for k in {*env_file, *unit_keys} if not known_setting(k))
    assert not unknown, f"settings convowatch does not have (they would be ignored): {unknown}"
    # Settings as the processes load them.
    settings = settings_of(worker.environment(tmp_path, "9464") | {"CONVOWATCH_KAFKA__BOOTSTRAP_SERVERS": "x:1"})
    assert settings.kafka.replication_factor == 3 == int(env_file["CONVOWATCH_KAFKA__REPLICATION_FACTOR"])
    assert settings.kafka.partitions == int(env_file["CONVOWATCH_KAFKA__PARTITIONS"])
    assert settings.judge.backend == env_file["CONVOWATCH_JUDGE__BACKEND"]
    assert settings.metrics.port == 9464
    assert str(settings.rubric_set) == f"{tmp_path}{env_file['CONVOWATCH_RUBRIC_SET']}"


def test_promtool_and_amtool_accept_the_production_configs(stack: Stack) -> None:
    assert "SUCCESS" in _ok([_tool("promtool"), "check", "config", str(PROMETHEUS_YML)])  # as written
    # as run here: the rule files now match dashboards/alerts/convowatch.rules.yml, which promtool checks too
    checked = _ok([_tool("promtool"), "check", "config", str(stack.prometheus_yml)])
    assert "SUCCESS: 1 rule files found" in checked and RULES.name in checked, checked
    assert "SUCCESS" in _ok([_tool("amtool"), "check-config", str(ALERTMANAGER_YML)])


# ------------------------------------------------------------------ Kafka


def test_convowatch_created_its_topics_with_the_env_files_partitions_and_three_replicas(stack: Stack) -> None:
    kafka = stack.settings.kafka
    assert kafka.replication_factor == 3 and kafka.partitions == int(stack.env_file["CONVOWATCH_KAFKA__PARTITIONS"])
    admin = KafkaAdminClient(bootstrap_servers=stack.bootstrap.split(","))
    try:
        names = service_topics(kafka)
        topics = {t["name"]: t for t in admin.describe_topics(names)}
        assert sorted(topics) == sorted(names)
        for name, topic in topics.items():
            partitions = topic["partitions"]
            assert len(partitions) == kafka.partitions, (name, len(partitions))
            assert {len(p["replica_nodes"]) for p in partitions} == {3}, name
            assert {len(p["isr_nodes"]) for p in partitions} == {3}, name
        # Nothing else convowatch (or Faust under it) made has fewer replicas.
        others = [t for t in admin.list_topics() if not t.startswith("__")]
        thin = {t["name"] for t in admin.describe_topics(others) if any(len(p["replica_nodes"]) < 3 for p in t["partitions"])}
        assert not thin, f"topics with fewer than 3 replicas: {sorted(thin)}"
    finally:
        admin.close()


def test_both_workers_and_the_sink_are_members_under_their_units_static_ids(stack: Stack) -> None:
    kafka = stack.settings.kafka
    assert kafka.consumer == "batch", "the units' static member ids are those of the batch consumer"
    owned = [w.metric_sum("convowatch_assigned_partitions") for w in stack.workers]
    assert sum(owned) == kafka.partitions and min(owned) >= 1, owned
    worker_ids = {env["CONVOWATCH_KAFKA__GROUP_INSTANCE_ID"] for env in stack.worker_envs}
    expected = {
        f"{kafka.app_id}-assemble": worker_ids,
        f"{kafka.app_id}-score": worker_ids,
        kafka.sink_group: {stack.sink_env["CONVOWATCH_KAFKA__GROUP_INSTANCE_ID"]},
    }
    admin = KafkaAdminClient(bootstrap_servers=stack.bootstrap.split(","))
    try:
        groups = admin.describe_groups(list(expected))
    finally:
        admin.close()
    for group, instance_ids in expected.items():
        members = groups[group]["members"]
        assert {m["group_instance_id"] for m in members} == instance_ids, (group, members)
        by_member = {m["group_instance_id"]: _member_partitions(m) for m in members}
        assert all(by_member.values()) and _whole_topics(list(by_member.values()), kafka.partitions), (group, by_member)


# ------------------------------------------------------------------ Prometheus and Alertmanager


def test_prometheus_on_the_production_config_scrapes_both_workers_and_the_sink_as_job_convowatch(stack: Stack) -> None:
    targets = {f"127.0.0.1:{w.metrics_port}": "worker" for w in stack.workers} | {f"127.0.0.1:{stack.sink.metrics_port}": "sink"}

    def all_up() -> list[dict[str, Any]]:
        up = prometheus_query(stack.prometheus, 'up{job="convowatch"}')
        return up if len(up) == 3 and all(r["value"][1] == "1" for r in up) else []

    # scrape_interval as written (15 s): the first scrape of a target comes within one interval.
    up = wait_for(all_up, timeout=60, interval=1, what='up{job="convowatch"} == 1 for 3 targets')
    assert {r["metric"]["instance"]: r["metric"]["role"] for r in up} == targets

    def partitions_scraped() -> list[dict[str, Any]]:
        return prometheus_query(stack.prometheus, 'sum(convowatch_assigned_partitions{job="convowatch",role="worker"})')

    [owned] = wait_for(partitions_scraped, timeout=60, interval=1, what="the workers' partitions in Prometheus")
    assert float(owned["value"][1]) == stack.settings.kafka.partitions

    rules = _get_json(f"{stack.prometheus}/api/v1/rules")["data"]["groups"]
    files = {g["file"] for g in rules}
    assert files == {str(stack.root / "etc" / "prometheus" / "rules" / RULES.name)}, files
    assert len(rules) == len(yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"])
    active = _get_json(f"{stack.prometheus}/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
    assert [a["url"] for a in active] == [f"{stack.alertmanager}/api/v2/alerts"], active


def test_alertmanager_runs_the_production_config(stack: Stack) -> None:
    status = _get_json(f"{stack.alertmanager}/api/v2/status")
    running = yaml.safe_load(status["config"]["original"])
    written = yaml.safe_load(ALERTMANAGER_YML.read_text(encoding="utf-8"))
    assert [r["name"] for r in running["receivers"]] == [r["name"] for r in written["receivers"]]
    assert running["route"]["receiver"] == written["route"]["receiver"]
    assert len(running["route"]["routes"]) == len(written["route"]["routes"])
    assert len(running["inhibit_rules"]) == len(written["inhibit_rules"])


# ------------------------------------------------------------------ the conversations (last: stops the processes)


def _scores_topic_ids(stack: Stack) -> list[str]:
    topic = stack.settings.kafka.scores_topic
    consumer = KafkaConsumer(bootstrap_servers=stack.bootstrap.split(","), enable_auto_commit=False, consumer_timeout_ms=5000)
    try:
        tps = [TopicPartition(topic, p) for p in range(stack.settings.kafka.partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        return [ScoreRecord.from_json(m.value).conversation_id for m in consumer]
    finally:
        consumer.close()


def _query_store(dsn: str, database: str, *sql: str) -> list[list[dict[str, Any]]]:
    """Read-only queries on the embedded store in one fresh process (the sink must have stopped)."""
    code = (
        "import json, sys\n"
        "from stream.store import ClickHouseStore\n"
        "with ClickHouseStore(sys.argv[1], sys.argv[2]) as s:\n"
        "    print(json.dumps([s.query(q) for q in sys.argv[3:]], default=str))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, dsn, database, *sql], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"store query failed: {done.stderr[-2000:]}"
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def _stop(processes: Sequence[Process], timeout: float = 60) -> None:
    """SIGTERM (systemd's stop signal) to every process at once, then wait for each; SIGKILL after ``timeout``."""
    for proc in processes:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
    for proc in processes:
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill9()


def test_replayed_conversations_are_scored_by_both_workers_and_stored_once(stack: Stack) -> None:
    ids = stack.conversation_ids
    assert f"to {stack.settings.kafka.events_topic}" in stack.replay_stdout, stack.replay_stdout
    scored = [w.metric_sum("convowatch_conversations_scored_total") for w in stack.workers]
    assert sum(scored) == len(ids) and min(scored) > 0, scored
    assert stack.judge.requests.get("answered", 0) > 0 and not stack.judge.requests.get("unknown"), stack.judge.requests
    assert sorted(_scores_topic_ids(stack)) == sorted(ids)  # one score record each
    assert stack.sink.metric_sum("convowatch_sink_rows_total", table="conversation_scores") == len(ids)
    assert [p.metric_sum("convowatch_broker_lost_data_total") for p in [*stack.workers, stack.sink]] == [0, 0, 0]

    processes = [stack.sink, *stack.workers]
    _stop(processes)
    for proc in processes:  # a clean stop: systemd counts exit 0 and death by SIGTERM as success
        assert proc.popen.returncode in (0, -signal.SIGTERM), f"{proc.name} exited {proc.popen.returncode}:\n{proc.log_tail()}"
    dsn, database = stack.settings.store.dsn, stack.settings.store.database
    assert dsn.startswith("chdb://"), dsn
    [row], stored = _query_store(
        dsn,
        database,
        f"SELECT count() AS rows, uniqExact(conversation_id) AS conversations, countIf(status = 'scored') AS scored "
        f"FROM {database}.conversation_scores FINAL",
        f"SELECT conversation_id FROM {database}.conversations FINAL",
    )
    assert row == {"rows": len(ids), "conversations": len(ids), "scored": len(ids)}
    assert sorted(r["conversation_id"] for r in stored) == sorted(ids)
