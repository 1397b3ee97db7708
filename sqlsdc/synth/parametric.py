"""``parametric``: a Gaussian copula with each column's own marginal distribution.

The fast non-DP baseline of issue 19 (SDV's GaussianCopula is the peer): every column is
mapped to normal scores, their correlation matrix is estimated, correlated normal vectors are
drawn and mapped back through each column's marginal:

* numeric columns (integers, floats, dates and times as numbers): the normal score of a value
  is Φ⁻¹ of its mid-rank ``(rank − ½)/n`` (ties share the average rank); back-transformed
  through the empirical quantile function with linear interpolation (``numpy.quantile``) of
  the observed values top- and bottom-coded (:mod:`sqlsdc.synth.tails`): the 5 largest values
  replaced by their mean, and the 5 smallest by theirs (top and bottom coding, Hundepool et al.,
  *Statistical Disclosure Control*, 2012, §3.4; sdcMicro ``topBotCoding`` with the coded
  values' mean as ``replacement``), so synthetic values follow the observed distribution and
  stay inside the coded range (integers are rounded back to integers). Without the coding, the
  largest of m draws landed at 1 − 1/m of the top gap: 100 times the source's rows showed the
  largest income to 0.003 % (red team s47i);
* categorical columns (strings, booleans, categories): each category owns the interval of
  [0, 1] its frequency gives (categories in order of first appearance); a value's normal score
  is Φ⁻¹ of a uniform draw inside its interval, and a synthetic uniform picks the category
  whose interval holds it, so the frequencies are kept;
* missing values: a column's missing values are drawn independently at the column's rate.

The correlation is the Pearson correlation of the normal scores (the normal-scores rank
correlation) over the records where both columns are present (pairwise deletion), made
positive semi-definite by clipping its eigenvalues at 1e-6.

Example:
    >>> import pandas as pd
    >>> data = pd.DataFrame({"x": range(100), "g": ["a", "b"] * 50})
    >>> out, details = synthesize_parametric(data, rng=np.random.default_rng(0))
    >>> out.shape, sorted(out["g"].unique()), bool(out["x"].between(0, 99).all())
    ((100, 2), ['a', 'b'], True)
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from sqlsdc.synth.tails import code_tails

__all__ = ["coded_columns", "synthesize_parametric"]


def _numeric(column: pd.Series) -> bool:
    return (
        pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)
    ) or pd.api.types.is_datetime64_any_dtype(column)


def coded_columns(data: pd.DataFrame) -> list[str]:
    """The columns whose marginals are top- and bottom-coded (numbers, dates and times)."""
    return [name for name in data.columns if _numeric(data[name])]


def _as_float(column: pd.Series) -> np.ndarray:
    if pd.api.types.is_datetime64_any_dtype(column):
        values = column.astype("int64").to_numpy(float)
        values[column.isna().to_numpy()] = np.nan
        return values
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _scores(column: pd.Series, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Normal scores of one column and what is needed to map scores back to values."""
    missing = column.isna().to_numpy()
    z = np.full(len(column), np.nan)  # missing values: left out of the correlations
    if _numeric(column):
        x = _as_float(column)
        seen = x[~missing]
        if seen.size:
            ranks = pd.Series(seen).rank(method="average").to_numpy()
            z[~missing] = ndtri((ranks - 0.5) / seen.size)
        return z, {"kind": "numeric", "values": np.sort(code_tails(seen))}
    seen = column[~missing]
    counts = seen.value_counts(sort=False)
    levels = list(counts.index)
    edges = np.concatenate([[0.0], np.cumsum(counts.to_numpy()) / max(len(seen), 1)])
    if len(seen):
        codes = pd.Categorical(seen, categories=levels).codes
        low, high = edges[codes], edges[codes + 1]
        z[~missing] = ndtri(np.clip(low + rng.random(len(seen)) * (high - low), 1e-12, 1 - 1e-12))
    return z, {"kind": "categorical", "levels": levels, "edges": edges}


def _values(u: np.ndarray, marginal: dict, column: pd.Series):
    """Values of the column's marginal at uniforms ``u``."""
    if marginal["kind"] == "numeric":
        observed = marginal["values"]
        if observed.size == 0:
            return np.full(len(u), np.nan)
        x = np.quantile(observed, u, method="linear")
        if pd.api.types.is_integer_dtype(column) or pd.api.types.is_datetime64_any_dtype(column):
            x = np.rint(x)
        return x
    levels, edges = marginal["levels"], marginal["edges"]
    if not levels:
        return np.full(len(u), None, dtype=object)
    index = np.clip(np.searchsorted(edges, u, side="right") - 1, 0, len(levels) - 1)
    return np.asarray(levels, dtype=object)[index]


def _cast(values, column: pd.Series, missing: np.ndarray) -> pd.Series:
    """Synthetic values in the column's dtype, missing where drawn missing."""
    series = pd.Series(values)
    if pd.api.types.is_datetime64_any_dtype(column):
        # the integers are in the column's own unit: DuckDB hands dates and timestamps to
        # pandas in microseconds, read as nanoseconds every date fell in January 1970
        # (new user s48e)
        unit = getattr(column.dtype, "unit", None) or np.datetime_data(column.dtype)[0]
        series = pd.to_datetime(series.astype("Int64"), unit=unit).astype(column.dtype)
    elif pd.api.types.is_integer_dtype(column):
        series = series.astype("Int64" if missing.any() else column.dtype)
    elif pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        series = series.astype(column.dtype)
    series[missing] = None
    if not pd.api.types.is_numeric_dtype(series) and not missing.any():
        try:
            series = series.astype(column.dtype)
        except (TypeError, ValueError):
            pass  # object columns with mixed values stay object
    return series


def synthesize_parametric(
    data: pd.DataFrame, *, rng: np.random.Generator, n: int | None = None, **options
) -> tuple[pd.DataFrame, dict]:
    """``n`` synthetic records (default ``len(data)``) from a Gaussian copula fitted to
    ``data`` (module docstring); returns them and the details (correlation size, timing)."""
    if options:
        raise TypeError(f"parametric takes no options, got {sorted(options)}")
    started = time.perf_counter()
    n = len(data) if n is None else int(n)
    columns = list(data.columns)
    if not columns or data.empty:
        return data.iloc[:0].copy(), {"columns": columns, "seconds": 0.0}
    scores, marginals = [], []
    for name in columns:
        z, marginal = _scores(data[name], rng)
        scores.append(z)
        marginals.append(marginal)
    z = np.column_stack(scores)
    correlation = pd.DataFrame(z).corr(min_periods=3).to_numpy()
    correlation = np.nan_to_num(np.atleast_2d(correlation))
    np.fill_diagonal(correlation, 1.0)
    w, v = np.linalg.eigh(correlation)
    factor = v * np.sqrt(np.clip(w, 1e-6, None))
    drawn = rng.standard_normal((n, len(columns))) @ factor.T
    u = ndtr(drawn / np.sqrt((factor**2).sum(axis=1)))
    out = {}
    for j, name in enumerate(columns):
        rate = float(data[name].isna().mean())
        missing = rng.random(n) < rate
        out[name] = _cast(_values(u[:, j], marginals[j], data[name]), data[name], missing)
    frame = pd.DataFrame(out, columns=columns)
    details = {
        "columns": columns,
        "numeric": [c for c, m in zip(columns, marginals, strict=True) if m["kind"] == "numeric"],
        "missing_rates": {c: float(data[c].isna().mean()) for c in columns},
        "seconds": round(time.perf_counter() - started, 4),
    }
    return frame, details
