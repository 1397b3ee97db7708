"""Which date parts and formats DuckDB 2.0 computes without error on every value of a type.

``EXTRACT(part FROM x)`` and ``STRFTIME(x, format)`` are total for most parts, but not all:
the week, ISO year and year-week of the earliest DATEs raise, and so do the nanoseconds and
the ``epoch_ms``/``epoch_us``/``epoch_ns`` of dates and timestamps far from today (they
overflow 64 bits; sqlglot even writes ``EXTRACT(nanosecond ...)`` as a cast to TIMESTAMP_NS);
the time zone of a DATE raises whenever it is evaluated; a TIME has no year, day or week; the
ISO week formats ``%G %U %V %W`` of the earliest DATEs raise. Any of these, evaluated on stored
values, would tell whether the cells hold such a value (found by the sweep of
``tests/security/test_error_oracle_sweep.py``). So the parts are an allowlist per type, judged
on the SQL that will run (sqlglot's spelling of the part), and anything else is refused.
"""

from __future__ import annotations

import re

from sqlglot import exp

DIALECT = "duckdb"
T = exp.DataType.Type

_CLOCK = {"EPOCH", "HOUR", "MINUTE", "SECOND", "MILLISECOND", "MICROSECOND"}
_CALENDAR = {
    "YEAR", "QUARTER", "MONTH", "DAY", "DAYOFWEEK", "WEEKDAY", "ISODOW", "DAYOFYEAR", "DECADE",
    "CENTURY", "MILLENNIUM", "MILLENNIA", "MILLENIUM", "ERA", "JULIAN",
}  # fmt: skip
_ZONE = {"TIMEZONE", "TIMEZONE_HOUR", "TIMEZONE_MINUTE"}
_WEEKS = {"WEEK", "WEEKS", "ISOYEAR", "YEARWEEK"}

TIMES = {T.TIME, T.TIMETZ}
PARTS: dict[str, set[str]] = {
    "date": _CLOCK | _CALENDAR,
    "timestamp": _CLOCK | _CALENDAR | _ZONE | _WEEKS,
    "time": _CLOCK | _ZONE,
    "unknown": _CLOCK,  # a value whose exact date/time type is not known: what all types allow
}
DATE_UNSAFE_FORMATS = set("GUVW")  # ISO week-based year and week numbers of the earliest dates


def _kind(dtype: T | None) -> str:
    if dtype is T.DATE:
        return "date"
    if dtype in TIMES:
        return "time"
    if dtype is None or dtype not in exp.DataType.TEMPORAL_TYPES:
        return "unknown"
    return "timestamp"


def extract_problem(node: exp.Extract, dtype: T | None) -> str | None:
    """Why ``EXTRACT`` of this part can raise on some value of type ``dtype``, or None."""
    written = re.match(r"EXTRACT\((\w+|'[^']*') FROM ", node.sql(DIALECT))
    if written is None:  # sqlglot computes the part otherwise (e.g. through a cast)
        return "this part is computed through casts that overflow for distant dates; use epoch"
    part, kind = written.group(1).strip("'").upper(), _kind(dtype)
    if part in PARTS[kind]:
        return None
    allowed = ", ".join(sorted(p.lower() for p in PARTS[kind]))
    return f"EXTRACT({part.lower()}) raises for some values of this type; allowed parts: {allowed}"


def strftime_problem(node: exp.TimeToStr, dtype: T | None) -> str | None:
    """Why ``STRFTIME`` with this format can raise on some value of type ``dtype``, or None."""
    if dtype is T.TIMESTAMP_S or dtype is T.TIMESTAMP_MS:
        return "STRFTIME converts the value to microseconds, which can overflow"
    fmt = node.args.get("format")
    if _kind(dtype) == "timestamp":
        return None
    if not isinstance(fmt, exp.Literal):
        return "the format must be a literal"
    specifiers = set(re.findall(r"%-?(.)", str(fmt.this)))
    unsafe = specifiers & DATE_UNSAFE_FORMATS
    if _kind(dtype) == "date" and not unsafe:
        return None
    if _kind(dtype) == "date":
        formats = ", ".join(f"%{s}" for s in sorted(unsafe))
        return f"STRFTIME {formats} of the earliest dates raises; use %Y, %m, %d or %j"
    return "STRFTIME of a value of unknown date/time type"
