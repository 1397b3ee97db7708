"""Tests of sqlsdc.tabular.gauss: GaussSuppression's secondary suppression."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
from scipy import sparse

from sqlsdc.errors import TabularError
from sqlsdc.tabular import _gauss_kernel as kernel
from sqlsdc.tabular import gauss
from sqlsdc.tabular.gauss import SINGLETON_METHODS, candidate_order, gauss_suppress

# --- a tiny table builder (cells = all code combinations, Kronecker order) ---------------------


def _dim(spec):
    """(codes, leaves-by-codes ancestor matrix, parent-children constraint rows) of a dimension.

    ``spec`` is an int n (flat: Total + n codes) or ``{code: parent or None}`` with parents listed
    before their children.
    """
    parents = {f"c{i}": None for i in range(spec)} if isinstance(spec, int) else dict(spec)
    codes = ["Total", *parents]
    par = {c: ("Total" if p is None else p) for c, p in parents.items()}
    children = {c: [k for k, p in par.items() if p == c] for c in codes}
    leaves = [c for c in codes if not children[c]]
    D = np.zeros((len(leaves), len(codes)), dtype=np.int8)
    for i, leaf in enumerate(leaves):
        c = leaf
        while c is not None:
            D[i, codes.index(c)] = 1
            c = par.get(c)
    H = [
        [1 if c == p else (-1 if c in children[p] else 0) for c in codes]
        for p in codes
        if children[p]
    ]
    return codes, leaves, D, np.array(H, dtype=float)


def make_table(*dims, inner):
    """X, A, cell values and cell labels of a table with all margins of ``dims``."""
    parts = [_dim(d) for d in dims]
    X = sparse.csc_matrix(np.ones((1, 1), dtype=np.int8))
    for _, _, D, _ in parts:
        X = sparse.kron(X, sparse.csc_matrix(D), format="csc")
    X = X.astype(np.int8)
    sizes = [len(codes) for codes, *_ in parts]
    rows = []
    for d, (_, _, _, H) in enumerate(parts):
        before = int(np.prod(sizes[:d]))
        after = int(np.prod(sizes[d + 1 :]))
        rows.append(sparse.kron(sparse.kron(sparse.eye(before), H), sparse.eye(after)))
    A = sparse.vstack(rows).tocsr()
    z = np.asarray(inner, dtype=float).ravel()
    labels = list(itertools.product(*[codes for codes, *_ in parts]))
    return X, A, X.T @ z, labels


def cells_of(labels, mask):
    return {labels[c] for c in np.flatnonzero(mask)}


def determined(X, published, cells) -> bool | list[bool]:
    """Exact test: is each column in ``cells`` in the span of the published columns of X?

    The published columns are brought to echelon form once (rational arithmetic); a column is
    in their span when the echelon vectors reduce it to zero."""
    basis: list[tuple[int, list[Fraction]]] = []  # (pivot, vector): zero at earlier pivots
    for c in np.flatnonzero(published):
        vector = _reduced(X[:, c].toarray().ravel(), basis)
        pivot = next((i for i, v in enumerate(vector) if v), None)
        if pivot is not None:
            basis.append((pivot, vector))
    out = [not any(_reduced(X[:, c].toarray().ravel(), basis)) for c in np.atleast_1d(cells)]
    return out if np.ndim(cells) else out[0]


def _reduced(column, basis) -> list[Fraction]:
    """``column`` minus its components along the echelon vectors, in their order."""
    vector = [Fraction(int(v)) for v in column]
    for pivot, b in basis:
        if vector[pivot]:
            f = vector[pivot] / b[pivot]
            vector = [v - f * w if w else v for v, w in zip(vector, b, strict=True)]
    return vector


# --- a literal transcription of SSBtools GaussSuppression1 (dense, Fractions, slow) -----------


def reference_gauss(X, primary, cost, *, forced=None, singleton=None, method="anySum", values=None):
    """GaussSuppression1 as written in R: eager elimination, pivot = first row (singletons last).

    Covers the methods "none" and "anySum" without forced cells, enough to check that the fast
    implementation takes the same decisions.
    """
    X = X.toarray().astype(int)
    n_rows, n_cells = X.shape
    forced = np.zeros(n_cells, bool) if forced is None else forced
    single = np.zeros(n_rows, bool) if singleton is None or method == "none" else singleton
    row_order = sorted(range(n_rows), key=lambda r: (single[r], r))  # order(singleton), stable
    pos = {r: i for i, r in enumerate(row_order)}
    n_nonsingle = int((~single).sum())

    def vec(c):
        return {pos[r]: Fraction(int(X[r, c])) for r in range(n_rows) if X[r, c]}

    order = [c for c in candidate_order(sparse.csc_matrix(X), cost, values) if not primary[c]]
    cand = [c for c in np.flatnonzero(forced)] + [c for c in order if not forced[c]]
    A = [vec(c) for c in cand]
    prim = [c for c in np.flatnonzero(primary)]
    if single.any():  # primaries of singletons only are handled by anySum
        prim = [c for c in prim if any(not single[r] for r in range(n_rows) if X[r, c])]
    B = [vec(c) for c in prim]
    secondary, sub_used = [], set()

    def proportional(a, b):
        if not b or set(a) != set(b):
            return False
        r0 = next(iter(a))
        return all(a[r] * b[r0] == b[r] * a[r0] for r in a)

    for j, a in enumerate(A):
        if not a:
            continue
        rows = sorted(a)
        if j >= int(forced.sum()):
            sub_sec = single.any() and rows[0] >= n_nonsingle
            if sub_sec and len(set(a.values())) > 1 and not sub_used.intersection(rows):
                sub_sec = False
                sub_used.update(rows)
            if sub_sec or any(proportional(a, b) for b in B):
                secondary.append(cand[j])
                continue
        ind = rows[0]
        for other in A[j + 1 :] + B:
            if ind in other:
                f = other[ind] / a[ind]
                for r, x in a.items():
                    other[r] = other.get(r, 0) - f * x
                    if other[r] == 0:
                        del other[r]
    out = primary.copy()
    out[secondary] = True
    return out


# --- hand-solvable tables ----------------------------------------------------------------------


def test_rectangle_in_3x3_table():
    inner = [[1, 5, 9], [6, 7, 8], [10, 11, 12]]
    X, A, values, labels = make_table(3, 3, inner=inner)
    primary = np.array([lab == ("c0", "c0") for lab in labels])
    s = gauss_suppress(X, primary, values, values=values)
    # margins and the large cells go first; publishing (1,1), (1,0) or (0,1) after (0,2), (1,2),
    # (2,*) would pin (0,0), so exactly the rectangle rows {0,1} x cols {0,1} is suppressed
    assert cells_of(labels, s) == {("c0", "c0"), ("c0", "c1"), ("c1", "c0"), ("c1", "c1")}
    assert not determined(X, ~s, labels.index(("c0", "c0")))


def test_docstring_2x2_and_no_primary():
    X, _, values, labels = make_table(2, 2, inner=[[1, 5], [6, 7]])
    primary = np.zeros(len(labels), bool)
    assert not gauss_suppress(X, primary, values).any()
    primary[labels.index(("c0", "c0"))] = True
    s = gauss_suppress(X, primary, values)
    assert cells_of(labels, s) == {("c0", "c0"), ("c0", "c1"), ("c1", "c0"), ("c1", "c1")}


def test_one_dimension_cheapest_partner():
    X, _, values, labels = make_table(4, inner=[2, 9, 4, 30])
    primary = np.array([lab == ("c0",) for lab in labels])
    s = gauss_suppress(X, primary, values)
    assert cells_of(labels, s) == {("c0",), ("c2",)}  # 4 is the cheapest other cell


def test_published_example_small_counts_vignette():
    """GaussSuppression vignette "Small count frequency table suppression", Table 1.

    SSBtoolsData("example1"), year 2014, SuppressSmallCounts(dimVar = c("age", "geo"),
    maxN = 1): primary young/Portugal (0); suppressed: old/Iceland, old/Portugal,
    young/Iceland, young/Portugal. smallCountSpec: protectZeros = TRUE, zeros are the singletons,
    candidates = CandidatesDefault (cost freq + 1, zeros first).
    """
    geo = ["Iceland", "Portugal", "Spain"]
    inner = [[3, 4, 6], [2, 0, 5]]  # old, young
    X, _, freq, labels = make_table(
        {"old": None, "young": None}, {g: None for g in geo}, inner=inner
    )
    primary = freq <= 1
    single = np.asarray(inner).ravel() == 0
    s = gauss_suppress(X, primary, freq + 1, singleton=single, values=freq)
    assert cells_of(labels, s) == {
        ("old", "Iceland"),
        ("old", "Portugal"),
        ("young", "Iceland"),
        ("young", "Portugal"),
    }
    assert cells_of(labels, primary) == {("young", "Portugal")}


# --- singletons, forced, linked ---------------------------------------------------------------


def test_two_singletons_in_a_row_need_a_third_cell():
    # Total = a + b + c + d with a = b = 1 primary; a's respondent knows a and would get b from
    # a + b = Total - c - d. anySum suppresses c, the cheaper non-singleton cell.
    X, _, freq, labels = make_table(4, inner=[1, 1, 5, 7])
    primary = (freq >= 1) & (freq <= 2)
    single = np.array([True, True, False, False])
    none = gauss_suppress(X, primary, freq + 1, singleton=single, singleton_method="none")
    assert cells_of(labels, none) == {("c0",), ("c1",)}
    for method in ("anySum", "subSum", "subSumAny", "subSpace", "subSumSpace"):
        s = gauss_suppress(X, primary, freq + 1, singleton=single, singleton_method=method)
        assert cells_of(labels, s) == {("c0",), ("c1",), ("c2",)}, method


def test_singleton_published_as_non_primary_is_refused():
    X, _, freq, _ = make_table(3, inner=[1, 4, 7])
    primary = np.zeros(len(freq), bool)
    primary[2] = True  # c1 = 4, while c0 = 1 (a singleton) stays publishable
    with pytest.raises(TabularError, match="anySumNOTprimary"):
        gauss_suppress(X, primary, freq + 1, singleton=np.array([True, False, False]))


def test_forced_cells_are_published_and_protection_moves_elsewhere():
    inner = [[1, 5, 9], [6, 7, 8], [10, 11, 12]]
    X, _, values, labels = make_table(3, 3, inner=inner)
    primary = np.array([lab == ("c0", "c0") for lab in labels])
    forced = np.array([lab in {("c0", "c1"), ("c1", "c1")} for lab in labels])
    s = gauss_suppress(X, primary, values, forced=forced)
    assert not (s & forced).any()
    assert cells_of(labels, s) == {("c0", "c0"), ("c0", "c2"), ("c1", "c0"), ("c1", "c2")}
    assert not determined(X, ~s, labels.index(("c0", "c0")))


def test_forced_primary_and_disclosing_forced_are_errors():
    X, _, values, labels = make_table(3, inner=[1, 5, 9])
    primary = np.array([lab == ("c0",) for lab in labels])
    with pytest.raises(TabularError, match="both primary and forced"):
        gauss_suppress(X, primary, values, forced=primary.copy())
    forced = np.array([lab in {("Total",), ("c1",), ("c2",)} for lab in labels])
    with pytest.raises(TabularError, match=r"make 1 primary cell\(s\) computable"):
        gauss_suppress(X, primary, values, forced=forced)


def test_linked_tables_share_inner_cells():
    """region×sex and region×age published together: columns over region×sex×age inner cells."""
    inner = np.array([[[3, 1], [4, 6]], [[2, 8], [5, 9]]])  # region × sex × age
    X3, _, _, lab3 = make_table(2, 2, 2, inner=inner)
    keep = [i for i, (_, s, a) in enumerate(lab3) if s == "Total" or a == "Total"]
    X = X3[:, keep]  # table 1: age = Total; table 2: sex = Total (the shared margins once)
    labels = [lab3[i] for i in keep]
    values = X.T @ inner.ravel().astype(float)
    primary = np.array([lab == ("c0", "c0", "Total") for lab in labels])  # region0, sex0: 4
    s = gauss_suppress(X, primary, values)
    assert not determined(X, ~s, labels.index(("c0", "c0", "Total")))
    assert cells_of(labels, s) == {
        ("c0", "c0", "Total"),
        ("c0", "c1", "Total"),
        ("c1", "c0", "Total"),
        ("c1", "c1", "Total"),
    }


def test_input_errors():
    X, _, values, _ = make_table(3, inner=[1, 5, 9])
    primary = np.zeros(4, bool)
    primary[1] = True
    with pytest.raises(TabularError, match="scipy.sparse"):
        gauss_suppress(X.toarray(), primary, values)
    with pytest.raises(TabularError, match="bool array of length 4"):
        gauss_suppress(X, primary.astype(int), values)
    bad = values.copy()
    bad[2] = 0.0
    with pytest.raises(TabularError, match=r"no positive finite cost, e.g. cell 2 with cost 0.0"):
        gauss_suppress(X, primary, bad)
    with pytest.raises(TabularError, match="not implemented"):
        gauss_suppress(X, primary, values, singleton_method="sub2Sum")
    with pytest.raises(TabularError, match="unknown singleton_method"):
        gauss_suppress(X, primary, values, singleton_method="any")
    Xe = sparse.hstack([X, sparse.csc_matrix((3, 1), dtype=np.int8)]).tocsc()
    with pytest.raises(TabularError, match="no inner cell"):
        gauss_suppress(Xe, np.append(primary, True), np.append(values, 1.0))


def test_candidate_order_matches_candidates_default():
    X, _, freq, labels = make_table(2, 2, inner=[[3, 0], [5, 2]])
    order = candidate_order(X, freq + 1, values=freq)
    # the zero first, then decreasing freq + 1; ties (3 and 2) go to the margin, which covers
    # more inner cells
    assert [labels[c] for c in order] == [
        ("c0", "c1"),
        ("Total", "Total"),
        ("Total", "c0"),
        ("c1", "Total"),
        ("c1", "c0"),
        ("c0", "Total"),
        ("c0", "c0"),
        ("Total", "c1"),
        ("c1", "c1"),
    ]


# --- the algorithm against the literal transcription, and the guarantee -----------------------


def _random_table(rng):
    g1, g2 = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    d1 = {f"a{g}": None for g in range(g1)} | {
        f"a{g}x{i}": f"a{g}" for g in range(g1) for i in range(int(rng.integers(1, 4)))
    }
    d2 = {f"b{g}": None for g in range(g2)} | {
        f"b{g}x{i}": f"b{g}" for g in range(g2) for i in range(int(rng.integers(1, 4)))
    }
    dims = [d1, d2] if rng.random() < 0.6 else [d1, d2, int(rng.integers(2, 4))]
    shape = [len(_dim(d)[1]) for d in dims]
    inner = rng.poisson(2.0, size=shape) * (rng.random(shape) < 0.8)
    return make_table(*dims, inner=inner), inner.ravel()


@pytest.mark.parametrize("seed", range(40))
def test_same_decisions_as_reference_and_no_primary_determined(seed):
    rng = np.random.default_rng(seed)
    (X, _, freq, _), inner = _random_table(rng)
    primary = (freq >= 1) & (freq <= 2)
    if not primary.any():
        primary[int(rng.integers(len(freq)))] = True
    nonempty = np.diff(X.indptr) > 0
    primary &= nonempty
    if not primary.any():
        return
    single = inner == 1
    for kwargs in ({}, {"singleton": single}):
        try:
            got = gauss_suppress(X, primary, freq + 1, values=freq, **kwargs)
        except TabularError as e:  # only the documented refusal for published singletons
            assert "anySumNOTprimary" in str(e)
            continue
        want = reference_gauss(X, primary, freq + 1, values=freq, **kwargs)
        assert np.array_equal(got, want)
        assert primary[got].sum() == primary.sum()
        check = [
            c
            for c in np.flatnonzero(primary)
            # a primary made of singletons only is covered by the singleton rule instead
            if "singleton" not in kwargs or X[:, c].toarray().ravel()[~single].any()
        ]
        assert not any(determined(X, ~got, check))


# --- the compiled walk against the Python-integer walk -----------------------------------------


def _hierarchy(rng, name, groups, codes):
    """{code: parent}: Total -> ``groups`` groups -> 1..codes codes each."""
    spec = {f"{name}{g}": None for g in range(groups)}
    for g in range(groups):
        spec |= {f"{name}{g}x{i}": f"{name}{g}" for i in range(int(rng.integers(1, codes + 1)))}
    return spec


def _both_walks(monkeypatch, X, primary, cost, **kwargs):
    """gauss_suppress with the compiled walk, then with the exact one: result or error message.

    The compiled walk also runs with pools that start at one entry and one chunk, so that every
    table makes it collect garbage and grow; it must give the same answer.
    """

    def run():
        try:
            return gauss_suppress(X, primary, cost, **kwargs)
        except TabularError as e:
            return str(e)

    with monkeypatch.context() as m:
        m.setattr(gauss, "_COMPILED_FROM_NNZ", 0)
        fast = run()
        m.setattr(kernel, "POOL_SIZES", (1, 1))
        tiny = run()
    assert type(tiny) is type(fast)
    assert tiny == fast if isinstance(fast, str) else np.array_equal(tiny, fast)
    with monkeypatch.context() as m:
        m.setattr(gauss._Walk, "compiled", lambda self, forced, cand: None)
        exact = run()
    return fast, exact


@pytest.mark.parametrize("seed", range(12))
def test_compiled_walk_takes_the_python_walks_decisions(monkeypatch, seed):
    """Random 2-D (even seeds) and 3-D hierarchical tables, every singleton method, with and
    without forced cells (some of which disclose a primary: the same error)."""
    rng = np.random.default_rng(1000 + seed)
    if seed % 2:
        dims = [_hierarchy(rng, d, 2, 3) for d in "abc"]
    else:
        dims = [_hierarchy(rng, d, 3, 4) for d in "ab"]
    shape = [len(_dim(d)[1]) for d in dims]
    inner = rng.poisson(1.5, size=shape) * (rng.random(shape) < 0.85)
    X, _, freq, _ = make_table(*dims, inner=inner)
    primary = (freq >= 1) & (freq <= 2)
    single = inner.ravel() == 1
    forced = np.zeros(len(freq), dtype=bool)
    forced[rng.choice(np.flatnonzero(~primary), size=3, replace=False)] = True
    decided = 0
    for method in SINGLETON_METHODS:
        for kwargs in ({}, {"forced": forced}):
            fast, exact = _both_walks(
                monkeypatch,
                X,
                primary,
                freq + 1,
                singleton=single,
                singleton_method=method,
                values=freq,
                **kwargs,
            )
            assert type(fast) is type(exact)
            if isinstance(fast, str):
                assert fast == exact
            else:
                assert np.array_equal(fast, exact), (method, kwargs)
                decided += int((fast & ~primary).sum())
    fast, exact = _both_walks(monkeypatch, X, primary, freq + 1, values=freq)
    assert np.array_equal(fast, exact)
    assert decided > 0  # the tables need secondary suppressions


def _integer_matrix(rng, n_rows=24, n_cells=60):
    """A random sparse model matrix with entries in ±{1, 2, 3}: pivots that need scaling."""
    entries = rng.choice([-3, -2, -1, 1, 2, 3], size=(n_rows, n_cells))
    return sparse.csc_matrix(entries * (rng.random((n_rows, n_cells)) < 0.12))


@pytest.mark.parametrize("seed", range(6))
def test_compiled_walk_matches_on_integer_matrices(monkeypatch, seed):
    rng = np.random.default_rng(2000 + seed)
    X = _integer_matrix(rng)
    primary = (rng.random(X.shape[1]) < 0.2) & (np.diff(X.indptr) > 0)
    cost = rng.integers(1, 50, X.shape[1]).astype(float)
    single = rng.random(X.shape[0]) < 0.2
    for kwargs in (
        {},
        {"singleton": single},
        {"singleton": single, "singleton_method": "subSpace"},
    ):
        fast, exact = _both_walks(monkeypatch, X, primary, cost, **kwargs)
        assert type(fast) is type(exact)
        assert fast == exact if isinstance(fast, str) else np.array_equal(fast, exact)


@pytest.mark.parametrize("table", ["hierarchical", "integer"])
def test_compiled_walk_falls_back_when_coefficients_outgrow_its_bound(monkeypatch, table):
    """A coefficient beyond COEF_LIMIT stops the kernel; the Python-integer walk redoes it."""
    rng = np.random.default_rng(8)
    if table == "integer":
        X = _integer_matrix(rng)
        primary = (rng.random(X.shape[1]) < 0.2) & (np.diff(X.indptr) > 0)
        cost = rng.integers(1, 50, X.shape[1]).astype(float)
    else:
        dims = [_hierarchy(rng, d, 2, 3) for d in "abc"]
        shape = [len(_dim(d)[1]) for d in dims]
        X, _, freq, _ = make_table(*dims, inner=rng.poisson(1.5, size=shape))
        primary, cost = (freq >= 1) & (freq <= 2), freq + 1
    want = gauss_suppress(X, primary, cost)
    assert kernel.walk(*_kernel_args(X, primary, cost, limit=1))[0] == kernel.OVERFLOW
    assert kernel.walk(*_kernel_args(X, primary, cost, limit=kernel.COEF_LIMIT))[0] == kernel.OK
    calls = []
    exact = gauss._Walk.exact

    def spy(self, *args):
        calls.append(1)
        return exact(self, *args)

    monkeypatch.setattr(gauss._Walk, "exact", spy)
    monkeypatch.setattr(gauss, "_COMPILED_FROM_NNZ", 0)
    for limit in (1, 2, 3, 5, 8):
        monkeypatch.setattr(kernel, "COEF_LIMIT", limit)
        assert np.array_equal(gauss_suppress(X, primary, cost), want), limit
    assert calls  # the small limits fell back


def _kernel_args(X, primary, cost, limit):
    """kernel.walk's arguments for a matrix without singletons or forced cells."""
    Xc = sparse.csc_matrix(X, dtype=np.int64)
    Xc.sort_indices()
    P = Xc[:, np.flatnonzero(primary)]
    cand = candidate_order(Xc, cost)
    cand = cand[~primary[cand]]
    i64 = np.int64
    return (
        Xc.indptr.astype(i64), Xc.indices.astype(i64), Xc.data.astype(i64), Xc.shape[0],
        P.indptr.astype(i64), P.indices.astype(i64), P.data.astype(i64),
        np.zeros(Xc.shape[0], dtype=bool), False, False, np.zeros(0, dtype=i64), cand, limit,
        (0, 0),
    )  # fmt: skip
