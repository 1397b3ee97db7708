"""The guard's driver: parse → resolve → classify/check → plan → rewrite → validate.

``protect`` turns analyst SQL into a :class:`ProtectedQuery` without touching data: the SQL the
engine will run, the name and mechanism of every output column, and a fingerprint. Anything it
cannot prove safe raises :class:`~sqlsdc.PolicyViolation`; there is no fallback to the original.
"""

from __future__ import annotations

import gc
import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from sqlglot import exp

from sqlsdc.engines.trees import nodes, release
from sqlsdc.errors import Error, InternalError, PolicyViolation
from sqlsdc.guard.list_parameters import arrays_as_in
from sqlsdc.guard.parse import (
    bind_parameters,
    check_limits,
    fold_limit_casts,
    output_names,
    parse_statement,
    too_complex,
)
from sqlsdc.guard.pg_types import built_in_types
from sqlsdc.guard.positioned_subqueries import name_positioned_subqueries
from sqlsdc.guard.resolve import check_tables, qualify_tree
from sqlsdc.guard.validate import validate_release
from sqlsdc.mechanisms.accountant import PrivacyCost, compose, exact_text
from sqlsdc.planner.analyze import analyze
from sqlsdc.planner.identity import AggregationIdentity, aggregation_identity, describe_scope
from sqlsdc.planner.multiplicity import prove_multiplicity
from sqlsdc.planner.normal_form import SUMMED
from sqlsdc.planner.plan import plan_query
from sqlsdc.planner.repeated_columns import RepeatedColumns
from sqlsdc.planner.repeated_keys import RepeatedKeys
from sqlsdc.planner.scopes import Analysis, Kind
from sqlsdc.policy import AggregateKind, Method, Policy
from sqlsdc.rewrite.cells import ACCURACY_PREFIXES, STATUS_PREFIX, protect_cells
from sqlsdc.rewrite.ckm import PTableKey, PTableRef, refuse_many_lookups
from sqlsdc.rewrite.derived_classes import derive_classes, refuse_derived_classes
from sqlsdc.rewrite.dominance import rules
from sqlsdc.rewrite.dp import DpStage
from sqlsdc.rewrite.key_size import refuse_long_keys
from sqlsdc.rewrite.order import in_released_order, mark_analyst_scopes
from sqlsdc.rewrite.registry import RewriteContext, frame_builders
from sqlsdc.rewrite.spelling import released_in_one_spelling

DIALECT = "duckdb"


@dataclass(frozen=True)
class GuardContext:
    """Everything the guard needs to know about the database, fixed for one connection."""

    policy: Policy
    policy_version: int
    schema: dict[str, dict[str, str]]
    unit_per_row: dict[str, bool]
    constant_type: Callable[[exp.Expr], exp.DataType | None]  # planner.scopes.ConstantCheck
    to_sql: Callable[[exp.Expr], str]
    ptables: Mapping[PTableKey, PTableRef] = field(default_factory=dict)
    unique_columns: Mapping[str, frozenset[str]] = field(default_factory=dict)
    fingerprint: str = ""  # digest of all the above; empty: checks are not shared (check_cache)


@dataclass(frozen=True)
class OutputColumn:
    name: str
    mechanism: str  # threshold | ckm | key | public | derived
    min_frequency: int | None = None
    noise: PTableRef | None = None  # CKM counts: the ptable whose noise the values carry
    dp: tuple[float, float] | None = None  # DP counts and sums: (noise sd, 95% half-width)
    rounding: tuple[int, str] | None = None  # method round: (base, rule)
    dominance: tuple[str, ...] = ()  # threshold and round magnitudes: their dominance rules
    unit_noise: tuple[float, float] | None = None  # CKM magnitudes: (a, b) of the unit factors

    @property
    def released(self) -> bool:
        """A protected value (or one derived from protected values), not a key or public."""
        return self.mechanism not in ("key", "public")

    def to_dict(self) -> dict:
        described = {
            "name": self.name,
            "mechanism": self.mechanism,
            "min_frequency": self.min_frequency,
        }
        if self.noise is not None:
            described["noise_variance"] = round(self.noise.variance, 6)
            described["max_deviation"] = max(abs(v) for v, _p in self.noise.noise)
        if self.dp is not None:
            described["noise_sd"], described["half_width_95"] = self.dp
        if self.rounding is not None:
            described["base"], described["rounding"] = self.rounding
        if self.dominance:
            described["dominance"] = list(self.dominance)
        if self.unit_noise is not None:
            described["unit_noise"] = {"a": self.unit_noise[0], "b": self.unit_noise[1]}
        return described


@dataclass(frozen=True)
class ProtectedQuery:
    sql: str  # what the engine runs
    columns: list[OutputColumn]
    status_columns: dict[int, str] = field(default_factory=dict)  # output position -> column
    fingerprint: str = ""
    tables: tuple[str, ...] = ()
    tree: exp.Expr | None = None
    suppressed: tuple[str, ...] = ()  # tables whose protected universe the SQL reads
    dp_stages: tuple[DpStage, ...] = ()  # DP aggregations: exact cells, noised before the SQL
    # output position -> hidden columns: noise sd, 95% half-width, dropped and clamped shares
    accuracy_columns: dict[int, tuple[str, ...]] = field(default_factory=dict)
    population: str = ""  # canonical identity of what the result tabulates (ledger cell key)
    summed: tuple[tuple[str, str], ...] = ()  # (table, column) a floating-point sum adds up

    def detached(self) -> ProtectedQuery:
        """A copy that shares nothing mutable with this one (lists, dicts, trees), for callers
        outside the guard: this object is the check cache's, answered to every connection of
        the process, and Spark runs its ``tree``; an analyst who changed the one ``explain``
        returned changed what later statements recorded in the ledger or ran."""
        stages = tuple(
            replace(s, trees={k: t.copy() for k, t in s.trees.items()}) for s in self.dp_stages
        )
        return replace(
            self,
            columns=list(self.columns),
            status_columns=dict(self.status_columns),
            accuracy_columns=dict(self.accuracy_columns),
            tree=None if self.tree is None else self.tree.copy(),
            dp_stages=stages,
        )

    @property
    def dp_cost(self) -> PrivacyCost:
        """The most this query can cost: every DP cell new (cells released before are free);
        its ``delta`` is that of private group selection, added up over the stages."""
        return compose(stage.cost for stage in self.dp_stages)

    def to_dict(self) -> dict:
        described = {
            "sql": self.sql,
            "fingerprint": self.fingerprint,
            "tables": list(self.tables),
            "columns": [c.to_dict() for c in self.columns],
        }
        if self.dp_stages:
            cost = self.dp_cost
            described["dp_cost"] = {kind: exact_text(getattr(cost, kind))
                                    for kind in ("epsilon", "rho", "delta")}  # fmt: skip
            described["dp_cells_sql"] = [stage.sql for stage in self.dp_stages]
            described["dp_bounding_report"] = [_report_line(s) for s in self.dp_stages]
        return described

    def __str__(self) -> str:
        lines = ["columns:"]
        for c in self.columns:
            k = f" (min_frequency {c.min_frequency})" if c.mechanism == "threshold" else ""
            if c.mechanism == "suppress":
                k = " (cells of the audited suppression pattern of " + ", ".join(self.suppressed)
                k += "; NULL when suppressed)"
            if c.noise is not None:
                deviation = max(abs(v) for v, _p in c.noise.noise)
                k = f" (noise variance {c.noise.variance:.3g}, at most ±{deviation:g})"
            if c.dp is not None:
                k = f" (noise sd {c.dp[0]:.4g}; 95% of cells within ±{c.dp[1]:.4g})"
            if c.rounding is not None:
                k = f" (base {c.rounding[0]}, {c.rounding[1]}; min_frequency {c.min_frequency})"
            if c.dominance:  # the cell is also suppressed when these rules find it dominated
                rules_text = "dominance " + ", ".join(c.dominance)
                k = f"{k[:-1]}; {rules_text})" if k else f" ({rules_text})"
            if c.unit_noise is not None:  # the values summed are x·m, not the stored x
                a, b = c.unit_noise
                k = f" (each value times its unit's permanent factor in [{2 - b:g}, {2 - a:g}] ∪ "
                k += f"[{a:g}, {b:g}])"
            lines.append(f"  {c.name}: {c.mechanism}{k}")
        lines.append("tables: " + (", ".join(self.tables) or "none"))
        if self.dp_stages:
            cost = self.dp_cost.describe()
            lines.append(f"privacy cost: at most {cost} (cells released before are free)")
            for stage in self.dp_stages:
                lines.append(f"bounding ({stage.table}): {_report_line(stage)}")
            for stage in self.dp_stages:
                lines += ["exact bounded cells (never returned):", "  " + stage.sql]
        lines += ["protected SQL:", "  " + self.sql]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """IPython and Jupyter show ``con.explain(sql)`` as :meth:`__str__` writes it, as
        ``print`` does, not as the dataclass's fields (tests/test_dbapi.py)."""
        printer.text(str(self))


def _report_line(stage: DpStage) -> str:
    """What explain says about the bias that bounding may add to a stage's cells."""
    if stage.shares_zero:
        return ("nothing dropped nor clamped (one row per unit, no measure clamped): the "
                "shares are 0 (cursor.cell_accuracy: dropped, clamped), no report drawn nor "
                "charged")  # fmt: skip
    if stage.report is None:
        return ("not reported (an admin sets dp.bounding_report); the intervals cover the "
                "noise only: rows dropped by the caps and values clamped to the bounds bias the "
                "cells")  # fmt: skip
    parts = [s.calibration for s in stage.statistics if s.column in stage.report]
    dropped = ("noisy shares of input dropped by the row caps and" if stage.report[0] else
               "no rows dropped (one row per unit); noisy shares of input")  # fmt: skip
    return (f"per cell, {dropped} clamped to the bounds (cursor.cell_accuracy: dropped, "
            f"clamped); cost {(len(parts) * parts[0].cost).describe()}, noise sd "
            f"{parts[0].sd:.3g} persons' worth per part")  # fmt: skip


def protect(
    sql: str, params, context: GuardContext, in_time: Callable[[], object] | None = None
) -> ProtectedQuery:
    """Check and rewrite one analyst query. Raises PolicyViolation when it is not allowed.

    ``in_time`` is called before each pass and raises to stop the check (a guarded
    connection's statement timeout): a long check ends at the next pass, not after the last.

    Any other failure inside the passes is a bug; it is raised as InternalError, so the query is
    refused, never run in another form.
    """
    return _failing_closed(sql, lambda: _protect(sql, params, context, in_time))


def _failing_closed(sql: str, run: Callable[[], object]):
    """``run()`` with the cycle collector paused; a failure that is not a refusal is a bug,
    raised as InternalError (the query is refused, never run in another form)."""
    try:
        with _cycle_collection_paused():
            return run()
    except Error:
        raise
    except RecursionError:  # a shape MAX_DEPTH let through but a pass cannot handle: refused
        raise too_complex(sql) from None
    except Exception as bug:  # fail closed: an unexpected state refuses the query
        raise InternalError(f"the guard failed on this query: {type(bug).__name__}: {bug}") from bug


_checks_running = 0  # in all threads
_resume_collection = False  # whether the collector was on when the first running check began
_pause_lock = threading.Lock()


@contextmanager
def _cycle_collection_paused():
    """Pause Python's cycle collector while statements are checked.

    sqlglot trees are cyclic (every node points to its parent) and a check allocates a few
    copies of the tree; with the collector on, its collections re-walk the trees alive, which
    made checking a 100 KB statement several times slower (3-10x measured). The garbage of a
    check is collected when the collector resumes, after the last running check ends.
    """
    global _checks_running, _resume_collection
    with _pause_lock:
        if _checks_running == 0:
            _resume_collection = gc.isenabled()
            gc.disable()
        _checks_running += 1
    try:
        yield
    finally:
        with _pause_lock:
            _checks_running -= 1
            if _checks_running == 0 and _resume_collection:
                gc.enable()


def _protect(sql: str, params, context: GuardContext, in_time) -> ProtectedQuery:
    in_time = in_time or _unlimited
    in_time()
    walked: list[exp.Expr] = []  # one walk for the checks before qualification, one after
    parsed = parse_statement(sql, context.policy.max_statement_characters, walked)
    in_time()
    tree = bind_parameters(parsed, params, sql, context.policy.max_statement_characters)
    if tree is not parsed:  # parameters bound into a copy
        walked = nodes(tree)
    if built_in_types(walked):  # CAST(x AS pg_catalog.int4), as PostgreSQL clients write
        walked = nodes(tree)
    if arrays_as_in(walked):  # x = ANY(ARRAY['a', 'b']), as psycopg2 writes a list
        walked = nodes(tree)
    if fold_limit_casts(walked):  # LIMIT CAST(3 AS INT), as SQLAlchemy binds .limit(3)
        walked = nodes(tree)
    check_limits(tree, sql, walked)
    names = output_names(tree)
    starred = any(  # its columns are named by qualify's expansion, one column or many
        isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star))
        for p in _first_select(tree).expressions
    )
    if name_positioned_subqueries(walked):  # GROUP BY 2 of an unnamed (SELECT ...)
        walked = nodes(tree)
    tables = sorted(check_tables(tree, context.policy, sql, walked))
    repeated = RepeatedColumns(tree, walked)
    keys = RepeatedKeys(walked)
    qualified_nodes: list[exp.Expr] = []
    try:
        tree = qualify_tree(tree, context.schema, sql, repeated, walked, qualified_nodes)
    except PolicyViolation:
        if not (repeated.pairs or repeated.lists):
            raise
        # refused as when sqlglot resolves every column (which one a message names may
        # depend on the order it meets them in): again, on a fresh tree, without groups
        limit = context.policy.max_statement_characters
        fresh = bind_parameters(parse_statement(sql, limit), params, sql, limit)
        name_positioned_subqueries(nodes(fresh))
        qualify_tree(fresh, context.schema, sql)
        raise
    qualified_names = [p.alias_or_name for p in _first_select(tree).expressions]
    if starred or len(qualified_names) != len(names):  # a * was expanded: into one column,
        names = qualified_names  # SELECT * FROM (SELECT COUNT(*) AS n ...) t named it "*"
    _check_names(names, sql)
    in_time()
    analysis = analyze(
        tree,
        context.policy,
        context.schema,
        sql,
        context.constant_type,
        repeated,
        qualified_nodes,
        keys,
    )
    in_time()
    multiplicity = prove_multiplicity(analysis, context.policy, context.unique_columns, sql)
    plan = plan_query(analysis, context.policy, context.unit_per_row, multiplicity)
    refuse_long_keys(plan.cells)
    refuse_many_lookups(plan.cells)
    in_time()
    stages: dict[int, DpStage] = {}  # by id of the aggregation in ``tree``
    discarded: list[exp.Expr] = []  # parts of the rewrite's copy that it replaced
    if plan.cells:
        rewritten = {id(c.select) for c in plan.cells}
        rewritten |= {id(a.node) for c in plan.cells for a in c.aggregates}
        mark_analyst_scopes(tree, rewritten)
    root = _root_identity(analysis)  # the DP frame of the root aggregation reuses its population
    populations = {} if root is None else {id(analysis.root.scope): root.population}
    rewrite = RewriteContext(context.policy, context.ptables, stages, context.to_sql, populations)
    population = _population(analysis, root)  # before the rewrite moves the analysed WHERE
    # nothing below reads the analysed tree under its aggregations' projections: their WHERE
    # may move into the result instead of being copied
    protected = protect_cells(tree, plan, frame_builders(rewrite), discarded, moving=True)
    in_time()
    protected = _rename_outputs(protected, names)
    if plan.cells:  # rows of confidential data: their order tells nothing the values do not
        protected = in_released_order(protected, sql)
        released_in_one_spelling(protected, sql)  # and none of the values SQL holds equal
    # a class of a unit-noised measure: of x·m (no walk when no table read has one)
    derive_classes(protected, context.policy, tables)
    for stage in stages.values():  # run apart, not rewritten: refused if it reads one
        for stage_tree in stage.trees.values():
            refuse_derived_classes(stage_tree, context.policy, tables)
    kept = validate_release(protected, context.policy)  # the nodes of the result
    text = context.to_sql(protected)
    columns = _describe_outputs(analysis, plan, names, context.ptables, stages)
    with_status = any(c.with_status for c in plan.cells)
    status = {i: f"{STATUS_PREFIX}{i}" for i in range(len(names))} if with_status else {}
    accuracy = (
        {i: tuple(f"{prefix}{i}" for prefix in ACCURACY_PREFIXES) for i in range(len(names))}
        if with_status and stages
        else {}
    )
    # the analysed trees are not read any more: freed now, not by the cycle collector
    for stage in stages.values():
        kept += [n for t in stage.trees.values() for n in nodes(t)]
    release({id(t): t for t in (parsed, tree, *discarded)}.values(), keep=kept)
    return ProtectedQuery(
        sql=text,
        columns=columns,
        status_columns=status,
        accuracy_columns=accuracy,
        dp_stages=tuple(stages.values()),
        fingerprint=hashlib.sha256(text.encode()).hexdigest()[:16],
        population=population,
        summed=tuple(
            sorted(
                {s for c in plan.cells for a in c.aggregates for s in a.node.meta.get(SUMMED, ())}
            )
        ),
        tables=tuple(tables),
        tree=protected,
        suppressed=tuple(
            sorted({c.tables[0] for c in plan.cells if c.mechanism is Method.SUPPRESS})
        ),
    )


def _unlimited() -> None:
    """No time limit (``protect`` without ``in_time``)."""


def _root_identity(analysis: Analysis) -> AggregationIdentity | None:
    """The identity of the query's result when it is an aggregation (population, keys and
    aggregates written on base columns, whatever the aliases, CTEs or conjunct order)."""
    root = analysis.root
    if root.kind is not Kind.AGGREGATE:
        return None
    return aggregation_identity(root.scope, aggregates=root.aggregates)


def _population(analysis: Analysis, root: AggregationIdentity | None) -> str:
    """The canonical identity of the query's result: that of its aggregation (``root``) when
    the result is one, else of the whole query. With the key values of a row it identifies a
    released cell in the ledger, so that cells of different populations never share a key."""
    if root is not None:
        return root.digest
    text = json.dumps(describe_scope(analysis.root.scope), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _first_select(tree: exp.Expr) -> exp.Select:
    while isinstance(tree, (exp.Union, exp.Intersect, exp.Except, exp.Subquery)):
        tree = tree.this
    return tree


def _check_names(names: list[str], sql: str) -> None:
    """Refuse an output column whose name holds the NUL character: a cursor's description
    cut the name at it (``"a\\x00b"`` was described as ``a``), and PostgreSQL, whose
    protocol ends every text at a NUL, has no such name either."""
    for name in names:
        if "\x00" in name:
            raise PolicyViolation(
                f"the output column name {name!r} contains the NUL character (\\x00)",
                "name the column without it: expression AS name",
                sql,
            )


def _rename_outputs(tree: exp.Expr, names: list[str]) -> exp.Expr:
    """Give the result columns the names DuckDB would have given the original query."""
    select = _first_select(tree)
    renamed = {}
    for projection, name in zip(select.expressions, names, strict=False):
        if projection.alias_or_name != name:
            renamed[projection.alias_or_name] = name
            projection.replace(exp.alias_(projection.unalias().copy(), name, quoted=True))
    for order in (tree.args.get("order"), select.args.get("order")):
        for column in order.find_all(exp.Column) if order is not None else []:
            if not column.table and column.name in renamed:
                column.replace(exp.column(exp.to_identifier(renamed[column.name], quoted=True)))
    return tree


def _dp_accuracy(stage: DpStage | None, node: exp.Expr, cell_plan) -> tuple[float, float] | None:
    """(sd, 95% half-width) of a DP COUNT or SUM output; None for ratios (data-dependent)."""
    if stage is None:
        return None
    for aggregate, output in zip(cell_plan.aggregates, stage.outputs, strict=True):
        if aggregate.node is node:
            plan = output.plan
            return (plan.sd, plan.half_width) if plan.sd is not None else None
    return None


def _unit_noise(used) -> tuple[float, float] | None:
    """(a, b) when every CKM magnitude of a column carries the same permanent unit noise
    (:mod:`sqlsdc.mechanisms.unit_noise`), which the explanation then states."""
    found = {
        a.rule.magnitude.unit_noise
        for a in used
        if a.kind is AggregateKind.MAGNITUDES and a.rule.magnitude is not None
    }
    if len(found) != 1 or None in found:
        return None
    (noise,) = found
    return (noise.a, noise.b)


def _describe_outputs(
    analysis: Analysis, plan, names: list[str], ptables, stages: dict[int, DpStage]
) -> list[OutputColumn]:
    root = analysis.root
    cells = {id(c.select): c for c in plan.cells}
    select = _first_select(root.scope.expression)
    columns = []
    if root.kind is Kind.AGGREGATE or id(select) in cells:
        cell_plan = cells[id(select)]
        by_node = {id(a.node): a for a in cell_plan.aggregates}
        for name, projection in zip(names, select.expressions, strict=False):
            used = [by_node[id(n)] for n in nodes(projection) if id(n) in by_node]
            if used:
                k = max(a.min_frequency for a in used)
                methods = {a.rule.method.value for a in used}
                noise = None
                if methods == {Method.CKM.value} and all(
                    a.kind is AggregateKind.COUNTS and a.node is projection.unalias() for a in used
                ):
                    noise = ptables.get(("counts", used[0].rule.ptable))
                dp = None
                if methods == {Method.DP.value}:
                    k = None
                    dp = _dp_accuracy(stages.get(id(select)), projection.unalias(), cell_plan)
                rounding = None
                if methods == {Method.ROUND.value} and len({a.rule for a in used}) == 1:
                    rounding = (used[0].rule.base, used[0].rule.rounding.value)
                ruled = [r for a in used if rules(a) for r in a.rule.dominance]
                dominance = tuple(dict.fromkeys(ruled))
                columns.append(
                    OutputColumn(
                        name,
                        "+".join(sorted(methods)),
                        k,
                        noise,
                        dp,
                        rounding,
                        dominance,
                        _unit_noise(used),
                    )
                )
            else:
                columns.append(OutputColumn(name, "key"))
        return columns
    for name, lineage in zip(names, root.columns, strict=False):
        mechanism = "derived" if lineage.protected else "key" if lineage.sources else "public"
        columns.append(OutputColumn(name, mechanism))
    return columns
