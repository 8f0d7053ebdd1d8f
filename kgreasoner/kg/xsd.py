"""Whether a typed literal's text is a value of its XSD datatype (`"1815-13-45"^^xsd:date` is not).

pyoxigraph parses an ill-typed literal without a word and stores it; a SPARQL comparison or sort
then treats it as an error value, so a date that cannot exist silently drops out of a query. The
loaders ask `invalid_reason` of every distinct typed literal instead. Datatypes not listed here
(strings, language-tagged text, custom IRIs) are taken as written.
"""

from __future__ import annotations

import calendar
import re

XSD = "http://www.w3.org/2001/XMLSchema#"
_TZ = r"(Z|[+-](\d{2}):(\d{2}))?"
_YEAR = r"(-?\d{4,})"
_DATE = re.compile(_YEAR + r"-(\d{2})-(\d{2})" + _TZ)
_DATETIME = re.compile(_YEAR + r"-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?" + _TZ)
_GYEAR = re.compile(_YEAR + _TZ)
_GYEARMONTH = re.compile(_YEAR + r"-(\d{2})" + _TZ)
_INTEGER = re.compile(r"[+-]?\d+")
_DECIMAL = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")
_DOUBLE = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?INF|NaN")
INTEGER_TYPES = (
    "integer",
    "int",
    "long",
    "short",
    "byte",
    "nonNegativeInteger",
    "positiveInteger",
    "nonPositiveInteger",
    "negativeInteger",
    "unsignedLong",
    "unsignedInt",
    "unsignedShort",
    "unsignedByte",
)


def invalid_reason(value: str, datatype: str) -> str | None:
    """Why `value` is not a lexical form of `datatype` (a full IRI); None when it is, or the type is not checked."""
    if not datatype.startswith(XSD):
        return None
    kind = datatype[len(XSD) :]
    if kind == "date":
        match = _DATE.fullmatch(value)
        return "expected YYYY-MM-DD" if match is None else _bad_date(*match.group(1, 2, 3)) or _bad_zone(match, 4)
    if kind == "dateTime":
        match = _DATETIME.fullmatch(value)
        if match is None:
            return "expected YYYY-MM-DDThh:mm:ss"
        return _bad_date(*match.group(1, 2, 3)) or _bad_time(*match.group(4, 5, 6, 7)) or _bad_zone(match, 8)
    if kind == "gYear":
        match = _GYEAR.fullmatch(value)
        return "expected YYYY" if match is None else _bad_year(match.group(1)) or _bad_zone(match, 2)
    if kind == "gYearMonth":
        match = _GYEARMONTH.fullmatch(value)
        if match is None:
            return "expected YYYY-MM"
        return _bad_year(match.group(1)) or _bad_month(match.group(2)) or _bad_zone(match, 3)
    if kind in INTEGER_TYPES:
        return None if _INTEGER.fullmatch(value) else "expected an integer"
    if kind == "decimal":
        return None if _DECIMAL.fullmatch(value) else "expected a decimal number"
    if kind in ("double", "float"):
        return None if _DOUBLE.fullmatch(value) else "expected a floating-point number"
    if kind == "boolean":
        return None if value in ("true", "false", "1", "0") else "expected true, false, 1 or 0"
    return None


def _bad_year(year: str) -> str | None:
    return "year 0000 does not exist" if int(year) == 0 else None


def _bad_month(month: str) -> str | None:
    return None if 1 <= int(month) <= 12 else f"month {month} does not exist"


def _bad_date(year: str, month: str, day: str) -> str | None:
    problem = _bad_year(year) or _bad_month(month)
    if problem:
        return problem
    # XSD years are proleptic Gregorian with no year 0: year -1 is 1 BCE, a leap year like 0 in `calendar`.
    leap_year = int(year) + 1 if int(year) < 0 else int(year)
    days = calendar.monthrange(2000 if calendar.isleap(leap_year) else 2001, int(month))[1]
    return None if 1 <= int(day) <= days else f"day {day} does not exist in month {month}"


def _bad_time(hour: str, minute: str, second: str, fraction: str | None) -> str | None:
    if hour == "24" and minute == "00" and second == "00" and not (fraction or "").strip(".0"):
        return None  # 24:00:00 is the end of the day
    if int(hour) > 23 or int(minute) > 59 or int(second) > 59:
        return f"time {hour}:{minute}:{second} does not exist"
    return None


def _bad_zone(match: re.Match, group: int) -> str | None:
    if match.group(group) in (None, "Z"):
        return None
    hours, minutes = int(match.group(group + 1)), int(match.group(group + 2))
    if hours * 60 + minutes <= 14 * 60 and minutes < 60:
        return None
    return f"time zone {match.group(group)} does not exist"
