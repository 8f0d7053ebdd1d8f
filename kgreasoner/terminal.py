"""Text from data (KB labels, questions, model output, request fields) made safe to print on a terminal.

A label holding an ANSI escape (`\x1b[2J`, `\x1b]0;...`) printed raw would clear the screen, retitle
the window or hide the lines before it; a newline would forge a line of its own. `printable` writes
every C0 and C1 control character, DEL and the bidirectional overrides (which reorder what is shown)
as a visible escape instead: `\x1b`, `\u202e`.
"""

from __future__ import annotations

_BIDI = [*range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = (
    {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
    | {0x0A: "\\n", 0x0D: "\\r"}
    | {code: f"\\u{code:04x}" for code in _BIDI}
)
_FIELD = {code: text for code, text in _ESCAPES.items() if code != 0x09}
_LINES = {code: text for code, text in _FIELD.items() if code != 0x0A}


# JSON escapes C0 itself; DEL, C1 and the overrides are legal raw in its strings, so `json_line` escapes them
_JSON = {code: f"\\u{code:04x}" for code in [0x7F, *range(0x80, 0xA0), *_BIDI]}


def json_line(value: object) -> str:
    """`value` as one line of JSON (non-ASCII kept) with no character a terminal acts on."""
    import json

    return json.dumps(value, ensure_ascii=False).translate(_JSON)


def printable(text: str, lines: bool = False) -> str:
    """`text` with its control characters escaped (a tab kept); `lines`: newlines kept too (a message of
    several lines), else escaped (one field of a line)."""
    return text.translate(_LINES if lines else _FIELD)
