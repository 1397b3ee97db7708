"""pandas-level entry points: protect a table by cell suppression, audit a suppressed table.

:func:`protect` runs the whole job a statistics office runs in τ-ARGUS or sdcTable:

1. ``build_table`` (or ``Table.from_cells`` for aggregated input): all cells, X and A;
2. ``apply_rules``: primary cells with their protection levels;
3. secondary suppression: ``gauss_suppress`` (GaussSuppression), ``optimal_suppress`` (one MILP)
   or ``hitas_suppress`` (HiTaS sub-tables);
4. ``audit_intervals``/``audit_check``: the attacker's LP (or integer) feasibility interval of
   every suppressed cell, checked against the protection levels.

A release never looks successful when its audit fails. Primary cells whose interval is too
narrow get more suppressions by GaussSuppression's interval step (R's ``interval_suppression``
and ``FixRiskyIntervals``, :func:`~sqlsdc.tabular.gauss.fix_risky_intervals`): the published
cells are walked in candidate order and each one that would leave a primary's interval short of
its protection levels is suppressed; GaussSuppression then runs again with every suppressed cell
as primary, and the audit is repeated, up to ``max_rounds`` times. A primary that no pattern can
protect (the forced cells and the a-priori bounds pin it) is named in the error. After that
:func:`protect` raises :class:`~sqlsdc.errors.TabularError`. The audit outcome is
``result.attrs["audit"]``, an :class:`AuditReport`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.tabular.model import TOTAL, Table, build_table
from sqlsdc.tabular.rules import ManualRule, apply_rules, default_rules, required_top_k

METHODS = ("gauss", "optimal", "hitas")
COSTS = ("value", "frequency", "unity")


@dataclass(frozen=True)
class AuditReport:
    """The audit of a suppression pattern.

    Attributes:
        passed: every primary cell's feasibility interval reaches its protection levels and
            every interval was proven (not cut short by the time limit).
        n_primary, n_secondary: suppressed cells by status.
        n_failing: primary cells whose protection is not met or not proven.
        failing: positions (rows of the result) of those cells.
        exact: every primary interval was solved to proven optimality.
        method: the secondary suppression method ("audit" for :func:`audit`).
        rounds: rounds of the interval step (extra suppressions) the audit needed.
        solver_status: the optimisation status reported by ``optimal``/``hitas``, else None.
    """

    passed: bool
    n_primary: int
    n_secondary: int
    n_failing: int
    failing: tuple[int, ...]
    exact: bool
    method: str
    rounds: int = 0
    solver_status: str | None = None


def protect(
    data: pd.DataFrame | Table,
    dims: Sequence[str] | None = None,
    measure: str | None = None,
    *,
    rules: Sequence | None = None,
    method: str = "gauss",
    hierarchies: Mapping | None = None,
    primary: np.ndarray | Callable | None = None,
    forced: np.ndarray | Callable | None = None,
    held: np.ndarray | Callable | None = None,
    forced_known: bool = False,
    cost: str | np.ndarray = "value",
    weight: str | None = None,
    holding: str | None = None,
    unit: str | None = None,
    shadow: str | None = None,
    apriori: float | tuple | None = None,
    total: str = TOTAL,
    integer: bool | None = None,
    time_limit: float = 60.0,
    min_level: float = 1.0,
    max_rounds: int = 5,
    singleton_method: str = "anySumAudit",
) -> pd.DataFrame:
    """Protect a table by primary and secondary cell suppression, audited.

    Args:
        data: microdata (one row per record) or a :class:`Table` (e.g. ``Table.from_cells``).
        dims, measure, hierarchies, weight, holding, unit, shadow, total: as in
            :func:`~sqlsdc.tabular.model.build_table` (ignored for a ``Table``).
        rules: primary rules (:mod:`sqlsdc.tabular.rules`); default: the frequency rule, plus
            the p%-rule for magnitude tables. ``[]`` with ``primary=`` uses only that mask.
        method: ``"gauss"``, ``"optimal"`` or ``"hitas"``.
        primary: extra primary cells: a boolean mask over the table's cells (in ``Table``
            order, i.e. the result's row order) or a function of the cells DataFrame; they get
            τ-ARGUS's manual protection (10 % of the value; pass a ``ManualRule`` in ``rules``
            for another range).
        forced: cells that must be published (mask or function), e.g. published elsewhere.
        held: cells that must stay suppressed without a protection level of their own (mask
            or function), e.g. secondary cells of an earlier release; primary when any rule
            flags them, with that rule's levels.
        forced_known: the forced cells are public already (an earlier release): a primary
            cell's levels are cut to the interval they leave open (hiding more cannot widen
            it) instead of refusing the table.
        cost: ``"value"`` (|value|), ``"frequency"`` (n) or ``"unity"`` — τ-ARGUS's cost
            functions — or an array of costs.
        apriori: what the attacker knows of every cell: ``None`` (``[0, inf)`` for non-negative
            tables, unbounded otherwise), a percentage ``p`` (``value ± p %``, τ-ARGUS's
            a-priori bounds) or a ``(lower, upper)`` pair of arrays or scalars.
        integer: audit with integer cells; default: for unweighted frequency tables.
        time_limit: seconds per solver call (optimal MILP, each HiTaS sub-table, the audit).
        min_level: minimum protection level of a primary cell (see ``apply_rules``).
        max_rounds: rounds of the interval step when the audit fails.
        singleton_method: GaussSuppression's singleton method (SSBtools ``singletonMethod``,
            :data:`~sqlsdc.tabular.gauss.SINGLETON_METHODS`), for ``gauss`` and for the walk
            over the ``optimal``/``hitas`` pattern: ``"anySumAudit"`` (default: ``anySum``,
            its walk redone until no one-unit cell's respondent computes another primary;
            :mod:`~sqlsdc.tabular.respondents`), ``"anySum"`` (SSBtools' default, which lets
            such a respondent compute r1c2 - r0c1 = 0 through: red team s44o) or the
            conservative ``"subSpace"`` (all respondents together; README, "Singletons").

    Returns:
        One row per cell: the dimensions (total code on margins), ``n``, ``value``, ``status``
        (``published``/``primary``/``secondary``), ``rule`` (rules that fired), ``upl``,
        ``lpl`` and the audited interval ``lo``/``hi`` (``lo = hi = value`` when published);
        ``attrs["audit"]`` is the :class:`AuditReport`. ``upl``/``lpl`` derive from the
        confidential contributions (and ``lo``/``hi`` from the a-priori bounds): they are for the
        producer; publish the dimensions, ``status`` and the published values only.

    Raises:
        TabularError: invalid input, no protecting pattern, or an audit still failing after
            ``max_rounds``.

    Example:
        >>> income = [10.0, 12, 9, 11, 8, 10, 7, 9, 8, 30, 6, 9, 10, 12, 8, 9, 11]
        >>> df = pd.DataFrame({"region": list("aaaaaabbbbbcccccc"),
        ...                    "sex": list("mmmfffmmmffmmmfff"), "income": income})
        >>> out = protect(df, ["region", "sex"], "income")
        >>> hidden = out[out["status"] != "published"]
        >>> hidden[["region", "sex", "status", "rule"]].values.tolist()
        [['b', 'f', 'primary', 'freq; p(10)'], ['b', 'm', 'secondary', ''], \
['c', 'f', 'secondary', ''], ['c', 'm', 'secondary', '']]
        >>> out.attrs["audit"].passed
        True
    """
    if method not in METHODS:
        raise TabularError(f"method must be one of {METHODS}; got {method!r}")
    from sqlsdc.tabular.gauss import check_singleton_method

    check_singleton_method(singleton_method)
    if rules is None:
        rules = [] if primary is not None else None
    if isinstance(data, Table):
        table = data
    else:
        if dims is None:
            raise TabularError("protect() needs `dims` for microdata input")
        top_k = required_top_k(rules or default_rules(measure is None))
        table = build_table(
            data,
            dims,
            measure,
            hierarchies=hierarchies,
            weight=weight,
            holding=holding,
            unit=unit,
            shadow=shadow,
            total=total,
            top_k=top_k,
        )
    rules = list(default_rules(table.count) if rules is None else rules)
    if primary is not None:
        rules.append(primary if isinstance(primary, ManualRule) else ManualRule(primary))
    found = apply_rules(table, rules, min_level=min_level)
    values = table.values
    lower, upper = _bounds(table, apriori)
    upl = np.minimum(found.upl, upper - values)
    lpl = np.minimum(found.lpl, values - lower)
    prim = found.primary | table.mask(held, "held")
    force = table.mask(forced, "forced")
    if forced_known and force.any():
        upl, lpl = _left_open(table, prim, upl, lpl, lower, upper, force, integer, time_limit)
    if (force & prim).any():
        raise TabularError(
            f"{int((force & prim).sum())} cells are both primary and forced to be published; "
            "a forced cell cannot be protected — drop it from `forced`"
        )
    costs = _costs(cost, table)
    suppressed, solver_status = _secondary(
        method, table, prim, upl, lpl, costs, lower, upper, force, time_limit, singleton_method
    )
    integer = _integer(table) if integer is None else integer
    suppressed, result, failing, rounds = _audit_rounds(
        table,
        suppressed,
        prim,
        upl,
        lpl,
        costs,
        lower,
        upper,
        force,
        integer,
        time_limit,
        max_rounds,
    )
    if failing.any() and method != "optimal" and len(values) <= OPTIMAL_FALLBACK_CELLS:
        # the fast pattern cannot reach the protection levels: solve for them (time-limited)
        method = f"{method}+optimal"
        suppressed, solver_status = _secondary(
            "optimal", table, prim, upl, lpl, costs, lower, upper, force, time_limit,
            singleton_method,
        )  # fmt: skip
        suppressed, result, failing, more = _audit_rounds(
            table, suppressed, prim, upl, lpl, costs, lower, upper, force, integer, time_limit,
            max_rounds,
        )  # fmt: skip
        rounds += more
    if failing.any():
        where = _describe(table, failing)
        raise TabularError(
            f"the audit fails for {int(failing.sum())} primary cells after {rounds} rounds of "
            f"extra suppression (e.g. {where}); try method='optimal', a longer time_limit or "
            "coarser categories"
        )
    out = _output(table, prim, suppressed, found.rule, upl, lpl, result)
    out.attrs["audit"] = AuditReport(
        passed=True,
        n_primary=int(prim.sum()),
        n_secondary=int((suppressed & ~prim).sum()),
        n_failing=0,
        failing=(),
        exact=bool(np.all(result.exact[prim])),
        method=method,
        rounds=rounds,
        solver_status=solver_status,
    )
    return out


def audit(
    cells: pd.DataFrame,
    dims: Sequence[str],
    *,
    hierarchies: Mapping | None = None,
    total: str | None = None,
    integer: bool | None = None,
    apriori: float | tuple | None = None,
    time_limit: float = 60.0,
) -> pd.DataFrame:
    """Feasibility intervals of the suppressed cells of a table in :func:`protect`'s format.

    ``cells`` needs the dimension columns, ``n``, ``value`` and ``status`` (a cell is suppressed
    unless its status is ``"published"``); hierarchies and the total code default to those
    :func:`protect` stored in ``cells.attrs``. When ``upl``/``lpl`` columns are present, the
    primary cells are checked and ``attrs["audit"]`` holds the :class:`AuditReport`.

    Returns:
        A copy of ``cells`` with ``lo`` and ``hi`` (``lo = hi = value`` for published cells).

    Example:
        >>> df = pd.DataFrame({"g": ["a", "a", "a", "b", "c", "c", "c"],
        ...                    "v": [5.0, 6, 7, 40, 8, 9, 10]})
        >>> out = protect(df, ["g"], "v")
        >>> audit(out, ["g"])[["g", "status", "lo", "hi"]].values.tolist()
        [['Total', 'published', 85.0, 85.0], ['a', 'secondary', 0.0, 58.0], \
['b', 'primary', 0.0, 58.0], ['c', 'published', 27.0, 27.0]]

    Tables of :func:`~sqlsdc.tabular.model.link_tables` cannot be re-read here (their cells have
    no common inner cells); audit them with ``audit_intervals`` on ``Table.A``.
    """
    from sqlsdc.tabular.attacker import audit_check, audit_intervals

    dims = [dims] if isinstance(dims, str) else list(dims)
    for col in ("n", "value", "status"):
        if col not in cells.columns:
            raise TabularError(f"audit() needs a {col!r} column; give protect()'s output")
    hierarchies = hierarchies if hierarchies is not None else cells.attrs.get("hierarchies")
    total = total if total is not None else cells.attrs.get("total", TOTAL)
    table = Table.from_cells(
        cells[[*dims, "n", "value"]], dims, top=[], hierarchies=hierarchies, total=total
    )
    key = cells[dims].astype(str).reset_index(drop=True)
    pos = key.merge(
        table.cells[dims].reset_index().astype({d: str for d in dims}), on=dims, how="left"
    )["index"].to_numpy()
    if np.isnan(pos.astype(float)).any():
        raise TabularError("audit() got cells that are not cells of the table")
    pos = pos.astype(np.int64)
    suppressed = np.zeros(len(table.cells), dtype=bool)
    suppressed[pos] = cells["status"].to_numpy() != "published"
    lower, upper = _bounds(table, apriori)
    integer = _integer(table) if integer is None else integer
    result = audit_intervals(
        table.A,
        table.values,
        suppressed,
        lower=lower,
        upper=upper,
        integer=integer,
        time_limit=time_limit,
    )
    out = cells.copy()
    out["lo"], out["hi"] = result.lo[pos], result.hi[pos]
    if {"upl", "lpl"} <= set(cells.columns):
        prim = np.zeros(len(table.cells), dtype=bool)
        prim[pos] = cells["status"].to_numpy() == "primary"
        upl, lpl = np.zeros(len(prim)), np.zeros(len(prim))
        upl[pos], lpl[pos] = cells["upl"].to_numpy(float), cells["lpl"].to_numpy(float)
        ok = np.asarray(audit_check(result, table.values, prim, upl, lpl), dtype=bool)
        failing = prim & ~(ok & np.asarray(result.exact, dtype=bool))
        back = np.full(len(prim), -1)
        back[pos] = np.arange(len(pos))
        out.attrs["audit"] = AuditReport(
            passed=not failing.any(),
            n_primary=int(prim.sum()),
            n_secondary=int((suppressed & ~prim).sum()),
            n_failing=int(failing.sum()),
            failing=tuple(int(i) for i in back[failing]),
            exact=bool(np.all(np.asarray(result.exact)[prim])),
            method="audit",
        )
    return out


# --- steps --------------------------------------------------------------------------------


OPTIMAL_FALLBACK_CELLS = 5_000  # the compact MILP solves tables of about this size in minutes


def _secondary(method, table, prim, upl, lpl, cost, lower, upper, forced, time_limit, singleton):
    values = table.values
    if method == "gauss":
        from sqlsdc.tabular.gauss import gauss_suppress

        if table.X is None:
            raise TabularError(
                "method='gauss' needs the model matrix X, which these linked tables lack (link "
                "tables built from the same microdata); use method='optimal'"
            )
        return gauss_suppress(
            table.X,
            prim,
            cost,
            forced=forced,
            singleton=_singletons(table, prim),
            singleton_method=singleton,
            values=values,
        ), None
    if method == "optimal":
        from sqlsdc.tabular.optimal import optimal_suppress

        r = optimal_suppress(
            table.A,
            values,
            prim,
            upl,
            lpl,
            cost,
            lower=lower,
            upper=upper,
            forced=forced,
            time_limit=time_limit,
        )
    else:
        from sqlsdc.tabular.hitas import hitas_suppress

        if any(h is None for h in table.hierarchies.values()):
            raise TabularError(
                "method='hitas' needs one hierarchy per dimension; these linked tables use "
                "different hierarchies for a dimension — use method='optimal'"
            )
        r = hitas_suppress(
            table.cells[list(table.dims)],
            table.parents(),
            values,
            prim,
            upl,
            lpl,
            cost,
            lower=lower,
            upper=upper,
            forced=forced,
            total=table.total,
            time_limit_per_subtable=time_limit,
        )
    if r.status in ("infeasible", "timeout"):
        raise TabularError(
            f"method={method!r} found no protecting pattern (status {r.status!r}); raise "
            "time_limit, relax `forced`, or lower the protection levels"
        )
    suppressed = np.asarray(r.suppressed, dtype=bool)
    return _protect_singletons(table, prim, suppressed, cost, forced, singleton), r.status


def _singletons(table: Table, prim: np.ndarray) -> np.ndarray:
    """Inner cells (rows of ``X``) a respondent can subtract: primary cells of one unit
    (GaussSuppression's ``SingletonDefault``)."""
    inner = table.inner
    single = np.zeros(len(inner), dtype=bool)
    ok = inner >= 0
    single[ok] = (table.n[inner[ok]] == 1) & prim[inner[ok]]
    return single


def _protect_singletons(table, prim, suppressed, cost, forced, method) -> np.ndarray:
    """The optimal or HiTaS pattern plus what GaussSuppression's singleton rule ``method``
    (``anySumAudit`` by default, ``anySum``, ``subSpace`` conservative; ``none``: nothing) adds.

    The LP attacker of those methods is an outsider. The respondent of a primary cell of one
    unit knows that cell, and with two such cells hidden in one sum (a = c = 1 in Total = a + b
    + c with b published) each respondent computes the other's (sdcTable's ``protectTable``
    test, ``detectSingletons = TRUE``). The pattern's published cells are walked first (cost
    above every suppressed cell's), so the walk only hides a published cell whose publication
    would let a singleton's respondent compute another primary; nothing is unsuppressed.
    Linked tables without ``X`` are left as they are (their audit is the outsider's only).
    """
    from sqlsdc.tabular.gauss import gauss_suppress

    single = _singletons(table, prim) if table.X is not None else None
    if single is None or not single.any() or method == "none":
        return suppressed
    published_first = np.where(suppressed, cost, cost + 2.0 * float(np.max(cost)) + 2.0)
    walked = gauss_suppress(
        table.X, prim, published_first, forced=forced, singleton=single, singleton_method=method
    )
    return suppressed | walked


def _audit_rounds(
    table, suppressed, prim, upl, lpl, cost, lower, upper, forced, integer, time_limit, max_rounds
):
    """Audit; while primaries fail, add suppressions by GaussSuppression's interval step.

    Each round is R's ``interval_suppression``: :func:`~sqlsdc.tabular.gauss.fix_risky_intervals`
    suppresses the first published cells (in candidate order) that make a failing primary's
    interval too narrow, then ``gauss_suppress`` re-runs with every suppressed cell as primary so
    that none of the new ones is computable (without ``X``, for linked tables, this step is
    skipped and the audit alone judges the pattern). The first walk uses the LP attacker (R's
    ``allInt = FALSE``); later rounds, needed only when the integer audit of a count table still
    fails, use the integer one.
    """
    from sqlsdc.tabular.attacker import audit_check, audit_intervals
    from sqlsdc.tabular.gauss import candidate_order, fix_risky_intervals, gauss_suppress

    values = table.values
    if table.X is not None:
        order = candidate_order(table.X, cost, values)
    else:
        order = np.lexsort((np.arange(len(cost)), -cost))
    rounds = 0
    while True:
        result = audit_intervals(
            table.A,
            values,
            suppressed,
            lower=lower,
            upper=upper,
            integer=integer,
            time_limit=time_limit,
        )
        ok = np.asarray(audit_check(result, values, prim, upl, lpl), dtype=bool)
        failing = prim & ~(ok & np.asarray(result.exact, dtype=bool))
        if not failing.any() or rounds >= max_rounds:
            return suppressed, result, failing, rounds
        if rounds == 0:
            _refuse_unprotectable(
                table, failing, upl, lpl, lower, upper, forced, integer, time_limit
            )
        extra = fix_risky_intervals(
            table.A,
            values,
            suppressed,
            failing,
            upl,
            lpl,
            order,
            lower=lower,
            upper=upper,
            forced=forced,
            integer=integer and rounds > 0,
            time_limit=time_limit,
        )
        if not extra.any():
            return suppressed, result, failing, rounds
        suppressed = suppressed | extra
        if table.X is not None:
            suppressed = gauss_suppress(table.X, suppressed, cost, forced=forced, values=values)
        rounds += 1


def _left_open(table, prim, upl, lpl, lower, upper, forced, integer, time_limit):
    """``upl``/``lpl`` of the primary cells cut to the widest interval an attacker can have
    with every cell but the forced ones hidden (exact audits only; others keep their levels)."""
    from sqlsdc.tabular.attacker import audit_intervals

    values = table.values
    integer = _integer(table) if integer is None else integer
    widest = audit_intervals(
        table.A, values, ~forced, lower=lower, upper=upper, integer=integer,
        time_limit=time_limit, cells=prim & ~forced,
    )  # fmt: skip
    exact = prim & ~forced & np.asarray(widest.exact, dtype=bool)
    hi = np.asarray(widest.hi, dtype=np.float64)
    lo = np.asarray(widest.lo, dtype=np.float64)
    upl = np.where(exact, np.fmin(upl, hi - values), upl)
    lpl = np.where(exact, np.fmin(lpl, values - lo), lpl)
    return upl, lpl


def _refuse_unprotectable(table, failing, upl, lpl, lower, upper, forced, integer, time_limit):
    """Raise when a failing primary misses its levels even with every non-forced cell hidden.

    Suppressing more cells only widens intervals, so such a cell has no protecting pattern: the
    forced cells and the a-priori bounds pin it (``optimal`` would report "infeasible").
    """
    from sqlsdc.tabular.attacker import audit_check, audit_intervals

    values = table.values
    hidden = ~forced
    cells = failing & hidden
    widest = audit_intervals(
        table.A,
        values,
        hidden,
        lower=lower,
        upper=upper,
        integer=integer,
        time_limit=time_limit,
        cells=cells,
    )
    ok = np.asarray(audit_check(widest, values, cells, upl, lpl), dtype=bool) & widest.exact
    stuck = np.flatnonzero(failing & ~(ok & cells) & widest.exact)
    if stuck.size == 0:
        return
    keys = table.cells.iloc[stuck[:3]][list(table.dims)].astype(str).to_dict("records")
    examples = "; ".join(
        f"{key} = {values[c]:g} needs [{values[c] - lpl[c]:g}, {values[c] + upl[c]:g}], "
        f"at most [{widest.lo[c]:g}, {widest.hi[c]:g}] with all but the forced cells hidden"
        for key, c in zip(keys, stuck[:3].tolist(), strict=True)
    )
    raise TabularError(
        f"{stuck.size} primary cell(s) cannot be protected by any suppression pattern: "
        f"{examples}; the forced cells and the a-priori bounds pin them — publish fewer cells "
        "as forced, widen `apriori`, or lower the protection levels (rules' safety ranges)"
    )


def _output(table, prim, suppressed, rule, upl, lpl, result) -> pd.DataFrame:
    out = table.cells[[*table.dims, "n", "value"]].copy()
    status = np.where(prim, "primary", np.where(suppressed, "secondary", "published"))
    out["status"] = status
    out["rule"] = np.where(prim, rule, "")
    out["upl"], out["lpl"] = upl, lpl
    out["lo"] = np.asarray(result.lo, dtype=np.float64)
    out["hi"] = np.asarray(result.hi, dtype=np.float64)
    out.attrs["hierarchies"] = table.parents()
    out.attrs["total"] = table.total
    return out


# --- inputs ---------------------------------------------------------------------------------


def _bounds(table: Table, apriori) -> tuple[np.ndarray, np.ndarray]:
    """A-priori bounds [lower, upper] the attacker knows for every cell."""
    v = table.values
    nonneg = not table.negative and bool((v >= 0).all())
    if apriori is None:
        lower = np.zeros_like(v) if nonneg else np.full_like(v, -np.inf)
        return lower, np.full_like(v, np.inf)
    if isinstance(apriori, int | float):
        if not apriori > 0:
            raise TabularError(f"apriori percentage must be > 0; got {apriori!r}")
        span = np.abs(v) * apriori / 100.0
        lower = np.maximum(v - span, 0.0) if nonneg else v - span
        return lower, v + span
    try:
        lo, up = apriori
    except (TypeError, ValueError):
        raise TabularError(
            f"apriori must be None, a percentage or a (lower, upper) pair; got {apriori!r}"
        ) from None
    lower = np.broadcast_to(np.asarray(lo, dtype=np.float64), v.shape).copy()
    upper = np.broadcast_to(np.asarray(up, dtype=np.float64), v.shape).copy()
    if np.any(lower > v) or np.any(upper < v):
        raise TabularError("a-priori bounds must satisfy lower <= value <= upper for every cell")
    return lower, upper


def _costs(cost, table: Table) -> np.ndarray:
    if isinstance(cost, str):
        if cost == "value":
            c = np.abs(table.values)
        elif cost == "frequency":
            c = np.maximum(table.n, 1).astype(np.float64)
        elif cost == "unity":
            c = np.ones(len(table.cells))
        else:
            raise TabularError(f"cost must be one of {COSTS} or an array; got {cost!r}")
    else:
        c = np.asarray(cost, dtype=np.float64)
        if c.shape != (len(table.cells),) or not np.all(np.isfinite(c)) or np.any(c < 0):
            raise TabularError(f"cost must be {len(table.cells)} finite values >= 0")
    positive = c[c > 0]
    floor = positive.min() * 1e-3 if len(positive) else 1.0
    return np.where(c > 0, c, floor)  # zero-valued cells stay candidates, cheapest of all


def _integer(table: Table) -> bool:
    v = table.values
    return bool(table.count and not table.weighted and np.all(v == np.round(v)))


def _describe(table: Table, mask: np.ndarray) -> str:
    rows = table.cells.loc[mask, list(table.dims)].head(3)
    return "; ".join(str(dict(r)) for r in rows.astype(str).to_dict("records"))
