"""Hierarchies of codes: one dimension's codes in pre-order with their parents.

A dimension's codes form a tree under its total code; :class:`Hierarchy` keeps them in pre-order
(the total first, every parent before its children), which is the order of the table's cell keys
(:mod:`sqlsdc.tabular.model`). Built from a flat code list, a ``{code: parent}`` mapping or level
columns of microdata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from sqlsdc.errors import InternalError, TabularError

TOTAL = "Total"


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
