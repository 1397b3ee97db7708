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
  who compute a primary, the walk is redone guarding all of them (:class:`RespondentSpans`): a
  candidate is hidden also when publishing it would put a primary (not the respondent's own
  cell) in ``span(published) + span(e_s)``. The redone walk can change later decisions, so the
  audit runs again; each round adds at least one respondent, and the walk ends when the audit
  finds none, or gives way to ``subSpace`` (all respondents together; its pattern is audited
  once, and a disclosure left is an error) when the rounds' work would pass ``WORK_LIMIT``.

On the 100 random tables: 0 pairs, 1,045 hidden cells against anySum's 938 (+11.4 %) and
subSpace's 1,104 (+17.7 %). The rounds walk with Python integers (the compiled kernel has no
respondent test): on a 2-D table of 8,969 cells (bench_suppression.py's, 1,850 singletons, 75
pairs under anySum) 3,822 hidden against anySum's 3,759 and subSpace's 4,119, in 3.9 s of CPU
against 0.3 s; on a 3-D table of 8,708 cells 4,253 against 4,086 and 4,601, in 38 s against
0.8 s. So tables whose X has 200,000 nonzeros or more (where even the first audit, a Python
elimination, costs a minute; subSpace unaudited, which left no respondent a primary on any
table measured here) and walks whose rounds would pass ``WORK_LIMIT`` respondent tests take
``subSpace`` instead (:func:`~sqlsdc.tabular.gauss.gauss_suppress`).
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
    """The guarded respondents' test of a candidate, over one plain mirror of the walk's span.

    The walk's own elimination holds ``anySum``'s primaries (without those made of singletons
    only); this mirror holds every primary reduced against the published span P. The respondent
    of singleton ``s`` knows ``span(P) + e_s``; with ``r = e_s`` reduced against P (nonzero on
    one pivot row ``q`` at least), publishing a candidate ``v`` (reduced against P) lets them
    compute primary ``p`` iff ``p`` reduced also by ``r`` at ``q`` is a nonzero multiple of ``v``
    reduced by ``r`` at ``q``. The primaries to compare are found through the rows of ``v``,
    so a test costs a few short vectors per guarded respondent, not an elimination each.
    """

    def __init__(self, Xc, primary, rows):
        self.cells = np.flatnonzero(primary).tolist()
        self.own = _own_cells(Xc, self.cells)
        self.rows = list(rows)
        self.plain = _Elimination(Xc.shape[0], None, False)
        for c in self.cells:
            self.plain.add_primary(_column(Xc, c))
        self._vec: dict[int, int] = {}

    def publish_forced(self, col: dict[int, int]) -> None:
        """Publish a forced cell. A primary it gives a respondent (with ``e_s``) is left as
        ``anySum`` leaves it: no pattern hides it, and its column reduced by ``r``, now empty,
        matches no candidate (:func:`respondent_disclosures` leaves such pairs out too)."""
        vec = self.plain.reduce(dict(col))
        if vec:
            self.plain.publish(vec)

    def discloses(self, col: dict[int, int]) -> bool:
        """Would publishing this column let a guarded respondent compute a primary?"""
        self._vec = vec = self.plain.reduce(dict(col))
        return bool(vec) and any(self._completes(vec, s) for s in self.rows)

    def publish(self) -> None:
        """Publish the column :meth:`discloses` tested last."""
        if self._vec:
            self.plain.publish(self._vec)
        self._vec = {}

    def _completes(self, vec: dict[int, int], s: int) -> bool:
        """Does ``vec`` put a primary in ``span(P) + e_s``, with P the published span?

        ``r`` (e_s reduced against P) is ``e_s`` when ``s`` is no pivot row, else the basis
        vector of pivot ``s`` without its entry ``s`` (up to sign and scale). A primary ``p``
        whose reduced column misses row ``q`` of ``r`` can only match when ``vec`` has row ``q``
        (else ``p`` ∝ ``vec``: the outsider's case, the walk's own test), and then it shares
        a row ``t`` of ``vec`` outside ``r``; so the primaries to compare are those holding
        ``q`` or ``t``, read from the mirror's index.
        """
        plain = self.plain
        b = plain.basis.get(s)
        q = s if b is None else next((r for r in b if r != s), None)
        if q is None:
            return False  # the published cells determine z[s]: nothing more to know
        pinv, own, cells = plain.pinv, self.own.get(s, ()), self.cells
        which = pinv.get(q, ())
        if q not in vec and all(cells[i] in own for i in which):
            return False  # no primary but the respondent's own cells holds row q
        known = {s: 1} if b is None else {r: x for r, x in b.items() if r != s}
        moved = _without(vec, known, q)
        if not moved:
            return False  # vec ∝ r: it discloses e_s, which the walk's own test refuses
        if q in vec:
            t = next((r for r in moved if r not in known), next(iter(moved)))
            which = set(which) | pinv.get(t, set())
        for i in which:
            if cells[i] in own:
                continue
            other = _without(plain.prim[i], known, q)
            if other and _same_direction(other, moved):
                return True
        return False


def _without(vec: dict[int, int], known: dict[int, int], q: int) -> dict[int, int]:
    """``vec`` with row ``q`` eliminated by ``known`` (exact integers; a new dict)."""
    f = vec.get(q)
    if not f:
        return dict(vec)
    k = known[q]
    out = {r: x * k for r, x in vec.items()}
    for r, x in known.items():
        y = out.get(r, 0) - f * x
        if y:
            out[r] = y
        else:
            out.pop(r, None)
    return out


def _same_direction(a: dict[int, int], b: dict[int, int]) -> bool:
    """Is ``a`` a nonzero multiple of ``b`` (both nonzero)?"""
    if len(a) != len(b):
        return False
    r0 = next(iter(b))
    a0, b0 = a.get(r0), b[r0]
    return bool(a0) and all(a.get(r, 0) * b0 == x * a0 for r, x in b.items())


WORK_LIMIT = 500_000
"""Respondent tests (guarded respondents x candidates, summed over the rounds) the redone walks
may take; beyond, :func:`walk_for_respondents` gives up and the caller takes ``subSpace``. A
test costs about 10 µs: the 2-D table of 8,969 cells of bench_suppression.py takes one round of
74 respondents x 5,485 candidates (0.41 million tests, 3.9 s of CPU in all against anySum's
0.3 s); the 3-D one of 8,708 cells would take 125 x 7,083 (0.89 million, 9.5 s) and two more
rounds, so it takes subSpace (0.7 s)."""


def walk_for_respondents(walk, Xc, primary, single, forced, cand, column, secondary):
    """The ``anySum`` walk's decisions redone until no singleton's respondent computes a primary.

    Args:
        walk: the :class:`~sqlsdc.tabular.gauss._Walk` of ``anySum`` (its exact walk reruns).
        Xc: model matrix (CSC, int64). primary: bool[C]. single: bool[I], the singletons.
        forced, cand: lists of cells, the forced ones and the candidates in order.
        column: cell -> ``{row: coefficient}``. secondary: bool[len(cand)], the walk's result.

    Returns:
        bool[len(cand)], the candidates hidden; None when the next round would pass
        ``WORK_LIMIT`` (the caller then walks ``subSpace``).
    """
    order = np.asarray(cand, dtype=np.int64)
    at_forced = np.zeros(Xc.shape[1], dtype=bool)
    at_forced[list(forced)] = True
    guarded: set[int] = set()
    work = 0
    for _ in range(int(np.count_nonzero(single)) + 1):
        pattern = primary.copy()
        pattern[order[secondary]] = True
        found = {s for s, _ in respondent_disclosures(Xc, pattern, primary, single, at_forced)}
        if not found:
            return secondary
        if found <= guarded:
            break  # never expected: a guarded respondent computes a primary
        guarded |= found
        work += len(guarded) * len(cand)
        if work > WORK_LIMIT:
            return None
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
