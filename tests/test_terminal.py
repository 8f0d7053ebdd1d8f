"""Text from data printed on a terminal: every control character shown as an escape."""

import json

from kgreasoner.terminal import json_line, printable


def test_printable_escapes_c0_c1_del_and_bidi_overrides_and_keeps_tabs():
    assert printable("a\x1b[2Jb\x07\x7f\x9b\u202e\u2066\tc") == "a\\x1b[2Jb\\x07\\x7f\\x9b\\u202e\\u2066\tc"
    assert printable("one\r\ntwo") == "one\\r\\ntwo"
    assert printable("one\ntwo\x1b", lines=True) == "one\ntwo\\x1b"
    assert printable("Zürich — 東京") == "Zürich — 東京"


def test_a_json_line_reads_back_the_same_and_holds_no_raw_control_character():
    value = {"label": "a\x1b[2J\x9b31m\u202e\x7f", "name": "Zürich\n"}
    line = json_line(value)
    assert json.loads(line) == value
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in line)
    assert "Zürich" in line
