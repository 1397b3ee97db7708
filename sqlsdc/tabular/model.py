"""The table model: cells over all margins, model matrix X and constraint matrix A.

Hierarchies are in :mod:`sqlsdc.tabular.hierarchy`, the numeric kernel (keys, sums, top
contributions, constraint rows) in :mod:`sqlsdc.tabular._cube`, linked tables in
:mod:`sqlsdc.tabular.linking`; ``Hierarchy``, ``TOTAL`` and ``link_tables`` are re-exported here.

A table over dimensions d = 1..D holds one cell for every combination of codes, one code per
dimension taken from any level of that dimension's hierarchy (inner cells and all margins).
Cells are identified by an integer key: each code gets its position in the hierarchy's pre-order
(the total code is 0) and a cell's key is the mixed-radix number of its code positions, so sorting
by key lists the grand total first and every parent before its children (the order sdcTable and
τ-ARGUS print tables in).

Every cell is computed from microdata in one vectorised pass per *level combination* (the depth of
each dimension's code): contributions are grouped per cell with numpy sorts, never per cell in
Python. Only cells with at least one contributor exist: an empty cell is a zero everybody knows
(τ-ARGUS's default structural empty, GaussSuppression's ``extend0 = FALSE``), so it is neither
sensitive nor a candidate for secondary suppression, and it drops out of the additivity equations.

The two matrices of the contract (notes/tabular_contract.md):

* ``X`` (I×C, int8): ``X[i, c] = 1`` if inner cell ``i`` lies below cell ``c`` in every dimension,
  so ``values = X.T @ inner_values`` (GaussSuppression's model matrix, Langsrud 2024).
* ``A`` (R×C, float64): one row ``parent − Σ children = 0`` per parent code of each dimension and
  each combination of codes in the other dimensions; ``A @ values == 0`` up to float rounding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import sparse

from sqlsdc.errors import TabularError
from sqlsdc.tabular._cube import _Cube, _pairs, _top_candidates
from sqlsdc.tabular.hierarchy import TOTAL, Hierarchy, _factor, _require_columns


@dataclass(frozen=True, eq=False)
class Table:
    """A table's cells with the matrices secondary suppression and the audit work on.

    Attributes:
        cells: one row per cell: the dimension columns (codes, with the total code on margins),
            ``n`` (contributing units), ``value``; ``weight`` (sum of sampling weights) when
            weighted; ``shadow`` when rules run on a shadow variable; ``top1..topK`` (largest
            unit contributions to the rules' variable, 0 when fewer units) with ``top1_w..``
            (their sampling weights) when weighted; ``n_holding`` and ``htop1..`` with holdings;
            ``level`` (sum of the codes' depths, 0 for the grand total) and ``is_inner``.
        dims: dimension names. hierarchies: one :class:`Hierarchy` per dimension (``None`` for a
            dimension of linked tables whose tables use different hierarchies).
        X: model matrix (I×C) or ``None`` when it cannot be derived (see :func:`link_tables`).
        A: constraint matrix (R×C). inner: for each row of ``X`` the position of that inner cell
            in ``cells``; -1 for a row of linked tables' cover table that is not a cell.
        count: frequency table (value = weighted count of records).
        weighted: built with sampling weights. negative: some contribution is negative.
    """

    cells: pd.DataFrame
    dims: tuple[str, ...]
    hierarchies: Mapping[str, Hierarchy | None]
    X: sparse.csc_matrix | None
    A: sparse.csr_matrix
    inner: np.ndarray
    total: str = TOTAL
    count: bool = False
    weighted: bool = False
    negative: bool = False
    _rows: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def values(self) -> np.ndarray:
        return self.cells["value"].to_numpy(dtype=np.float64)

    @property
    def n(self) -> np.ndarray:
        return self.cells["n"].to_numpy(dtype=np.int64)

    @property
    def top_k(self) -> int:
        return sum(1 for c in self.cells.columns if c.startswith("top") and c[3:].isdigit())

    def parents(self) -> dict[str, dict[str, str | None]]:
        """``{dim: {code: parent}}`` as ``hitas_suppress`` takes it."""
        return {d: h.parents for d, h in self.hierarchies.items() if h is not None}

    def mask(self, spec, what: str) -> np.ndarray:
        """A caller's cell selection (``held``, ``forced``, ``sensitive``, ``fixed``) as one
        boolean per cell in table order: ``spec`` is such an array, a function of
        :attr:`cells` returning one, or ``None`` (no cell); anything else is refused, naming
        ``what``."""
        if spec is None:
            return np.zeros(len(self.cells), dtype=bool)
        m = np.asarray(spec(self.cells) if callable(spec) else spec)
        if m.dtype != bool or m.shape != (len(self.cells),):
            raise TabularError(
                f"`{what}` must be {len(self.cells)} booleans in table order or a function of "
                f"the cells; got dtype {m.dtype}, shape {m.shape}"
            )
        return m

    @classmethod
    def from_cells(
        cls,
        cells: pd.DataFrame,
        dims: Sequence[str],
        *,
        value: str = "value",
        n: str = "n",
        top: Sequence[str] | None = None,
        hierarchies: Mapping | None = None,
        total: str = TOTAL,
    ) -> Table:
        """A table from aggregated input (τ-ARGUS tabular input, sdcTable ``freqVarInd`` input).

        ``cells`` must hold every non-empty inner cell; margin rows are optional. Missing margins
        are computed: values and frequencies are summed (each unit is assumed to lie in one inner
        cell, as τ-ARGUS assumes for tabular input) and ``top`` columns (largest contributions,
        largest first) are merged. Given margins keep their ``n`` and top values, and their value
        must equal the sum of their inner cells.

        Example:
            >>> df = pd.DataFrame({"sex": ["m", "f"], "value": [5.0, 7.0], "n": [2, 3]})
            >>> Table.from_cells(df, ["sex"]).cells[["sex", "value", "n"]].values.tolist()
            [['Total', 12.0, 5], ['f', 7.0, 3], ['m', 5.0, 2]]

        Raises:
            TabularError: missing columns, unknown codes, duplicate cells, margins that do not
                add up, or margins without inner cells.
        """
        dims = _as_dims(dims)
        top = list(top) if top is not None else _top_columns(cells)
        _require_columns(cells, [*dims, value, n, *top], "tabular input")
        hiers = _resolve_hierarchies(cells, dims, hierarchies, total, aggregated=True)
        ids = np.column_stack([_code_ids(cells[d], hiers[d], d, margins=True) for d in dims])
        if pd.DataFrame(ids).duplicated().any():
            raise TabularError(f"tabular input has duplicate cells over {list(dims)}")
        vals = _numbers(cells[value], value)
        freq = _numbers(cells[n], n).astype(np.int64)
        tops = np.column_stack([_numbers(cells[t], t) for t in top]) if top else None
        leaf = np.all([hiers[d].is_leaf[ids[:, j]] for j, d in enumerate(dims)], axis=0)
        if not leaf.any():
            raise TabularError("tabular input has no inner cells; give the bottom-level cells")
        cand = None
        if tops is not None:
            idx = np.repeat(np.arange(int(leaf.sum())), len(top))
            cand = (idx, tops[leaf].ravel(), None)
        cube = _Cube([hiers[d] for d in dims])
        out = cube.assemble(ids[leaf], {"value": vals[leaf], "n": freq[leaf]}, cand, len(top))
        pos = np.searchsorted(out["key"], cube.key(ids))
        given = ~leaf
        if given.any():
            if np.any(
                out["key"][np.minimum(pos, len(out["key"]) - 1)][given] != cube.key(ids)[given]
            ):
                raise TabularError("tabular input has margin cells without any inner cell below")
            p = pos[given]
            bad = ~np.isclose(out["value"][p], vals[given], rtol=1e-9, atol=1e-9)
            if bad.any():
                i = np.flatnonzero(given)[np.argmax(bad)]
                cell = dict(zip(dims, cells[list(dims)].iloc[i].astype(str), strict=True))
                got, want = float(vals[i]), float(out["value"][pos[i]])
                raise TabularError(
                    f"cell {cell} is given as {got:g} but its inner cells add up to {want:g}; "
                    "the table is not additive"
                )
            out["n"][p] = freq[given]
            if tops is not None:
                out["top"][p] = tops[given]
        negative = bool((vals < 0).any() or (tops is not None and (tops < 0).any()))
        return _finish(cube, dims, hiers, total, out, count=False, weighted=False, neg=negative)


def build_table(
    microdata: pd.DataFrame,
    dims: Sequence[str],
    measure: str | None = None,
    *,
    hierarchies: Mapping | None = None,
    weight: str | None = None,
    holding: str | None = None,
    unit: str | None = None,
    shadow: str | None = None,
    total: str = TOTAL,
    top_k: int = 2,
) -> Table:
    """Tabulate microdata into all cells of a (hierarchical) table with X and A.

    Args:
        microdata: one row per record.
        dims: dimension columns (bottom-level codes).
        measure: column summed into ``value``; ``None`` counts records (a frequency table).
        hierarchies: per dimension a :class:`Hierarchy`, a ``{code: parent}`` mapping, or a list
            of level columns coarse to fine ending with the dimension (``["region", "muni"]``);
            other dimensions are flat over their observed codes.
        weight: sampling weight column (constant per unit): ``value = Σ w·x``; ``weight`` column.
        holding: holding (enterprise group) column for holding-level rules; a missing holding
            makes the unit its own holding (τ-ARGUS). Not combinable with ``weight``.
        unit: unit column when several rows belong to one unit; contributions are summed per
            unit within each cell before rules see them.
        shadow: variable the sensitivity rules use instead of ``measure`` (τ-ARGUS shadow
            variable, e.g. a non-negative one when the measure has negative contributions).
        total: the total code of every dimension. top_k: how many largest contributions to keep.

    Example:
        >>> df = pd.DataFrame({"sex": ["m", "m", "f"], "inc": [10.0, 30.0, 5.0]})
        >>> t = build_table(df, ["sex"], "inc")
        >>> t.cells[["sex", "n", "value", "top1", "top2"]].values.tolist()
        [['Total', 3, 45.0, 30.0, 10.0], ['f', 1, 5.0, 5.0, 0.0], ['m', 2, 40.0, 30.0, 10.0]]

    Raises:
        TabularError: missing columns, missing values, codes outside a hierarchy, negative weights,
            weights or holdings that vary within a unit, or weights together with holdings.
    """
    dims = _as_dims(dims)
    wanted = [*dims, *(c for c in (measure, weight, holding, unit, shadow) if c is not None)]
    _require_columns(microdata, wanted, "microdata")
    if weight is not None and holding is not None:
        raise TabularError(
            "sampling weights and holdings cannot be combined: τ-ARGUS defines holding-level "
            "rules only for unweighted data; drop `weight` or `holding`"
        )
    hiers = _resolve_hierarchies(microdata, dims, hierarchies, total, aggregated=False)
    leaf = np.column_stack([_code_ids(microdata[d], hiers[d], d, margins=False) for d in dims])
    rows = len(microdata)
    x = np.ones(rows) if measure is None else _numbers(microdata[measure], measure)
    s = x if shadow is None else _numbers(microdata[shadow], shadow)
    w = None if weight is None else _numbers(microdata[weight], weight)
    if w is not None and (w < 0).any():
        raise TabularError(f"sampling weights in column {weight!r} must be >= 0")
    hid = None if holding is None else _holding_ids(microdata[holding])
    gid = None
    if unit is not None:
        uid, _ = _factorize(microdata[unit], unit)
        for name, col in (("weight", w), ("holding", hid)):
            if col is not None and _varies(uid, col):
                raise TabularError(f"the {name} varies within a unit of column {unit!r}")
        first = np.unique(uid, return_index=True)[1]
        if hid is not None:
            hid = np.where(hid >= 0, hid, -1 - np.arange(rows))[first][uid]
        gid = uid
    elif hid is not None:
        hid = np.where(hid >= 0, hid, -1 - np.arange(rows))
    cube = _Cube([hiers[d] for d in dims])
    inner_keys, inv = np.unique(cube.key(leaf), return_inverse=True)
    inner_ids = cube.ids(inner_keys)
    ones = np.ones(rows) if w is None else w
    sums = {"value": np.bincount(inv, ones * x, len(inner_keys))}
    if shadow is not None:
        sums["shadow"] = np.bincount(inv, ones * s, len(inner_keys))
    k = 0 if (measure is None and shadow is None) else top_k
    cand = groups = None
    if gid is None:
        sums["n"] = np.bincount(inv, minlength=len(inner_keys)).astype(np.float64)
        if w is not None:
            sums["weight"] = np.bincount(inv, w, len(inner_keys))
        cand = (inv, s, w)
    else:
        # one contributor per (inner cell, unit): the unit's summed contribution
        inv_u, g_u, s_u, w_u = _pairs(inv.astype(np.int64), gid, s, w)
        if len(np.unique(g_u)) == len(g_u):  # every unit in one inner cell: n adds up
            sums["n"] = np.bincount(inv_u, minlength=len(inner_keys)).astype(np.float64)
            if w is not None:
                sums["weight"] = np.bincount(inv_u, w_u, len(inner_keys))
            cand = (inv_u, s_u, w_u)
        else:
            groups = (inv_u, g_u, s_u, w_u)
    holdings = None
    if hid is not None:
        inv_h, h_h, s_h, _ = _pairs(inv.astype(np.int64), hid, s, None)
        holdings = (inv_h, h_h, s_h)
    if cand is not None and k:
        cand = _top_candidates(cand[0], len(inner_keys), cand[1], cand[2], k)
    out = cube.assemble(inner_ids, sums, cand if k else None, k, groups, holdings)
    source = pd.DataFrame({d: leaf[:, j] for j, d in enumerate(dims)})
    return _finish(
        cube,
        dims,
        hiers,
        total,
        out,
        count=measure is None,
        weighted=w is not None,
        neg=bool((s < 0).any()),
        rows=source,
    )


def _finish(cube, dims, hiers, total, out, *, count, weighted, neg, rows=None) -> Table:
    keys = out["key"]
    ids = cube.ids(keys)
    frame = {d: np.asarray(hiers[d].codes, dtype=object)[ids[:, j]] for j, d in enumerate(dims)}
    frame["n"] = np.rint(out["n"]).astype(np.int64)
    frame["value"] = out["value"]
    for name in ("weight", "shadow"):
        if name in out:
            frame[name] = out[name]
    for prefix in ("", "h"):
        if prefix == "h" and "n_holding" in out:
            frame["n_holding"] = np.rint(out["n_holding"]).astype(np.int64)
        if prefix + "top" in out:
            for j in range(out[prefix + "top"].shape[1]):
                frame[f"{prefix}top{j + 1}"] = out[prefix + "top"][:, j]
        if prefix + "top_w" in out:
            for j in range(out[prefix + "top_w"].shape[1]):
                frame[f"top{j + 1}_w"] = out[prefix + "top_w"][:, j]
    frame["level"] = sum(hiers[d].depth[ids[:, j]] for j, d in enumerate(dims))
    frame["is_inner"] = np.all([hiers[d].is_leaf[ids[:, j]] for j, d in enumerate(dims)], axis=0)
    cells = pd.DataFrame(frame)
    return Table(
        cells,
        tuple(dims),
        dict(hiers),
        out["X"],
        cube.constraints(keys),
        out["inner"],
        total,
        count=count,
        weighted=weighted,
        negative=neg,
        _rows=rows,
    )


def _as_dims(dims) -> tuple[str, ...]:
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    if not dims:
        raise TabularError("a table needs at least one dimension")
    if len(set(dims)) != len(dims):
        raise TabularError(f"dimensions {list(dims)} repeat a name")
    return dims


def _resolve_hierarchies(frame, dims, hierarchies, total, *, aggregated):
    hierarchies = dict(hierarchies or {})
    unknown = sorted(set(hierarchies) - set(dims))
    if unknown:
        raise TabularError(f"hierarchies given for {unknown}, which are not dimensions {dims}")
    out = {}
    for d in dims:
        h = hierarchies.get(d)
        if h is None:
            names = _factor(frame[d], d, None if aggregated else total)[1]
            out[d] = Hierarchy.flat(sorted(set(names) - {str(total)}), total=total)
        elif isinstance(h, Hierarchy):
            if h.total != total:
                raise TabularError(f"hierarchy of {d!r} has total {h.total!r}, not {total!r}")
            out[d] = h
        elif isinstance(h, Mapping):
            out[d] = Hierarchy.from_parents(h, total=total)
        else:
            levels = list(h)
            if aggregated or not levels or levels[-1] != d:
                raise TabularError(
                    f"hierarchy of {d!r} as level columns must be microdata columns ending with "
                    f"{d!r} (e.g. ['region', {d!r}]); got {levels}"
                )
            out[d] = Hierarchy.from_levels(frame, levels, total=total)
    return out


def _code_ids(col: pd.Series, h: Hierarchy, name: str, *, margins: bool) -> np.ndarray:
    ids, names = _factor(col, name, None)
    at = np.array([h.index.get(c, -1) for c in names], dtype=np.int64)
    if (at < 0).any():
        bad = sorted(c for c, i in zip(names, at, strict=True) if i < 0)[:5]
        raise TabularError(
            f"column {name!r} has codes {bad} that are not in its hierarchy; add them to the "
            "hierarchy or recode the data"
        )
    if not margins and not h.is_leaf[at].all():
        bad = sorted(c for c, i in zip(names, at, strict=True) if not h.is_leaf[i])[:5]
        raise TabularError(
            f"column {name!r} has codes {bad} that are not bottom-level codes of its hierarchy; "
            "microdata must be coded at the finest level"
        )
    return at[ids]


def _numbers(col: pd.Series, name: str) -> np.ndarray:
    try:
        x = pd.to_numeric(col).to_numpy(dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TabularError(f"column {name!r} must be numeric ({exc})") from None
    if np.isnan(x).any():
        raise TabularError(f"column {name!r} has missing values; impute or drop those rows")
    return x


def _factorize(col: pd.Series, name: str):
    ids, uniques = pd.factorize(col)
    if (ids < 0).any():
        raise TabularError(f"column {name!r} has missing identifiers")
    return ids.astype(np.int64), len(uniques)


def _holding_ids(col: pd.Series) -> np.ndarray:
    return pd.factorize(col)[0].astype(np.int64)


def _varies(gid: np.ndarray, col: np.ndarray) -> bool:
    frame = pd.DataFrame({"g": gid, "v": col})
    return bool((frame.groupby("g")["v"].nunique() > 1).any())


def _top_columns(frame: pd.DataFrame) -> list[str]:
    tops = sorted(
        (
            c
            for c in frame.columns
            if isinstance(c, str) and c.startswith("top") and c[3:].isdigit()
        ),
        key=lambda c: int(c[3:]),
    )
    return tops


# linked tables live in their own module; re-exported here, where they were first defined (the
# import comes last because linking builds on Table)
from sqlsdc.tabular.linking import link_tables  # noqa: E402

__all__ = ["TOTAL", "Hierarchy", "Table", "build_table", "link_tables"]
