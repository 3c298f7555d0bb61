"""What the commands print: stored strings made safe for a terminal."""

from __future__ import annotations


def shown(text: str) -> str:
    """A stored string as the terminal may print it: control characters (an ESC or BEL in a conversation id or an
    attribute could clear the screen or retitle the terminal) written as escapes, ``\\x1b``."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
