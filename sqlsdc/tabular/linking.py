"""Linked tables: several tables over the same microdata protected as one.

:func:`link_tables` stacks the cells of tables that share dimensions (with the same or different
hierarchies) into one :class:`~sqlsdc.tabular.model.Table` whose constraint matrix holds every
table's equations, so a cell common to two tables is suppressed or published in both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import sparse

from sqlsdc.errors import InternalError, TabularError
from sqlsdc.tabular.model import Table


def link_tables(tables: Sequence[Table]) -> Table:
    """Link tables that share cells into one table over the union of their dimensions.

    A table without dimension ``d`` is read as being at ``d``'s total code. Cells with identical
    codes are one cell (their values and frequencies must agree); ``A`` stacks every table's
    equations. ``X`` is over the cross-classification of all dimensions (the "cover table") and
    needs tables built by :func:`~sqlsdc.tabular.model.build_table` from the same microdata rows,
    or tables over the same dimensions; otherwise ``X`` is ``None`` (use ``method="optimal"``).

    Example:
        >>> from sqlsdc.tabular.model import build_table
        >>> df = pd.DataFrame({"r": ["a", "b", "b"], "s": ["m", "f", "m"], "g": ["x", "x", "y"]})
        >>> t = link_tables([build_table(df, ["r", "s"]), build_table(df, ["r", "g"])])
        >>> len(t.cells), t.X.shape
        (13, (3, 13))

    Raises:
        TabularError: different total codes, or a shared cell with different values.
    """
    if not tables:
        raise TabularError("link_tables needs at least one table")
    total = tables[0].total
    if any(t.total != total for t in tables):
        raise TabularError("linked tables must use the same total code")
    dims = tuple(dict.fromkeys(d for t in tables for d in t.dims))
    frames = []
    for j, t in enumerate(tables):
        f = t.cells.drop(columns=["level", "is_inner"], errors="ignore")
        f = f.assign(**{d: total for d in dims if d not in t.dims}, __table=j)
        frames.append(f)
    allc = pd.concat(frames, ignore_index=True)
    codes = allc[list(dims)].astype(str)
    order = {}
    for d in dims:  # totals first, then codes in text order
        order[f"__{d}"], order[d] = codes[d] != total, codes[d]
    allc["__cell"] = pd.DataFrame(order).groupby(list(order), sort=True).ngroup()
    first = allc.groupby("__cell")[["value", "n"]].transform("first")
    bad = ~np.isclose(allc["value"], first["value"], rtol=1e-9) | (allc["n"] != first["n"])
    if bad.any():
        row = allc[bad].iloc[0]
        seen = sorted({float(v) for v in allc.loc[allc["__cell"] == row["__cell"], "value"]})
        raise TabularError(
            f"linked tables disagree on cell {dict(row[list(dims)].astype(str))}: values "
            f"{seen}; tables must come from the same data"
        )
    keep = [c for c in allc.columns if c not in ("__table", "__cell")]
    cells = allc.groupby("__cell", sort=True)[keep].first()  # rule inputs of the first table
    cols = [sparse.csr_matrix(t.A) for t in tables]
    maps = [allc.loc[allc["__table"] == j, "__cell"].to_numpy() for j in range(len(tables))]
    C = len(cells)
    A = _distinct_rows(
        sparse.vstack([a @ _selector(m, C) for a, m in zip(cols, maps, strict=True)])
    )
    hiers = {}
    for d in dims:
        hs = [t.hierarchies[d] for t in tables if d in t.dims]
        hiers[d] = hs[0] if all(h is not None and h.codes == hs[0].codes for h in hs) else None
    X, inner = _linked_x(tables, dims, maps, C)
    out = cells[[*dims, *(c for c in keep if c not in dims)]].reset_index(drop=True)
    out["is_inner"] = False
    for t, m in zip(tables, maps, strict=True):
        out.loc[m[t.inner], "is_inner"] = True
    return Table(
        out,
        dims,
        hiers,
        X,
        A,
        inner,
        total,
        count=all(t.count for t in tables),
        weighted=any(t.weighted for t in tables),
        negative=any(t.negative for t in tables),
    )


# --- the cube: per level combination grouping ------------------------------------------------


def _selector(cell_of: np.ndarray, C: int) -> sparse.csr_matrix:
    """Matrix mapping a table's cell positions to positions in the linked cell list."""
    return sparse.csr_matrix(
        (np.ones(len(cell_of)), (np.arange(len(cell_of)), cell_of)), shape=(len(cell_of), C)
    )


def _distinct_rows(A) -> sparse.csr_matrix:
    """Drop equations that several linked tables share (rows equal entry by entry)."""
    A = sparse.csr_matrix(A)
    A.sort_indices()
    probe = A @ np.random.default_rng(0).random((A.shape[1], 2))  # a row fingerprint
    _, first, of = np.unique(probe, axis=0, return_index=True, return_inverse=True)
    keep = np.zeros(A.shape[0], dtype=bool)
    keep[first] = True
    drop = np.flatnonzero(~keep)
    same = abs(A[drop] - A[first[of.ravel()[drop]]]).sum(axis=1).A.ravel() == 0
    keep[drop[~same]] = True
    return A[np.flatnonzero(keep)]


def _linked_x(tables, dims, maps, C):
    """X of linked tables over the cover table's inner cells (the cross-classification of all
    dimensions), and for each of its rows the linked cell it is, or -1 when it is not a cell."""
    if all(t._rows is not None for t in tables) and len({len(t._rows) for t in tables}) == 1:
        shared: dict[str, int] = {}
        rows = {}
        for t in tables:
            for d in t.dims:
                trans = np.array(
                    [shared.setdefault(c, len(shared)) for c in t.hierarchies[d].codes]
                )
                ids = trans[t._rows[d].to_numpy()]
                if d in rows and not np.array_equal(rows[d], ids):
                    raise TabularError(f"linked tables code dimension {d!r} differently by row")
                rows[d] = ids
        names = np.array(list(shared), dtype=object)
        cover = pd.DataFrame(rows)[list(dims)].drop_duplicates()
        cover = pd.DataFrame({d: names[cover[d].to_numpy()] for d in dims})
    elif all(set(t.dims) == set(dims) for t in tables):
        cover = pd.concat([t.cells.loc[t.inner, list(dims)] for t in tables], ignore_index=True)
    else:
        return None, np.zeros(0, dtype=np.int64)
    cover = cover.astype(str).drop_duplicates().reset_index(drop=True)
    X = None
    for t, m in zip(tables, maps, strict=True):
        inner_codes = t.cells.loc[t.inner, list(t.dims)].astype(str).reset_index(drop=True)
        inner_codes["__i"] = np.arange(len(inner_codes))
        at = cover[list(t.dims)].merge(inner_codes, on=list(t.dims), how="left")["__i"]
        if at.isna().any():
            raise InternalError("a cover cell has no inner cell in a linked table")
        P = _selector(at.to_numpy(dtype=np.int64), len(inner_codes))
        block = (P @ t.X.astype(np.float64) @ _selector(m, C)).tocsc()
        X = block if X is None else X.maximum(block)
    ncov = len(cover)
    cover["__row"] = np.arange(ncov)
    inner = np.full(ncov, -1, dtype=np.int64)
    for t, m in zip(tables, maps, strict=True):
        if set(t.dims) == set(dims):
            codes = t.cells.loc[t.inner, list(dims)].astype(str).reset_index(drop=True)
            codes["__cell"] = m[t.inner]
            hit = cover.merge(codes, on=list(dims), how="inner")
            inner[hit["__row"].to_numpy()] = hit["__cell"].to_numpy()
    return sparse.csc_matrix(X.astype(np.int8)), inner


# --- input checking -----------------------------------------------------------------------------
