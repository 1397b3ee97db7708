"""Red-team attacks on protection core v2 (issue 16), written as tests of the SAFE behaviour.

Each test runs an attack an analyst can mount with the guarded connection only, and asserts that
it does not work (the query is refused, or the answer carries no more than the mechanism's
stated information). Each failed against the first build of the new core; each test's
docstring says what leaked and why, and the fix is in the mechanism or check named there:
magnitude noise spread over its ptable grid cell (``mechanisms.ckm.Lookup.interpolated``),
distinct counts of stored columns only with their own salt (``planner.analyze``), cell keys
of the driver's rows only (``planner.plan._row_source``), no DP aggregation over other
aggregations' cells (``rewrite.dp``), only value-preserving casts in sums (``planner.linear``).

The attacker knows the policy (it is shown by ``sqlsdc policy show``) and therefore the
perturbation tables: they are generated deterministically from the public parameters
(``sqlsdc ptable --D 4 --V 1 --step 12``). The tests read them from the catalog (``raw_ckm``)
only as a shortcut for regenerating them.
"""

from __future__ import annotations

import pytest

import sqlsdc

# ---------------------------------------------------------------------------------- helpers
FP, P_SMALL, P_LARGE, Q = 20000, 0.2, 0.05, 3  # the demo's persons magnitude flex parameters


def _magnitude_pvs(raw) -> list[float]:
    """|v| of the magnitude ptable's last row (i = D = 4): public, from D 4, V 1, step 12."""
    rows = raw.execute(
        "SELECT DISTINCT abs(v) FROM sqlsdc.ptable_entries e JOIN sqlsdc.ptables t "
        "USING (ptable_id) WHERE t.kind <> 'counts' AND e.i = (SELECT max(i) FROM "
        "sqlsdc.ptable_entries WHERE ptable_id = e.ptable_id)"
    ).fetchall()
    if not rows:  # fall back to every magnitude table entry
        rows = raw.execute("SELECT DISTINCT abs(v) FROM sqlsdc.ptable_entries WHERE ptable_id > 1")
        rows = rows.fetchall()
    return sorted({round(r[0], 4) for r in rows})


def _flex(x: float) -> float:
    """m(x) of cellKey's flex function with the demo's parameters (public)."""
    x = abs(x)
    if x < FP:
        return P_SMALL
    f = 2 * FP / (FP + x)
    return P_LARGE * (1 + ((x * P_SMALL - P_LARGE * FP) / (P_LARGE * FP)) * f**Q)


def _invert_income(xhat: float, mu: float, pvs: list[float]) -> set[float]:
    """Every cent value x with x + s·x·m(x)·(mu + |pv|) = xhat for some sign s and grid pv."""
    found = set()
    for p in pvs:
        for s in (1, -1):

            def g(x, s=s, p=p):
                return x + s * x * _flex(x) * (mu + p) - xhat

            lo, hi = 0.0, 3 * abs(xhat) + 1
            g_lo = g(lo)
            if g_lo * g(hi) > 0:
                continue
            for _ in range(200):  # bisection, until the interval stops changing
                mid = (lo + hi) / 2
                g_mid = g(mid)
                if g_lo * g_mid <= 0:
                    if hi == mid:
                        break
                    hi = mid
                else:
                    if lo == mid:
                        break
                    lo, g_lo = mid, g_mid
            x = (lo + hi) / 2
            if abs(x * 100 - round(x * 100)) < 1e-4:
                found.add(round(x, 2))
    return found


# ------------------------------------------------------------- 1. AVG divides by the true n
def test_avg_of_a_constant_valued_column_does_not_reveal_the_exact_count(ckm, raw_ckm):
    """AVG(x) is published as x̂/n with the TRUE contributor count n (mean_before_sum). In a cell
    where every value is the same known constant (``WHERE age = 40`` then ``AVG(age)``), x = 40·n
    and x̂ − x = ±0.2·40·(mu + |pv|) with pv on the public 1/12 grid, so n·(AVG − 40) must be one
    of ~100 known values: scanning n over [n̂−5, n̂+5] leaves exactly one n for most cells —
    the exact count of a small cell from one query. (rewrite/ckm.py: ``__o / __n`` for AVG.)"""
    pvs = _magnitude_pvs(raw_ckm)
    sql = ("SELECT municipality, sex, COUNT(*) AS n, AVG(age) AS a FROM persons WHERE age = 40 "
           "GROUP BY municipality, sex")  # fmt: skip
    truth = {(m, s): n for m, s, n, _a in raw_ckm.execute(sql).fetchall()}

    def candidates(avg: float, nhat: int) -> list[int]:
        out = []
        for n in range(1, nhat + 6):
            noise, mu = n * (avg - 40), (0.5 if n < 3 else 0.0)
            if abs(noise) < 1e-9:
                if mu == 0:
                    out.append(n)
                continue
            k = abs(noise) / (P_SMALL * 40) - mu
            if any(abs(k - p) < 1e-6 for p in pvs):
                out.append(n)
        return out

    small = exact = 0
    for m, s, nhat, avg in ckm.execute(sql).fetchall():
        if avg is None or truth[(m, s)] >= 10:
            continue
        small += 1
        exact += candidates(avg, nhat) == [truth[(m, s)]]
    assert small >= 20
    assert exact <= 0.2 * small, f"exact count of {exact} of {small} small cells from AVG(age)"


# ------------------------------------- 2. COUNT(DISTINCT household_id) shares COUNT(*)'s noise
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT municipality, COUNT(*), COUNT(DISTINCT household_id) FROM persons "
        "WHERE age < 10 GROUP BY municipality",
        "SELECT p.municipality, COUNT(DISTINCT p.person_id), COUNT(DISTINCT p.household_id) "
        "FROM persons p WHERE p.age < 10 GROUP BY p.municipality",
        "SELECT p.municipality, COUNT(*), COUNT(DISTINCT p.household_id) FROM persons p "
        "JOIN households h ON p.household_id = h.household_id WHERE p.age < 10 "
        "GROUP BY p.municipality",
        # through a derived households table the count was keyed by the persons' rows,
        # unsalted: 107 of 107 differences exact at 100,000 persons (closed in session 30)
        "SELECT p.municipality, COUNT(*), COUNT(DISTINCT h.household_id) FROM persons p "
        "JOIN (SELECT household_id, tenure FROM households) h "
        "ON p.household_id = h.household_id WHERE p.age < 10 GROUP BY p.municipality",
    ],
)
def test_count_and_distinct_households_do_not_share_noise(ckm, raw_ckm, sql):
    """On persons, COUNT(DISTINCT household_id) (a unit of *households*) was keyed by the sum of
    the *persons'* record keys, unsalted: the same key as COUNT(*), so for cells of 8 or more
    (same ptable row) both got the same noise and their difference was exact (persons minus
    households of the cell). It is keyed by the households' own keys
    (``sqlsdc.rewrite.counted_units``)."""
    truth = {m: (n, h) for m, n, h in raw_ckm.execute(sql).fetchall()}
    big = exact = 0
    for m, n, h in ckm.execute(sql).fetchall():
        tn, th = truth[m]
        if tn >= 8 and th >= 8 and n is not None and h is not None:
            big += 1
            exact += (n - h) == (tn - th)
    assert big >= 10
    assert exact <= 0.5 * big, f"{exact} of {big} differences are exact"


# ------------------------------- 3. multiplicative magnitude noise on a grid is invertible
def _unique_targets(raw, count: int) -> list[tuple]:
    return raw.execute(
        "SELECT * FROM (SELECT municipality, age, sex, occupation, any_value(income) AS x "
        "FROM persons WHERE age BETWEEN 25 AND 65 GROUP BY ALL "
        "HAVING count(*) = 1 AND count(income) = 1) AS t "
        f"ORDER BY hash(municipality, age, sex, occupation) LIMIT {count}"
    ).fetchall()


@pytest.mark.slow
def test_one_person_average_does_not_invert_to_the_exact_income(ckm, raw_ckm):
    """A one-person cell's AVG(income) is x̂ = x·(1 ± m(x)·(0.5 + |pv|)) with m the public flex
    function and pv one of ~100 grid values: inverting each candidate factor and keeping the
    results on the cent grid leaves one value, the exact income, whenever the cell is published
    (about 1 in 6 one-person cells, one query each)."""
    pvs = _magnitude_pvs(raw_ckm)
    published = exact = 0
    for m, a, s, o, income in _unique_targets(raw_ckm, 120):
        rows = ckm.execute(
            "SELECT AVG(income) FROM persons WHERE municipality = ? AND age = ? AND sex = ? "
            "AND occupation = ?",
            [m, a, s, o],
        ).fetchall()
        if not rows or rows[0][0] is None:
            continue
        published += 1
        exact += _invert_income(rows[0][0], 0.5, pvs) == {income}
    assert published >= 5
    assert exact <= 0.2 * published, f"exact income of {exact} of {published} published targets"


@pytest.mark.slow
def test_zero_padded_cell_does_not_invert_to_the_exact_income(ckm, raw_ckm):
    """Padding the target with children of the same municipality (income 0, real persons, so
    the cell is large and always published, and the target is its only and largest
    contribution): x̂ = AVG·n for n in [n̂−5, n̂+5], inverted as above. Most targets come out
    exact after one query, the rest within 2-3 candidates (a second padding decides)."""
    pvs = _magnitude_pvs(raw_ckm)
    tried = exact = 0
    for m, a, s, o, income in _unique_targets(raw_ckm, 30):
        rows = ckm.execute(
            "SELECT AVG(income), COUNT(income) FROM persons WHERE municipality = ? AND "
            "(age < 10 OR (age = ? AND sex = ? AND occupation = ?))",
            [m, a, s, o],
        ).fetchall()
        if not rows or rows[0][0] is None:
            continue
        avg, nhat = rows[0]
        tried += 1
        found = set()
        for n in range(max(1, nhat - 5), nhat + 6):
            found |= _invert_income(avg * n, 0.5 if n < 3 else 0.0, pvs)
        exact += found == {income}
    assert tried >= 10
    assert exact <= 0.2 * tried, f"exact income of {exact} of {tried} padded targets"


# ------------------------- 4. LEFT self-joins on the unit multiply the cell key: fresh noise
def _count_ptable(raw) -> dict[int, list[tuple[int, int, int]]]:
    """(v, lo, hi) per row i of the counts ptable (public: D 5, V 3, js 2)."""
    table: dict[int, list[tuple[int, int, int]]] = {}
    for i, v, lo, hi in raw.execute(
        "SELECT e.i, e.v, e.lo, e.hi FROM sqlsdc.ptable_entries e JOIN sqlsdc.ptables t "
        "USING (ptable_id) WHERE t.kind = 'counts' ORDER BY e.i, e.lo"
    ).fetchall():
        table.setdefault(int(i), []).append((int(v), int(lo), int(hi)))
    return table


def _intersect(a, b):
    out, i, j = [], 0, 0
    a, b = sorted(a), sorted(b)
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _consistent(n: int, observed: dict[int, int], table, top: int) -> bool:
    """Whether some cell key s (mod 2^32) explains every observation: the query with k−1 LEFT
    self-joins has key k·s mod 2^32, and shows n + v where v's key interval holds it."""
    m = 2**32
    keys = [(0, m)]
    for k, shown in observed.items():
        found = [(lo, hi) for v, lo, hi in table[min(n, top)] if v == shown - n]
        if not found:
            return False
        candidates = [((lo + j * m + k - 1) // k, (hi + j * m + k - 1) // k)
                      for lo, hi in found for j in range(k)]  # fmt: skip
        keys = _intersect(keys, candidates)
        if not keys:
            return False
    return True


def test_left_self_joins_do_not_give_fresh_count_noise(ckm, raw_ckm):
    """``FROM persons p LEFT JOIN persons q ON q.person_id = p.person_id`` repeats no row, so
    the multiplicity proof accepts it, but the cell key of a LEFT join sums the distinct keys of
    every joined instance: with k−1 self-joins the key is k·S mod 2^32, a new noise draw for the
    same persons (CKM promises one value per set of units, however the SQL is written). Twelve
    queries give the exact count of most small cells, hidden ones (published 0) included, by
    intersecting the key intervals the public ptable allows. (rewrite/ckm.py, the cell key
    of joins without a row source: SUM(DISTINCT rk) over every instance.)"""
    table = _count_ptable(raw_ckm)
    top = max(table)
    where = "WHERE p.age BETWEEN 38 AND 42"
    observed: dict[tuple, dict[int, int]] = {}
    for k in range(12):
        joins = " ".join(f"LEFT JOIN persons q{i} ON q{i}.person_id = p.person_id"
                         for i in range(k))  # fmt: skip
        for m, s, c in ckm.execute(
            f"SELECT p.municipality, p.sex, COUNT(*) FROM persons p {joins} {where} "
            "GROUP BY p.municipality, p.sex"
        ).fetchall():
            observed.setdefault((m, s), {})[k + 1] = c
    truth = raw_ckm.execute(
        f"SELECT p.municipality, p.sex, COUNT(*) FROM persons p {where} GROUP BY ALL"
    ).fetchall()
    small = exact = 0
    for m, s, n in truth:
        if n >= 10:
            continue
        shown = {k: observed.get((m, s), {}).get(k, 0) for k in range(1, 13)}
        small += 1
        exact += [c for c in range(1, 30) if _consistent(c, shown, table, top)] == [n]
    assert small >= 20
    assert exact <= 0.2 * small, f"exact count of {exact} of {small} small cells"


# ------------- 5. two distinct counts of expressions of one column share noise: a yes/no oracle
def test_distinct_counts_of_two_expressions_of_one_column_do_not_cancel(ckm):
    """COUNT(DISTINCT municipality) next to COUNT(DISTINCT CASE WHEN municipality = t THEN o ELSE
    municipality END) over a padded cell was a yes/no oracle on one person (the two shared their
    noise; bisection on income > x found an income to the cent in 28 queries). A distinct count
    now takes a stored column as it is, so every phrasing of the second statistic is refused."""
    phrasings = [
        "SELECT COUNT(DISTINCT municipality) - COUNT(DISTINCT CASE WHEN municipality = 'R01-M001' "
        "THEN 'R01-M002' ELSE municipality END) FROM persons WHERE region = 'R01'",
        "SELECT COUNT(DISTINCT m) FROM (SELECT CASE WHEN municipality = 'R01-M001' THEN "
        "'R01-M002' ELSE municipality END AS m FROM persons) x",
        "WITH x AS (SELECT COALESCE(NULLIF(municipality, 'R01-M001'), 'R01-M002') AS m "
        "FROM persons) SELECT COUNT(DISTINCT m) FROM x",
        "SELECT COUNT(DISTINCT municipality || '') FROM persons",
    ]
    for sql in phrasings:
        with pytest.raises(sqlsdc.PolicyViolation, match="one stored column"):
            ckm.execute(sql)
    assert ckm.execute("SELECT COUNT(DISTINCT m) FROM (SELECT municipality AS m FROM persons) x")


@pytest.mark.parametrize(
    "sql",
    [
        # a DP aggregation nested in a DP aggregation's WHERE
        "SELECT scheme, COUNT(*) FROM benefits WHERE amount > (SELECT AVG(amount) FROM benefits)"
        " GROUP BY scheme",
        "SELECT scheme, COUNT(*) FROM benefits WHERE scheme IN (SELECT scheme FROM benefits "
        "GROUP BY scheme HAVING COUNT(*) > 20000) GROUP BY scheme",
        # a CKM aggregation (persons) in a DP aggregation's WHERE
        "SELECT scheme, COUNT(*) FROM benefits WHERE region IN (SELECT region FROM persons "
        "WHERE age = 40 GROUP BY region) GROUP BY scheme",
    ],
)
def test_dp_queries_with_protected_subqueries_are_answered_or_refused(ckm, sql):
    """These pass every check, then fail in the connection's engine-table check on the DP
    stage's SQL (``InternalError: the engine would read undeclared table __sqlsdc_dp_cells_0``
    / ``ptable_entries`` ... "this is a bug in sqlsdc"): the DP stage SQL embeds the other
    aggregation's protected frame, but check_engine_tables only exempts catalog and noisy-cell
    tables that sit inside a ``__cells`` frame of the *main* tree. They must be answered, or
    refused with a PolicyViolation saying what to write instead."""
    try:
        ckm.execute(sql).fetchall()
    except sqlsdc.PolicyViolation:
        pass
    except sqlsdc.InternalError as bug:  # pragma: no cover - the failure this test documents
        pytest.fail(f"internal error on a query the guard accepted: {bug}")


# ------------------------------------------------ 7. narrowing casts dropped: wrong answers
@pytest.mark.parametrize(
    "aggregate",
    ["SUM(TRY_CAST(income AS SMALLINT))", "AVG(TRY_CAST(income AS SMALLINT))"],
)
def test_narrowing_try_cast_in_a_sum_is_not_silently_dropped(ckm, raw_ckm, aggregate):
    """guard/linear.py drops every numeric cast ("the value is the column's"), TRY_CAST to a
    narrow type included, so SUM(TRY_CAST(income AS SMALLINT)) — a sum over the incomes that
    fit (others are NULL) — is answered as SUM(income): 8 times the true value on the demo,
    with no warning. Refuse it, or answer the question asked."""
    sql = f"SELECT region, {aggregate} FROM persons GROUP BY region ORDER BY region"
    truth = dict(raw_ckm.execute(sql).fetchall())
    try:
        got = dict(ckm.execute(sql).fetchall())
    except sqlsdc.PolicyViolation:
        return
    for region, value in got.items():
        assert value == pytest.approx(truth[region], rel=0.05), region
