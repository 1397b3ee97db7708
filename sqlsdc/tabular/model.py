"""The table model: hierarchies, cells over all margins, model matrix X and constraint matrix A.

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

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import pandas as pd
from scipy import sparse

from sqlsdc.errors import InternalError, TabularError

TOTAL = "Total"
_MAX_KEY = 2**62


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """The codes of one dimension with their parents, in pre-order (the total first).

    Codes are strings (numbers in the data are compared by their text, as in τ-ARGUS code lists).

    Example:
        >>> h = Hierarchy.from_parents({"A": None, "A1": "A", "A2": "A", "B": None})
        >>> h.parents["A1"], h.parents["Total"], h.children["A"]
        ('A', None, ('A1', 'A2'))
    """

    codes: tuple[str, ...]
    parent_index: tuple[int, ...]
    total: str = TOTAL

    def __post_init__(self):
        if not self.codes or self.codes[0] != self.total or self.parent_index[0] != -1:
            raise InternalError("a Hierarchy must start with its total code and no parent")
        if any(not 0 <= p < i for i, p in enumerate(self.parent_index) if i):
            raise InternalError("Hierarchy codes must be listed parents before children")

    @classmethod
    def flat(cls, codes: Sequence, total: str = TOTAL) -> Hierarchy:
        """A one-level dimension: every code rolls up into ``total``."""
        return cls.from_parents({c: None for c in codes}, total=total)

    @classmethod
    def from_parents(cls, parents: Mapping, total: str = TOTAL) -> Hierarchy:
        """Build from ``{code: parent}``; a parent of ``None`` (or the total) means the top level.

        Raises:
            TabularError: for an unknown parent, a cycle, or the total code with a parent.
        """
        total = str(total)
        up: dict[str, str] = {}
        for code, parent in parents.items():
            code = str(code)
            if code == total:
                if parent is not None:
                    raise TabularError(
                        f"the total code {total!r} cannot have a parent (got {parent!r}); "
                        "it is the root of the hierarchy"
                    )
                continue
            up[code] = total if parent is None else str(parent)
        for code, parent in up.items():
            if parent != total and parent not in up:
                raise TabularError(
                    f"code {code!r} has parent {parent!r}, which is not a code of the hierarchy; "
                    f"add {parent!r} to the mapping or map {code!r} to None (the total)"
                )
        kids: dict[str, list[str]] = {total: []}
        for code, parent in up.items():
            kids.setdefault(parent, []).append(code)
        order, index, parent_index = [], {}, []
        stack = [(total, -1)]
        while stack:
            code, parent = stack.pop()
            index[code] = len(order)
            order.append(code)
            parent_index.append(parent)
            stack.extend((k, index[code]) for k in reversed(kids.get(code, [])))
        if len(order) != len(up) + 1:
            lost = sorted(set(up) - set(index))
            raise TabularError(
                f"the hierarchy has a cycle through codes {lost[:5]}; every code must roll up to "
                f"the total {total!r}"
            )
        return cls(tuple(order), tuple(parent_index), total)

    @classmethod
    def from_levels(cls, frame: pd.DataFrame, columns: Sequence[str], total: str = TOTAL):
        """Build from columns of ``frame`` ordered coarse to fine, e.g. ``["region", "muni"]``.

        Each code of a finer column rolls up into the code of the coarser column on the same rows,
        and the coarsest into ``total``; codes are listed in sorted order within a level.

        Raises:
            TabularError: a missing code, a code with two parents, a code on two levels, or a code
                equal to the total code.
        """
        _require_columns(frame, columns, "hierarchy level")
        parents: dict[str, str | None] = {}
        level_of: dict[str, str] = {}
        above = None
        for column in columns:
            ids, names = _factor(frame[column], column, total)
            if above is None:
                pairs = [(c, None) for c in names]
            else:
                up_ids, up_names = above
                pair = np.unique(ids * len(up_names) + up_ids)
                child, par = pair // len(up_names), pair % len(up_names)
                twice = child[np.r_[False, child[1:] == child[:-1]]]
                if len(twice):
                    two = sorted(up_names[p] for p in par[child == twice[0]])[:2]
                    raise TabularError(
                        f"code {names[twice[0]]!r} of column {column!r} has two parents in the "
                        f"coarser column: {two[0]!r} and {two[1]!r}; a hierarchy needs exactly "
                        "one parent per code"
                    )
                pairs = [(names[c], up_names[p]) for c, p in zip(child, par, strict=True)]
            for c, p in sorted(pairs):
                if c in level_of:
                    raise TabularError(
                        f"code {c!r} appears in columns {level_of[c]!r} and {column!r}; codes "
                        "must be unique across hierarchy levels (prefix them, e.g. 'R1', 'M1')"
                    )
                level_of[c] = column
                parents[c] = p
            above = (ids, names)
        return cls.from_parents(parents, total=total)

    @cached_property
    def index(self) -> dict[str, int]:
        """Position of each code in :attr:`codes`."""
        return {c: i for i, c in enumerate(self.codes)}

    @property
    def parents(self) -> dict[str, str | None]:
        """``{code: parent code}``; the total's parent is ``None``."""
        return {
            c: (self.codes[p] if p >= 0 else None)
            for c, p in zip(self.codes, self.parent_index, strict=True)
        }

    @property
    def children(self) -> dict[str, tuple[str, ...]]:
        """``{code: child codes}`` (empty for a bottom-level code)."""
        kids: dict[str, list[str]] = {c: [] for c in self.codes}
        for c, p in zip(self.codes[1:], self.parent_index[1:], strict=True):
            kids[self.codes[p]].append(c)
        return {c: tuple(k) for c, k in kids.items()}

    @cached_property
    def depth(self) -> np.ndarray:
        """Depth of each code (total 0) in :attr:`codes` order."""
        d = np.zeros(len(self.codes), dtype=np.int64)
        for i, p in enumerate(self.parent_index[1:], start=1):
            d[i] = d[p] + 1
        return d

    @cached_property
    def is_leaf(self) -> np.ndarray:
        """True for bottom-level codes (the codes of inner cells)."""
        leaf = np.ones(len(self.codes), dtype=bool)
        leaf[[p for p in self.parent_index if p >= 0]] = False
        return leaf

    @cached_property
    def ancestor(self) -> np.ndarray:
        """``ancestor[level, code]``: the code's ancestor at depth ``level``, or -1 if shallower."""
        parent = np.asarray(self.parent_index, dtype=np.int64)
        table = np.full((int(self.depth.max()) + 1, len(self.codes)), -1, dtype=np.int64)
        cur = np.arange(len(self.codes))
        for _ in range(table.shape[0]):
            ok = cur >= 0
            table[self.depth[cur[ok]], np.flatnonzero(ok)] = cur[ok]
            cur = np.where(ok, parent[np.maximum(cur, 0)], -1)
        return table


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
        uid, n_units = _factorize(microdata[unit], unit)
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


def link_tables(tables: Sequence[Table]) -> Table:
    """Link tables that share cells into one table over the union of their dimensions.

    A table without dimension ``d`` is read as being at ``d``'s total code. Cells with identical
    codes are one cell (their values and frequencies must agree); ``A`` stacks every table's
    equations. ``X`` is over the cross-classification of all dimensions (the "cover table") and
    needs tables built by :func:`build_table` from the same microdata rows, or tables over the
    same dimensions; otherwise ``X`` is ``None`` (use ``method="optimal"``).

    Example:
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


class _Cube:
    """Key arithmetic over the hierarchies and the vectorised aggregation of all margins."""

    def __init__(self, hiers: list[Hierarchy]):
        self.hiers = hiers
        self.size = np.array([len(h.codes) for h in hiers], dtype=np.int64)
        if float(np.prod(self.size.astype(float))) >= _MAX_KEY:
            raise TabularError(
                f"the table has {' x '.join(map(str, self.size))} codes per dimension, too many "
                "cell keys for 64-bit integers; split the table"
            )
        self.stride = np.ones(len(hiers), dtype=np.int64)
        for d in range(len(hiers) - 2, -1, -1):
            self.stride[d] = self.stride[d + 1] * self.size[d + 1]

    def key(self, ids: np.ndarray) -> np.ndarray:
        return ids.astype(np.int64) @ self.stride

    def ids(self, keys: np.ndarray) -> np.ndarray:
        return (keys[:, None] // self.stride[None, :]) % self.size[None, :]

    def combos(self, inner_ids: np.ndarray):
        """For each level combination: the key of each inner cell's ancestor cell (-1: none)."""
        levels = [range(h.ancestor.shape[0]) for h in self.hiers]
        for combo in itertools.product(*levels):
            key = np.zeros(len(inner_ids), dtype=np.int64)
            ok = np.ones(len(inner_ids), dtype=bool)
            for d, lev in enumerate(combo):
                anc = self.hiers[d].ancestor[lev, inner_ids[:, d]]
                ok &= anc >= 0
                key += np.maximum(anc, 0) * self.stride[d]
            yield np.where(ok, key, -1)

    def assemble(self, inner_ids, sums, cand, top_k, groups=None, holdings=None) -> dict:
        """Aggregate inner cells into every cell, one vectorised pass per level combination.

        ``sums``: per inner cell arrays summed into each cell. ``cand``: ``(inner index,
        contribution, weight)`` of distinct contributors for the top-k (the top-k of a cell is
        the top-k of its inner cells' top-k lists). ``groups``: ``(inner index, unit id,
        contribution, weight)`` when units span inner cells: ``n``, ``weight`` and top-k then
        come from per-cell unit sums. ``holdings``: ``(inner index, holding id, contribution)``.
        """
        parts: dict[str, list] = {"key": [], "ikey": []}
        crank = None if cand is None else _rank(cand[1])
        for ckey in self.combos(inner_ids):
            ok = ckey >= 0
            ukeys, inv = np.unique(ckey[ok], return_inverse=True)
            nc = len(ukeys)
            ci = np.full(len(ckey), -1, dtype=np.int64)
            ci[ok] = inv
            parts["key"].append(ukeys)
            parts["ikey"].append(ckey)
            for name, col in sums.items():
                parts.setdefault(name, []).append(np.bincount(inv, col[ok], nc))
            if groups is not None:
                idx, gid, x, w = groups
                c2, _, x2, w2 = _pairs(ci[idx], gid, x, w)
                parts.setdefault("n", []).append(np.bincount(c2, minlength=nc).astype(float))
                if w is not None:
                    parts.setdefault("weight", []).append(np.bincount(c2, w2, nc))
                if top_k:
                    _add(parts, "", _top(c2, nc, x2, w2, _rank(x2), top_k))
            elif cand is not None and top_k:
                idx, x, w = cand
                cc = ci[idx]
                m = cc >= 0
                _add(parts, "", _top(cc[m], nc, x[m], None if w is None else w[m], crank[m], top_k))
            if holdings is not None:
                idx, hid, x = holdings
                c2, _, x2, _ = _pairs(ci[idx], hid, x, None)
                parts.setdefault("n_holding", []).append(np.bincount(c2, minlength=nc) * 1.0)
                _add(parts, "h", _top(c2, nc, x2, None, _rank(x2), max(top_k, 1)))
        ikeys = parts.pop("ikey")
        out = {name: np.concatenate(v) for name, v in parts.items()}
        order = np.argsort(out["key"], kind="stable")
        out = {name: v[order] for name, v in out.items()}
        rows, cols = [], []
        for ckey in ikeys:
            ok = np.flatnonzero(ckey >= 0)
            rows.append(ok)
            cols.append(np.searchsorted(out["key"], ckey[ok]))
        r, c = np.concatenate(rows), np.concatenate(cols)
        out["X"] = sparse.csc_matrix(
            (np.ones(len(r), dtype=np.int8), (r, c)), shape=(len(inner_ids), len(out["key"]))
        )
        out["inner"] = np.searchsorted(out["key"], self.key(inner_ids))
        return out

    def constraints(self, keys: np.ndarray) -> sparse.csr_matrix:
        """``A``: one row per (parent cell, dimension) with +1 on the parent, -1 on its children."""
        ids = self.ids(keys)
        eq, child, parent = [], [], []
        for d, h in enumerate(self.hiers):
            par = np.asarray(h.parent_index, dtype=np.int64)[ids[:, d]]
            has = np.flatnonzero(par >= 0)
            pkey = keys[has] + (par[has] - ids[has, d]) * self.stride[d]
            ppos = np.searchsorted(keys, pkey)
            if np.any(keys[np.minimum(ppos, len(keys) - 1)] != pkey):
                raise InternalError("a cell's parent cell is missing from the table")
            eq.append(ppos * len(self.hiers) + d)
            child.append(has)
            parent.append(ppos)
        eq_all = np.concatenate(eq)
        rows, row_of = np.unique(eq_all, return_inverse=True)
        par_pos = rows // len(self.hiers)
        r = np.concatenate([row_of, np.arange(len(rows))])
        c = np.concatenate([np.concatenate(child), par_pos])
        v = np.concatenate([-np.ones(len(row_of)), np.ones(len(rows))])
        return sparse.csr_matrix((v, (r, c)), shape=(len(rows), len(keys)))


def _rank(x: np.ndarray) -> np.ndarray:
    """Position of each contribution in descending order (ties by input order)."""
    r = np.empty(len(x), dtype=np.int64)
    r[np.argsort(-x, kind="stable")] = np.arange(len(x))
    return r


def _order2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Order by (a, b) for non-negative integers; one integer sort when the pair fits."""
    nb = int(b.max()) + 1 if len(b) else 1
    if len(a) and (int(a.max()) + 1) * nb < _MAX_KEY:
        return np.argsort(a * nb + b, kind="stable")
    return np.lexsort((b, a))


def _top(ci, nc, x, w, rank, k):
    """Top-k contributions (largest first) per cell index; 0 where a cell has fewer."""
    order = _order2(ci, rank)
    cs = ci[order]
    starts = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]]) if len(cs) else cs[:0]
    counts = np.diff(np.r_[starts, len(cs)])
    at = cs[starts]
    top = np.zeros((nc, k))
    topw = None if w is None else np.zeros((nc, k))
    for j in range(k):
        m = counts > j
        top[at[m], j] = x[order[starts[m] + j]]
        if topw is not None:
            topw[at[m], j] = w[order[starts[m] + j]]
    return top, topw, counts, at


def _add(parts, prefix, result):
    top, topw = result[:2]
    parts.setdefault(prefix + "top", []).append(top)
    if topw is not None:
        parts.setdefault(prefix + "top_w", []).append(topw)


def _pairs(ci, gid, x, w):
    """Sum contributions per (cell index, group): one contributor per group and cell.

    Returns the pairs' cell index, group, summed contribution and weight (the group's first).
    """
    ok = ci >= 0
    ci, gid, x = ci[ok], gid[ok], x[ok]
    order = _order2(ci, gid - gid.min() if len(gid) else gid)
    c2, g2 = ci[order], gid[order]
    if not len(c2):
        return c2, g2, x[:0], (None if w is None else x[:0])
    starts = np.flatnonzero(np.r_[True, (c2[1:] != c2[:-1]) | (g2[1:] != g2[:-1])])
    w2 = None if w is None else w[ok][order][starts]
    return c2[starts], g2[starts], np.add.reduceat(x[order], starts), w2


def _top_candidates(inv, ni, x, w, k):
    """Reduce contributors to each inner cell's k largest (enough for every margin's top-k)."""
    top, topw, counts, at = _top(inv, ni, x, w, _rank(x), k)
    keep = np.arange(k)[None, :] < np.bincount(inv, minlength=ni)[:, None]
    idx = np.broadcast_to(np.arange(ni)[:, None], (ni, k))[keep]
    return idx, top[keep], (None if topw is None else topw[keep])


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


def _as_dims(dims) -> tuple[str, ...]:
    dims = (dims,) if isinstance(dims, str) else tuple(dims)
    if not dims:
        raise TabularError("a table needs at least one dimension")
    if len(set(dims)) != len(dims):
        raise TabularError(f"dimensions {list(dims)} repeat a name")
    return dims


def _require_columns(frame: pd.DataFrame, columns, what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise TabularError(
            f"{what} has no column(s) {missing}; available columns: {list(frame.columns)}"
        )


def _factor(col: pd.Series, name: str, total: str | None) -> tuple[np.ndarray, list[str]]:
    """Row codes as integers into a list of distinct code strings (fast on large columns)."""
    ids, uniques = pd.factorize(col)
    if (ids < 0).any():
        raise TabularError(f"column {name!r} has missing codes; recode them (e.g. 'unknown')")
    as_text = [str(u) for u in uniques]
    again, names = pd.factorize(pd.Index(as_text, dtype=object))
    if total is not None and str(total) in as_text:
        raise TabularError(
            f"column {name!r} contains the total code {total!r} as a data code; rename it or "
            "pass another `total`"
        )
    return again.astype(np.int64)[ids], [str(n) for n in names]


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
