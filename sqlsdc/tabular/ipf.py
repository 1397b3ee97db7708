"""Iterative proportional fitting (IPF, raking) and Cox–Orelien–Shah's MDI-CTA step.

IPF (Deming & Stephan 1940) scales a non-negative seed table to given margins: each step
multiplies the cells of one margin group by ``target / current sum``; a cycle runs through every
margin. The limit, when it exists, is the table with those margins that minimises the
discrimination information ``K(P) = Σ P ln(P/O)`` relative to the seed ``O`` (Ireland & Kullback
1968), and its cells factorise as ``P = O · Π_m α_m(group)``. Cells that are 0 in the seed stay 0.

:func:`mdi_adjust` is steps 3–4 of Cox, Orelien & Shah (PSD 2006; digest
``shared/reference/seed_2006_tabular.md`` §1.1): sensitive cells fixed at their safe values ``L``
or ``U``, the other inner cells raked from ``O`` to the targets ``O_margin − Σ fixed cells``, one
IPF step per margin partition (every published margin: for hierarchies and 3-D tables, all of
them, as the digest's caution asks), and K reported. We run IPF to a tight tolerance (the
paper's 0.25 / 25 iterations leave the table visibly non-additive, digest §11 T9); margins are
then recomputed from the inner cells, so the result is additive to float rounding and the
margins match the originals to the IPF tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError


@dataclass(frozen=True)
class IPFResult:
    """A raked table.

    Attributes:
        values: fitted cells (a Series indexed like the seed).
        iterations: full cycles through the margins.
        max_error: largest |fitted margin − target| after the last cycle.
        converged: ``max_error <= tol``.
    """

    values: pd.Series
    iterations: int
    max_error: float
    converged: bool


@dataclass(frozen=True)
class MDIResult:
    """:func:`mdi_adjust`'s output: all cells of the table, K and the IPF run."""

    adjusted: np.ndarray
    mdi_k: float
    iterations: int
    max_error: float


def rake(
    seed: np.ndarray,
    groups: Sequence[np.ndarray],
    targets: Sequence[np.ndarray],
    *,
    tol: float | None = None,
    max_iter: int = 1000,
) -> tuple[np.ndarray, int, float, bool]:
    """IPF on a flat cell vector: ``groups[m][i]`` is cell i's group in margin m.

    Returns ``(fitted, iterations, max_error, converged)``. ``tol`` is absolute; by default
    ``1e-9 · max(1, largest target)``. Raises :class:`TabularError` for negative seeds or
    targets and for a positive target whose group has no positive seed cell.

    Example:
        >>> x, it, err, ok = rake(np.ones(4), [np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])],
        ...                       [np.array([3.0, 7.0]), np.array([4.0, 6.0])])
        >>> x.round(6).tolist(), it, ok
        ([1.2, 1.8, 2.8, 4.2], 1, True)
    """
    x = np.asarray(seed, dtype=np.float64).copy()
    if np.any(~(x >= 0)):
        raise TabularError("IPF needs a non-negative seed without missing values")
    targets = [np.asarray(t, dtype=np.float64) for t in targets]
    top = max((float(t.max(initial=0.0)) for t in targets), default=0.0)
    tol = 1e-9 * max(1.0, top) if tol is None else float(tol)
    for m, (g, t) in enumerate(zip(groups, targets, strict=True)):
        if np.any(~(t >= 0)):
            raise TabularError(f"IPF margin {m} has negative or missing targets")
        support = np.bincount(g, x, t.size)
        bad = (t > tol) & (support <= 0)
        if bad.any():
            raise TabularError(
                f"IPF margin {m}: group {int(np.argmax(bad))} has target {t[bad][0]:g} but no "
                "positive seed cell (zeros stay zero); the margins do not fit the seed's zeros"
            )
    error = np.inf
    for iteration in range(1, max_iter + 1):
        for g, t in zip(groups, targets, strict=True):
            sums = np.bincount(g, x, t.size)
            factor = np.divide(t, sums, out=np.zeros_like(t), where=sums > 0)
            x *= factor[g]
        error = max(
            float(np.abs(np.bincount(g, x, t.size) - t).max(initial=0.0))
            for g, t in zip(groups, targets, strict=True)
        )
        if error <= tol:
            return x, iteration, error, True
    return x, max_iter, error, False


def ipf(
    seed: pd.Series | pd.DataFrame,
    margins: Sequence[pd.Series],
    *,
    value: str = "value",
    tol: float | None = None,
    max_iter: int = 1000,
) -> IPFResult:
    """Rake a table to given margins (iterative proportional fitting).

    Args:
        seed: a Series with a MultiIndex whose level names are the dimensions, or a DataFrame
            with the dimension columns and ``value``. Missing combinations are zeros.
        margins: target totals, each a Series indexed by one or more dimensions (the index
            names), e.g. row totals ``pd.Series([3, 7], index=pd.Index(["a", "b"], name="r"))``.
        tol: absolute tolerance on every margin (default ``1e-9 · max(1, largest target)``);
            Cox–Orelien–Shah used 0.25. max_iter: cycles through the margins.

    Returns:
        :class:`IPFResult`.

    Raises:
        TabularError: unknown dimensions, codes without target, inconsistent margins (their
            common sub-margins or grand totals differ), a positive target over seed zeros, or
            no convergence within ``max_iter`` cycles.

    Example:
        >>> seed = pd.Series([1.0, 1, 1, 1], index=pd.MultiIndex.from_product(
        ...     [["a", "b"], ["x", "y"]], names=["r", "c"]))
        >>> rows = pd.Series([3.0, 7], index=pd.Index(["a", "b"], name="r"))
        >>> cols = pd.Series([4.0, 6], index=pd.Index(["x", "y"], name="c"))
        >>> ipf(seed, [rows, cols]).values.round(6).tolist()
        [1.2, 1.8, 2.8, 4.2]
    """
    series = _seed_series(seed, value)
    dims = list(series.index.names)
    frame = series.index.to_frame(index=False)
    groups, targets = [], []
    for m, margin in enumerate(margins):
        names = list(margin.index.names)
        if not names or any(n not in dims for n in names):
            raise TabularError(f"margin {m} is indexed by {names}, which are not all of {dims}")
        if margin.index.duplicated().any():
            raise TabularError(f"margin {m} over {names} repeats a code")
        keys = (
            pd.MultiIndex.from_frame(frame[names]) if len(names) > 1 else pd.Index(frame[names[0]])
        )
        pos = margin.index.get_indexer(keys)
        if (pos < 0).any():
            missing = keys[pos < 0][0]
            raise TabularError(f"margin {m} over {names} has no target for {missing!r}")
        groups.append(pos.astype(np.int64))
        targets.append(margin.to_numpy(dtype=np.float64))
    _check_consistent(margins, tol)
    fitted, iterations, error, converged = rake(
        series.to_numpy(np.float64), groups, targets, tol=tol, max_iter=max_iter
    )
    if not converged:
        raise TabularError(
            f"IPF did not converge in {max_iter} cycles (largest margin error {error:g}); the "
            "seed's zeros may make the margins unreachable — raise max_iter or check the zeros"
        )
    return IPFResult(pd.Series(fitted, index=series.index, name=value), iterations, error, True)


def mdi_adjust(
    table,
    fixed: np.ndarray,
    fixed_values: np.ndarray,
    *,
    tol: float | None = None,
    max_iter: int = 1000,
) -> MDIResult:
    """Fix some inner cells and rake the others to the table's margins (Cox–Orelien–Shah §1.1).

    Args:
        table: a :class:`~sqlsdc.tabular.model.Table` with non-negative values and a model
            matrix ``X``. fixed: mask over the cells (inner cells only). fixed_values: their new
            values (the safe values L or U).

    Returns:
        :class:`MDIResult`: every cell (margins recomputed from the inner cells) and
        ``K = Σ A ln(A/O)`` over the inner cells (0·ln 0 = 0).

    Raises:
        TabularError: negative values, fixed margin cells, fixed cells exceeding a margin, or a
            margin the remaining cells cannot reach.
    """
    values = table.values
    if table.X is None or np.any(table.inner < 0):
        raise TabularError("MDI-CTA needs a table with a model matrix X (not linked tables)")
    if np.any(values < 0):
        raise TabularError("MDI-CTA needs a non-negative table (K = Σ A ln(A/O))")
    inner_cells = table.inner
    is_inner = np.zeros(values.size, dtype=bool)
    is_inner[inner_cells] = True
    if np.any(fixed & ~is_inner):
        raise TabularError("MDI-CTA fixes inner cells only; margins stay at their original values")
    new = values.copy()
    new[fixed] = fixed_values
    X = table.X.tocsc()
    free_inner = ~fixed[inner_cells]
    groups, targets = [], []
    for cols in margin_partitions(table):
        label = np.full(inner_cells.size, -1, dtype=np.int64)
        sub = X[:, cols]
        rows, which = sub.nonzero()
        label[rows] = which
        if (label < 0).any():
            continue  # not a partition of the inner cells (should not happen for a cube)
        fixed_sum = np.bincount(label[~free_inner], new[inner_cells][~free_inner], cols.size)
        target = values[cols] - fixed_sum
        short = target < -1e-9 * max(1.0, float(np.abs(values).max()))
        if short.any():
            c = cols[np.argmax(short)]
            raise TabularError(
                f"the fixed sensitive cells exceed margin {_cell(table, c)} ({values[c]:g}); "
                "choose other directions (e.g. method='lp')"
            )
        groups.append(label[free_inner])
        targets.append(np.maximum(target, 0.0))
    seed = values[inner_cells][free_inner]
    fitted, iterations, error, converged = rake(seed, groups, targets, tol=tol, max_iter=max_iter)
    if not converged:
        raise TabularError(
            f"IPF did not converge in {max_iter} cycles (largest margin error {error:g}): the "
            "zero cells leave no table with these margins and safe values; try other directions"
        )
    inner_new = new[inner_cells]
    inner_new[free_inner] = fitted
    adjusted = np.asarray(table.X.T @ inner_new, dtype=np.float64).ravel()
    orig = values[inner_cells]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(inner_new > 0, inner_new * np.log(inner_new / orig), 0.0)
    return MDIResult(adjusted, float(terms.sum()), iterations, error)


def mdi_k(original: np.ndarray, adjusted: np.ndarray) -> float:
    """Cox–Orelien–Shah's K = Σ A ln(A/O), 0·ln 0 = 0 (∞ if A > 0 where O = 0)."""
    o = np.asarray(original, dtype=np.float64)
    a = np.asarray(adjusted, dtype=np.float64)
    if np.any(a[o == 0] > 0):
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.where(a > 0, a * np.log(a / o), 0.0).sum())


# ----------------------------------------------------------------------------- helpers


def _seed_series(seed, value) -> pd.Series:
    if isinstance(seed, pd.DataFrame):
        if value not in seed.columns:
            raise TabularError(f"the seed DataFrame needs a {value!r} column")
        dims = [c for c in seed.columns if c != value]
        series = seed.set_index(dims)[value]
    elif isinstance(seed, pd.Series):
        series = seed
    else:
        raise TabularError(f"ipf() takes a Series or DataFrame seed; got {type(seed).__name__}")
    if any(n is None for n in series.index.names):
        raise TabularError("name every index level of the seed (they are the dimensions)")
    if series.index.duplicated().any():
        raise TabularError("the seed repeats a cell")
    return series.astype(np.float64)


def _check_consistent(margins: Sequence[pd.Series], tol) -> None:
    """Two margins must agree on the margin over their common dimensions (or the grand total)."""
    scale = max(
        (float(np.abs(m.to_numpy(np.float64)).max(initial=0.0)) for m in margins), default=1.0
    )
    limit = 1e-9 * max(1.0, scale) if tol is None else float(tol)
    for i, a in enumerate(margins):
        for j in range(i + 1, len(margins)):
            b = margins[j]
            common = [n for n in a.index.names if n in b.index.names]
            if not common:
                sa, sb = float(a.sum()), float(b.sum())
                if abs(sa - sb) > limit:
                    raise TabularError(
                        f"margins {i} and {j} have different grand totals ({sa:g} vs {sb:g})"
                    )
                continue
            sa, sb = a.groupby(level=common).sum(), b.groupby(level=common).sum()
            diff = sa.sub(sb, fill_value=0.0).abs()
            if (diff > limit).any():
                where = diff.idxmax()
                raise TabularError(
                    f"margins {i} and {j} disagree on their common margin over {common} at "
                    f"{where!r}: {sa.get(where, 0.0):g} vs {sb.get(where, 0.0):g}"
                )


def margin_partitions(table):
    """Margin cell positions per depth combination; each set partitions the inner cells."""
    dims = list(table.dims)
    depth = np.column_stack(
        [
            table.hierarchies[d].depth[table.cells[d].astype(str).map(table.hierarchies[d].index)]
            for d in dims
        ]
    )
    is_inner = table.cells["is_inner"].to_numpy(dtype=bool)
    frame = pd.DataFrame(depth[~is_inner])
    cells = np.flatnonzero(~is_inner)
    for _, rows in frame.groupby(list(frame.columns)).indices.items():
        yield cells[rows]


def _cell(table, c) -> str:
    return str(
        dict(zip(table.dims, table.cells.iloc[c][list(table.dims)].astype(str), strict=True))
    )
