"""The id vocabulary every KG, dataset and reader shares.

Entities are strings. What the string is depends on the graph: a name (PathQuestion TSV), a Freebase mid
(`m.07srw`), a Wikidata id (`Q30`), or a literal. Literals use the N-Triples lexical form
(`"1987-03-02"^^<http://www.w3.org/2001/XMLSchema#date>`, `"42"`, `"Utah"@en`) so that one string identifies
one node in every store.

Relations in a path may carry a leading `^` to mean "follow the edge backwards" (as in SPARQL property
paths): `^people.person.nationality` goes from a country to its nationals.
"""

from __future__ import annotations

import re

INVERSE_PREFIX = "^"


def is_literal_id(entity: str) -> bool:
    """True when `entity` is written as an N-Triples literal (it starts with a double quote)."""
    return entity.startswith('"')


def literal_value(entity: str) -> str:
    """The lexical form of an N-Triples literal (`"42"^^<...#int>` -> `42`), its escapes read (`\\n`, `\\t`,
    `\\u001B`: pyoxigraph writes control characters so); other ids unchanged."""
    if not is_literal_id(entity):
        return entity
    end = entity.rfind('"')
    if end <= 0:
        return entity[1:]
    body = entity[1:end]
    if "\\" not in body:
        return body
    return _NT_ESCAPE.sub(_unescape, body)


_NT_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|([tbnrf\"'\\]))")
"""N-Triples' escapes in a literal: UCHAR (`\\uXXXX`, `\\UXXXXXXXX`) and ECHAR (`\\t`, `\\n`, `\\"`, ...)."""
_ECHAR = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1) or match.group(2)
    if code is None:
        return _ECHAR[match.group(3)]
    value = int(code, 16)
    return chr(value) if value <= 0x10FFFF else match.group()


def make_literal(value: str, datatype: str | None = None, lang: str | None = None) -> str:
    """The N-Triples form of a literal value, the inverse of `literal_value`."""
    body = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if datatype:
        return f'"{body}"^^<{datatype}>'
    if lang:
        return f'"{body}"@{lang}'
    return f'"{body}"'
