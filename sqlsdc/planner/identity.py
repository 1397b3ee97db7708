"""Canonical cell identity: what population an aggregation tabulates, independent of spelling.

Every mechanism that keys anything by "the same cell" (DP noise seeds and the DP cell cache,
the privacy ledger, CKM consistency checks, caches of any engine) must agree on when two
aggregations are the same. Keying by aliases, output names or the text of one SELECT is
unsafe: ``SELECT region, COUNT(*) FROM (SELECT * FROM t WHERE month < 6) x GROUP BY region``
and the same with ``month >= 6`` have the same outer SELECT but different populations, and
two draws of the same noise on different populations give their exact difference.

:func:`aggregation_identity` describes one aggregation scope of a qualified, analysed tree
(:mod:`sqlsdc.planner.analyze`) as canonical JSON, from the tree alone (no database, no engine):

* **relations**: the base tables read, by name; a table read more than once gets ``#k`` labels
  in the order of appearance. A source that cannot be flattened (an aggregation, a set
  operation, a SELECT with DISTINCT/LIMIT/windows) is one relation described recursively by
  its whole canonical query, so its predicates, groups and limits are all part of the identity.
* **predicates**: *every* condition between the base tables and the aggregation: the WHERE and
  the inner-join ON conditions of the aggregation and of every row-level derived table and CTE
  it reads (inner joins and plain row-level SELECTs are flattened: a WHERE inside a derived
  table is the same population as the same WHERE outside). Columns are replaced by the base
  expression they stand for (``label.column``, aliases and output names gone); the conjunction
  is simplified with sqlglot's ``simplify`` (semantics-preserving rewrites under SQL's
  three-valued logic: ``6 > m`` is ``m < 6``, ``NOT m < 6`` is ``m >= 6``, absorption) and,
  when small, put in conjunctive normal form (``normalize``); conjuncts are then deduplicated
  and sorted, so ``a AND b`` and ``b AND a`` are one population. simplify sees the logic
  only, every value an opaque placeholder (:func:`_logic`): it folds constants as Python
  computes them, not as DuckDB does, and ``1.0 / 3 * 3 = 1`` (TRUE to DuckDB, FALSE to it)
  made ``x = 1 OR 1.0 / 3 * 3 = 1``, every row, the population ``x = 1``.
  Outer joins are not flattened: their sources, sides and ON conditions are kept in order.
  A row-level derived table or CTE with outer joins that is the whole FROM of the SELECTs
  above it is read as its joins written there (``FROM (SELECT ... FROM a LEFT JOIN b ON c) t
  WHERE p`` is ``FROM a LEFT JOIN b ON c WHERE p``: WHERE applies after FROM either way);
  beside another source or join it stays one opaque relation.
* **keys**: the canonical base expression of every GROUP BY key (in the order given).
* **aggregates**: the canonical text of every aggregate call (function, DISTINCT, arguments on
  base columns).

Soundness is one-sided by design: two spellings of one population should get one identity, but
when in doubt (self-joins in another order, a renamed output of an opaque subquery, predicates
the simplifier cannot equate) they get different identities, which costs budget but never
privacy. Two different populations never get the same identity unless sqlglot's simplifier
rewrites a predicate into one of different meaning; it is only applied to conditions the
guard's allowlist accepted.

The parts: :mod:`sqlsdc.planner.population` (the relations and predicates of an inner-join
block, columns resolved to their base expressions), :mod:`sqlsdc.planner.canonical_conditions`
(predicates simplified, sorted and deduplicated) and :mod:`sqlsdc.planner.canonical_text` (the
dialect, JSON and digest they are written in); this module describes whole aggregations and
queries.

Example:
    >>> import sqlglot
    >>> from sqlglot.optimizer.annotate_types import annotate_types
    >>> from sqlglot.optimizer.qualify import qualify
    >>> from sqlglot.optimizer.scope import build_scope
    >>> schema = {"t": {"region": "VARCHAR", "month": "INT"}}
    >>> def population(sql):
    ...     tree = qualify(sqlglot.parse_one(sql, read="duckdb"), schema=schema, dialect="duckdb")
    ...     annotate_types(tree, schema=schema)  # as the guard's analysis does
    ...     return aggregation_identity(build_scope(tree)).population.text
    >>> json.loads(population("SELECT region, COUNT(*) FROM t WHERE month < 6 GROUP BY 1"))
    {'predicates': ['"t"."month" < 6'], 'relations': [{'label': 't', 'table': 't'}]}
    >>> population("SELECT x.region, COUNT(*) FROM t AS x WHERE 'a' = x.region AND 6 > x.month "
    ...            "GROUP BY 1") == population(
    ...     "SELECT region, COUNT(*) FROM (SELECT * FROM t WHERE region = 'a') AS s "
    ...     "WHERE s.month < 6.0 GROUP BY 1")
    True
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.engines.trees import nodes
from sqlsdc.planner.canonical_text import _SET_OPERATIONS, DIALECT, _json, _sha
from sqlsdc.planner.population import Population, _Block, _output, output_reference

__all__ = [
    "AggregationIdentity",
    "Population",
    "aggregation_identity",
    "describe_scope",
    "output_reference",
]

VERSION = 1


@dataclass(frozen=True)
class AggregationIdentity:
    """Population, canonical group keys and aggregates of one aggregation scope."""

    population: Population
    keys: tuple[str, ...]
    aggregates: tuple[str, ...]
    text: str = field(repr=False)  # canonical JSON of the whole aggregation
    digest: str = ""  # SHA-256 of text, hex

    def key(self, i: int) -> str:
        return self.keys[i]


def aggregation_identity(
    scope: Scope,
    keys: list[exp.Expr] | None = None,
    aggregates: list[exp.Expr] | None = None,
    population: Population | None = None,
) -> AggregationIdentity:
    """The canonical identity of the aggregation ``scope`` (a SELECT of a qualified tree).

    ``keys`` and ``aggregates`` are nodes of that SELECT (default: its GROUP BY expressions
    and no aggregates); each gets its canonical text in the same order. Extra expressions of
    the scope can be canonicalised later with :func:`canonical_expression`. ``population``,
    when given, is that of an earlier identity of the same scope (it depends on the scope
    only), so that a second identity of one check does not describe it again.
    """
    describer = _Describer()
    block = describer.block(scope)
    if keys is None:
        keys = _group_parts(scope.expression)
    key_texts = tuple(block.text(k) for k in keys)
    aggregate_texts = tuple(block.text(a) for a in aggregates or [])
    population = population or block.population()
    doc = {
        "v": VERSION,
        "population": json.loads(population.text),
        "keys": list(key_texts),
        "aggregates": list(aggregate_texts),
    }
    text = _json(doc)
    return AggregationIdentity(population, key_texts, aggregate_texts, text, _sha(text))


def canonical_expression(scope: Scope, node: exp.Expr) -> exp.Expr:
    """``node`` (an expression of ``scope``) with every column replaced by the canonical base
    expression it stands for; a new tree. Base columns are ``"label"."column"``."""
    return _Describer().block(scope).expression(node)


def describe_scope(scope: Scope) -> dict:
    """Canonical description of any query scope (SELECT or set operation), as a JSON value."""
    return _Describer().query(scope)


# --- implementation --------------------------------------------------------------------------


def _outputs_by_position(node: exp.Expr, query: exp.Query) -> str:
    """The text of ``node`` (a clause of the set operation ``query``) with every reference
    to an output by name written as its position."""
    copy = node.copy()
    for column in [n for n in nodes(copy) if isinstance(n, exp.Column)]:
        position = _output(query, column)
        if position is not None:
            if column is copy:
                return position.sql(DIALECT)
            column.replace(position)
    return copy.sql(DIALECT)


class _Describer:
    """Builds canonical descriptions; one per identity (labels are local to it)."""

    def block(self, scope: Scope) -> _Block:
        block = _Block(self)
        block.add_select(scope)
        return block

    def query(self, scope: Scope) -> dict:
        """Full canonical description of a query scope (used for opaque relations)."""
        node = scope.expression
        if isinstance(node, _SET_OPERATIONS):
            parts = [self.query(s) for s in scope.set_operation_scopes]
            return {
                "set": node.key,
                "distinct": bool(node.args.get("distinct")),
                "parts": parts,
                **self._tail(node, None),
            }
        block = self.block(scope)
        return {
            "population": json.loads(block.population().text),
            "select": [block.text(p.unalias()) for p in node.expressions],
            "group": [block.text(g) for g in _group_parts(node)],
            "having": block.predicate_text(node.args.get("having")),
            "distinct": block.text(node.args["distinct"]) if node.args.get("distinct") else None,
            "windows": any(isinstance(n, exp.Window) for n in node.walk()),
            **self._tail(node, block),
        }

    @staticmethod
    def _tail(node: exp.Expr, block: _Block | None) -> dict:
        """ORDER BY, LIMIT, OFFSET and QUALIFY of a query; a name of an output in them is
        its position (:func:`_output`), as the select list is described without names."""
        tail = {}
        order = node.args.get("order")
        if order is not None:
            tail["order"] = block.text(order) if block else _outputs_by_position(order, node)
        for key in ("limit", "offset", "qualify"):
            value = node.args.get(key)
            if value is not None:
                tail[key] = block.text(value) if block else _outputs_by_position(value, node)
        return tail


def _group_parts(select: exp.Select) -> list[exp.Expr]:
    group = select.args.get("group")
    if group is None:
        return []
    parts = list(group.expressions)
    for key in ("rollup", "cube", "grouping_sets"):
        parts += list(group.args.get(key) or [])
    return parts
