"""The ledger identity of released cells written in Python, byte for byte as DuckDB writes it.

The ledger keys each released cell by the JSON text of ``json_object('tables', to_json([...]),
['population', ...,] 'keys', json_object(name, value, ...))`` (:func:`sqlsdc.catalog.store.
ledger_insert`). DuckDB's JSON functions cost about 0.4 ms of a small query's ledger INSERT
(benchmarks/README.md, "DP fixed cost, session 37"); for values whose JSON text is plain this
module writes the same text, which the INSERT then takes as a parameter. Plain means: text of
printable ASCII without ``"`` or ``\\`` (written between quotes, nothing escaped), integers
(not booleans: DuckDB writes ``true``), and NULL (``null``). Anything else (other characters,
floats, decimals, dates, wide integers) returns None, and DuckDB writes the identity as before:
the differencing checks match ledger rows by this text, so it must never differ.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PLAIN = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' (0x22) and '\' (0x5C)


def _json(value) -> str | None:
    """DuckDB's JSON text of ``value``, or None when it is not plain."""
    if value is None:
        return "null"
    if type(value) is int:  # exactly int: bool is an int that DuckDB writes as true/false
        return str(value)
    if type(value) is str and _PLAIN.fullmatch(value):
        return f'"{value}"'
    return None


def identities(
    tables: Sequence[str],
    population: str | None,
    names: Sequence[str],
    columns: Sequence[list],
    rows: int,
) -> list[str] | None:
    """The identity text of each of ``rows`` rows (``columns``: the key columns' values, in
    the order of ``names``), or None when any table, key name, population or value is not
    plain."""
    words = [_json(t) for t in tables]
    head = [_json(n) for n in names]
    pop = _json(population) if population is not None else ""
    if None in words or None in head or pop is None:
        return None
    prefix = '{"tables":[' + ",".join(words) + "]"
    if population is not None:
        prefix += ',"population":' + pop
    prefix += ',"keys":{'
    if not columns:
        return [prefix + "}}"] * rows
    texts = []
    for values in zip(*columns, strict=True):
        words = [_json(v) for v in values]
        if None in words:
            return None
        texts.append(prefix + ",".join(f"{k}:{v}" for k, v in zip(head, words, strict=True)) + "}}")
    return texts
