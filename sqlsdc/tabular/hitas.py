"""HiTaS: secondary suppression of hierarchical tables through their non-hierarchical sub-tables.

de Wolf (2002), "HiTaS: a heuristic approach to cell suppression in hierarchical tables"
(Inference Control in Statistical Databases, LNCS 2316), the τ-ARGUS "Modular" method
(sdcTools/tauhitas): a hierarchical table is covered by the non-hierarchical tables formed by one
parent code and its direct children in every dimension. They are protected one at a time,
top-down by hierarchy level (the sum of the parents' depths), each with the optimal MILP of
:mod:`sqlsdc.tabular.optimal` on its own equations:

- every cell already suppressed (a primary, or a secondary chosen in another sub-table) is a
  primary of the sub-table. True primaries keep their protection levels; secondaries get
  ``SECONDARY_MARGIN`` (10%) of ``|value|``, at least ``SECONDARY_MIN_LEVEL`` and at most the
  a-priori room, on both sides: τ-ARGUS's choice (``LOWERMARG=0.9``/``UPPERMARG=1.1`` and the
  0.0001 floor in tauhitas ``CalcPbounds``), so a secondary cannot be recomputed exactly from a
  lower-level table;
- cells that were published by a sub-table solved earlier may still be suppressed, but cost more
  than all other cells of the sub-table together (τ-ARGUS gives such marginals large weights);
  when it happens, every sub-table holding the cell is solved again (backtracking), so shared
  cells stay consistent. The loop ends when no sub-table gains suppressions.

HiTaS protects each primary within every sub-table; an attacker who combines the equations of
several sub-tables can know more. sqlsdc therefore finishes with an audit over the WHOLE table
(attacker LP per primary) and, for primaries found under-protected, one repair MILP over the whole
table that keeps the pattern and only adds cells (adding suppressions never narrows an interval),
with sub-problems for the failing primaries only.
"""

from __future__ import annotations

import itertools
import math
import numbers

import numpy as np
import pandas as pd
import scipy.sparse as sp

from sqlsdc.errors import TabularError
from sqlsdc.tabular.optimal import (
    SuppressionResult,
    _validated,
    attacker_ranges,
    optimal_suppress,
)

#: Protection level of a secondary suppression where it is a primary of another sub-table,
#: as a fraction of |value| (τ-ARGUS Modular default: 10%).
SECONDARY_MARGIN = 0.10
#: Smallest protection level of such a secondary (τ-ARGUS: 0.0001).
SECONDARY_MIN_LEVEL = 1e-4


def hitas_suppress(
    cells: pd.DataFrame,
    hierarchies: dict,
    values,
    primary,
    upl,
    lpl,
    cost,
    *,
    lower,
    upper,
    forced=None,
    total="Total",
    solver: str = "SCIP",
    time_limit_per_subtable: float = 10.0,
) -> SuppressionResult:
    """Secondary suppression of a hierarchical table by the HiTaS decomposition (de Wolf 2002).

    Args:
        cells: one row per cell, one column per dimension (the keys of ``hierarchies``) holding
            its code; margins carry the parent codes, the grand total ``total`` everywhere.
            Missing combinations are structural empties (known zeros).
        hierarchies: ``{dimension: {code: parent_code}}``; the total's parent is None (codes
            whose parent is None other than ``total`` hang under ``total``). A dimension without
            hierarchy maps its codes to ``total``.
        values, primary, upl, lpl, cost, lower, upper, forced: per cell, as in
            :func:`sqlsdc.tabular.optimal.optimal_suppress`.
        total: the code of the total in every dimension.
        solver: MILP solver for the sub-tables ("SCIP", "HIGHS", "CBC", "CP-SAT").
        time_limit_per_subtable: seconds per sub-table solve (and for the final repair).

    Returns:
        SuppressionResult. ``status`` is "feasible" (a pattern protecting every primary over the
        whole table; HiTaS is a heuristic, so not proven optimal; ``gap`` None), "optimal" only
        when no secondary suppression was needed, "infeasible" (some sub-table cannot protect
        its primaries), or "timeout" (the final repair found no pattern in time); for the last
        two ``suppressed`` is the fail-closed pattern (every cell not forced).

    Raises:
        TabularError: codes missing from the hierarchies, duplicate cells, invalid arrays.

    Example:
        >>> import pandas as pd, numpy as np
        >>> h = {"r": {"Total": None, "a": "Total", "b": "Total"},
        ...      "c": {"Total": None, "x": "Total", "y": "Total"}}
        >>> cells = pd.DataFrame([(r, c) for r in ["a", "b", "Total"] for c in ["x", "y", "Total"]],
        ...                      columns=["r", "c"])
        >>> v = np.array([5., 7, 12, 3, 9, 12, 8, 16, 24])
        >>> p = np.zeros(9, bool); p[0] = True
        >>> pl = np.where(p, 2.0, 0.0)
        >>> r = hitas_suppress(cells, h, v, p, pl, pl, v, lower=0.0, upper=np.inf)
        >>> r.status, r.cost, np.flatnonzero(r.suppressed).tolist()
        ('feasible', 24.0, [0, 1, 3, 4])
    """
    limit = time_limit_per_subtable
    if not (isinstance(limit, numbers.Real) and math.isfinite(limit) and limit > 0):
        raise TabularError(
            f"time_limit_per_subtable must be a positive number, got {time_limit_per_subtable!r}"
        )
    table = _Table(cells, hierarchies, total)
    A = table.constraints()
    data = _validated(A, values, primary, upl, lpl, cost, lower, upper, forced)
    A, values, primary, upl, lpl, cost, lower, upper, forced = data
    options = dict(solver=solver, time_limit=time_limit_per_subtable)

    def result(suppressed, status):
        gap = 0.0 if status == "optimal" else None
        return SuppressionResult(suppressed, float(cost[suppressed].sum()), status, gap)

    suppressed = _protect_subtables(table, *data[1:], options)
    if suppressed is None:
        return result(~forced, "infeasible")
    suppressed, status = _repair(A, suppressed, *data[1:], options)
    if status in ("infeasible", "timeout"):
        return result(~forced, status)
    return result(suppressed, "optimal" if (suppressed == primary).all() else "feasible")


def _protect_subtables(table, values, primary, upl, lpl, cost, lower, upper, forced, options):
    """The HiTaS loop; the suppression pattern, or None if a sub-table cannot be protected."""
    margin = np.maximum(SECONDARY_MARGIN * np.abs(values), SECONDARY_MIN_LEVEL)
    up = np.where(primary, upl, np.minimum(margin, upper - values))
    lo = np.where(primary, lpl, np.minimum(margin, values - lower))
    subtables = table.subtables()
    membership = _membership(subtables, values.size)
    suppressed = primary.copy()
    settled = np.zeros(values.size, bool)  # published by a sub-table solved earlier
    dirty = np.ones(len(subtables), bool)
    while dirty.any():
        t = int(np.argmax(dirty))  # the sub-tables are sorted top-down
        dirty[t] = False
        cells, sub_A = subtables[t]
        fixed = suppressed[cells]
        if fixed.any():
            penalty = (settled[cells] & ~fixed) * (cost[cells].sum() + 1.0)
            local_cost = cost[cells] + penalty
            args = (sub_A, values[cells], fixed)
            kwargs = dict(lower=lower[cells], upper=upper[cells], forced=forced[cells], **options)
            pl_up, pl_lo = up[cells] * fixed, lo[cells] * fixed
            res = optimal_suppress(*args, pl_up, pl_lo, local_cost, **kwargs)
            if res.status == "infeasible":
                # the secondaries' levels are HiTaS's own demand; only true primaries bind
                true = primary[cells]
                res = optimal_suppress(*args, pl_up * true, pl_lo * true, local_cost, **kwargs)
                if res.status == "infeasible":
                    return None
            # a "timeout" returns the sub-table's fail-closed pattern: safe, if heavy
            new = cells[res.suppressed & ~fixed]
            suppressed[new] = True
            for cell in new:
                dirty[membership[cell]] = True
            dirty[t] = False
        settled[cells] = True
    return suppressed


def _repair(A, suppressed, values, primary, upl, lpl, cost, lower, upper, forced, options):
    """Audit every primary over the whole table; add cells where the sub-tables fell short."""
    targets = np.flatnonzero(primary & ((upl > 0) | (lpl > 0)))
    low, high = attacker_ranges(A, values, suppressed, lower, upper, targets)
    tol = 1e-6 * np.maximum(1.0, np.abs(values[targets]))
    short_up = targets[high < values[targets] + upl[targets] - tol]
    short_lo = targets[low > values[targets] - lpl[targets] + tol]
    if not (short_up.size or short_lo.size):
        return suppressed, "feasible"
    need_up, need_lo = np.zeros_like(upl), np.zeros_like(lpl)
    need_up[short_up], need_lo[short_lo] = upl[short_up], lpl[short_lo]
    bounds = dict(lower=lower, upper=upper, forced=forced)
    res = optimal_suppress(A, values, suppressed, need_up, need_lo, cost, **bounds, **options)
    return res.suppressed, res.status


class _Table:
    """Codes of a hierarchical table as integer ids, with fast cell lookup by code tuple."""

    def __init__(self, cells: pd.DataFrame, hierarchies: dict, total):
        if not isinstance(cells, pd.DataFrame):
            raise TabularError(f"cells must be a pandas DataFrame, got {type(cells).__name__}")
        if not hierarchies:
            raise TabularError("hierarchies is empty; give {dimension: {code: parent}}")
        if cells.empty:
            raise TabularError("cells is empty; give one row per cell of the table")
        self.dims = list(hierarchies)
        missing = [d for d in self.dims if d not in cells.columns]
        if missing:
            raise TabularError(
                f"cells has no column for dimension(s) {missing}; columns are {list(cells.columns)}"
            )
        self.codes, self.parent, self.depth, self.children = [], [], [], []
        ids = []
        for dim in self.dims:
            codes, parent = _normalised(dim, hierarchies[dim], total)
            index = pd.Index(codes)
            found = index.get_indexer(cells[dim])
            if (found < 0).any():
                bad = pd.unique(cells[dim].to_numpy()[found < 0])[:5].tolist()
                raise TabularError(
                    f"codes {bad} of dimension {dim!r} are not in its hierarchy; add them with "
                    f"their parent (or {total!r})"
                )
            depth = _depths(dim, codes, parent)
            order = np.argsort(parent, kind="stable")
            edges = np.searchsorted(parent[order], np.arange(len(codes) + 1))
            children = [order[edges[i] : edges[i + 1]] for i in range(len(codes))]
            self.codes.append(codes)
            self.parent.append(parent)
            self.depth.append(depth)
            self.children.append(children)
            ids.append(found)
        self.ids = np.column_stack(ids).astype(np.int64)
        sizes = np.array([len(c) for c in self.codes], dtype=np.float64)
        if np.prod(sizes) >= 2.0**62:
            raise TabularError("too many code combinations to index (product of code counts)")
        self.stride = np.cumprod(np.concatenate([[1], sizes[:-1]])).astype(np.int64)
        self.keys = self.ids @ self.stride
        order = np.argsort(self.keys, kind="stable")
        self._sorted, self._order = self.keys[order], order
        if (np.diff(self._sorted) == 0).any():
            dup = self.keys[order][np.flatnonzero(np.diff(self._sorted) == 0)[0]]
            row = int(np.flatnonzero(self.keys == dup)[0])
            raise TabularError(
                f"cells has duplicate rows for codes {cells.iloc[row][self.dims].tolist()}; "
                "give one row per cell"
            )

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Cell index of each key, -1 where the combination is not a cell."""
        pos = np.searchsorted(self._sorted, keys)
        pos = np.minimum(pos, self._sorted.size - 1)
        hit = self._sorted[pos] == keys
        return np.where(hit, self._order[pos], -1)

    def constraints(self) -> sp.csr_matrix:
        """A for the whole table: one row "parent - sum(children) = 0" per parent cell and
        dimension, over the child cells that exist."""
        rows, cols, data, n = [], [], [], 0
        for d in range(len(self.dims)):
            child = np.flatnonzero(self.parent[d][self.ids[:, d]] >= 0)
            shift = (self.parent[d][self.ids[child, d]] - self.ids[child, d]) * self.stride[d]
            parent_cell = self.lookup(self.keys[child] + shift)
            child, parent_cell = child[parent_cell >= 0], parent_cell[parent_cell >= 0]
            heads, row = np.unique(parent_cell, return_inverse=True)
            rows += [n + np.arange(heads.size), n + row]
            cols += [heads, child]
            data += [np.ones(heads.size), -np.ones(child.size)]
            n += heads.size
        r, c, v = (np.concatenate(x) for x in (rows, cols, data))
        return sp.csr_matrix((v, (r, c)), shape=(n, self.keys.size))

    def subtables(self) -> list[tuple[np.ndarray, sp.csr_matrix]]:
        """(cells, A) of every non-hierarchical sub-table, top-down by level."""
        heads = []
        for d in range(len(self.dims)):
            nonleaf = [i for i, ch in enumerate(self.children[d]) if ch.size]
            heads.append(nonleaf or [int(np.flatnonzero(self.parent[d] < 0)[0])])
        combos = sorted(
            itertools.product(*heads),
            key=lambda c: (sum(int(self.depth[d][i]) for d, i in enumerate(c)), c),
        )
        return [self._subtable(combo) for combo in combos]

    def _subtable(self, combo) -> tuple[np.ndarray, sp.csr_matrix]:
        groups = [np.concatenate([[i], self.children[d][i]]) for d, i in enumerate(combo)]
        grid = np.zeros([g.size for g in groups], dtype=np.int64)
        for d, g in enumerate(groups):
            shape = [1] * len(groups)
            shape[d] = g.size
            grid = grid + (g * self.stride[d]).reshape(shape)
        found = self.lookup(grid)
        present = found >= 0
        local = np.full(found.shape, -1, dtype=np.int64)
        local[present] = np.arange(int(present.sum()))
        rows, cols, data, n = [], [], [], 0
        for d in range(len(groups)):
            if groups[d].size < 2:
                continue
            flat = np.moveaxis(local, d, 0).reshape(groups[d].size, -1)
            head, kids = flat[0], flat[1:]
            ok = (head >= 0) & (kids >= 0).any(axis=0)
            head, kids = head[ok], kids[:, ok]
            row_ids = n + np.arange(head.size)
            k_row = np.broadcast_to(row_ids, kids.shape)[kids >= 0]
            rows += [row_ids, k_row]
            cols += [head, kids[kids >= 0]]
            data += [np.ones(head.size), -np.ones(k_row.size)]
            n += head.size
        size = int(present.sum())
        if rows:
            r, c, v = (np.concatenate(x) for x in (rows, cols, data))
        else:
            r = c = np.zeros(0, np.int64)
            v = np.zeros(0)
        return found[present], sp.csr_matrix((v, (r, c)), shape=(n, size))


def _normalised(dim, hierarchy: dict, total) -> tuple[list, np.ndarray]:
    """Codes of one dimension (total first) and the parent id of each (-1 for the total)."""
    parents = {code: parent for code, parent in hierarchy.items() if code != total}
    for code, parent in parents.items():
        if parent is not None and parent != total and parent not in hierarchy:
            raise TabularError(
                f"dimension {dim!r}: the parent {parent!r} of code {code!r} is not a code of the "
                f"hierarchy; add it with its own parent (or {total!r})"
            )
    if hierarchy.get(total) is not None:
        raise TabularError(
            f"dimension {dim!r}: the total {total!r} has parent {hierarchy[total]!r}; the total "
            "is the root (parent None)"
        )
    codes = [total] + list(parents)
    index = {code: i for i, code in enumerate(codes)}
    parent = np.array(
        [-1] + [index[total if p is None else p] for p in parents.values()], dtype=np.int64
    )
    return codes, parent


def _depths(dim, codes, parent) -> np.ndarray:
    depth = np.zeros(len(codes), dtype=np.int64)
    known = parent < 0
    for level in range(1, len(codes) + 1):
        step = ~known & known[np.maximum(parent, 0)] & (parent >= 0)
        if not step.any():
            break
        depth[step] = level
        known |= step
    if not known.all():
        loop = [codes[i] for i in np.flatnonzero(~known)[:5]]
        raise TabularError(f"dimension {dim!r}: codes {loop} form a cycle of parents")
    return depth


def _membership(subtables, n_cells) -> list[np.ndarray]:
    """Indices of the sub-tables holding each cell."""
    cell = np.concatenate([c for c, _ in subtables])
    table = np.concatenate([np.full(c.size, t) for t, (c, _) in enumerate(subtables)])
    order = np.argsort(cell, kind="stable")
    bounds = np.searchsorted(cell[order], np.arange(n_cells + 1))
    return [table[order[bounds[i] : bounds[i + 1]]] for i in range(n_cells)]
