"""A parameterised statement as the audit log keeps it: its text and the values it was run with.

The statement's text alone, with its ``?`` (``$1``, ``$name``) placeholders, would not tell an
auditor which cells ``SELECT COUNT(*) FROM persons WHERE region = ? AND age = ?`` asked, nor
tell apart the thousand askings of it with other values (issue 18). So the values follow the
text on a line of their own,
``-- parameters: 'R01', 42``, written as the literals the guard bound in their place
(:func:`sqlsdc.guard.parse.literal`: ``'R01'``, ``42``, ``1.5``, ``TRUE``, ``NULL``,
``CAST('2020-01-02' AS DATE)``; a list of ``= ANY(?)`` as ``[..., ...]``; named ones as
``$name = value``, sorted by name), so the entry is the statement that ran: a value shows its
type, and one value has one spelling (canonical).

The line is always the entry's last (a statement's own text may hold a comment that reads
like it; only the last one is the values'). One line, whatever the values hold: a backslash,
a control character or a line separator in them is written as a JSON escape (``\\n``,
``\\u2028``), so a value cannot end the comment and put text on lines of the entry that
look like the statement's own. About
:data:`AUDITED_PARAMETER_CHARACTERS` characters are kept: when the values are longer, each
keeps an equal share (at least 96 characters), the longer ones as their start, their length
and their SHA-256 (the values still identify the query; a megabyte value does not grow the log
by a megabyte, nor hides the values after it); only a line of more values than shares is cut
as a whole. What is kept is counted by the
statement rate (:mod:`sqlsdc.guard.statement_rate`), which reads this text.

Values are only the analyst's own: nothing of the policy, its secret or a cell key is here.
A value the guard cannot bind (an unsupported type) is written ``<TYPE value>`` by its type's
name, never by its ``repr`` (the analyst's code).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence

from sqlsdc.guard.list_parameters import is_list
from sqlsdc.guard.parse import literal

__all__ = ["AUDITED_PARAMETER_CHARACTERS", "audited_text", "snapshot"]

AUDITED_PARAMETER_CHARACTERS = 4_096
"""Characters of a statement's parameter line the audit log keeps whole."""

_PREFIX = "\n-- parameters: "
_NAME = 64  # characters of an unsupported value's type name shown


def snapshot(params):
    """``params`` as a built-in tuple or dict when it is another sequence or mapping, read
    once by position (by key): what the guard binds and what the audit log writes are then
    the same values, even from an object whose ``__getitem__`` answers differently each time.
    Anything else (None, a list, tuple or dict, a str, an object the guard refuses, one whose
    reading fails) is returned as it is, for the guard to bind or refuse."""
    if type(params) in (type(None), list, tuple, dict) or isinstance(params, str | bytes):
        return params
    try:
        if isinstance(params, Mapping):
            return {key: params[key] for key in list(params)}
        if isinstance(params, Sequence) and not isinstance(params, bytearray):
            return tuple(params[i] for i in range(len(params)))
    except Exception:  # noqa: BLE001 - the analyst's object: the guard says what is wrong
        return params
    return params


def audited_text(sql: str, params) -> str:
    """``sql`` with its parameters' line, as the audit log keeps it: none for no parameters,
    unless the statement's own text holds a line that reads like one, which would then be the
    entry's last (``(none)`` follows it, so that the last line is always the guard's)."""
    if params is None or (type(params) in (list, tuple, dict) and not params):
        return f"{sql}{_PREFIX}(none)" if _reads_like_values(sql) else sql
    parts = [_one_line(part) for part in _values(params)]
    if sum(map(len, parts)) + 2 * len(parts) > AUDITED_PARAMETER_CHARACTERS:
        # each value keeps its share, so that a long list does not hide the values after it
        # (red team s46j: 1,000 'R01' in = ANY(?) left the next parameter, an age, unwritten)
        share = max(AUDITED_PARAMETER_CHARACTERS // len(parts), _SHARE)
        parts = [_shortened(part, share) for part in parts]
    line = ", ".join(parts)
    if len(parts) > AUDITED_PARAMETER_CHARACTERS // _SHARE:  # more values than shares
        line = _shortened(line, AUDITED_PARAMETER_CHARACTERS)
    return f"{sql}{_PREFIX}{line}"


_SHARE = 96  # characters a value keeps at least when the line is shortened


def _shortened(text: str, keep: int) -> str:
    """``text``, or its first ``keep`` characters with its length and SHA-256 when longer (the
    value still identifies the query; a megabyte value does not grow the log by a megabyte)."""
    if len(text) <= keep:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{text[:keep]} ... [{len(text):,} characters in all; SHA-256: {digest}]"


_LIKE_VALUES = re.compile(r"\s*--\s*parameters\s*:", re.IGNORECASE)
_ANYWHERE = re.compile(r"--\s*parameters\s*:", re.IGNORECASE)


def _reads_like_values(sql: str) -> bool:
    """Whether a line of ``sql`` reads like the values' line: a line as a reader splits it
    (``str.splitlines``: ``\\r``, ``\\x0b``, ``\\x85``, ``\\u2028`` ... end lines too, not only
    ``\\n``; a ``--`` comment runs past them to the engine), spaces and case aside (red team
    s46j: ``...'R01'\\r-- parameters: 'R09'`` ended its entry with a forged values line)."""
    if _ANYWHERE.search(sql) is None:  # one scan of a long statement, no list of its lines
        return False
    return any(_LIKE_VALUES.match(line) for line in sql.splitlines())


def _values(params) -> list[str]:
    if type(params) is dict:
        return [f"${_key(k)} = {_value(v)}" for k, v in sorted(params.items(), key=_by)]
    if type(params) in (list, tuple):
        return [_value(v) for v in params]
    return [f"<{_type(params)} parameters>"]  # a str, or what the guard refuses to bind


def _by(item) -> str:
    return _key(item[0])


def _key(key) -> str:
    return str.__str__(key) if isinstance(key, str) else f"<{_type(key)} key>"


def _value(value) -> str:
    if is_list(value):
        return f"[{', '.join(_value(v) for v in value)}]"
    kind = type(value)
    if kind in _PLAIN:  # the common types written as literal() writes them, without sqlglot:
        # 1.4 us a value against 14 (a list of 1,000 values for = ANY(?) took 14 ms)
        try:
            return _PLAIN[kind](value)
        except (ValueError, UnicodeEncodeError):  # too many digits, a lone surrogate: as below
            pass
    try:
        return literal(value).sql(dialect="duckdb")
    except Exception:  # noqa: BLE001 - not bound either: the guard refuses the statement for it
        return f"<{_type(value)} value>"


def _string(value: str) -> str:
    if not value.isascii():
        value.encode("utf-8")  # a lone surrogate raises, as literal() refuses it
    return "'" + value.replace("'", "''") + "'"


def _float(value: float) -> str:
    if value != value or value in (math.inf, -math.inf):
        raise ValueError("not finite: literal() writes a cast")
    return float.__repr__(value)


_PLAIN = {
    type(None): lambda _: "NULL",
    bool: lambda value: "TRUE" if value else "FALSE",
    int: int.__repr__,
    float: _float,
    str: _string,
}


def _type(value) -> str:
    return type(value).__name__[:_NAME]


def _one_line(text: str) -> str:
    """``text`` with backslashes, control characters and line separators as JSON escapes
    (and nothing else changed), so it stays on its line and reads back unambiguously."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(json.dumps(c)[1:-1] if c == "\\" or not c.isprintable() else c for c in text)
