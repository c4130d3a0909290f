"""A Ray job's log, made inert before it reaches a terminal or a CI log.

The log is untrusted: a terminal obeys escape sequences (title, OSC 52 clipboard, cursor moves,
queries) and GitHub Actions obeys lines starting with `::` (`##[` the older form). Colour (SGR) is
kept; every other escape sequence and control character but newline and tab, a lone carriage return
and the Unicode bidirectional overrides are removed; a would-be workflow command gets `> ` in front.
"""

from __future__ import annotations

import re

_SGR = re.compile(r"\x1b\[[0-9;]*m")
_ESCAPE = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"      # OSC (title, hyperlink, clipboard), to BEL or ST
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"          # DCS, SOS, PM, APC strings
    r"|\x1b\[[0-?]*[ -/]*[@-~]"                # CSI (cursor, erase, queries, ...)
    r"|\x1b[ -/]*[0-~]?"                       # any other escape
)
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_COMMAND = re.compile(r"^(\s*)(::|##\[)", re.MULTILINE)


def inert(text: str) -> str:
    """`text` with only newlines, tabs, printable characters and colour left, no line a CI command."""
    text = text.replace("\r\n", "\n")
    parts, last = [], 0
    for colour in _SGR.finditer(text):
        parts += [_strip(text[last:colour.start()]), colour.group(0)]
        last = colour.end()
    parts.append(_strip(text[last:]))
    return _COMMAND.sub(r"\1> \2", "".join(parts))


def _strip(text: str) -> str:
    return _CONTROL.sub("", _ESCAPE.sub("", text.replace("\r", "\n")))


class InertLines:
    """`inert` over a stream of chunks: only whole lines go out, so a command or an escape sequence
    split across two chunks is still seen whole."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, chunk: str) -> str:
        """The whole lines `chunk` completes, made inert; a trailing partial line waits."""
        lines, newline, self._pending = (self._pending + chunk).rpartition("\n")
        return inert(lines + newline)

    def flush(self) -> str:
        """What is left at the end of the stream (a last line without a newline)."""
        rest, self._pending = self._pending, ""
        return inert(rest)
