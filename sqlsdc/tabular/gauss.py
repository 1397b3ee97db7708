"""Secondary suppression by Gaussian elimination (Langsrud's GaussSuppression).

A published table is ``y = X.T @ z`` for the unknown inner cells ``z`` (``X`` is the I×C model
matrix of notes/tabular_contract.md). An attacker who knows the published cells knows every
linear combination of their columns of ``X``, so a suppressed cell ``b`` is disclosed exactly iff
``X[:, b]`` lies in the span of the published columns. GaussSuppression (Langsrud 2024; SSBtools
``R/GaussSuppression.R``, ``GaussSuppression1``) walks the candidates in a fixed order and keeps
the published span in echelon form: a candidate whose column, reduced against the span, is empty
adds nothing and is published; a candidate whose reduced column is proportional to the reduced
column of a primary cell would make that primary cell computable, so it becomes a secondary
suppression; any other candidate is published and its column joins the span.

This module implements that algorithm exactly, with these engineering choices (none changes the
result):

* The published span is kept in *reduced* row-echelon form (each basis vector is zero on every
  other pivot row), primaries are reduced eagerly as R does, but a candidate is reduced only when
  its turn comes. The reduced form of a vector is the unique representative of ``v + span`` that
  is zero on all pivot rows, so the decisions do not depend on which pivot rows are chosen: pivots
  are chosen to keep fill-in low (a ±1 entry in the row touched by the fewest stored vectors).
  With singletons, R's order "non-singleton rows first, then singleton rows by index" is kept,
  because the singleton methods look at the singleton part of reduced columns.
* Arithmetic is exact (R uses 32-bit integers and falls back to doubles with a tolerance
  ``tolGauss``). :class:`_Elimination` keeps vectors as sparse ``{row: int}`` dicts of Python
  integers, which cannot overflow. Tables with at least 200,000 nonzeros in ``X`` take the same
  walk compiled with numba (:mod:`sqlsdc.tabular._gauss_kernel`: flat int32 arrays, int64
  arithmetic); if a coefficient would pass ``2**31 - 1`` there, the walk is redone with Python
  integers. Coefficients stay at most 4 on the benchmark tables.

Measured (benchmarks/bench_suppression.py, one core of a shared 2-core machine, hierarchical
frequency tables, 15 % primary cells), compiled walk against the Python one: about 10^5 cells in
1.3 s against 4 s (2-D) and 9 s (3-D); about 10^6 cells in 11 s against 65 s (2-D) and 55 s
against 310-385 s (3-D), plus 15 s to compile the kernel the first time (numba caches it) and
0.7 s to load it in each process. The cost is the fill-in of the echelon form while the large
margins are published (they come first in the candidate order), spread evenly over the walk; no
dense matrix is ever formed. Other pivot rules and a lazily reduced basis were measured slower
in Python (benchmarks/README.md).

Exact disclosure is all this elimination prevents; GaussSuppression's interval protection
(``lpPackage`` with ``IntervalLimits``: ``rangePercent``/``rangeMin``, ``protectionPercent``) adds
suppressions afterwards until every primary's feasibility interval reaches its limits:
:func:`fix_risky_intervals` (R's ``FixRiskyIntervals``), driven by ``protect``'s audit rounds.

Singleton methods for frequency tables (SSBtools ``singletonMethod``): ``"anySum"`` (SSBtools'
default, and this function's), ``"subSum"``, ``"subSumAny"``, ``"subSpace"``, ``"subSumSpace"``
and ``"none"``; and sqlsdc's ``"anySumAudit"`` (``DEFAULT_SINGLETON``, the default of
``protect``, the policy and the jobs): ``anySum``, whose walk is redone until no singleton's
respondent computes a primary exactly (:mod:`sqlsdc.tabular.respondents`); on tables whose X
has 200,000 nonzeros or more, or whose audited rounds would pass
``respondents.WORK_LIMIT`` tests, ``subSpace`` instead (compiled; no respondent computes a
primary either, at more hidden cells). Not implemented:
``"anySumNOTprimary"`` (published singletons), ``"sub2Sum"`` and the ``NumSingleton`` methods for
magnitude tables, ``xExtraPrimary``, ``hidden`` cells and ``unsafeAsNegative`` (a primary that
forced cells disclose is an error here, not a warning).

References:
    Langsrud, Ø. (2024). Secondary Cell Suppression by Gaussian Elimination: An Algorithm
    Suitable for Handling Issues with Zeros and Singletons. PSD 2024, LNCS 14915, 83-91.
    SSBtools ``GaussSuppression`` and GaussSuppression ``CandidatesDefault``,
    ``interval_suppression``, ``FixRiskyIntervals``, ``SmartOrder`` and ``IntervalLimits``
    (Statistics Norway, MIT licence), read at statisticsnorway/ssb-ssbtools and
    ssb-gausssuppression.
"""

from __future__ import annotations

import time
from collections import defaultdict
from math import gcd

import numpy as np
from scipy import sparse

from sqlsdc.errors import InternalError, TabularError

__all__ = [
    "DEFAULT_SINGLETON",
    "SINGLETON_METHODS",
    "candidate_order",
    "check_singleton_method",
    "fix_risky_intervals",
    "gauss_suppress",
]

SINGLETON_METHODS = (
    "anySumAudit",
    "anySum",
    "subSum",
    "subSumAny",
    "subSpace",
    "subSumSpace",
    "none",
)
DEFAULT_SINGLETON = "anySumAudit"  # protect's, the policy's and the jobs' (red team s44o)
_LATER = ("anySumNOTprimary", "anySum0", "sub2Sum")
# X with fewer nonzeros takes the Python walk: it is done before numba is imported and the
# compiled walk loaded (0.7 s; the first compile of all takes 15 s, then it is cached)
_COMPILED_FROM_NNZ = 200_000
# anySumAudit's audit and rounds walk with Python integers (3.9 s against anySum's 0.3 s on a
# 2-D table of 9,000 cells); from here on it takes subSpace's compiled walk, respondent-safe too
_AUDITED_BELOW_NNZ = _COMPILED_FROM_NNZ


def candidate_order(X, cost, values=None) -> np.ndarray:
    """All cells in GaussSuppression's candidate order: the cells to publish first come first.

    GaussSuppression's ``CandidatesDefault`` sorts cells by decreasing ``key = |cost| + 0.99 *
    tie / max(tie)`` with ``tie = |X.T @ X @ cost|`` (ties go to cells computed from many inner
    cells) and, unless zeros may be secondary suppressed, moves cells whose value is 0 in front.
    ``CandidatesDefault`` uses ``cost = freq + 1``; pass that to reproduce its order. Ties keep the
    cell order (R's ``order`` is stable).

    Args:
        X: model matrix (I×C). cost: float[C]; non-finite costs count as 0.
        values: float[C] or None; when given, cells with value 0 come first.

    Returns:
        int64[C], a permutation of the cells.

    Example:
        >>> X = sparse.csc_matrix(np.array([[1, 1, 0], [1, 0, 1]]))
        >>> candidate_order(X, np.array([3.0, 2.0, 2.0]), values=np.array([3.0, 2.0, 0.0]))
        array([2, 0, 1])
    """
    w = np.abs(np.asarray(cost, dtype=np.float64))
    w[~np.isfinite(w)] = 0.0
    Xf = sparse.csc_matrix(X, dtype=np.float64)
    tie = np.abs(Xf.T @ (Xf @ w))
    key = w + 0.99 * tie / tie.max() if tie.size and tie.max() > 0 else w.copy()
    if values is not None:
        zero = np.asarray(values, dtype=np.float64) == 0
        key[zero] = 0.01 + key.max() + key[zero]
    return np.lexsort((np.arange(len(key)), -key)).astype(np.int64)


def gauss_suppress(
    X,
    primary,
    cost,
    *,
    forced=None,
    singleton=None,
    singleton_method: str = "anySum",
    values=None,
) -> np.ndarray:
    """Secondary suppression by Gaussian elimination (SSBtools ``GaussSuppression``).

    Forced cells are published first, then the candidates (every cell that is neither primary nor
    forced) in :func:`candidate_order`: the most costly to lose (largest ``cost``) first, so that
    secondary suppressions fall on cheap cells. Afterwards no primary cell's column of ``X`` lies
    in the span of the published columns: no primary cell is computable from the published cells.

    Args:
        X: model matrix (I×C, integer entries, usually 0/1); linked tables stack their cells as
            columns over the union of inner cells.
        primary: bool[C], primary suppressed cells.
        cost: float[C], finite and > 0 for every candidate; ``value``, ``n + 1`` or 1.
        forced: bool[C] or None, cells that must be published.
        singleton: bool[I] or None, inner cells (rows of ``X``) a respondent can subtract: for
            frequency tables the cells with count 1 (or count 0 when zeros are primary
            suppressed), as GaussSuppression's ``SingletonDefault``.
        singleton_method: one of ``SINGLETON_METHODS``; see the module docstring.
        values: float[C] or None; cells with value 0 are published first (GaussSuppression's
            default ``secondaryZeros = FALSE``).

    Returns:
        bool[C], all suppressed cells (primary and secondary).

    Raises:
        TabularError: shapes or types are wrong, a forced cell is primary, a candidate has no
            positive finite cost, a primary cell has no inner cells, a singleton inner cell is
            published as a non-primary cell, or forced cells make a primary cell computable.

    Example:
        A 2×2 table with margins; cells are (r1,c1), (r1,c2), (r2,c1), (r2,c2), r1, r2, c1, c2,
        total. Suppressing (r1,c1) forces a whole rectangle:

        >>> X = sparse.csc_matrix(np.array([
        ...     [1, 0, 0, 0, 1, 0, 1, 0, 1],
        ...     [0, 1, 0, 0, 1, 0, 0, 1, 1],
        ...     [0, 0, 1, 0, 0, 1, 1, 0, 1],
        ...     [0, 0, 0, 1, 0, 1, 0, 1, 1]]))
        >>> primary = np.array([1, 0, 0, 0, 0, 0, 0, 0, 0], dtype=bool)
        >>> cost = np.array([1, 5, 6, 7, 9, 9, 9, 9, 20], dtype=float)
        >>> np.flatnonzero(gauss_suppress(X, primary, cost)).tolist()
        [0, 1, 2, 3]
    """
    Xc, primary, cost, forced, single, method = _check(
        X, primary, cost, forced, singleton, singleton_method, values
    )
    audit = None
    if method == "anySumAudit":  # anySum, then each respondent's audit; subSpace on large X
        method = "anySum" if Xc.nnz < _AUDITED_BELOW_NNZ else "subSpace"
        audit = single if method == "anySum" else None
    n_cells = Xc.shape[1]
    suppressed = primary.copy()
    if not primary.any():
        return suppressed
    indptr, indices, data = Xc.indptr, Xc.indices, Xc.data

    def column(c):
        a, b = indptr[c], indptr[c + 1]
        return dict(zip(indices[a:b].tolist(), data[a:b].tolist(), strict=True))

    prim_cells = np.flatnonzero(primary).tolist()
    prim_vecs = [column(c) for c in prim_cells]
    if single is not None:
        prim_cells, prim_vecs, single, method = _prepare_singletons(
            Xc, column, primary, forced, single, method, prim_cells, prim_vecs
        )
    if single is None or method == "subSum":
        single = None  # subSum's singleton rule is all in its extra primaries
    walk = _Walk(Xc, prim_vecs, single, "Space" in method)
    cand = candidate_order(Xc, cost, values)
    cand = cand[~primary[cand] & ~forced[cand]]
    at_forced, in_order = np.flatnonzero(forced).tolist(), cand.tolist()
    result = None
    if Xc.nnz >= _COMPILED_FROM_NNZ:
        result = walk.compiled(np.flatnonzero(forced), cand)
    if result is None:  # a small table, or a number outgrew the kernel's int32 storage
        result = walk.exact(at_forced, in_order, column)
    secondary, lost = result
    if lost:
        lost = [prim_cells[i] for i in lost]
        raise TabularError(
            f"forced (never suppressed) cells make {len(lost)} primary cell(s) computable, "
            f"e.g. cell(s) {sorted(set(lost))[:10]} (a cell >= {n_cells} is a sum of "
            "singletons); no suppression pattern can protect them: publish fewer cells as "
            "forced or drop those primary flags"
        )
    if audit is not None and audit.any():
        from sqlsdc.tabular.respondents import walk_for_respondents

        secondary = walk_for_respondents(
            walk, Xc, primary, audit, at_forced, in_order, column, secondary
        )
        if secondary is None:  # too much work for the audited rounds: subSpace, audited once
            from sqlsdc.tabular.respondents import respondent_disclosures

            space = gauss_suppress(
                X, primary, cost, forced=forced, singleton=singleton,
                singleton_method="subSpace", values=values,
            )  # fmt: skip
            if respondent_disclosures(Xc, space, primary, audit, forced):
                raise InternalError("subSpace left a singleton's respondent a primary")
            return space
    suppressed[cand[secondary]] = True
    return suppressed


class _Walk:
    """GaussSuppression's walk over the forced cells, then the candidates, two ways.

    :meth:`compiled` runs the numba kernel of :mod:`sqlsdc.tabular._gauss_kernel` (the same
    steps on flat arrays, coefficients bounded by ``COEF_LIMIT``; 6 to 7 times faster on 10^6
    cells) and returns None when a number outgrows its bound; :meth:`exact` runs
    :class:`_Elimination` with Python integers, the reference. Both return ``(secondary,
    lost)``: bool[len(cand)], the candidates suppressed, and the indexes of the primaries the
    forced cells make computable (then the candidates are not walked).
    """

    def __init__(self, Xc, prim_vecs, single, space):
        self.Xc, self.single, self.n_rows = Xc, single, Xc.shape[0]
        self.space = space and single is not None
        if self.space:  # the Space methods compare the primaries without their singleton rows
            prim_vecs = [{r: x for r, x in v.items() if not single[r]} for v in prim_vecs]
        self.prim_vecs = prim_vecs

    def compiled(self, forced, cand):
        from sqlsdc.tabular import _gauss_kernel as kernel  # imports numba: only when used

        Xc, vecs = self.Xc, [sorted(v.items()) for v in self.prim_vecs]
        if self.n_rows + len(vecs) + 2 > np.iinfo(np.int32).max:
            return None  # the kernel numbers rows and vectors in int32
        ptr = np.zeros(len(vecs) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(v) for v in vecs])
        flat = [item for v in vecs for item in v]
        rows = np.array([r for r, _ in flat], dtype=np.int64)
        vals = np.array([x for _, x in flat], dtype=np.int64)
        single = np.zeros(self.n_rows, dtype=bool) if self.single is None else self.single
        status, secondary, lost = kernel.walk(
            Xc.indptr.astype(np.int64),
            Xc.indices.astype(np.int64),
            Xc.data.astype(np.int64),
            self.n_rows,
            ptr,
            rows,
            vals,
            single,
            self.single is not None,
            self.space,
            np.asarray(forced, dtype=np.int64),
            np.asarray(cand, dtype=np.int64),
            kernel.COEF_LIMIT,
            kernel.POOL_SIZES,
        )
        if status == kernel.OVERFLOW:
            return None
        return secondary, lost.tolist()

    def exact(self, forced, cand, column, respondents=None):
        """The walk with Python integers; ``respondents``: a
        :class:`~sqlsdc.tabular.respondents.RespondentSpans` whose test a candidate must pass
        too (``anySumAudit``), or None."""
        elim = _Elimination(self.n_rows, self.single, self.space)
        for vec in self.prim_vecs:
            elim.add_primary(dict(vec))  # a copy: the elimination changes it, a walk may rerun
        secondary = np.zeros(len(cand), dtype=bool)
        if forced:
            was_empty = [not v for v in elim.prim]
            for c in forced:
                vec = elim.reduce(column(c))
                if vec:
                    elim.publish(vec)
                if respondents is not None:
                    respondents.publish_forced(column(c))
            lost = [i for i, v in enumerate(elim.prim) if not v and not was_empty[i]]
            if lost:
                return secondary, lost
        for t, c in enumerate(cand):
            if len(elim.basis) == self.n_rows:
                break  # every inner cell is determined; R stops here too (ii > m)
            vec = elim.reduce(column(c))
            if not vec:
                continue  # in the published span, hence in every respondent's
            if respondents is not None and respondents.discloses(column(c)):
                secondary[t] = True
            elif elim.is_secondary(vec):
                secondary[t] = True
            else:
                elim.publish(vec)
                if respondents is not None:
                    respondents.publish()
        return secondary, []


def fix_risky_intervals(
    A,
    values,
    suppressed,
    risky,
    upl,
    lpl,
    order,
    *,
    lower,
    upper,
    forced=None,
    integer: bool = False,
    time_limit: float = 60.0,
) -> np.ndarray:
    """New suppressions that widen the intervals of risky primary cells (``FixRiskyIntervals``).

    GaussSuppression's interval protection (``interval_suppression`` and ``FixRiskyIntervals``
    in R/FixRiskyIntervals.R of ssb-gausssuppression, with the ``lomax``/``upmin`` limits of
    ``IntervalLimits``): after the exact-disclosure pass, the published cells are taken in
    candidate order (the cells to publish first come first) and the attacker is allowed to know
    only a prefix of them. Knowing more cells can only narrow an interval, so each risky primary
    has a first prefix length at which its interval misses ``[v - lpl, v + upl]``; the cell that
    ends that prefix is suppressed (R's "new primary") and the walk goes on without it. The
    prefixes are visited in R's ``SmartOrder`` (:func:`smart_order`): every position twice, once
    ahead of time in a bisection order and once in sequence; an interval found wide enough at a
    prefix is wide enough at every shorter one and after every later suppression, so most
    sequential checks are skipped. The caller then re-runs :func:`gauss_suppress` with all
    suppressed cells as primary, so that no new suppression can be computed exactly, as R does.

    The attacker is the one of :func:`~sqlsdc.tabular.attacker.audit_intervals` (``A``, the
    a-priori bounds, LP or integer). Forced cells (R refuses them here) are always known and
    never suppressed.

    Args:
        A: constraint matrix (R×C). values: float[C]. suppressed: bool[C], the pattern so far.
        risky: bool[C], suppressed primary cells whose interval is too narrow.
        upl, lpl: float[C], protection levels. order: int[C], :func:`candidate_order`.
        lower, upper: float[C], a-priori bounds. forced: bool[C] or None.
        integer: bound the cells over integer tables (count tables).
        time_limit: seconds for all the interval computations; when it runs out the
            suppressions found so far are returned (the caller's audit then fails closed).

    Returns:
        bool[C], the new suppressions.

    Raises:
        TabularError: a risky primary is too narrow even when only the forced cells are
            published (no suppression pattern can protect it).

    Example:
        A 2×2 table with margins, cells (r1,c1) (r1,c2) (r2,c1) (r2,c2) r1 r2 c1 c2 total, the
        inner cells suppressed. (r1,c1) = 5 needs its interval to reach 2 (``lpl = 3``). Once
        r1, r2 and c1 are known, (r2,c2) = (r1,c1) - 3 >= 0 pins it at 3 or more, so c1 is
        suppressed, and then c2, which gives c1 through the total:

        >>> rows = [[0, 1, 4], [2, 3, 5], [0, 2, 6], [1, 3, 7], [4, 5, 8], [6, 7, 8]]
        >>> A = np.zeros((6, 9))
        >>> for k, (a, b, t) in enumerate(rows):
        ...     A[k, [a, b, t]] = 1, 1, -1
        >>> v = np.array([5.0, 3, 4, 2, 8, 6, 9, 5, 14])
        >>> sup = np.arange(9) < 4
        >>> lpl = np.where(np.arange(9) == 0, 3.0, 0.0)
        >>> new = fix_risky_intervals(sparse.csr_matrix(A), v, sup, np.arange(9) == 0,
        ...     np.zeros(9), lpl, [8, 4, 5, 6, 7, 0, 1, 2, 3], lower=np.zeros(9),
        ...     upper=np.full(9, np.inf))
        >>> np.flatnonzero(new).tolist()
        [6, 7]
    """
    from sqlsdc.tabular.attacker import ProtectionCheck

    values = np.asarray(values, dtype=np.float64)
    n_cells = len(values)
    suppressed = _mask(suppressed, n_cells, "suppressed")
    risky = _mask(risky, n_cells, "risky") & suppressed
    forced = np.zeros(n_cells, dtype=bool) if forced is None else _mask(forced, n_cells, "forced")
    extra = np.zeros(n_cells, dtype=bool)
    targets = np.flatnonzero(risky)
    if targets.size == 0:
        return extra
    order = np.asarray(order, dtype=np.int64)
    pub = order[~suppressed[order] & ~forced[order]]
    rank = np.full(n_cells, len(pub))
    rank[pub] = np.arange(len(pub))
    rank[forced] = -1
    deadline = time.monotonic() + max(float(time_limit), 0.0)
    check = ProtectionCheck(A, values, upl, lpl, lower=lower, upper=upper, integer=integer)

    def ok_at(i: int, which: np.ndarray, stop_early: bool = False) -> np.ndarray:
        """Which of the primaries ``which`` keep their protection when prefix 1..i is known."""
        unknown = suppressed | extra | (rank >= i)
        left = deadline - time.monotonic()
        return check.met(unknown, which, time_limit=left, stop_early=stop_early)

    hopeless = ~ok_at(0, targets)
    if hopeless.any() and check.timed_out:
        return extra  # out of time before anything was decided
    if hopeless.any():
        cells = targets[hopeless][:10].tolist()
        raise TabularError(
            f"{int(hopeless.sum())} primary cell(s) cannot reach their protection levels even "
            f"with every cell suppressed except the forced ones, e.g. cell(s) {cells}: the "
            "forced cells and the a-priori bounds pin them; publish fewer cells as forced, "
            "widen the a-priori bounds or lower the protection levels"
        )
    best_ok = np.zeros(len(targets), dtype=np.int64)  # longest prefix proven safe, per target
    version, seen = 0, np.full(len(pub) + 1, -1)  # extra-set version at each look-ahead check
    last = 0  # the target found risky last is tried first in the sequential visits
    for step in [*smart_order(len(pub)), len(pub)]:
        i, final = abs(step), step < 0
        todo = best_ok < i
        if todo.any() and (not final or seen[i] != version):
            if time.monotonic() >= deadline:
                break
            which = np.flatnonzero(todo)
            if final:  # only "is any target risky?" decides here: stop at the first one
                which = np.concatenate([which[which == last], which[which != last]])
            good = ok_at(i, targets[which], stop_early=final)
            best_ok[which[good]] = i
            if not good.all():
                last = int(which[np.argmin(good)])
        if final and best_ok.min() < i:
            extra[pub[i - 1]] = True
            version += 1
        if not final:
            seen[i] = version
    return extra


def smart_order(n: int) -> list[int]:
    """R's ``SmartOrder``: positions 1..n, each twice; the second visits are negative, in order.

    The first visits follow ``SmartOrder0`` (the middle, the left half recursively, the end,
    the right half recursively); a position's second visit comes as soon as it and all earlier
    positions have had their first.

    Example:
        >>> smart_order(5)
        [2, 1, -1, -2, 5, 3, -3, 4, -4, -5]
    """
    ahead: list[int] = []
    stack = [(0, n)]  # SmartOrder0(m) shifted by `offset`, without recursion
    while stack:
        offset, m = stack.pop()
        if m <= 2:
            ahead.extend(offset + k for k in range(1, m + 1))
            continue
        half = m // 2
        ahead.append(offset + half)
        # pushed in reverse: the left half, then the end, then the right half
        stack.append((offset + half, m - half - 1))
        stack.append((offset + m - 1, 1))
        stack.append((offset, half - 1))
    out, visited, k = [], np.zeros(n + 2, dtype=bool), 1
    for a in ahead:
        out.append(a)
        visited[a] = True
        while k <= n and visited[k]:
            out.append(-k)
            k += 1
    return out


class _Elimination:
    """The published span in reduced row-echelon form and the primary columns reduced against it.

    ``basis[p]`` is the basis vector with pivot row ``p``; it is zero on every other pivot row, so a
    vector is reduced in one pass over its pivot rows. ``inv[r]`` / ``pinv[r]`` index the basis
    vectors / primaries that have row ``r``, so publishing touches only the vectors it changes.
    """

    def __init__(self, n_rows: int, single: np.ndarray | None, space: bool):
        self.n_rows = n_rows
        self.basis: dict[int, dict[int, int]] = {}
        self.inv: defaultdict[int, set[int]] = defaultdict(set)
        self.prim: list[dict[int, int]] = []
        self.pinv: defaultdict[int, set[int]] = defaultdict(set)
        self.single = None if single is None else single.tolist()
        self.space = space and single is not None
        self.sub_used: set[int] = set()

    def add_primary(self, vec: dict[int, int]) -> None:
        """Add a primary column (in the Space methods without its singleton rows)."""
        i = len(self.prim)
        self.prim.append(vec)
        for r in vec:
            self.pinv[r].add(i)

    def reduce(self, vec: dict[int, int]) -> dict[int, int]:
        """Reduce ``vec`` (modified in place) against the basis: zero on every pivot row."""
        basis = self.basis
        for p in [r for r in vec if r in basis]:
            b = basis[p]
            f, bp = vec[p], b[p]
            if f % bp:
                m = bp // gcd(f, bp)
                for r in vec:
                    vec[r] *= m
                f *= m
            q = f // bp
            get = vec.get
            for r, x in b.items():
                nv = get(r, 0) - q * x
                if nv:
                    vec[r] = nv
                else:
                    del vec[r]
        return vec

    def is_secondary(self, vec: dict[int, int]) -> bool:
        """GaussSuppression1's test for a reduced, non-empty candidate column."""
        single = self.single
        if single is None:
            return self._any_proportional(vec)
        if all(single[r] for r in vec):  # only a combination of singletons ("subSubSec")
            if self.space:
                return True
            if len(set(vec.values())) > 1 and not self.sub_used.intersection(vec):
                # not a plain sum of singletons, and no overlap with an earlier such exception
                self.sub_used.update(vec)
                return self._any_proportional(vec)
            return True
        if self.space:
            return self._any_proportional({r: x for r, x in vec.items() if not single[r]})
        return self._any_proportional(vec)

    def _any_proportional(self, vec: dict[int, int]) -> bool:
        """Would publishing ``vec`` eliminate a primary, i.e. is a reduced primary ∝ ``vec``?"""
        pinv = self.pinv
        best = None
        for r in vec:
            s = pinv.get(r)
            if not s:
                return False
            if best is None or len(s) < len(best):
                best = s
        n = len(vec)
        r0, v0 = next(iter(vec.items()))
        for i in best:
            b = self.prim[i]
            if len(b) != n:
                continue
            b0 = b.get(r0)
            if b0 is not None and all(b.get(r, 0) * v0 == x * b0 for r, x in vec.items()):
                return True
        return False

    def publish(self, vec: dict[int, int]) -> None:
        """Add a reduced, non-empty column to the span and eliminate its pivot everywhere."""
        g = gcd(*vec.values())
        if g > 1:
            for r in vec:
                vec[r] //= g
        q = self._pivot(vec)
        nq = vec[q]
        for p in list(self.inv.get(q, ())):
            _eliminate(self.basis[p], vec, q, nq, p, self.inv)
        self.basis[q] = vec
        for r in vec:
            self.inv[r].add(q)
        owners = self.pinv.get(q)
        if owners:
            part = vec
            if self.space:
                part = {r: x for r, x in vec.items() if not self.single[r]}
            for i in list(owners):
                _eliminate(self.prim[i], part, q, nq, i, self.pinv)

    def _pivot(self, vec: dict[int, int]) -> int:
        """A ±1 entry in the row held by the fewest stored vectors (least work, least fill-in).

        Any pivot gives the same decisions; only with singletons must R's order be kept:
        non-singleton rows first, and among singleton rows the first one.
        """
        single = self.single
        rows = list(vec) if single is None else [r for r in vec if not single[r]]
        if not rows:
            return min(vec)
        unit = [r for r in rows if vec[r] in (1, -1)] or rows
        gi, gp, n, empty = self.inv.get, self.pinv.get, self.n_rows, ()
        return min(unit, key=lambda r: (len(gi(r, empty)) + len(gp(r, empty))) * n + r)


def _eliminate(u: dict, vec: dict, q: int, nq: int, owner: int, inv) -> None:
    """``u -= (u[q] / vec[q]) * vec`` in exact integers (scaling ``u`` when needed)."""
    uq = u[q]
    if uq % nq:
        m = nq // gcd(uq, nq)
        for r in u:
            u[r] *= m
        uq *= m
    f = uq // nq
    get = u.get
    for r, x in vec.items():
        old = get(r)
        if old is None:
            u[r] = -f * x
            inv[r].add(owner)
        else:
            nv = old - f * x
            if nv:
                u[r] = nv
            else:
                del u[r]
                inv[r].discard(owner)
    if q in u:
        raise InternalError(f"pivot row {q} survived elimination")


def _prepare_singletons(Xc, column, primary, forced, single, method, prim_cells, prim_vecs):
    """Singleton preparation of GaussSuppression (before its main loop), as in SSBtools."""
    single = single.copy()
    colsum = np.asarray(Xc.sum(axis=0)).ravel()
    one = colsum == 1
    # a forced cell that is a single inner cell cannot be a singleton (R ignores the marking)
    forced_one = np.flatnonzero(forced & one)
    if forced_one.size:
        single[Xc[:, forced_one].indices] = False
    if not single.any() or method == "none":
        return prim_cells, prim_vecs, None, method
    s_count = np.asarray(Xc[single].sum(axis=0)).ravel()
    published_single = one & (s_count == 1) & ~primary
    if published_single.any():
        raise TabularError(
            f"{int(published_single.sum())} cell(s) consisting of one singleton inner cell are "
            f"not primary suppressed (e.g. cell {int(np.flatnonzero(published_single)[0])}); "
            "GaussSuppression's singleton methods assume published singletons are primary: "
            "mark them primary, or pass singleton=None; the method for published singletons "
            "(anySumNOTprimary) is not implemented"
        )
    n_forced = int(forced.sum())
    if method == "anySum" and n_forced:
        method = "subSumAny"  # R does this too, so that unsafe primaries are detected
    if "subSum" in method:
        seen = {tuple(sorted(v.items())) for v in prim_vecs}
        n_cells = Xc.shape[1]
        for c in np.flatnonzero(s_count > 1).tolist():
            extra = {r: x for r, x in column(c).items() if single[r]}
            key = tuple(sorted(extra.items()))
            if key not in seen:
                seen.add(key)
                prim_cells.append(n_cells + len(prim_cells))
                prim_vecs.append(extra)
        if method == "subSum":
            return prim_cells, prim_vecs, single, method
    elif not n_forced:
        # primaries made of singletons only are protected by the singleton rule itself
        keep = [i for i, v in enumerate(prim_vecs) if any(not single[r] for r in v)]
        prim_cells = [prim_cells[i] for i in keep]
        prim_vecs = [prim_vecs[i] for i in keep]
    return prim_cells, prim_vecs, single, method


def _check(X, primary, cost, forced, singleton, method, values):
    if not sparse.issparse(X):
        raise TabularError(f"X must be a scipy.sparse matrix (I inner × C cells), got {type(X)}")
    Xc = sparse.csc_matrix(X)
    n_rows, n_cells = Xc.shape
    data = Xc.data
    if data.size and not np.all(np.isfinite(data) & (data == np.round(data))):
        raise TabularError("X must have integer entries (0/1 for tables built by sqlsdc)")
    Xc = sparse.csc_matrix((data.astype(np.int64), Xc.indices, Xc.indptr), shape=Xc.shape)
    Xc.eliminate_zeros()
    Xc.sort_indices()
    primary = _mask(primary, n_cells, "primary")
    forced = np.zeros(n_cells, dtype=bool) if forced is None else _mask(forced, n_cells, "forced")
    cost = np.asarray(cost, dtype=np.float64)
    if cost.shape != (n_cells,):
        raise TabularError(f"cost must have one entry per cell ({n_cells}), got {cost.shape}")
    if values is not None and np.shape(values) != (n_cells,):
        raise TabularError(f"values must have one entry per cell ({n_cells})")
    both = np.flatnonzero(primary & forced)
    if both.size:
        raise TabularError(
            f"{both.size} cell(s) are both primary and forced, e.g. cell {int(both[0])}: a forced "
            "cell is never suppressed; drop the forced flag or the primary flag"
        )
    cand = ~primary & ~forced
    bad = np.flatnonzero(cand & ~(np.isfinite(cost) & (cost > 0)))
    if bad.size:
        raise TabularError(
            f"{bad.size} candidate cell(s) have no positive finite cost, e.g. cell {int(bad[0])} "
            f"with cost {float(cost[bad[0]])!r}; give every cell that may be suppressed a cost > 0 "
            "(value, frequency + 1 or 1)"
        )
    empty = np.flatnonzero(primary & (np.diff(Xc.indptr) == 0))
    if empty.size:
        raise TabularError(
            f"{empty.size} primary cell(s) have no inner cell (empty column of X), e.g. cell "
            f"{int(empty[0])}: their value is 0 in every table, so suppression cannot protect "
            "them; build X with the inner cells below them or drop their primary flag"
        )
    check_singleton_method(method)
    single = None
    if singleton is not None:
        single = _mask(singleton, n_rows, "singleton (one entry per inner cell, row of X)")
    return Xc, primary, cost, forced, single, method


def check_singleton_method(method) -> None:
    """Refuse a singleton method this module does not implement, naming the ones it does."""
    if method in _LATER:
        raise TabularError(
            f"singleton_method {method!r} is not implemented; use one of {SINGLETON_METHODS}"
        )
    if method not in SINGLETON_METHODS:
        raise TabularError(f"unknown singleton_method {method!r}; use one of {SINGLETON_METHODS}")


def _mask(a, n: int, what: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.shape != (n,) or arr.dtype != bool:
        raise TabularError(f"{what} must be a bool array of length {n}, got {arr.dtype}{arr.shape}")
    return arr.copy()
