"""Keeping an API key out of what an upstream says: one scrubber for every client that holds a key.

A judge or generator endpoint may echo the key it was sent in an error body, whole or cut, and encoded: a proxy
that base64s the ``Authorization`` header, a URL-encoded query string, a hex dump. Error text reaches logs, the
scores topic and ClickHouse (``unscored_reason``), so `scrub` removes from a text every run of at least
`FRAGMENT_CHARS` consecutive characters of any form of the key:

- the key itself, URL-encoded (``quote`` and ``quote_plus``, upper and lower case escapes), hex (both cases);
- base64, standard and URL-safe, with or without padding, at each of the three byte alignments the key can have
  inside a longer encoded text (``"Bearer " + key``, say): only characters whose six bits all come from the key.

`describe_error_body` is what of an error body may be kept at all: status, the error type if the body is OpenAI
JSON, the body's length and a SHA-256 prefix (to match a report against a server log), and a short scrubbed excerpt.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from urllib.parse import quote, quote_plus

FRAGMENT_CHARS = 8  # a run this long of any form of the key is removed (shorter keys: the whole key)
MIN_SECRET_CHARS = 4  # shorter keys are not searched for (they would blank out ordinary words)
EXCERPT_CHARS = 160  # of an error body's scrubbed text kept in a message
ERROR_TYPE_CHARS = 40  # of an error body's error.type / error.code
DIGEST_HEX_CHARS = 12  # of the body's SHA-256 shown
KEY_MARK = "[api key]"


def _base64_cores(secret: bytes) -> list[str]:
    """The base64 characters (standard and URL-safe) fully determined by ``secret`` at each byte alignment."""
    cores: list[str] = []
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + secret + b"\0\0\0").decode("ascii")
        first_bit, end_bit = 8 * offset, 8 * (offset + len(secret))
        core = "".join(c for i, c in enumerate(encoded) if 6 * i >= first_bit and 6 * i + 6 <= end_bit)
        cores += [core, core.replace("+", "-").replace("/", "_")]
    return cores


def secret_forms(secret: str) -> list[str]:
    """Every form of ``secret`` that `scrub` looks for (module docstring)."""
    raw = secret.encode("utf-8")
    forms = [secret, quote(secret, safe=""), quote_plus(secret, safe=""), raw.hex(), raw.hex().upper()]
    forms += [re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), f) for f in forms[1:3]]
    forms += _base64_cores(raw)
    return list(dict.fromkeys(f for f in forms if f))


def scrub(text: str, secret: str) -> str:
    """``text`` with every run of >= `FRAGMENT_CHARS` characters of any form of ``secret`` replaced by `KEY_MARK`."""
    if not secret or len(secret) < MIN_SECRET_CHARS or not text:
        return text
    n = min(FRAGMENT_CHARS, len(secret))
    grams = {f[i : i + n] for f in secret_forms(secret) for i in range(len(f) - n + 1)}
    covered = [False] * len(text)
    for i in range(len(text) - n + 1):
        if text[i : i + n] in grams:
            covered[i : i + n] = [True] * n
    out: list[str] = []
    for i, ch in enumerate(text):
        if not covered[i]:
            out.append(ch)
        elif i == 0 or not covered[i - 1]:
            out.append(KEY_MARK)
    return "".join(out)


def printable(text: str) -> str:
    """``text`` with control (non-printable) characters replaced by spaces: no terminal escapes in logs."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def cut(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, an ellipsis marking a cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def safe_excerpt(text: str, secret: str, limit: int = EXCERPT_CHARS) -> str:
    """A text fit to log and store: scrubbed of ``secret``, control characters dropped, cut to ``limit``."""
    return cut(printable(scrub(text, secret)), limit)


def _error_type(body: str) -> str | None:
    """``error.type`` (else ``error.code``) of an OpenAI-style JSON error body, if it has one."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return None
    for field in ("type", "code"):
        value = error.get(field)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return None


def _message(body: str) -> str:
    """``error.message`` of a JSON error body when there is one (the readable part), else the body."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else body


def describe_error_body(status: int, body: str | bytes, secret: str, excerpt_chars: int = EXCERPT_CHARS) -> str:
    """What of an upstream's error reply may be logged and stored: ``HTTP <status>, type <t>, <n> bytes,
    sha256 <prefix>: <excerpt>``; the excerpt scrubbed of ``secret`` and cut to ``excerpt_chars`` (0: none)."""
    raw = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
    text = raw.decode("utf-8", "replace")
    parts = [f"HTTP {status}"]
    error_type = _error_type(text)
    if error_type is not None:
        parts.append(f"type {safe_excerpt(error_type, secret, ERROR_TYPE_CHARS)!r}")
    parts.append(f"{len(raw)} bytes, sha256 {hashlib.sha256(raw).hexdigest()[:DIGEST_HEX_CHARS]}")
    summary = ", ".join(parts)
    excerpt = safe_excerpt(_message(text), secret, excerpt_chars) if excerpt_chars > 0 else ""
    return f"{summary}: {excerpt}" if excerpt else summary
