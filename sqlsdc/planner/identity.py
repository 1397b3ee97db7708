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
* **keys**: the canonical base expression of every GROUP BY key (in the order given).
* **aggregates**: the canonical text of every aggregate call (function, DISTINCT, arguments on
  base columns).

Soundness is one-sided by design: two spellings of one population should get one identity, but
when in doubt (self-joins in another order, a renamed output of an opaque subquery, predicates
the simplifier cannot equate) they get different identities, which costs budget but never
privacy. Two different populations never get the same identity unless sqlglot's simplifier
rewrites a predicate into one of different meaning; it is only applied to conditions the
guard's allowlist accepted.

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

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from decimal import Context, Decimal, InvalidOperation

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.optimizer.normalize import normalization_distance, normalize
from sqlglot.optimizer.scope import Scope
from sqlglot.optimizer.simplify import simplify

from sqlsdc.engines.trees import nodes, of_kind, release
from sqlsdc.errors import InternalError
from sqlsdc.planner.connectors import balanced

__all__ = [
    "AggregationIdentity",
    "Population",
    "aggregation_identity",
    "describe_scope",
    "output_reference",
]

DIALECT = "duckdb"
VERSION = 1
MAX_CNF_DISTANCE = 64  # larger conditions keep their (simplified) shape rather than blow up
MAX_SIMPLIFY_NODES = 2_000  # larger conditions are not simplified (sqlglot's simplify compares
# the operands of a connector pairwise: quadratic); they keep their shape, a finer identity
_SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)
SUBQUERY_MARKER = "SQLSDC_SUBQUERY"
OUTPUT_MARKER = "SQLSDC_OUTPUT"  # an output by position (ORDER BY its alias)
_OPAQUE = "\x00value"  # the table of the placeholders simplify sees instead of values
_FLIPPED = {exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT,
            exp.LTE: exp.GTE}  # fmt: skip
_ROW_BLOCKERS = ("group", "having", "distinct", "limit", "offset", "qualify", "order")


@dataclass(frozen=True)
class Population:
    """The canonical population of an aggregation: base tables read and the JSON that
    defines which of their rows (joined how, filtered how) are tabulated."""

    tables: tuple[str, ...]  # base tables read (sorted, distinct), public ones included
    text: str  # canonical JSON of relations and predicates
    digest: str  # SHA-256 of text, hex


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


def _subquery(description: str) -> exp.Expr:
    """The canonical stand-in for a subquery: a call of a function no analyst can write (the
    allowlist refuses unknown functions), so that no literal, expression or column spells the
    same text. A string literal did: ``x = 'subquery:{...}'`` had the identity of
    ``x = (SELECT ...)`` over another population."""
    return exp.Anonymous(this=SUBQUERY_MARKER, expressions=[exp.Literal.string(description)])


def output_reference(query: exp.Query, column: exp.Column) -> int | None:
    """The position of the output that the unqualified ``column`` of ``query``'s ORDER BY
    names as DuckDB reads it, or None when DuckDB could read it otherwise (the guard refuses
    such a name). Alone as an ORDER BY key a name is the output; inside an expression DuckDB
    reads a column of the tables of that name first, so only an output that is that very
    column (``m`` of ``SELECT m ...``) is read the same either way."""
    names = list(query.named_selects)
    if column.table or column.name not in names:
        return None
    position = names.index(column.name)
    if isinstance(column.parent, exp.Ordered):
        return position
    itself = query.selects[position].unalias()
    same = isinstance(itself, exp.Column) and itself.name == column.name
    return position if same else None


def _output(query: exp.Query, column: exp.Column) -> exp.Expr | None:
    """The canonical stand-in for a reference to an output by name (an alias in ORDER BY):
    its position (:func:`output_reference`), by a call no analyst can write. The select list
    is described without its names, so ``SELECT a AS x, b AS y ... ORDER BY x LIMIT 1`` and
    ``SELECT a AS y, b AS x ... ORDER BY x LIMIT 1`` (other rows) had one description."""
    position = output_reference(query, column)
    if position is None:
        return None
    return exp.Anonymous(this=OUTPUT_MARKER, expressions=[exp.Literal.number(position)])


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


def _unresolved(column: exp.Column) -> InternalError:
    return InternalError(
        f"column {column.sql(DIALECT)} could not be resolved for the cell identity"
    )


def _json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, (exp.Subquery, exp.Paren)):
        node = node.this
    return node


def _is_inner(join: exp.Join) -> bool:
    side, kind = join.args.get("side"), (join.args.get("kind") or "").upper()
    return not side and kind in ("", "INNER", "CROSS") and not join.args.get("using")


def _flattenable(scope: Scope) -> bool:
    """A plain row-level SELECT: its rows are its sources' rows filtered (inner joins only)."""
    select = scope.expression
    if not isinstance(select, exp.Select):
        return False
    if any(select.args.get(k) for k in _ROW_BLOCKERS):
        return False
    if any(isinstance(n, (exp.AggFunc, exp.Window)) for p in select.expressions for n in p.walk()):
        return False
    return all(_is_inner(j) for j in select.args.get("joins") or [])


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


class _Block:
    """Relations and predicates of one inner-join block, with canonical column resolution.

    ``resolvers[id(scope)][alias]`` maps a source alias of a flattened scope to a function
    that turns a column name into its canonical expression.
    """

    def __init__(self, describer: _Describer):
        self.describer = describer
        self.relations: list[tuple[str, object]] = []  # (kind, descriptor) in order of appearance
        self.labels: list[str] = []
        self.predicates: list[tuple[exp.Expr, Scope]] = []  # in the scope they belong to
        self.outer: list[dict] = []  # joins of a SELECT with an outer join, in order
        self.resolvers: dict[int, dict[str, object]] = {}
        self.scopes: dict[int, Scope] = {}

    # -- building
    def add_select(self, scope: Scope) -> None:
        """Add the sources and conditions of ``scope``; plain row-level children joined by
        inner joins are flattened into this block. A SELECT with an outer join keeps its
        joins in order and flattens nothing (a condition of a null-supplying side does not
        commute with the join)."""
        select = scope.expression
        self.scopes[id(select)] = scope
        resolvers: dict[str, tuple] = {}
        self.resolvers[id(select)] = resolvers
        # a source's node is its Table, or the SELECT inside a derived table's parentheses
        joins = {id(_unwrap(j.this)): j for j in select.args.get("joins") or []}
        ordered = any(not _is_inner(j) for j in joins.values())
        for alias, (node, source) in scope.selected_sources.items():
            if isinstance(source, exp.Table):
                resolvers[alias] = ("relation", self._relation(("table", source.name.lower())))
            elif not ordered and _flattenable(source) and id(source.expression) not in self.scopes:
                # a CTE read twice is flattened once: its second reading is opaque (one scope
                # has one set of column resolutions, and both readings took the second's)
                self.add_select(source)
                resolvers[alias] = ("scope", source)
            else:
                described = ("query", self.describer.query(source))
                resolvers[alias] = ("relation", self._relation(described))
            join = joins.get(id(node))
            on = join.args.get("on") if join is not None else None
            if ordered and join is not None:
                self.outer.append({"join": join, "scope": scope, "relation": resolvers[alias]})
            elif on is not None:
                self.predicates.append((on, scope))
        where = select.args.get("where")
        if where is not None:
            self.predicates.append((where.this, scope))

    def _relation(self, descriptor: tuple[str, object]) -> int:
        self.relations.append(descriptor)
        return len(self.relations) - 1

    # -- labels
    def _label(self, index: int) -> str:
        if not self.labels:
            texts = [_json(list(d)) for d in self.relations]
            for i, (kind, value) in enumerate(self.relations):
                base = value if kind == "table" else "q" + _sha(texts[i])  # whole: no collision
                if texts.count(texts[i]) > 1:
                    base += f"#{texts[: i + 1].count(texts[i])}"
                self.labels.append(base)
        return self.labels[index]

    # -- canonical expressions
    def expression(self, node: exp.Expr, scope: Scope | None = None) -> exp.Expr:
        """A canonical copy of ``node`` of ``scope`` (default: the block's own select)."""
        scope = scope or next(iter(self.scopes.values()))
        return self._rebuild(node, scope)

    def _rebuild(self, node: exp.Expr, scope: Scope) -> exp.Expr:
        """A canonical copy of ``node`` of ``scope``: columns replaced by their canonical
        expressions, subqueries by their descriptions, parentheses kept (untyped), any other
        node copied with its type, without its comments. One walk with a stack, each copy's
        children linked as its constructor links them; a node of a class with a constructor of
        its own (which may change its arguments) is built by that constructor."""
        root = self._replaced(node, scope)
        if root is not None:
            return root
        root = _shell(node)
        stack = [(node, root)]
        push, pop = stack.append, stack.pop
        while stack:
            original, copy = pop()
            args = copy.args
            for key, value in original.args.items():
                if isinstance(value, exp.Expr):
                    child = self._child(value, scope, push)
                    child.parent, child.arg_key, child.index = copy, key, None
                    args[key] = child
                elif type(value) is list:
                    items = []
                    for index, item in enumerate(value):
                        if isinstance(item, exp.Expr):
                            child = self._child(item, scope, push)
                            child.parent, child.arg_key, child.index = copy, key, index
                            item = child
                        items.append(item)
                    args[key] = items
                else:
                    args[key] = value
        return root

    def _child(self, node: exp.Expr, scope: Scope, push) -> exp.Expr:
        """The canonical copy of ``node`` for :meth:`_rebuild`: its stand-in, or an empty
        shell that ``push`` schedules to be filled. What a class of node needs is looked up
        once per class (:func:`_handling`)."""
        handling = _HANDLING.get(node.__class__)
        if handling is None:
            handling = _handling(node.__class__)
        if handling is _REPLACED:
            child = self._replaced(node, scope)
            if child is not None:
                return child
            child = _shell(node)
        elif handling is _LITERAL and type(node.args.get("this")) is str:
            child = exp.Literal()  # its text and kind: no node below it to schedule
            child.args = node.args.copy()
            child._type = node.type
            return child
        else:
            child = node.__class__()
            if handling is _TYPED:
                child.type = node.type
        push((node, child))
        return child

    def _replaced(self, node: exp.Expr, scope: Scope) -> exp.Expr | None:
        """The canonical stand-in of a column or subquery, or the copy of a node whose class
        has its own constructor; None for a node :meth:`_rebuild` copies itself."""
        if isinstance(node, exp.Column):
            return self._column(node, scope)
        if isinstance(node, (exp.Subquery, exp.Select, *_SET_OPERATIONS)):
            inner = _unwrap(node)
            for sub in scope.subquery_scopes:
                if sub.expression is inner:
                    return _subquery(_json(self.describer.query(sub)))
            raise InternalError("a subquery could not be resolved for the cell identity")
        if type(node).__init__ is not _PLAIN_INIT:
            copy = node.__class__(
                **{
                    k: (
                        [self._rebuild(v, scope) if isinstance(v, exp.Expr) else v for v in value]
                        if isinstance(value, list)
                        else self._rebuild(value, scope)
                        if isinstance(value, exp.Expr)
                        else value
                    )
                    for k, value in node.args.items()
                }
            )
            copy.type = node.type
            return copy
        return None

    def _column(self, column: exp.Column, scope: Scope) -> exp.Expr:
        """The canonical expression of ``column`` of ``scope``. A column that resolves to
        nothing known is an error, never its verbatim text: ``"?q"."x"`` named whatever the
        alias ``q`` stood for, so two queries with two meanings of it shared one text."""
        resolvers = self.resolvers.get(id(scope.expression), {})
        how = resolvers.get(column.table)
        name = column.name.lower()
        if how is None and isinstance(scope.expression, exp.Select):
            position = _output(scope.expression, column)
            if position is not None:
                return position
        if how is None:
            raise _unresolved(column)
        if how[0] == "relation":
            index = how[1]
            kind, _value = self.relations[index]
            if kind == "query":  # an opaque relation: its output by position
                source = scope.sources[column.table]
                names = [p.alias_or_name for p in source.expression.selects]
                if column.name not in names:
                    raise _unresolved(column)
                name = f"${names.index(column.name)}"
            return _base_column(name, self._label(index), column.type)
        child: Scope = how[1]
        for projection in child.expression.expressions:
            if projection.alias_or_name == column.name:
                inner = self._rebuild(projection.unalias(), child)
                return inner if isinstance(inner, exp.Column) else exp.Paren(this=inner)
        raise _unresolved(column)

    def text(self, node: exp.Expr, scope: Scope | None = None) -> str:
        """The canonical text of ``node``: its canonical copy, a fresh tree read by nothing
        else, printed without a copy of its own (as :func:`_conjuncts` prints its conjuncts;
        a group key of thousands of nodes was copied once more to be printed) and freed."""
        canonical = _normalise_literals(self.expression(node, scope))
        text = Dialect.get_or_raise(DIALECT).generate(canonical, copy=False)
        release([canonical])
        return text

    def predicate_text(self, node: exp.Expr | None) -> list[str]:
        if node is None:
            return []
        condition = node.this if isinstance(node, exp.Having) else node
        return _conjuncts([self.expression(condition)])

    # -- the population
    def population(self) -> Population:
        predicates = _conjuncts([self._rebuild(p, s) for p, s in self.predicates])
        outer = []
        for item in self.outer:
            join: exp.Join = item["join"]
            on = join.args.get("on")
            _kind, index = item["relation"]
            outer.append({
                "side": (join.args.get("side") or "").upper(),
                "kind": (join.args.get("kind") or "").upper(),
                "relation": self._label(index),
                "on": _conjuncts([self._rebuild(on, item["scope"])]) if on is not None else [],
            })  # fmt: skip
        relations = []
        for i, (kind, value) in enumerate(self.relations):
            label = self._label(i)
            relations.append({"label": label, kind: value})
        if not outer:  # inner joins commute: the relations are a set
            relations.sort(key=_json)
        doc = {"relations": relations, "predicates": predicates}
        if outer:
            doc["joins"] = outer
        text = _json(doc)
        tables = tuple(sorted({v for k, v in self.relations if k == "table"}))
        return Population(tables, text, _sha(text))


def _base_column(name: str, label: str, dtype: exp.DataType | None) -> exp.Column:
    """``exp.column(name, table=label, quoted=True)`` typed ``dtype``: the node that
    ``exp.Column(this=exp.Identifier(this=name, quoted=True), table=exp.Identifier(...),
    db=None, catalog=None)`` builds, its arguments linked directly (a column per operand of
    a long chain)."""
    column, this, table = exp.Column(), exp.Identifier(), exp.Identifier()
    this.args["this"], this.args["quoted"] = name, True
    table.args["this"], table.args["quoted"] = label, True
    args = column.args
    args["this"], args["table"], args["db"], args["catalog"] = this, table, None, None
    this.parent, this.arg_key = column, "this"
    table.parent, table.arg_key = column, "table"
    column._type = dtype  # a DataType or None, as ``type`` gives it
    return column


_PLAIN_INIT = exp.Expr.__init__
_REPLACED, _TYPED, _UNTYPED, _LITERAL = "replaced", "typed", "untyped", "literal"
_HANDLING: dict[type, str] = {}


def _handling(kind: type) -> str:
    """How :meth:`_Block._rebuild` copies a node of class ``kind``: ``_REPLACED`` for a
    class :meth:`_Block._replaced` may replace (a column, a subquery, a class with a
    constructor of its own), ``_LITERAL`` for a literal (its arguments copied at once: a
    text and a flag), else as :func:`_shell` does: with its type, or untyped (a
    parenthesis). Cached per class."""
    if (
        issubclass(kind, (exp.Column, exp.Subquery, exp.Select, *_SET_OPERATIONS))
        or kind.__init__ is not _PLAIN_INIT
    ):
        found = _REPLACED
    elif kind is exp.Literal:
        found = _LITERAL
    else:
        found = _UNTYPED if issubclass(kind, exp.Paren) else _TYPED
    _HANDLING[kind] = found
    return found


def _shell(node: exp.Expr) -> exp.Expr:
    """An empty node of ``node``'s class for :meth:`_Block._rebuild` to fill: a parenthesis
    untyped, any other node with ``node``'s type."""
    shell = node.__class__()
    if not isinstance(node, exp.Paren):
        shell.type = node.type
    return shell


def _conjuncts(conditions: list[exp.Expr]) -> list[str]:
    """Sorted, deduplicated canonical conjuncts of the AND of ``conditions`` (fresh trees the
    caller hands over; they are changed)."""
    if not conditions:
        return []
    combined = exp.and_(*conditions, copy=False)
    used = [combined]  # every tree built here: only the texts are kept
    if _size(combined, MAX_SIMPLIFY_NODES + 1) <= MAX_SIMPLIFY_NODES:
        try:
            values: dict[str, exp.Expr] = {}
            simplified = simplify(_logic(combined, values), dialect=DIALECT)
            if normalization_distance(simplified, max_=MAX_CNF_DISTANCE) <= MAX_CNF_DISTANCE:
                simplified = simplify(normalize(simplified), dialect=DIALECT)
            used.append(simplified)
            combined = _with_values(simplified, values)
        except Exception:  # noqa: BLE001 - a simplifier failure keeps the unsimplified shape
            pass
    generator = _ReusingGenerator(dialect=Dialect.get_or_raise(DIALECT))
    parts = list(combined.flatten()) if isinstance(combined, exp.And) else [combined]
    texts = set()
    used += [combined, *parts]
    for part in parts:
        part = _unwrap(part)
        if isinstance(part, exp.Boolean) and part.this:
            continue  # TRUE constrains nothing
        changed: list[exp.Expr] = []
        literals: list[exp.Literal] = []
        canonical = _sort_commutative(part, generator, used, changed, literals)
        canonical = _normalise_literals(canonical, changed, literals)
        generator.forget(changed)
        used.append(canonical)
        texts.add(generator.generate(canonical, copy=False))
        generator.known.clear()
    release(used)
    return sorted(texts)


class _ReusingGenerator(Dialect.get_or_raise(DIALECT).generator_class):
    """DuckDB's generator that reuses the text of the OR operands it printed to sort them
    when it prints the sorted condition: a long OR chain is printed once, not twice.

    ``known`` maps ``id(node)`` to ``(node, text)``; an entry holds its node, so the id is
    not reused while it lives. :meth:`forget` drops the entries of a changed node's
    ancestors, whose text would not be that of the changed tree."""

    def __init__(self, **options):
        super().__init__(**options)
        self.known: dict[int, tuple[exp.Expr, str]] = {}

    def remember(self, node: exp.Expr) -> str:
        """The text of ``node`` (a node with a parent) as :meth:`generate` prints it."""
        text = self.sql(node)
        self.known[id(node)] = (node, text)
        return text.strip()  # what ``generate`` returns; ``sql`` prints nested nodes unstripped

    def forget(self, changed: list[exp.Expr]) -> None:
        for node in changed:
            while node is not None:
                self.known.pop(id(node), None)
                node = node.parent

    def sql(self, expression, key=None, comment=True) -> str:
        if key is None and comment:
            known = self.known.get(id(expression))
            if known is not None and known[0] is expression:
                return known[1]
        return super().sql(expression, key, comment)


def _logic(condition: exp.Expr, values: dict[str, exp.Expr]) -> exp.Expr:
    """The logical skeleton of ``condition`` for sqlglot's ``simplify``: AND, OR, NOT, TRUE,
    FALSE and comparisons (BETWEEN too), with every value and every other predicate replaced
    by an opaque placeholder column, one per distinct canonical text (``values``: placeholder
    name -> the node it stands for).

    simplify then applies only the laws of three-valued logic and of comparisons (absorption,
    De Morgan, ``NOT m < 6`` is ``m >= 6``, CNF). It never sees a value: its folding of
    constants follows Python, not DuckDB (``1.0 / 3 * 3 = 1`` is FALSE to it and TRUE to
    DuckDB; ``DATE '2020-01-31' + INTERVAL 36 HOUR`` loses its hours), so a folded condition
    could name another population. A new tree; ``condition`` is not changed."""

    def placeholder(node: exp.Expr) -> exp.Column:
        text = node.sql(DIALECT)
        name = _sha(text)  # whole: two values must never share a placeholder
        values.setdefault(name, node)
        return exp.column(exp.to_identifier(name, quoted=True),
                          table=exp.to_identifier(_OPAQUE, quoted=True))  # fmt: skip

    def skeleton(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.And, exp.Or)):
            return node.__class__(this=skeleton(node.this), expression=skeleton(node.expression))
        if isinstance(node, (exp.Not, exp.Paren)):
            return node.__class__(this=skeleton(node.this))
        if isinstance(node, exp.Boolean):
            return exp.Boolean(this=node.this)
        if type(node) in _FLIPPED:
            return type(node)(this=placeholder(node.left), expression=placeholder(node.right))
        if type(node) is exp.Between and not node.args.get("symmetric"):
            return exp.Between(this=placeholder(node.this), low=placeholder(node.args["low"]),
                               high=placeholder(node.args["high"]))  # fmt: skip
        return placeholder(node)

    return skeleton(condition)


def _constant(node: exp.Expr) -> bool:
    """No column and no subquery in ``node``."""
    return not any(isinstance(n, (exp.Column, exp.Query, *_SET_OPERATIONS)) for n in node.walk())


def _with_values(skeleton: exp.Expr, values: dict[str, exp.Expr]) -> exp.Expr:
    """``skeleton`` (changed in place) with a copy of its value for every placeholder, and
    every comparison of a constant with another value written with the constant on the right
    (``6 > m`` is ``m < 6``; simplify orders two placeholders as it likes)."""
    walked = nodes(skeleton)
    for column in [n for n in walked if isinstance(n, exp.Column)]:
        value = values[column.name].copy()
        if column is skeleton:
            return value
        column.replace(value)
    for comparison in [n for n in walked if type(n) in _FLIPPED]:
        left, right = comparison.left, comparison.right
        if _constant(left) and not _constant(right):
            flipped = _FLIPPED[type(comparison)](this=right, expression=left)
            if comparison is skeleton:
                return flipped
            comparison.replace(flipped)
    return skeleton


def _size(node: exp.Expr, at_most: int) -> int:
    """The number of nodes of ``node``, counted up to ``at_most`` (a huge condition is not
    walked to the end only to learn that it is too large)."""
    return sum(1 for _ in itertools.islice(node.walk(), at_most))


def _sort_commutative(
    node: exp.Expr,
    generator: _ReusingGenerator,
    replaced: list[exp.Expr],
    changed: list[exp.Expr],
    literals: list[exp.Literal],
) -> exp.Expr:
    """``node`` (changed in place) with OR operands sorted (commutative under three-valued
    logic) and IN lists sorted and deduplicated; the OR chains it replaced are appended to
    ``replaced``, the nested OR chains and IN predicates it changed to ``changed``, and its
    literals to ``literals`` (sorting moves operands and drops repeated ones, and creates no
    literal). The generator remembers the text of every OR operand."""
    walked = nodes(node)  # the OR chains are rebuilt from their operands: the INs stay
    ins = of_kind(walked, exp.In)
    literals += of_kind(walked, exp.Literal)
    for part in of_kind(walked, exp.Or):
        if isinstance(part.parent, exp.Or):
            continue
        texts = {generator.remember(o): o for o in part.flatten()}
        operands = [
            exp.paren(o, copy=False) if isinstance(o, exp.Connector) else o
            for _t, o in sorted(texts.items())
        ]
        joined = balanced(exp.Or, operands)
        replaced.append(part)
        if part is node:
            node = joined
        else:
            part.replace(joined)
            changed.append(joined)  # inside an operand of an OR chain sorted before
    for part in ins:
        values = part.args.get("expressions")
        if values:
            unique = sorted({generator.generate(v, copy=False): v for v in values}.items())
            part.set("expressions", [v for _t, v in unique])
            changed.append(part)
    return node


_NUMERIC = exp.DataType.NUMERIC_TYPES


def _normalise_literals(
    node: exp.Expr,
    changed: list[exp.Expr] | None = None,
    literals: list[exp.Literal] | None = None,
) -> exp.Expr:
    """Number literals compared with a numeric column are written in their shortest exact
    decimal form (``6.0`` and ``6`` are one value there; against a text column they are not,
    so other literals keep their spelling). Literals DuckDB types DOUBLE keep their spelling:
    an exponent, or more than 38 digits with a decimal point (a DECIMAL holds 38), are
    compared after rounding to a double. A literal already in that form and without
    comments is kept, untyped like the new one it stands for (it prints the same); the new
    literals are appended to ``changed``. ``literals``: the literals of ``node``, when the
    caller has them, and maybe some it dropped (whose changes print nowhere)."""
    found = [n for n in nodes(node) if isinstance(n, exp.Literal)] if literals is None else literals
    for literal in found:
        if literal.is_string or not isinstance(literal.parent, exp.Binary):
            continue
        parent = literal.parent
        other = parent.right if parent.left is literal else parent.left
        if not isinstance(parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
            continue
        if other.type is None or other.type.this not in _NUMERIC:  # is_type, built-ins
            continue
        text = literal.this
        if "e" in text.lower() or ("." in text and sum(c.isdigit() for c in text) > 38):
            continue  # a DOUBLE to DuckDB (so are more than 38 digits with a point, zeros too:
            # ``x > 1.000...0`` compares x rounded to a double, ``x > 1`` exactly)
        try:
            value = Decimal(text)
        except InvalidOperation:
            continue
        # exact: the default context would round to 28 digits, and 1.00000000000000000000000000001
        # (DECIMAL(30,29) to DuckDB, above 1) would read as 1
        shortest = format(value.normalize(Context(prec=max(len(value.as_tuple().digits), 1))), "f")
        if shortest == text and not literal.comments:
            literal.type = None  # as the new literal would be: a later comparison reads it
            continue
        new = exp.Literal.number(shortest)
        literal.replace(new)
        if changed is not None:
            changed.append(new)
    return node
