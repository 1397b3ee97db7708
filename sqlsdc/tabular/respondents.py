"""A singleton's respondent as the attacker of GaussSuppression, for ``anySumAudit``.

GaussSuppression's singleton methods (Langsrud 2024; SSBtools ``singletonMethod``) guard the
respondent of a *singleton* (an inner cell of one unit, a primary) by rules applied while the
walk publishes cells. The default rule, ``anySum``, lets a combination of singletons with unequal
coefficients through once ("subSubSec"), and the respondent of one of them may then compute
another primary exactly: in red team s44o's 4 x 4 count table the published margins give
r1c2 - r0c1 = 0, so the one person of r0c1 computes r1c2 = 1 (131 such (singleton, primary)
pairs in 100 random count tables, benchmarks/bench_singletons.py). ``subSpace`` closes this by
dropping every singleton row at once, i.e. against all respondents colluding, at 18 % more
hidden cells.

``singleton_method="anySumAudit"`` (sqlsdc's, not SSBtools') guards each respondent alone, the
threat the singleton methods are about:

* :func:`respondent_disclosures` audits a pattern: the respondent of singleton row ``s`` knows
  the published cells and ``z[s]``, i.e. every combination in ``span(published) + span(e_s)``.
  A primary ``p`` is computed exactly iff its column lies in that span, i.e. iff its column
  reduced against the published span is a multiple of ``e_s`` reduced against it (one exact
  elimination of the published columns, then one reduction per singleton).
* :func:`walk_for_respondents`: after the ``anySum`` walk, while the audit finds respondents
  who compute a primary, the walk is redone with :class:`RespondentSpans` for all of them: one
  more elimination per such respondent, started from ``e_s``, and a candidate is hidden also
  when publishing it would put a primary (not the respondent's own cell) in that span. The
  redone walk can change later decisions, so the audit runs again; each round adds at least
  one respondent, and the walk ends when the audit finds none.

On the 100 random tables: 0 pairs, 1,038 hidden cells against anySum's 938 (+10.7 %) and
subSpace's 1,104 (+17.7 %). The rounds walk with Python integers (the compiled kernel has no
respondent spans), so ``anySumAudit`` costs one exact walk more per round on tables whose
``anySum`` pattern leaks.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from sqlsdc.errors import InternalError
from sqlsdc.tabular.gauss import _Elimination

__all__ = ["RespondentSpans", "respondent_disclosures", "walk_for_respondents"]


def respondent_disclosures(X, suppressed, primary, single, forced=None) -> list[tuple[int, int]]:
    """The (singleton row, primary cell) pairs where that singleton's respondent computes the cell.

    Args:
        X: model matrix (I×C, integer entries). suppressed: bool[C], the pattern.
        primary: bool[C], the cells to protect. single: bool[I], the singleton inner cells.
        forced: bool[C] or None, cells published whatever the pattern (public elsewhere, e.g.
            an earlier release): what they and ``z[s]`` determine no pattern can hide, so such
            pairs are left out, as ``anySum`` leaves them published.

    Returns:
        Sorted pairs ``(s, p)``: the published cells and ``z[s]`` determine cell ``p``, a primary
        that is not the respondent's own (its column is not a multiple of ``e_s``) and that the
        published cells alone do not determine (the outsider's audit judges those).

    Example:
        Total = a + b + c with a = c = 1 primary singletons and b, Total published: a's
        respondent computes c = Total - b - a (and c's computes a).

        >>> X = sparse.csc_matrix(np.array([[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1]]))
        >>> hidden = np.array([True, False, True, False])
        >>> single = np.array([True, False, True])
        >>> respondent_disclosures(X, hidden, hidden, single)
        [(0, 2), (2, 0)]
    """
    Xc = _integer_csc(X)
    n_cells = Xc.shape[1]
    forced = np.zeros(n_cells, dtype=bool) if forced is None else np.asarray(forced, dtype=bool)
    published = ~np.asarray(suppressed, dtype=bool)
    elim = _Elimination(Xc.shape[0], None, False)
    cells = np.flatnonzero(primary).tolist()
    for c in cells:
        elim.add_primary(_column(Xc, c))
    given: set[tuple[int, int]] = set()
    for first, stage in ((True, forced & published), (False, published & ~forced)):
        for c in np.flatnonzero(stage).tolist():
            vec = elim.reduce(_column(Xc, c))
            if vec:
                elim.publish(vec)
        if first and forced.any():  # what the forced cells give, whatever the pattern
            given = set(_pairs(elim, Xc, cells, single))
    return sorted(set(_pairs(elim, Xc, cells, single)) - given)


def _pairs(elim, Xc, cells, single):
    """The pairs of :func:`respondent_disclosures` for the span ``elim`` holds now."""
    own = _own_cells(Xc, cells)
    for s in np.flatnonzero(single).tolist():
        known = elim.reduce({s: 1})
        if not known:
            continue  # published already: the respondent knows nothing more than anyone
        for i in _proportional(elim, known):
            if cells[i] not in own.get(s, ()):
                yield s, cells[i]


class RespondentSpans:
    """One elimination per guarded respondent: the published span plus their singleton ``e_s``.

    Each holds the primaries (but the respondent's own cells, multiples of ``e_s``) reduced
    against that span; :meth:`discloses` tells whether publishing a candidate would reduce one
    of them to zero, :meth:`publish` publishes the candidate last tested.
    """

    def __init__(self, Xc, primary, rows):
        cells = np.flatnonzero(primary).tolist()
        own = _own_cells(Xc, cells)
        self.rows, self.elims, self._pending = list(rows), [], []
        for s in self.rows:
            elim = _Elimination(Xc.shape[0], None, False)
            for c in cells:
                if c not in own.get(s, ()):
                    elim.add_primary(_column(Xc, c))
            elim.publish({s: 1})
            if not all(elim.prim):
                raise InternalError("a primary vanished against its respondent's own cell alone")
            self.elims.append(elim)

    def publish_forced(self, col: dict[int, int]) -> None:
        """Publish a forced cell. A primary it gives a respondent (with ``e_s``) is left as
        ``anySum`` leaves it: no pattern hides it, and its reduced column, now empty, matches
        no candidate (:func:`respondent_disclosures` leaves such pairs out too)."""
        for elim in self.elims:
            vec = elim.reduce(dict(col))
            if vec:
                elim.publish(vec)

    def discloses(self, col: dict[int, int]) -> bool:
        """Would publishing this column let a guarded respondent compute a primary?"""
        self._pending = [elim.reduce(dict(col)) for elim in self.elims]
        return any(
            vec and elim._any_proportional(vec)
            for elim, vec in zip(self.elims, self._pending, strict=True)
        )

    def publish(self) -> None:
        """Publish the column :meth:`discloses` tested last."""
        for elim, vec in zip(self.elims, self._pending, strict=True):
            if vec:
                elim.publish(vec)
        self._pending = []


def walk_for_respondents(walk, Xc, primary, single, forced, cand, column, secondary):
    """The ``anySum`` walk's decisions redone until no singleton's respondent computes a primary.

    Args:
        walk: the :class:`~sqlsdc.tabular.gauss._Walk` of ``anySum`` (its exact walk reruns).
        Xc: model matrix (CSC, int64). primary: bool[C]. single: bool[I], the singletons.
        forced, cand: lists of cells, the forced ones and the candidates in order.
        column: cell -> ``{row: coefficient}``. secondary: bool[len(cand)], the walk's result.

    Returns:
        bool[len(cand)], the candidates hidden.
    """
    order = np.asarray(cand, dtype=np.int64)
    at_forced = np.zeros(Xc.shape[1], dtype=bool)
    at_forced[list(forced)] = True
    guarded: set[int] = set()
    for _ in range(int(np.count_nonzero(single)) + 1):
        pattern = primary.copy()
        pattern[order[secondary]] = True
        found = {s for s, _ in respondent_disclosures(Xc, pattern, primary, single, at_forced)}
        if not found:
            return secondary
        if found <= guarded:
            break  # never expected: a guarded respondent computes a primary
        guarded |= found
        spans = RespondentSpans(Xc, primary, sorted(guarded))
        secondary, lost = walk.exact(forced, cand, column, spans)
        if lost:
            break  # never expected: the first walk passed the same forced cells
    raise InternalError("GaussSuppression's respondent walk left a singleton disclosure")


def _integer_csc(X) -> sparse.csc_matrix:
    Xc = sparse.csc_matrix(X, dtype=np.int64)
    Xc.eliminate_zeros()
    Xc.sort_indices()
    return Xc


def _column(Xc, c: int) -> dict[int, int]:
    a, b = Xc.indptr[c], Xc.indptr[c + 1]
    return dict(zip(Xc.indices[a:b].tolist(), Xc.data[a:b].tolist(), strict=True))


def _own_cells(Xc, cells) -> dict[int, set[int]]:
    """Per inner row ``s``, the cells among ``cells`` whose column is a multiple of ``e_s``."""
    own: dict[int, set[int]] = {}
    nnz = np.diff(Xc.indptr)
    for c in cells:
        if nnz[c] == 1:
            own.setdefault(int(Xc.indices[Xc.indptr[c]]), set()).add(c)
    return own


def _proportional(elim: _Elimination, vec: dict[int, int]) -> list[int]:
    """The primaries whose reduced column is a nonzero multiple of ``vec`` (reduced too)."""
    rows = iter(vec)
    r0 = next(rows)
    v0 = vec[r0]
    n = len(vec)
    out = []
    for i in sorted(elim.pinv.get(r0, ())):
        b = elim.prim[i]
        b0 = b.get(r0)
        if len(b) == n and b0 and all(b.get(r, 0) * v0 == x * b0 for r, x in vec.items()):
            out.append(i)
    return out
