"""The name a function was called by in the statement, for refusal messages.

sqlglot reads many spellings as one function and prints its own: ``to_char(age, '999')``
becomes a ``CAST``, ``nvl`` and ``ifnull`` ``COALESCE``, ``string_agg`` and ``group_concat``
``LISTAGG``, ``substr`` ``SUBSTRING``. A refusal that said "function cast() is not allowed"
named a function the analyst never wrote. So the parse step records, on each function node,
the name as written: from the position sqlglot keeps of the name's token, or, for the few
spellings it parses without one, from the statement's text when exactly one of their names
is called there. Messages name the function by it (:func:`written_name`), the guard's and the
Spark engine's alike: the engine re-reads a protected tree from its SQL, and
:func:`carry_names` gives the copy the names of the nodes it was printed from (a module of its
own, below both the planner and the engines, which may not import the planner).
"""

from __future__ import annotations

import re

from sqlglot import exp

WRITTEN = "sqlsdc_written"  # meta key: the function's name as the statement spells it

_UNPOSITIONED = {  # functions sqlglot parses without the position of their name
    exp.GroupConcat: ("string_agg", "group_concat", "listagg"),
    exp.If: ("if", "iif"),
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CALLED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\(")
_KEYWORD_CALLS = {"CAST", "TRY_CAST", "EXTRACT", "POSITION"}  # not a call of that function


def remember_names(walked: list[exp.Expr], text: str) -> None:
    """Record on every function node of ``walked`` (a parsed tree's nodes) its name as
    ``text``, the statement sqlglot parsed, writes it."""
    called: dict[type, str | None] = {}  # unpositioned class -> its one name in the text
    for node in walked:
        if not isinstance(node, exp.Func) or isinstance(node, exp.Anonymous):
            continue
        meta = node.meta
        start, end = meta.get("start"), meta.get("end")
        if start is not None and end is not None:
            name = text[start : end + 1]
            if _NAME.fullmatch(name):
                meta[WRITTEN] = name
            continue
        names = _UNPOSITIONED.get(type(node))
        if names is not None:
            if type(node) not in called:
                called[type(node)] = _one_called(names, text)
            if called[type(node)] is not None:
                meta[WRITTEN] = called[type(node)]


def _one_called(names: tuple[str, ...], text: str) -> str | None:
    found = {
        m.group(1).lower()
        for m in re.finditer(rf"\b({'|'.join(names)})\s*\(", text, flags=re.IGNORECASE)
    }
    return found.pop() if len(found) == 1 else None


def carry_names(source: exp.Expr, reread: exp.Expr) -> exp.Expr:
    """``reread``, a tree parsed from ``source``'s DuckDB SQL (which keeps no meta), with the
    written names of ``source``'s functions on its nodes that print as they do (a name is
    carried only where the nodes printing alike were written alike). Returns ``reread``."""
    kinds = {type(n) for n in source.walk() if isinstance(n, exp.Func) and n.meta.get(WRITTEN)}
    named: dict[tuple[type, str], set[str | None]] = {}  # a node unnamed counts as None
    for tree in (source, reread):
        for node in tree.walk() if kinds else ():
            if type(node) in kinds:
                key = (type(node), node.sql("duckdb"))
                if tree is source:
                    named.setdefault(key, set()).add(node.meta.get(WRITTEN))
                elif len(names := named.get(key, ())) == 1 and None not in names:
                    node.meta[WRITTEN] = next(iter(names))
    return reread


def written_name(node: exp.Expr) -> str | None:
    """``node``'s name as the statement wrote it, lower case; None when not known."""
    if isinstance(node, exp.Anonymous):
        return node.name.lower()
    written = node.meta.get(WRITTEN) if isinstance(node, exp.Func) else None
    return written.lower() if written else None


def spelled_sql(node: exp.Expr, dialect: str = "duckdb", limit: int = 80) -> str:
    """The start of ``node``'s SQL for a refusal, its function named as the statement wrote
    it (``string_agg(persons.region, ',')``, not ``LISTAGG(...)``), and "read as" where
    sqlglot reads the call as another construct (``to_char(age, '999')`` as a CAST)."""
    text = node.sql(dialect)[:limit]
    written = written_name(node)
    if written is None or isinstance(node, exp.Anonymous):
        return text
    called = _CALLED.match(text)
    if called is not None and called.group(1).upper() not in _KEYWORD_CALLS:
        return written + text[called.end(1) :]
    return f"{written}(...), read as {text}"
