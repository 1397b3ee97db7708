"""The text every canonical description is written in: DuckDB's SQL, sorted compact JSON and
its SHA-256 (:mod:`sqlsdc.planner.identity`)."""

from __future__ import annotations

import hashlib
import json

from sqlglot import exp

DIALECT = "duckdb"
_SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, (exp.Subquery, exp.Paren)):
        node = node.this
    return node
