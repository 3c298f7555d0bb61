"""convowatch's ClickHouse store: score rows in, deduplicated reads out.

The sink writes each `ScoreRecord` as rows in the score tables (conversations,
conversation_scores, dimension_predictions, rubric_scores, behaviour_turns; a
shadow version's in shadow_scores) and user feedback and ratings in feedback
and conversation_ratings, all ReplacingMergeTree keyed so that writing the
same record again (re-delivery after a crash, re-scoring) replaces rather than
adds: read them with ``FINAL`` (see docs/clickhouse-schema.md). The tables' columns and
migrations are declared in `stream.tables`.

The DSN picks the engine: ``chdb://DIR`` is chDB, ClickHouse running inside
this process on a data directory (relative DIRs resolve against the current
directory); ``http(s)://user:pass@host:port`` is a ClickHouse server. chDB
has two hard limits that surface here as `StoreError`: one engine (one
directory) per process, and one process per directory. Several stores on the
same directory in one process are fine: they share the engine, each with its
own connection and default database.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import clickhouse_connect
from clickhouse_connect.driver.exceptions import Error as ClickHouseDriverError

from scorers.errors import ServiceError
from stream.owner_only import make_owner_only_dir
from stream.records import FeedbackRow, RatingRow, ScoreRecord
from stream.tables import CONVERSATION_RATINGS, FEEDBACK, MIGRATIONS, MIGRATIONS_TABLE, score_rows

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client
    from clickhouse_connect.driver.insert import InsertContext

    from stream.settings import StoreSettings


class StoreError(ServiceError, RuntimeError):
    """The store cannot be opened, migrated, written or read; the message says which and why."""


_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- the store ----------------------------------------------------------------------------------


class ClickHouseStore:
    """Writes score records and feedback to ClickHouse (chDB in-process or a server) and reads them back."""

    def __init__(self, dsn: str, database: str = "convowatch") -> None:
        if not _IDENTIFIER.match(database):
            raise StoreError(f"store database name {database!r} is not a plain identifier (letters, digits, _)")
        self.database = database
        self.dsn = _redact(dsn)
        self.chdb_path: Path | None = None
        self._closed = False
        # Each table's insert context (its column types), made once: clickhouse-connect otherwise runs DESCRIBE TABLE
        # before every insert, a query per table per write (a round trip to a server). Forgotten when an insert fails.
        self._insert_contexts: dict[tuple[str, tuple[str, ...]], InsertContext] = {}
        scheme = urlsplit(dsn).scheme.lower() if "://" in dsn else ""
        if scheme == "chdb":
            self.chdb_path = _chdb_dir(dsn)
            self._client = _ENGINE.open(self.chdb_path)
        elif scheme in ("http", "https"):
            self._client = _open_server(dsn)
        else:
            raise StoreError(
                f"store DSN {self.dsn!r} has scheme {scheme or '(none)'!r}; "
                "use chdb://DIR (embedded engine) or http(s)://user:pass@host:port (ClickHouse server)"
            )
        if self._database_exists():
            self._client.database = database

    @classmethod
    def open(cls, settings: StoreSettings) -> ClickHouseStore:
        """The store the settings name (``store.dsn``, ``store.database``)."""
        return cls(settings.dsn, settings.database)

    def __enter__(self) -> ClickHouseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClickHouseStore(dsn={self.dsn!r}, database={self.database!r})"

    # schema

    def migrate(self) -> list[str]:
        """Create the database, tables and view if missing; returns the migration ids applied by this call.

        ``schema_migrations`` records applied ids, so a second call applies nothing. Every DDL is
        ``IF NOT EXISTS``, so a migration interrupted half way is simply re-run.
        """
        db = self.database
        self._command(f"CREATE DATABASE IF NOT EXISTS {db}", "creating the database")
        self._command(MIGRATIONS_TABLE.format(db=db), "creating schema_migrations")
        self._client.database = db
        done = {r["id"] for r in self._select(f"SELECT id FROM {db}.schema_migrations FINAL", None, "reading schema_migrations")}
        applied = []
        for migration_id, statements in MIGRATIONS:
            if migration_id in done:
                continue
            for ddl in statements:
                self._command(ddl.format(db=db), f"applying migration {migration_id}")
            self._insert("schema_migrations", [[migration_id]], ("id",))
            applied.append(migration_id)
        return applied

    def applied_migrations(self) -> list[str]:
        """Ids in ``schema_migrations``, oldest first."""
        rows = self._select(
            f"SELECT id FROM {self.database}.schema_migrations FINAL ORDER BY applied_at, id", None, "reading schema_migrations"
        )
        return [r["id"] for r in rows]

    # writes

    def write_scores(self, records: Sequence[ScoreRecord]) -> dict[str, int]:
        """Insert the records' rows, one batch insert per table; returns the rows written per table.

        Records check their values when they are built (`stream.records`), so every record becomes rows."""
        written: dict[str, int] = {}
        for table, rows in score_rows(records):
            if rows:
                self._insert(table.name, rows, table.column_names)
            written[table.name] = len(rows)
        return written

    def write_ratings(self, items: Sequence[RatingRow]) -> int:
        """Insert conversation ratings in one batch; returns how many."""
        rows = [CONVERSATION_RATINGS.row(r) for r in items]
        if rows:
            self._insert(CONVERSATION_RATINGS.name, rows, CONVERSATION_RATINGS.column_names)
        return len(rows)

    def write_feedback(self, items: Sequence[FeedbackRow]) -> int:
        """Insert feedback rows in one batch; returns how many."""
        rows = [FEEDBACK.row(f) for f in items]
        if rows:
            self._insert(FEEDBACK.name, rows, FEEDBACK.column_names)
        return len(rows)

    # reads

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a read-only query (``readonly=1``: writes and DDL are refused) and return rows as dicts.

        Unqualified table names resolve in this store's database once it exists. DateTime64 columns
        come back as timezone-aware UTC datetimes.
        """
        return self._select(sql, parameters, "query")

    def count_conversations(self, scorer_version: str | None = None) -> int:
        """Distinct conversations with a score row (scored or not), optionally for one scorer version."""
        where = "WHERE scorer_version = {sv:String}" if scorer_version is not None else ""
        rows = self._select(
            f"SELECT uniqExact(conversation_id) AS n FROM {self.database}.conversation_scores {where}",
            {"sv": scorer_version} if scorer_version is not None else None,
            "counting conversations",
        )
        return int(rows[0]["n"])

    def close(self) -> None:
        """Close the connection (and release the chDB engine when no other store in this process uses it)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._client.close()
        finally:
            if self.chdb_path is not None:
                _ENGINE.release(self.chdb_path)

    # internals

    def _database_exists(self) -> bool:
        rows = self._select(
            "SELECT count() AS n FROM system.databases WHERE name = {db:String}", {"db": self.database}, "checking the database"
        )
        return bool(rows[0]["n"])

    def _command(self, sql: str, what: str) -> None:
        self._check_open()
        try:
            self._client.command(sql)
        except ClickHouseDriverError as e:
            raise StoreError(f"{what} in {self.database} on {self.dsn}: {e}") from e

    def _select(self, sql: str, parameters: Mapping[str, Any] | None, what: str) -> list[dict[str, Any]]:
        self._check_open()
        try:
            result = self._client.query(sql, parameters=dict(parameters or {}), settings={"readonly": 1})
            return list(result.named_results())
        except ClickHouseDriverError as e:
            raise StoreError(f"{what} failed on {self.dsn}: {e}") from e

    def _insert(self, table: str, rows: list[list[Any]], columns: Sequence[str]) -> None:
        self._check_open()
        key = (table, tuple(columns))
        try:
            context = self._insert_contexts.get(key)
            if context is None:
                context = self._client.create_insert_context(f"{self.database}.{table}", column_names=list(columns))
                self._insert_contexts[key] = context
            self._client.insert(context=context, data=rows)
        except ClickHouseDriverError as e:
            self._insert_contexts.pop(key, None)  # the table may have changed: describe it again next time
            raise StoreError(f"writing {len(rows)} rows to {self.database}.{table} on {self.dsn}: {e}") from e

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed")


# --- connecting ---------------------------------------------------------------------------------


def _redact(dsn: str) -> str:
    """The DSN with any password replaced by ***, for messages."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable DSN>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _chdb_dir(dsn: str) -> Path:
    """``chdb://DIR``: DIR is everything after the scheme (``chdb:///abs`` or ``chdb://relative``)."""
    raw = dsn[len("chdb://") :]
    if not raw or raw in ("memory", ":memory:"):
        raise StoreError(f"store DSN {dsn!r} names no directory; use chdb:///absolute/dir or chdb://relative/dir")
    if "?" in raw or "#" in raw:
        raise StoreError(f"store DSN {dsn!r}: a chdb DSN is just chdb://DIR, without ?options or #fragment")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path.cwd() / path
    try:
        make_owner_only_dir(path)  # it holds every conversation's text: owner only, even if it existed before
    except OSError as e:
        raise StoreError(f"cannot create the embedded store directory {path}: {e}") from e
    return Path(os.path.realpath(path))


def _open_server(dsn: str) -> Client:
    try:
        return clickhouse_connect.get_client(dsn=dsn, tz_mode="schema")
    except ClickHouseDriverError as e:
        raise StoreError(f"cannot connect to the ClickHouse server at {_redact(dsn)}: {e}") from e


def _other_process_holding(path: Path) -> int | None:
    """The pid of another process that has the chDB directory open (its ``status`` file is flock'ed), else None."""
    status = path / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _status_pid(status)
            return None if pid == os.getpid() else (pid or -1)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _status_pid(status: Path) -> int | None:
    try:
        m = re.search(r"^PID:\s*(\d+)", status.read_text(errors="replace"), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _locked_message(path: Path, pid: int) -> str:
    who = f" (pid {pid})" if pid > 0 else ""
    return (
        f"the embedded store {path} is open in another process{who} (only one process may open a chDB directory); "
        "stop it or use a ClickHouse server DSN"
    )


class _Engine:
    """This process's one chDB engine: which directory it is on and how many stores use it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.path: Path | None = None
        self.users = 0

    def open(self, path: Path) -> Client:
        with self._lock:
            if self.path is not None and self.path != path:
                raise StoreError(
                    f"cannot open the embedded store {path}: this process already has the chDB engine open on {self.path} "
                    f"(one chDB engine per process); use that directory with another database, close its stores first, "
                    "or use a ClickHouse server DSN"
                )
            if self.path is None and (pid := _other_process_holding(path)) is not None:
                raise StoreError(_locked_message(path, pid))
            try:
                client = clickhouse_connect.get_client(interface="chdb", path=str(path), tz_mode="schema")
            except ClickHouseDriverError as e:
                raise self._open_error(path, e) from e
            self.path = path
            self.users += 1
            return client

    def release(self, path: Path) -> None:
        with self._lock:
            if self.path == path:
                self.users -= 1
                if self.users <= 0:
                    self.path, self.users = None, 0

    @staticmethod
    def _open_error(path: Path, e: Exception) -> StoreError:
        text = str(e)
        m = re.search(r"already initialized with path '([^']*)'", text)
        if m:
            return StoreError(
                f"cannot open the embedded store {path}: this process already has the chDB engine open on {m.group(1)} "
                "(one chDB engine per process, opened outside this store); use a ClickHouse server DSN"
            )
        if (pid := _other_process_holding(path)) is not None:
            return StoreError(_locked_message(path, pid))
        return StoreError(f"cannot open the embedded store {path}: {text}")


_ENGINE = _Engine()
