"""The shared shape of every protected aggregation, whatever the mechanism.

Each aggregation over confidential rows is split in two:

    SELECT <projection over protected cells>              -- HAVING, ORDER BY, LIMIT, DISTINCT
    FROM (<cells: keys __g0.., GROUPING() __gg0.., protected values>) AS __cells
    WHERE <HAVING over protected cells>

A mechanism module (``threshold``, ``ckm``, ``round``, ...) builds the ``__cells`` frame from
the original FROM / WHERE / GROUP BY and says, per aggregate, which expression over ``__cells``
is its protected value and when it counts as published. Every aggregate the query mentions is
replaced by its protected value, so HAVING, ORDER BY, LIMIT, window functions and any
arithmetic on aggregates only ever see protected values. The functions here are pure: AST in,
new AST out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree, nodes
from sqlsdc.errors import InternalError, PolicyViolation
from sqlsdc.planner.plan import CellPlan, QueryPlan
from sqlsdc.planner.scopes import own_nodes
from sqlsdc.policy import AggregateKind, Method
from sqlsdc.rewrite.sql import cast, copy_clause

CELLS = "__cells"
STATUS_PREFIX = "__sdc_status_"
SD_PREFIX, HALF_WIDTH_PREFIX = "__sdc_sd_", "__sdc_hw_"
DROPPED_PREFIX, CLAMPED_PREFIX = "__sdc_dr_", "__sdc_cl_"  # DP: noisy shares of input bounded
ACCURACY_PREFIXES = (SD_PREFIX, HALF_WIDTH_PREFIX, DROPPED_PREFIX, CLAMPED_PREFIX)
PUBLISHED, SUPPRESSED, FAULT = "published", "suppressed", "error"


@dataclass(frozen=True)
class Frame:
    """The ``__cells`` subquery of one aggregation and how to read protected values from it."""

    source: exp.Subquery  # aliased CELLS
    value: Callable[[int], exp.Expr]  # protected value of aggregate i
    published: Callable[[int], exp.Expr]  # condition: aggregate i is published
    group_condition: exp.Expr | None = None  # groups that may exist at all
    fault: Callable[[int], exp.Expr] | None = None  # the mechanism failed for aggregate i
    # (standard deviation, 95% half-width) of aggregate i's noise and the shares of its input
    # that the bounding dropped and clamped, for noisy mechanisms
    accuracy: Callable[[int], tuple[exp.Expr, exp.Expr, exp.Expr, exp.Expr]] | None = None


@dataclass(frozen=True)
class Cells:
    """One aggregation of the copied tree, as the mechanism modules see it."""

    plan: CellPlan
    select: exp.Select  # the aggregation in the copy
    keys: list[exp.Expr]
    groupings: list[exp.Grouping]
    aggregates: list[exp.AggFunc]
    moved: dict[str, exp.Expr] = field(default_factory=dict)  # clauses taken out of ``select``
    # clauses of the analysed tree left out of ``select`` (protect_cells' ``moving``), which the
    # first :meth:`clause` call hands to the frame
    lent: dict[str, exp.Expr] = field(default_factory=dict)

    def clause(self, key: str) -> exp.Expr | list[exp.Expr] | None:
        """The clause ``key`` (``from_``, ``joins``, ``where``, ``group``) of the aggregation,
        for a frame to own. The WHERE is moved out of ``select``, the working copy that the
        frame replaces, rather than copied: a long condition is the largest part of a
        statement, and its copy in ``select`` would only be freed (or the analysed tree's
        WHERE is handed over, when ``lent``). :meth:`text` prints the aggregation with it; a
        second call gets a copy."""
        if key in self.moved:
            return copy_tree(self.moved[key])
        if key in self.lent:
            value = self.moved[key] = self.lent.pop(key)
            return value
        value = self.select.args.get(key)
        if key != "where" or value is None:
            return None if value is None else copy_clause(value)
        self.moved[key] = value.pop()
        return value

    def rows(self) -> exp.Select:
        """The aggregation's rows (its FROM, joins and WHERE, as :meth:`clause` hands them to a
        frame) with one copy of each group key as ``__g<i>``: the row level a frame aggregates
        itself (``alias_`` copies what it is given unless told not to)."""
        rows = exp.Select()
        for key in ("from_", "joins", "where"):
            value = self.clause(key)
            if value is not None:
                rows.set(key, value)
        for i, key in enumerate(self.keys):
            rows.append("expressions", exp.alias_(copy_tree(key), f"__g{i}", copy=False))
        return rows

    def text(self) -> str:
        """The SQL of the aggregation as analysed, with the clauses the frame took
        (the text of a refusal)."""
        taken = {**self.lent, **self.moved}
        if not taken:
            return self.select.sql("duckdb")
        shown = self.select.copy()
        for key, value in taken.items():
            shown.set(key, value.copy())
        return shown.sql("duckdb")

    def argument(self, i: int, twin: dict[int, exp.Expr]) -> exp.Expr | None:
        spec = self.plan.aggregates[i].argument
        return None if spec is None else twin.get(id(spec), spec)


FrameBuilder = Callable[[Cells, dict[int, exp.Expr]], Frame]
TAKING_THE_WHERE = (Method.CKM, Method.THRESHOLD, Method.ROUND)  # frames that own the WHERE
# whole (:meth:`Cells.clause`); the others read or copy it


def protect_cells(
    tree: exp.Expr,
    plan: QueryPlan,
    builders: dict[Method, FrameBuilder],
    discarded: list[exp.Expr] | None = None,
    moving: bool = False,
):
    """Return a protected copy of ``tree``; ``plan`` refers to nodes of ``tree``, left unchanged
    (unless ``moving``). The parts of the copy that the protected frames replaced are appended
    to ``discarded``.

    ``builders`` maps a protection method to the module that builds its frame
    (:mod:`sqlsdc.rewrite.registry`); each aggregation is built by the builder of the method
    the planner chose for it (:func:`sqlsdc.planner.plan.choose_mechanism`). When any
    aggregation is noisy (DP), the result carries the noise's standard deviation and 95%
    half-width per position next to the status columns.

    ``moving``: the caller reads nothing of ``tree`` below its aggregations any more, so the
    WHERE of an aggregation whose frame takes it whole (:data:`TAKING_THE_WHERE`) and that has
    no subquery is moved out of ``tree`` into the result instead of being copied (a long
    condition is most of a large statement). Not when a frame is DP's, which describes the
    populations of scopes of ``tree`` while it builds.
    """
    noisy = any(c.mechanism is Method.DP for c in plan.cells)
    lent = {}  # id of an aggregation of ``tree`` -> its WHERE, taken out of ``tree``
    if moving and not noisy:
        for cell_plan in plan.cells:
            where = cell_plan.select.args.get("where")
            scope = cell_plan.scope
            if (
                where is not None
                and cell_plan.mechanism in TAKING_THE_WHERE
                and scope is not None
                and scope.expression is cell_plan.select
                and not scope.subquery_scopes
            ):
                lent[id(cell_plan.select)] = where.pop()
    twin: dict[int, exp.Expr] = {}  # id of a node of ``tree`` -> its copy
    copy = copy_tree(tree, twin)  # with the analysis' types: the generator reads some of them
    for exposure in plan.exposures:
        select = twin[id(exposure.select)]
        select.append("expressions", exp.alias_(exposure.expression.copy(), exposure.alias))
    for cell_plan in plan.cells:
        cells = Cells(
            cell_plan,
            twin[id(cell_plan.select)],
            [twin.get(id(k), k) for k in cell_plan.keys],
            [twin[id(g)] for g in cell_plan.groupings],
            [twin[id(a.node)] for a in cell_plan.aggregates],
        )
        if id(cell_plan.select) in lent:
            cells.lent["where"] = lent[id(cell_plan.select)]
        frame = builders[cell_plan.mechanism](cells, twin)
        if cells.lent:  # fail closed: a frame without the aggregation's WHERE
            raise InternalError("a protected frame did not take the aggregation's WHERE")
        protected = _lift(cells, frame, with_accuracy=noisy)
        if cells.select is copy:
            copy = protected
        else:
            cells.select.replace(protected)
        if discarded is not None:
            discarded.append(cells.select)
    return copy


def inner_select(cells: Cells) -> exp.Select:
    """A SELECT with the aggregation's FROM, joins, WHERE and GROUP BY (copies; the WHERE
    moved, :meth:`Cells.clause`)."""
    inner = exp.Select()
    for key in ("from_", "joins", "where", "group"):
        value = cells.clause(key)
        if value is not None:
            inner.set(key, value)
    return inner


def unit_count(argument: exp.Expr | None, units: list[exp.Expr] | None) -> exp.Expr:
    """Number of units contributing to a cell: rows where ``argument`` is not NULL."""
    if units is None:
        return exp.Count(this=exp.Star() if argument is None else argument.copy())
    counts = []
    for unit in units:
        counts.append(exp.Count(this=exp.Distinct(expressions=[when_present(unit, argument)])))
    return counts[0] if len(counts) == 1 else exp.Least(this=counts[0], expressions=counts[1:])


def frequency_count(spec, argument: exp.Expr | None, units: list[exp.Expr] | None) -> exp.Expr:
    """The units the frequency rule counts for aggregate ``spec``: of a count every unit with
    a value; of a magnitude (SUM, AVG) its contributors, the units with a non-zero value (a
    unit with several rows: any of its rows), as GaussSuppression's ``NContributorsRule``
    (``remove0 = TRUE``) and as the cell key method counts a sum's contributors. Counted with
    its zeros, a cell of 3 non-zero incomes padded with ``OR income = 0`` reached
    ``min_frequency`` on the zero incomes and was published exactly where the cell alone was
    suppressed (red team s38e); a cell of zeros only has no contributor and is suppressed."""
    if spec.kind is AggregateKind.MAGNITUDES and argument is not None:
        return unit_count(nonzero(argument), units)
    return unit_count(argument, units)


def nonzero(value: exp.Expr) -> exp.Expr:
    """``NULLIF(value, 0)``: a record whose value is 0 adds nothing to a sum and is no
    contributor of it, as NULL is not (cellKey's default ``use_zero_rkeys = FALSE``)."""
    return exp.Nullif(this=value.copy(), expression=exp.Literal.number(0))


def when_present(value: exp.Expr, argument: exp.Expr | None) -> exp.Expr:
    """``value`` on rows where ``argument`` is not NULL (all rows when there is no argument)."""
    if argument is None:
        return value.copy()
    condition = exp.Not(this=exp.Is(this=argument.copy(), expression=exp.null()))
    return exp.Case(ifs=[exp.If(this=condition, true=value.copy())])


def cell_column(name: str) -> exp.Column:
    return exp.column(name, CELLS)


def _lift(cells: Cells, frame: Frame, *, with_accuracy: bool = False) -> exp.Select:
    select, plan = cells.select, cells.plan

    def lift(node: exp.Expr) -> exp.Expr:
        return _replace_own(node, cells.keys, cells.groupings, cells.aggregates, frame.value)

    outer = exp.Select(expressions=[lift(p) for p in select.expressions])
    outer.set("from_", exp.From(this=frame.source))
    condition = _shown_and_kept(frame.group_condition, select.args.get("having"), lift)
    if condition is not None:
        outer.set("where", exp.Where(this=condition))
    for key in ("order", "limit", "offset", "distinct", "with_"):
        value = select.args.get(key)
        if value is not None:
            outer.set(key, lift(value) if key == "order" else value.copy())
    _check_lifted(outer, cells)
    if plan.with_status:  # one per position, so that branches of a set operation line up
        for position, projection in enumerate(select.expressions):
            inside = {id(n) for n in nodes(projection)}  # one walk per projection, not one per
            used = [i for i, a in enumerate(cells.aggregates) if id(a) in inside]  # aggregate
            status = _status(used, frame) if used else cast(exp.null(), "VARCHAR")
            # fresh trees, read by nothing else: aliased as they are, not copied
            outer.append("expressions", exp.alias_(status, f"{STATUS_PREFIX}{position}",
                                                   copy=False))  # fmt: skip
        if with_accuracy:
            for position, projection in enumerate(select.expressions):
                values = _accuracy(cells, frame, projection.unalias())
                for prefix, value in zip(ACCURACY_PREFIXES, values, strict=True):
                    outer.append("expressions", exp.alias_(value, f"{prefix}{position}",
                                                           copy=False))  # fmt: skip
    return outer


def _shown_and_kept(shown: exp.Expr | None, having: exp.Having | None, lift) -> exp.Expr | None:
    """The outer filter: the frame's condition of the groups it shows, and the query's HAVING
    over protected values, evaluated only for groups shown: ``CASE WHEN shown THEN having ELSE
    FALSE END``. In an AND the engine may evaluate the HAVING first (its optimiser reorders
    and pushes down conjuncts), and a HAVING that can fail on a hidden cell's value
    (``CAST(COUNT(*) - 1 AS UTINYINT)`` on a cell the noise made 0) would tell that the cell
    exists."""
    if having is None:
        return shown
    kept = lift(having.this)
    if shown is None:
        return kept
    return exp.Case(ifs=[exp.If(this=shown, true=kept)], default=exp.false())


def _accuracy(cells: Cells, frame: Frame, projection: exp.Expr) -> tuple[exp.Expr, ...]:
    """The noise accuracy and bounding shares of a position that is exactly one noisy
    aggregate, else NULLs."""
    for i, aggregate in enumerate(cells.aggregates):
        if aggregate is projection and frame.accuracy is not None:
            return frame.accuracy(i)
    return tuple(cast(exp.null(), "DOUBLE") for _ in ACCURACY_PREFIXES)


def _status(used: list[int], frame: Frame) -> exp.Expr:
    """published / suppressed per cell; ``error`` (never released) if the mechanism failed."""
    ifs = []
    if frame.fault is not None:
        fault = exp.or_(*[frame.fault(i) for i in used])
        ifs.append(exp.If(this=fault, true=exp.Literal.string(FAULT)))
    condition = exp.and_(*[frame.published(i) for i in used])
    ifs.append(exp.If(this=condition, true=exp.Literal.string(PUBLISHED)))
    return exp.Case(ifs=ifs, default=exp.Literal.string(SUPPRESSED))


def _replace_own(node, keys, groupings, aggregates, protected_value) -> exp.Expr:
    """Copy of ``node`` with this scope's aggregates, GROUPING() calls and keys replaced."""
    aggregate_ids = {id(a): i for i, a in enumerate(aggregates)}
    grouping_ids = {id(g): i for i, g in enumerate(groupings)}
    return _Rebuild(aggregate_ids, grouping_ids, keys, protected_value).node(node)


@dataclass
class _Rebuild:
    """The recursion of :func:`_replace_own` (a method, not a recursive closure: a closure that
    calls itself is a reference cycle, which kept the analysed tree alive until the cycle
    collector ran)."""

    aggregate_ids: dict[int, int]
    grouping_ids: dict[int, int]
    keys: list[exp.Expr]
    protected_value: Callable[[int], exp.Expr]

    def node(self, current: exp.Expr) -> exp.Expr:
        if id(current) in self.aggregate_ids:
            return self.protected_value(self.aggregate_ids[id(current)])
        if id(current) in self.grouping_ids:
            return cell_column(f"__gg{self.grouping_ids[id(current)]}")
        if isinstance(current, (exp.Subquery, exp.Select)):
            return current.copy()
        if (
            not isinstance(current, (exp.Alias, exp.Ordered, exp.Order, exp.Window, exp.WindowSpec))
            and current in self.keys
        ):
            return cell_column(f"__g{self.keys.index(current)}")
        rebuilt = current.__class__(
            **{
                k: (
                    [self.node(v) if isinstance(v, exp.Expr) else v for v in value]
                    if isinstance(value, list)
                    else self.node(value)
                    if isinstance(value, exp.Expr)
                    else value
                )
                for k, value in current.args.items()
            }
        )
        if current._meta:  # the analysis' marks, as a copy keeps them (rewrite.order reads
            rebuilt._meta = dict(current._meta)  # the type a MIN over cells had)
        return rebuilt


def _check_lifted(outer: exp.Select, cells: Cells) -> None:
    """Every column the outer query reads must come from the protected cells."""
    aliases = {p.alias for p in outer.expressions if isinstance(p, exp.Alias)}
    for part in (*outer.expressions, outer.args.get("where"), outer.args.get("order")):
        if part is None:
            continue
        for n in own_nodes(part):
            if not isinstance(n, exp.Column) or n.table == CELLS:
                continue
            if part is not outer.args.get("order") or n.table or n.name not in aliases:
                raise PolicyViolation(
                    f"column {n.sql('duckdb')} must appear in GROUP BY or inside an aggregate",
                    "group by it, or aggregate it with COUNT, SUM or AVG",
                    cells.text(),
                )
