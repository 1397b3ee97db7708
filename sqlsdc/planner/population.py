"""The population of an aggregation: the relations and predicates of its inner-join block,
with every column resolved to the canonical base expression it stands for (:class:`_Block`),
as the canonical JSON and digest of :class:`Population` (:mod:`sqlsdc.planner.identity`
describes the whole aggregation with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.optimizer.scope import Scope

from sqlsdc.engines.trees import release
from sqlsdc.errors import InternalError, PolicyViolation
from sqlsdc.planner.canonical_conditions import _conjuncts, _normalise_literals
from sqlsdc.planner.canonical_text import _SET_OPERATIONS, DIALECT, _json, _sha, _unwrap

if TYPE_CHECKING:
    from sqlsdc.planner.identity import _Describer

SUBQUERY_MARKER = "SQLSDC_SUBQUERY"
OUTPUT_MARKER = "SQLSDC_OUTPUT"  # an output by position (ORDER BY its alias)
_ROW_BLOCKERS = ("group", "having", "distinct", "limit", "offset", "qualify", "order")


@dataclass(frozen=True)
class Population:
    """The canonical population of an aggregation: base tables read and the JSON that
    defines which of their rows (joined how, filtered how) are tabulated."""

    tables: tuple[str, ...]  # base tables read (sorted, distinct), public ones included
    text: str  # canonical JSON of relations and predicates
    digest: str  # SHA-256 of text, hex


def _subquery(description: str) -> exp.Expr:
    """The canonical stand-in for a subquery: a call of a function no analyst can write (the
    allowlist refuses unknown functions), so that no literal, expression or column spells the
    same text. A string literal did: ``x = 'subquery:{...}'`` had the identity of
    ``x = (SELECT ...)`` over another population."""
    return exp.Anonymous(this=SUBQUERY_MARKER, expressions=[exp.Literal.string(description)])


def shown(node: exp.Expr) -> str:
    """``node``'s SQL as an analyst may read it in a refusal: the stand-ins of subqueries and
    outputs (:func:`_subquery`, an output by position), which no analyst wrote, spelt
    ``(SELECT ...)`` and ``output n`` (s49j: a DP group key ``(SELECT SUM(amount) FROM
    benefits)`` was refused as ``SQLSDC_SUBQUERY('{"distinct":null,...}')``)."""

    def readable(part: exp.Expr) -> exp.Expr:
        if isinstance(part, exp.Anonymous) and part.this == SUBQUERY_MARKER:
            return exp.Var(this="(SELECT ...)")
        if isinstance(part, exp.Anonymous) and part.this == OUTPUT_MARKER:
            return exp.Var(this=f"output {int(part.expressions[0].this) + 1}")
        return part

    return node.transform(readable, copy=True).sql("duckdb")


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


def _unresolved(column: exp.Column) -> InternalError | PolicyViolation:
    """The error of a column that resolves to nothing known: a bug, but for ``t.*`` inside an
    expression over a derived table (``WHERE (t.*) IS NOT NULL``), which names no one column
    and is refused as the analysis refuses it over a table (red team s50j: it failed as a bug
    in sqlsdc)."""
    if isinstance(column.this, exp.Star):
        return PolicyViolation(
            f"{column.sql(DIALECT)} (every column of {column.table}) cannot be used inside an "
            "expression",
            "name the columns",
        )
    return InternalError(
        f"column {column.sql(DIALECT)} could not be resolved for the cell identity"
    )


def _is_inner(join: exp.Join) -> bool:
    side, kind = join.args.get("side"), (join.args.get("kind") or "").upper()
    return not side and kind in ("", "INNER", "CROSS") and not join.args.get("using")


def _flattenable(scope: Scope, outer: bool = False) -> bool:
    """A plain row-level SELECT: its rows are its sources' rows filtered (inner joins only;
    with ``outer``, outer joins too: the rows of its joins as written, then filtered)."""
    select = scope.expression
    if not isinstance(select, exp.Select):
        return False
    if any(select.args.get(k) for k in _ROW_BLOCKERS):
        return False
    if any(isinstance(n, (exp.AggFunc, exp.Window)) for p in select.expressions for n in p.walk()):
        return False
    return outer or all(_is_inner(j) for j in select.args.get("joins") or [])


def _sole_source(scope: Scope) -> bool:
    """Whether ``scope`` (a SELECT) reads one source and joins nothing: its rows are that
    source's rows, filtered by its WHERE."""
    select = scope.expression
    return len(scope.selected_sources) == 1 and not select.args.get("joins")


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
    def add_select(self, scope: Scope, alone: bool = True) -> None:
        """Add the sources and conditions of ``scope``; plain row-level children joined by
        inner joins are flattened into this block. A SELECT with an outer join keeps its
        joins in order and flattens nothing (a condition of a null-supplying side does not
        commute with the join). ``alone``: ``scope`` is the block's only source (the block's
        own SELECT, or read alone by every SELECT flattened above it)."""
        select = scope.expression
        self.scopes[id(select)] = scope
        resolvers: dict[str, tuple] = {}
        self.resolvers[id(select)] = resolvers
        # a source's node is its Table, or the SELECT inside a derived table's parentheses
        joins = {id(_unwrap(j.this)): j for j in select.args.get("joins") or []}
        ordered = any(not _is_inner(j) for j in joins.values())
        # a SELECT whose only source is a derived table or CTE with outer joins reads the rows
        # of those joins as written: it is flattened, its joins kept in order, so that
        # ``SELECT t.k ... FROM (SELECT ... FROM a LEFT JOIN b ON ...) t WHERE p`` is the
        # population of ``SELECT b.k ... FROM a LEFT JOIN b ON ... WHERE p`` (WHERE applies
        # after FROM either way). Only where it is the block's whole FROM: beside another
        # source or join it stays opaque
        sole = alone and _sole_source(scope)
        for alias, (node, source) in scope.selected_sources.items():
            if isinstance(source, exp.Table):
                resolvers[alias] = ("relation", self._relation(("table", source.name.lower())))
            elif (
                not ordered
                and _flattenable(source, outer=sole)
                and id(source.expression) not in self.scopes
            ):
                # a CTE read twice is flattened once: its second reading is opaque (one scope
                # has one set of column resolutions, and both readings took the second's)
                self.add_select(source, alone=sole)
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
