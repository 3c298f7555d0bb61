"""One real chDB engine for the whole test session, and a store per test on it.

chDB allows one engine (one data directory) per process and pytest runs every
test in one process, so the session opens one directory and keeps a store on
it open until the end (that keeps the engine up). Tests get their own stores
on the same directory, each in a database of its own, from `store_factory`.
Import these fixtures into conftest.py (or a test module)::

    from tests.chdb_fixture import chdb_dsn, chdb_store, store_factory  # noqa: F401

If they are imported in two places pytest makes two session instances; both
use the same directory (`_session_dir`), so they share the one engine. Tests
must not open a store on any other chDB directory.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator

import pytest

from stream.store import ClickHouseStore

SESSION_DATABASE = "convowatch_session"
_counter = itertools.count(1)
_session_dir: list[str] = []  # one directory per process, even if these fixtures are imported in two places

StoreFactory = Callable[..., ClickHouseStore]


@pytest.fixture(scope="session")
def chdb_dsn(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``chdb:///…``: the session's one embedded-engine directory."""
    if not _session_dir:
        _session_dir.append(str(tmp_path_factory.mktemp("chdb")))
    return f"chdb://{_session_dir[0]}"


@pytest.fixture(scope="session")
def chdb_store(chdb_dsn: str) -> Iterator[ClickHouseStore]:
    """A migrated store (database ``convowatch_session``) that keeps the session's engine open."""
    store = ClickHouseStore(chdb_dsn, database=SESSION_DATABASE)
    store.migrate()
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def store_factory(chdb_store: ClickHouseStore, chdb_dsn: str, request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """``store_factory(database=None, migrate=True)``: a store on the session engine in a fresh database.

    The default database name is unique per call and derived from the test's name; stores are
    closed after the test (the engine stays up with `chdb_store`).
    """
    opened: list[ClickHouseStore] = []

    def make(database: str | None = None, migrate: bool = True) -> ClickHouseStore:
        if database is None:
            stem = re.sub(r"\W", "_", request.node.name)[:40]
            database = f"t{next(_counter)}_{stem}"
        store = ClickHouseStore(chdb_dsn, database=database)
        opened.append(store)
        if migrate:
            store.migrate()
        return store

    try:
        yield make
    finally:
        for store in opened:
            store.close()
