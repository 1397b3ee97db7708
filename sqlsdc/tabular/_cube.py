"""The numeric kernel of the table model: cell keys, per-cell sums and top contributions.

Cells are keyed by the mixed-radix number of their codes' pre-order positions (the total is 0);
:class:`_Cube` turns inner-cell ids into the keys of all their margins, sums contributions per
cell with numpy sorts (one pass per level combination) and writes the constraint rows
``parent − Σ children = 0``. Used by :mod:`sqlsdc.tabular.model`; private.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import sparse

from sqlsdc.errors import InternalError, TabularError
from sqlsdc.tabular.hierarchy import Hierarchy

_MAX_KEY = 2**62


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
