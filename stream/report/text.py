"""Stored text as a report may show it: without control characters, HTML-escaped on the page.

Conversation ids, attributes, rubric ids, judge names and scorer versions come from producers; a NUL or an ESC in
one went raw into the page (20 raw ESC characters in one report) and, through matplotlib's missing-glyph warnings,
to the terminal. Every data string the page or a chart shows goes through `printable` first.
"""

from __future__ import annotations

from html import escape


def printable(text: str) -> str:
    """``text`` without its control characters (NUL, ESC, BEL, DEL, C1, line and paragraph separators, ...): every
    character `str.isprintable` refuses is dropped, so what is left reads the same on a page, a chart or a terminal."""
    return "".join(ch for ch in text if ch.isprintable())


def html_text(text: str) -> str:
    """``text`` fit for the report page: control characters dropped, then HTML-escaped (quotes included)."""
    return escape(printable(text))
