"""Information loss of a protected table against the original (rounded, adjusted, raked, ...).

The measures of Shlomo & Young (PSD 2006, digest ``shared/reference/seed_2006_tabular.md`` §7.3)
on the inner cells, arranged as rows k = 1..n_r (the codes of the ``rows`` dimensions) with n_k
cells each (the codes of the other dimensions: the "columns"); D = original, D' = protected::

    HD   = (1/n_r) Σ_k sqrt( Σ_c ½ (√D'_kc − √D_kc)² )            Hellinger distance
    RAD  = (1/n_r) Σ_k Σ_c |D'_kc − D_kc| / D_kc                   (cells with D = 0 skipped ⚠)
    AAD  = (1/n_r) Σ_k Σ_c |D'_kc − D_kc| / n_k
    RAT  = Σ_k |N'_k − N_k| / N_k,   AT = Σ_k |N'_k − N_k| / n_r   (N_k = Σ_c D_kc, row totals)
    RAV  = 100 (AV' − AV)/AV,  AV = mean over rows of the sample variance of the row's cells
    RCV  = 100 (V' − V)/V,  Cramér's V = sqrt((χ²/n) / min(R−1, C−1)) of the rows × columns
           table (χ² Pearson with e_rc = n_r· n_c / n; the digest's ⚠ min fixed)
    ENTT = 100 (ENT' − ENT)/ENT,  ENT = Σ_k −Σ_c p log p,  p = D_kc / N_k (sign and Σ fixed ⚠)
    RC   = per column, the share (%) of cells whose rank group (``rank_groups`` equal groups by
           value, ties by table order) changes; reported: the mean and the number of columns
           above 20 % (Shlomo–Young's "columns with > 20 % movement between 20 groups")

``aad_totals`` is the mean |D' − D| over the margin cells (Shlomo–Young's "AAD, totals").
Cox & Kim's (PSD 2006, §5.1) conditional χ² is ``Σ (D' − D)²/D`` over inner cells with D > 0
(``U_x = 0`` for x = 0), also over the non-sensitive cells only when ``sensitive`` is given (Cox,
Orelien & Shah §1.4: "conditional χ²"); their regression of protected on original values (b0, b1)
and the correlation come along. Between-variance (BVR) and the log-linear LR_m need a target
category or model and are not computed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError


@dataclass(frozen=True)
class QualityReport:
    """Information-loss measures (module docstring); NaN where a measure is undefined."""

    hd: float
    rad: float
    aad: float
    aad_totals: float
    rat: float
    at: float
    rav: float
    rcv: float
    entt: float
    rc_mean: float
    rc_columns_over_20: int
    chi2: float
    chi2_nonsensitive: float
    correlation: float
    intercept: float
    slope: float
    max_additivity_error: float
    max_abs_change: float
    max_abs_change_cell: dict | int | None
    max_rel_change: float
    max_rel_change_cell: dict | int | None
    n_cells: int
    n_rows: int
    n_zero_changed: int

    def to_dict(self) -> dict:
        return asdict(self)


def quality(
    original,
    protected,
    table=None,
    *,
    rows: Sequence[str] | np.ndarray | None = None,
    columns: np.ndarray | None = None,
    sensitive: np.ndarray | None = None,
    rank_groups: int = 20,
) -> QualityReport:
    """Compare a protected table with the original.

    Args:
        original, protected: values aligned with ``table.cells`` (arrays or Series), or any two
            equal-length vectors when ``table`` is None (then all cells count as inner cells).
        table: the :class:`~sqlsdc.tabular.model.Table` (for inner/margin cells, rows and
            columns, additivity and cell names).
        rows: with a table, the dimensions that index the rows (default: the first); without,
            an array of row labels (default: a single row). columns: without a table, an array
            of column labels (needed for RCV and RC).
        sensitive: mask of sensitive cells (for ``chi2_nonsensitive``).
        rank_groups: number of rank groups for RC.

    Example:
        >>> q = quality([4.0, 1, 9], [4.0, 0, 10])
        >>> round(q.hd, 6), q.rad, q.aad, q.max_abs_change
        (0.716357, 1.1111111111111112, 0.6666666666666666, 1.0)
    """
    o = _vector(original, "original")
    p = _vector(protected, "protected")
    if o.shape != p.shape:
        raise TabularError(f"original and protected differ in length: {o.size} vs {p.size}")
    if table is not None and o.size != len(table.cells):
        raise TabularError(f"the table has {len(table.cells)} cells but {o.size} values were given")
    sens = np.zeros(o.size, bool) if sensitive is None else np.asarray(sensitive, dtype=bool)
    if sens.shape != o.shape:
        raise TabularError("sensitive must be one boolean per cell")
    inner, row, col = _layout(o.size, table, rows, columns)
    io, ip = o[inner], p[inner]
    frame = pd.DataFrame({"row": row, "col": col, "o": io, "p": ip, "d": np.abs(ip - io)})
    by_row = frame.groupby("row", sort=False)
    n_r = by_row.ngroups
    nonneg = bool((io >= 0).all() and (ip >= 0).all())
    hd = np.nan
    if nonneg:
        frame["h"] = 0.5 * (np.sqrt(frame["p"]) - np.sqrt(frame["o"])) ** 2
        hd = float(np.sqrt(by_row["h"].sum()).sum() / n_r)
    nz = io != 0
    rad = float(np.sum(frame["d"].to_numpy()[nz] / np.abs(io[nz])) / n_r)
    aad = float((by_row["d"].sum() / by_row.size()).sum() / n_r)
    totals_o, totals_p = by_row["o"].sum(), by_row["p"].sum()
    dt = (totals_p - totals_o).abs()
    rat = float((dt[totals_o != 0] / totals_o[totals_o != 0].abs()).sum())
    at = float(dt.sum() / n_r)
    rav = _pct(by_row["p"].var().mean(), by_row["o"].var().mean())
    ok_cols = col is not None and frame["col"].notna().all()
    rcv = _pct(_cramers_v(frame, "p"), _cramers_v(frame, "o")) if ok_cols and nonneg else np.nan
    entt = _pct(_entropy(frame, "p"), _entropy(frame, "o")) if nonneg else np.nan
    rc_mean, rc_over = _rank_changes(frame, rank_groups) if ok_cols else (np.nan, 0)
    margins = ~inner
    aad_totals = float(np.abs(p[margins] - o[margins]).mean()) if margins.any() else np.nan
    chi2 = _chi2(o, p, inner)
    chi2_ns = _chi2(o, p, inner & ~sens) if sensitive is not None else np.nan
    corr, b0, b1 = _regression(o, p)
    change = np.abs(p - o)
    at_abs = int(np.argmax(change)) if o.size else None
    rel = np.where(o != 0, change / np.where(o != 0, np.abs(o), 1.0), 0.0)
    at_rel = int(np.argmax(rel)) if o.size else None
    additivity = np.nan if table is None else float(np.abs(table.A @ p).max(initial=0.0))
    return QualityReport(
        hd=hd,
        rad=rad,
        aad=aad,
        aad_totals=aad_totals,
        rat=rat,
        at=at,
        rav=rav,
        rcv=rcv,
        entt=entt,
        rc_mean=rc_mean,
        rc_columns_over_20=rc_over,
        chi2=chi2,
        chi2_nonsensitive=chi2_ns,
        correlation=corr,
        intercept=b0,
        slope=b1,
        max_additivity_error=additivity,
        max_abs_change=float(change.max(initial=0.0)),
        max_abs_change_cell=_cell(table, at_abs),
        max_rel_change=float(rel.max(initial=0.0)),
        max_rel_change_cell=_cell(table, at_rel),
        n_cells=int(inner.sum()),
        n_rows=int(n_r),
        n_zero_changed=int(np.sum((io == 0) & (ip != 0))),
    )


def _vector(x, name) -> np.ndarray:
    v = np.asarray(x.to_numpy() if isinstance(x, pd.Series) else x, dtype=np.float64).ravel()
    if np.isnan(v).any():
        raise TabularError(f"{name} has missing values")
    return v


def _layout(size, table, rows, columns):
    """Inner-cell mask, row label and column label of every inner cell."""
    if table is None:
        inner = np.ones(size, dtype=bool)
        row = np.zeros(size, np.int64) if rows is None else np.asarray(rows)
        if len(row) != size or (columns is not None and len(columns) != size):
            raise TabularError("rows/columns labels must be one per value")
        return inner, row, (None if columns is None else np.asarray(columns))
    dims = list(table.dims)
    rows = dims[:1] if rows is None else [rows] if isinstance(rows, str) else list(rows)
    if any(r not in dims for r in rows):
        raise TabularError(f"rows must be dimensions of the table {dims}; got {rows}")
    inner = table.cells["is_inner"].to_numpy(dtype=bool)
    cells = table.cells.loc[inner, dims].astype(str)
    rest = [d for d in dims if d not in rows]
    row = cells[rows].agg("\x1f".join, axis=1).to_numpy()
    col = cells[rest].agg("\x1f".join, axis=1).to_numpy() if rest else None
    return inner, row, col


def _pct(new, old) -> float:
    return float(100.0 * (new - old) / old) if old and np.isfinite(old) else np.nan


def _cramers_v(frame, value) -> float:
    t = frame.pivot_table(index="row", columns="col", values=value, aggfunc="sum", fill_value=0.0)
    t = t.loc[t.sum(axis=1) > 0, t.sum(axis=0) > 0].to_numpy()
    n = t.sum()
    if n <= 0 or min(t.shape) < 2:
        return np.nan
    e = np.outer(t.sum(axis=1), t.sum(axis=0)) / n
    chi2 = float(((t - e) ** 2 / e).sum())
    return float(np.sqrt(chi2 / n / (min(t.shape) - 1)))


def _entropy(frame, value) -> float:
    total = frame.groupby("row", sort=False)[value].transform("sum").to_numpy()
    share = np.divide(frame[value].to_numpy(), total, out=np.zeros(len(frame)), where=total > 0)
    terms = np.where(share > 0, -share * np.log(np.where(share > 0, share, 1.0)), 0.0)
    return float(terms.sum())


def _rank_changes(frame, groups: int) -> tuple[float, int]:
    """Mean RC (%) over columns and the number of columns with RC > 20 %."""
    out = []
    for _, part in frame.groupby("col", sort=False):
        n = len(part)
        order = np.arange(n)
        g_o = np.empty(n, np.int64)
        g_p = np.empty(n, np.int64)
        g_o[np.lexsort((order, part["o"].to_numpy()))] = order * groups // n
        g_p[np.lexsort((order, part["p"].to_numpy()))] = order * groups // n
        out.append(100.0 * np.mean(g_o != g_p))
    rc = np.asarray(out)
    return float(rc.mean()), int(np.sum(rc > 20.0))


def _chi2(o, p, mask) -> float:
    keep = mask & (o != 0)
    return float(np.sum((p[keep] - o[keep]) ** 2 / np.abs(o[keep])))


def _regression(o, p):
    if o.size < 2 or np.all(o == o[0]):
        return np.nan, np.nan, np.nan
    b1, b0 = np.polyfit(o, p, 1)
    corr = float(np.corrcoef(o, p)[0, 1]) if np.std(p) > 0 else np.nan
    return corr, float(b0), float(b1)


def _cell(table, i):
    if i is None or table is None:
        return i
    return dict(zip(table.dims, table.cells.iloc[i][list(table.dims)].astype(str), strict=True))
