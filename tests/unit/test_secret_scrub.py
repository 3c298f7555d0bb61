"""The API-key scrubber (scorers/secret_scrub.py): the key in every form an upstream could echo it never survives."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote, quote_plus

import pytest

from scorers.secret_scrub import EXCERPT_CHARS, FRAGMENT_CHARS, KEY_MARK, describe_error_body, scrub

# A key with characters that URL-encoding and base64's two alphabets treat differently.
KEY = "sk-proj-Zq8/+x~Tv3L0pW9mN2bR7cY4hJ6kE1dF"


def _encodings(key: str) -> dict[str, str]:
    """The key as an upstream could echo it, computed here independently of the scrubber."""
    raw = key.encode()
    forms = {"plain": key, "quote": quote(key, safe=""), "quote_plus": quote_plus(key, safe=""), "hex": raw.hex()}
    forms["HEX"] = raw.hex().upper()
    forms["quote_lower"] = quote(key, safe="").lower()  # lower-case escapes, and the key itself lower-cased
    for prefix in ("", "a", "ab", "Bearer "):  # every byte alignment of the key inside the encoded text
        for name, encode in (("b64", base64.b64encode), ("b64url", base64.urlsafe_b64encode)):
            encoded = encode((prefix + key).encode()).decode()
            forms[f"{name}[{prefix!r}]"] = encoded
            forms[f"{name}[{prefix!r}] unpadded"] = encoded.rstrip("=")
    return forms


def _fragments(text: str, n: int = FRAGMENT_CHARS) -> set[str]:
    return {text[i : i + n] for i in range(len(text) - n + 1)}


def _key_core(form: str, name: str) -> str:
    """The part of an encoded form that the key alone determines (what must go): for base64 with a prefix, the
    characters after the prefix's group, before the last (padded) group."""
    if name.startswith("b64"):
        return form[4:-4]
    return form


@pytest.mark.parametrize("name", list(_encodings(KEY)))
def test_no_form_of_the_key_survives(name: str) -> None:
    form = _encodings(KEY)[name]
    if name == "quote_lower":
        form = quote(KEY, safe="").replace("%2F", "%2f").replace("%2B", "%2b").replace("%7E", "%7e")
    text = f'{{"error": {{"message": "bad auth header {form} from 10.0.0.1"}}}}'
    out = scrub(text, KEY)
    assert KEY_MARK in out
    leaked = _fragments(_key_core(form, name)) & _fragments(out)
    assert leaked == set(), f"{name}: {sorted(leaked)[:3]} survived in {out!r}"
    assert out.startswith('{"error": {"message": "bad auth header ') and out.endswith(' from 10.0.0.1"}}')


def test_any_run_of_eight_key_characters_goes_and_shorter_ones_stay() -> None:
    for start in range(len(KEY) - FRAGMENT_CHARS + 1):
        for end in (start + FRAGMENT_CHARS, len(KEY)):
            out = scrub(f"x {KEY[start:end]} y", KEY)
            assert out == f"x {KEY_MARK} y", (start, end, out)
    short = KEY[3 : 3 + FRAGMENT_CHARS - 1]
    assert scrub(f"x {short} y", KEY) == f"x {short} y"  # 7 characters are not a key fragment: ordinary text stays


def test_text_without_the_key_is_unchanged_and_no_key_scrubs_nothing() -> None:
    text = "Error code: 500 - upstream overloaded, try again"
    assert scrub(text, KEY) == text
    assert scrub(f"x {KEY}", "") == f"x {KEY}"


def test_an_error_body_is_kept_as_status_type_size_digest_and_a_bounded_excerpt() -> None:
    secret_b64 = base64.b64encode(f"Bearer {KEY}".encode()).decode()
    body = json.dumps({"error": {"message": f"auth {secret_b64} " + "x" * 5000, "type": "server_error", "code": 1}})
    described = describe_error_body(500, body, KEY)
    assert described.startswith(f"HTTP 500, type 'server_error', {len(body.encode())} bytes, sha256 ")
    summary, excerpt = described.split(": ", 1)
    assert len(excerpt) <= EXCERPT_CHARS and excerpt.startswith(f"auth QmVhcmVyIH{KEY_MARK}")
    assert _fragments(secret_b64[12:-4]) & _fragments(described) == set()
    assert _fragments(KEY) & _fragments(described) == set()


def test_a_non_json_body_and_a_hostile_error_type() -> None:
    described = describe_error_body(502, "<html>\x1b]0;pwned\x07 bad gateway " + KEY + "</html>", KEY)
    assert described.startswith("HTTP 502, ") and "type" not in described.split(":")[0]
    assert "\x1b" not in described and "\x07" not in described and KEY[:FRAGMENT_CHARS] not in described
    hostile = json.dumps({"error": {"type": KEY + "y" * 200}})
    described = describe_error_body(400, hostile.encode(), KEY)
    assert KEY[:FRAGMENT_CHARS] not in described and len(described) < 300
    assert describe_error_body(500, b"", KEY).startswith("HTTP 500, 0 bytes, sha256 e3b0c44298fc")
