"""Push the dashboards to a running Grafana (HTTP API, through grafana-client).

Idempotent: every dashboard is saved with ``overwrite: true`` under its fixed
uid into one folder (created when missing), so pushing twice leaves one copy
of each, at a new version. Before anything is written the Grafana version is
read from ``/api/health`` (no credentials needed) and versions before
`MIN_GRAFANA_MAJOR` are refused. Every failure is a `PushError` whose
message says what went wrong and what to do: credentials refused (401) or
insufficient (403), Grafana unreachable (connection refused, DNS, timeout),
too old, or any other HTTP error. The token is never put in a message or a
log line, and user:password in the URL is redacted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import niquests.exceptions
from grafana_client import GrafanaApi
from grafana_client.client import (
    GrafanaClientError,
    GrafanaException,
    GrafanaServerError,
    GrafanaTimeoutError,
    GrafanaUnauthorizedError,
)

from scorers.errors import ServiceError, UserError

MIN_GRAFANA_MAJOR = 10  # the ClickHouse plugin v4, scenes-era panels and schemaVersion 41 need a recent Grafana
DEFAULT_FOLDER = "convowatch"
DEFAULT_TIMEOUT_S = 10.0
TOKEN_ENV = "CONVOWATCH_GRAFANA_TOKEN"
COMMIT_MESSAGE = "convowatch dashboards push"
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


class PushError(ServiceError, RuntimeError):
    """Grafana could not take the dashboards; the message says why and never contains the token."""


class PushTargetError(UserError, ValueError):
    """The Grafana URL or folder name given is not usable (fix the option and run again)."""


@dataclass(frozen=True)
class Pushed:
    """One dashboard saved in Grafana: its uid, Grafana's version counter and URL path."""

    uid: str
    version: int
    url: str


def push(
    url: str,
    token: str | None,
    dashboards: Mapping[str, Mapping[str, Any]],
    folder: str = DEFAULT_FOLDER,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Pushed]:
    """Save every dashboard (uid -> JSON model) into ``folder`` of the Grafana at ``url``, overwriting by uid.

    ``token`` is a Grafana service-account token (sent as a Bearer header);
    None uses user:password from the URL, if any.
    """
    where = redact(url)
    try:
        parts = urlsplit(url)
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:
        valid = False
    if not valid:
        raise PushTargetError(f"{where!r} is not an http(s)://host[:port] Grafana URL")
    api = GrafanaApi.from_url(url, credential=token or None, timeout=timeout_s)
    check_version(api, where, timeout_s)
    folder_uid = ensure_folder(api, where, folder, token, timeout_s)
    pushed = []
    for uid, model in dashboards.items():
        payload = {"dashboard": {**model, "id": None}, "folderUid": folder_uid, "overwrite": True, "message": COMMIT_MESSAGE}
        with _errors(where, f"saving dashboard {uid!r}", token, timeout_s):
            answer = api.dashboard.update_dashboard(payload)
        pushed.append(
            Pushed(uid=str(answer.get("uid", uid)), version=int(answer.get("version", 0)), url=str(answer.get("url", "")))
        )
    return pushed


def check_version(api: GrafanaApi, where: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Grafana's version from ``/api/health``; `PushError` when it is older than `MIN_GRAFANA_MAJOR` or unknown."""
    with _errors(where, "reading /api/health", None, timeout_s):
        health = api.client.GET("/health")
    version = str(health.get("version", "")) if isinstance(health, dict) else ""
    match = _VERSION.match(version)
    if not match:
        raise PushError(
            f"{where}/api/health did not report a Grafana version (answer: {str(health)[:200]!r}); is this a Grafana server?"
        )
    if int(match.group(1)) < MIN_GRAFANA_MAJOR:
        raise PushError(
            f"Grafana at {where} is version {version}; convowatch's dashboards need Grafana {MIN_GRAFANA_MAJOR} or newer "
            "(upgrade Grafana, or import the JSON files by hand at your own risk)"
        )
    return version


def ensure_folder(api: GrafanaApi, where: str, title: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """The uid of the folder titled ``title`` (uid derived from the title), created when missing."""
    uid = folder_uid(title)
    try:
        with _errors(where, f"reading folder {uid!r}", token, timeout_s):
            api.folder.get_folder(uid)
        return uid
    except _NotFound:
        pass
    with _errors(where, f"creating folder {title!r}", token, timeout_s):
        api.folder.create_folder(title, uid=uid)
    return uid


def folder_uid(title: str) -> str:
    """A Grafana uid for a folder title: letters, digits, ``-`` and ``_``, at most 40 characters."""
    uid = re.sub(r"[^A-Za-z0-9_-]+", "-", title.strip()).strip("-")[:40]
    if not uid:
        raise PushTargetError(f"folder name {title!r} has no letters or digits to make a uid from")
    return uid


def redact(url: str) -> str:
    """``url`` without user:password, query and trailing slash (for messages)."""
    try:
        parts = urlsplit(url)
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    except ValueError:  # e.g. a non-numeric port
        return url.rsplit("@", 1)[-1]
    if not netloc:
        return url.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")).rstrip("/")


class _NotFound(PushError):
    """Grafana answered 404: `ensure_folder` expects it for a missing folder; anywhere else it is a `PushError`."""


@contextmanager
def _errors(where: str, action: str, token: str | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[None]:
    """Turn grafana-client / niquests failures into a `PushError` (or `_NotFound` for a 404)."""
    try:
        yield
    except GrafanaUnauthorizedError:
        hint = f"the token in {TOKEN_ENV} is wrong or expired" if token else f"no token given: set {TOKEN_ENV}"
        raise PushError(f"Grafana at {where} refused the credentials while {action} (401 Unauthorized): {hint}") from None
    except GrafanaTimeoutError:
        raise PushError(f"Grafana at {where} is unreachable: no answer within {timeout_s:g} s while {action}") from None
    except GrafanaClientError as e:
        if e.status_code == 403:
            raise PushError(
                f"Grafana at {where} denied {action} (403 Forbidden): the token needs the Editor role "
                "(or Admin to create the folder)"
            ) from None
        if e.status_code == 404:
            raise _NotFound(f"Grafana at {where} answered 404 while {action}: {_message(e)}") from None
        raise PushError(f"Grafana at {where} answered {e.status_code} while {action}: {_message(e)}") from None
    except GrafanaServerError as e:
        raise PushError(f"Grafana at {where} failed while {action} ({e.status_code} server error): {_message(e)}") from None
    except GrafanaException as e:  # status 0: the request never got an answer
        raise PushError(f"Grafana at {where} is unreachable while {action}: {_scrub(str(e), token)}") from None
    except niquests.exceptions.Timeout:
        raise PushError(f"Grafana at {where} is unreachable: no answer within {timeout_s:g} s while {action}") from None
    except niquests.exceptions.ConnectionError as e:
        raise PushError(
            f"Grafana at {where} is unreachable while {action} (connection refused, unknown host or network down): "
            f"{_scrub(str(e), token)}"
        ) from None
    except niquests.exceptions.RequestException as e:
        raise PushError(f"request to Grafana at {where} failed while {action}: {_scrub(str(e), token)}") from None
    except ValueError as e:  # not JSON: something else answers on that port
        raise PushError(f"{where} did not answer like Grafana while {action}: {e}") from None


def _message(e: GrafanaException) -> str:
    body = e.response
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return str(body)[:300]


def _scrub(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token else text
