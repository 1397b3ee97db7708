"""The cells of a verification's answer and their fidelity measures ([MR]: McClure and Reiter,
see :mod:`sqlsdc.synth.verify`).

:func:`plan_cells` lays the answer's cells out from the synthetic (public) records alone, with
each cell's synthetic interval, before anything is charged or any confidential record read;
:func:`measure_cells` then measures each released cell on the confidential records: the decile
interval of the fidelity measure over the safety-zone scan (``interval``) or the fidelity
measure with discrete Laplace noise (``noisy``, :func:`noisy_fm`). The server around them
(access, cache, limits, the charge, the audit) is :mod:`sqlsdc.synth.verify`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.prf import KeyedStream
from sqlsdc.mechanisms.samplers import discrete_laplace
from sqlsdc.synth.fidelity import (
    Z95,
    combine_full,
    combine_partial,
    decile_interval,
    fidelity,
    normal_ci,
)
from sqlsdc.synth.request import Request
from sqlsdc.synth.scan import (
    aggregate_ci,
    candidates,
    fit_ols,
    ols_ci,
    safety_zones,
    scan_aggregate,
    scan_ols,
)

NOISY_GRID = 1000


@dataclass(frozen=True)
class Output:
    """The synthetic output a verification reads: its name, source and version, its copies and
    how their estimates combine, and the per-user query limit."""

    name: str
    source_sql: str
    version: str
    copies: int
    combining: str
    max_queries: int


def _keys(request: Request, frame: pd.DataFrame) -> pd.Series:
    """One group key per row: the tuple of its group values (missing values as None)."""
    names = [f"__g{i}" for i in range(len(request.groups))]
    columns = [frame[n].astype(object).where(frame[n].notna(), None) for n in names]
    return pd.Series(
        list(zip(*columns, strict=True)) if names else [()] * len(frame),
        index=frame.index,
        dtype=object,
    )


def _member(keys: pd.Series, group: tuple) -> np.ndarray:
    """Which rows belong to ``group`` (element-wise: pandas would read a tuple as a list)."""
    return np.fromiter((k == group for k in keys), dtype=bool, count=len(keys))


_JSON_VALUES = (str, int, float, bool, type(None))


def _plain(value):
    """A group value as an answer (and its cached copy, stored as JSON) holds it: a numpy
    scalar as Python's, NaN as None, any other type (a DATE, a DECIMAL, a TIMESTAMP) as its
    text, as the cell's noise label reads it. Red team s43b: kept as a ``date`` or a
    ``Decimal``, the answer's ``json.dumps`` failed after the charge (a TypeError, unaudited,
    uncached, uncounted against ``max_queries``, the confidential records read each time)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and np.isnan(value):
        return None
    return value if isinstance(value, _JSON_VALUES) else str(value)


def _terms(request: Request) -> list[tuple[int, str | None, int]]:
    """(estimand index, term name, coefficient index) for every released quantity."""
    terms = []
    for k, e in enumerate(request.estimands):
        if e.kind == "ols":
            names = ["intercept", *(i.sql("duckdb") for i in e.inputs[1:])]
            terms += [(k, name, j) for j, name in enumerate(names)]
        else:
            terms.append((k, None, 0))
    return terms


def plan_cells(request: Request, synthetic: pd.DataFrame, output: Output, k_min: int) -> list[dict]:
    """The cells of the answer, from the synthetic (public) records only: one per group present
    in the synthetic data × estimand × term; groups under ``k_min`` records per copy are
    suppressed, and each released cell carries its synthetic interval (``_syn_ci``).

    The interval is computed here, before the charge and before any confidential record is
    read, because it can refuse the request (regressors collinear on the synthetic data):
    refused in :func:`measure_cells`, after the charge, such a request cost the analyst ε per cell
    for no answer, read the confidential records, and being neither cached nor counted it
    escaped the per-output limit (red team s42b's open item, s43b)."""
    inside = synthetic[synthetic["__in"]]
    keys = _keys(request, inside)
    cells = []
    for group in sorted(set(keys), key=lambda g: tuple((v is None, str(v)) for v in g)):
        rows = inside[_member(keys, group)]
        per_copy = len(rows) / output.copies
        for k, term, j in _terms(request):
            cell = {
                "group": {n: _plain(v) for n, v in zip(request.groups, group, strict=True)},
                "estimand": request.estimands[k].label,
                "term": term,
            }
            if per_copy < k_min:
                cell.update(status="suppressed", reason=f"fewer than {k_min} synthetic records")
            else:
                cell.update(status="released")
                cell["_syn_ci"] = _synthetic_ci(request, (group, k, j), synthetic, output)
            cell["_slot"] = (group, k, j)
            cells.append(cell)
    return cells


def _values(rows: pd.DataFrame, k: int, kind: str) -> np.ndarray:
    if kind == "count" and f"__i{k}_0" not in rows:
        return np.ones(len(rows))
    y = rows[f"__i{k}_0"].to_numpy(dtype=float)
    y = y[~np.isnan(y)]
    return np.ones(len(y)) if kind == "count" else y


def _design(rows: pd.DataFrame, k: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    y = rows[f"__i{k}_0"].to_numpy(dtype=float)
    x = np.column_stack(
        [np.ones(len(rows))] + [rows[f"__i{k}_{j}"].to_numpy(dtype=float) for j in range(1, width)]
    )
    ok = ~np.isnan(y) & ~np.isnan(x).any(axis=1)
    return x[ok], y[ok]


def _estimate(kind, rows, k, j, width, population) -> tuple[float, float]:
    """(estimate, variance) of one quantity on one copy or on the confidential records."""
    if kind == "ols":
        x, y = _design(rows, k, width)
        est, se = ols_ci(fit_ols(x, y), j)
        return est, se**2
    y = _values(rows, k, kind)
    est, se = aggregate_ci(kind, y.sum(), (y * y).sum(), len(y), population)
    return float(est), float(se) ** 2


def _synthetic_ci(request, slot, synthetic, output) -> tuple[float, float]:
    """The synthetic confidence interval of one cell (refused if the synthetic regressors
    are collinear)."""
    try:
        return _combined_ci(request, slot, synthetic, output)
    except np.linalg.LinAlgError:
        label = request.estimands[slot[1]].label
        raise PolicyViolation(
            f"{label}: the regressors are collinear on the synthetic data",
            "drop or merge regressors",
        ) from None


def _combined_ci(request, slot, synthetic, output) -> tuple[float, float]:
    group, k, j = slot
    estimand = request.estimands[k]
    width = len(estimand.inputs)
    keys = _keys(request, synthetic)
    cell_rows = synthetic[synthetic["__in"].to_numpy() & _member(keys, group)]
    if output.copies == 1:
        est, var = _estimate(estimand.kind, cell_rows, k, j, width, len(synthetic))
        return normal_ci(est, np.sqrt(var))
    q, u = [], []
    for copy in range(1, output.copies + 1):
        mine = synthetic["__copy"] == copy
        est, var = _estimate(
            estimand.kind, cell_rows[cell_rows["__copy"] == copy], k, j, width, int(mine.sum())
        )
        q.append(est)
        u.append(var)
    if output.combining == "full":
        n_syn = len(synthetic) / output.copies
        combined = combine_full(q, u, n_synthetic=int(n_syn), n_observed=int(n_syn))
    else:
        combined = combine_partial(q, u)
    return combined.low, combined.high


def measure_cells(request, plan, synthetic, confidential, output, key, k_min, mode, eps) -> list:
    """Fidelity of every released cell: the decile interval of the scan, or the noisy FM.

    Called under ``np.errstate(all="ignore")``: numpy's floating-point warnings (overflow,
    invalid value) on the confidential records would tell the analyst's process, or raise
    there under ``np.seterr(all="raise")`` or ``warnings.simplefilter("error")``, whether some
    record's value overflowed a request's arithmetic (red team s43b)."""
    keys = _keys(request, confidential)
    population = len(confidential)
    out = []
    for cell in plan:
        slot, syn_ci = cell.pop("_slot"), cell.pop("_syn_ci", None)
        if cell["status"] != "released":
            out.append(cell)
            continue
        group, k, j = slot
        estimand = request.estimands[k]
        inside = confidential["__in"].to_numpy() & _member(keys, group)
        rows, outside = confidential[inside], confidential[~inside]
        if mode == "interval" and len(rows) < k_min:
            out.append(
                {
                    **cell,
                    "status": "suppressed",
                    "reason": f"fewer than {k_min} confidential records",
                }
            )
            continue
        width = len(estimand.inputs)
        if mode == "noisy":
            fm = _true_fm(estimand.kind, rows, k, j, width, population, syn_ci)
            out.append({**cell, "fm_noisy": noisy_fm(fm, key, request, cell, eps)})
            continue
        if estimand.kind == "ols":
            low, high = _scan_ols(
                rows,
                outside,
                k,
                j,
                width,
                syn_ci,
                key,
                estimand,
                _spread(synthetic[f"__i{k}_0"]),
                k_min,
            )
        else:
            y = _values(rows, k, estimand.kind)
            zones = None
            if estimand.kind != "count":
                column = estimand.inputs[0].sql("duckdb")
                zones = safety_zones(
                    y, key=_zone_key(key, column), spread=_spread(synthetic[f"__i{k}_0"])
                )
            joiners = candidates(_values(outside, k, estimand.kind))
            low, high = scan_aggregate(
                estimand.kind,
                y,
                population=population,
                synthetic=syn_ci,
                zones=zones,
                joiners=joiners,
                z=Z95,
            )
        out.append({**cell, "fm_interval": list(decile_interval([low, high]))})
    return out


def _true_fm(kind, rows, k, j, width, population, syn_ci) -> float:
    """The exact FM of one cell: internal only, never released ([MR] §3)."""
    try:
        est, var = _estimate(kind, rows, k, j, width, population)
    except (np.linalg.LinAlgError, ValueError, ZeroDivisionError):
        return 0.0  # no confidential estimate: no overlap
    if not np.isfinite(est) or not np.isfinite(var):
        return 0.0
    return fidelity(normal_ci(est, float(np.sqrt(var))), syn_ci)


def noisy_fm(fm: float, key: KeyedStream, request: Request, cell: dict, eps: Fraction) -> float:
    """FM on the grid 1/NOISY_GRID plus discrete Laplace noise of scale NOISY_GRID/ε, clipped
    to [0, 1]: ε-DP for FM in [0, 1] (sensitivity NOISY_GRID grid units), [MR] §4 / digest B.2.
    The noise is keyed by the query's canonical digest, ε and the cell: repeats are identical."""
    label = json.dumps([cell["group"], cell["estimand"], cell["term"]], sort_keys=True, default=str)
    stream = key.derive("noisy", request.digest, str(eps), label)
    noise = discrete_laplace(Fraction(NOISY_GRID) / eps, stream)
    grid = round(min(max(fm, 0.0), 1.0) * NOISY_GRID)
    return min(max(grid + noise, 0), NOISY_GRID) / NOISY_GRID


def _spread(values: pd.Series) -> float:
    """The synthetic (public) standard deviation of a column, 1 when it has none."""
    sd = float(np.nanstd(values.to_numpy(dtype=float))) if len(values) else 0.0
    return sd if np.isfinite(sd) and sd > 0 else 1.0


def _zone_key(key: KeyedStream, column: str) -> bytes:
    return key.derive("zone", column).bits(256).to_bytes(32, "big")


def _scan_ols(rows, outside, k, j, width, syn_ci, key, estimand, spread, k_min):
    x, y = _design(rows, k, width)
    try:
        fit = fit_ols(x, y)
    except np.linalg.LinAlgError:
        raise PolicyViolation(
            f"{estimand.label}: the regressors are collinear on the confidential records",
            "drop or merge regressors",
        ) from None
    if fit.dof < k_min or float(fit.leverage.max()) > 1 / k_min:
        raise PolicyViolation(
            f"{estimand.label}: a regressor singles out fewer than {k_min} records (or the cell "
            f"has fewer than {k_min} residual degrees of freedom) in the confidential data",
            "use regressors that describe groups of records, or a larger population",
        )
    column = estimand.inputs[0].sql("duckdb")
    zones = safety_zones(y, key=_zone_key(key, column), spread=spread)
    x_join, y_join = _design(outside, k, width)
    return scan_ols(
        fit, x, j, synthetic=syn_ci, zones=zones, y=y, x_join=x_join, y_join=y_join, z=Z95
    )
