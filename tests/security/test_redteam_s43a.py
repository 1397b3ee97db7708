"""Red team s43a: the analyst's SQL surface against CKM and threshold tables after session 42
(REMAINDER_FLOOR, sums over joins taking the summed table's count rule, the error oracles
closed in s42), and the two items s42 left open (top_k >= 2 sums, the small-cells ptable).

Attacked as an analyst on the demo (20,000 persons, CKM), one line each
(W: worked, fixed here; O: worked, left open; H: held):

- W  **An INTERVAL literal as a condition.** ``totality.condition_problem`` let a value of
     unknown type pass where it was not a column, literal, subquery, cast or choice
     ("predicates sqlglot leaves untyped"), and sqlglot gives an INTERVAL literal no type.
     As a constant it was evaluated alone (fine), never cast to BOOLEAN, and DuckDB's cast
     failed on every row that reached it: ``WHERE age > 93 AND INTERVAL 1 DAY`` failed in
     the engine and ``age > 94`` answered (the oldest person's age by bisection), likewise
     under NOT/OR, in ``COUNT(CASE WHEN ... AND INTERVAL 1 DAY THEN 1 END)``, as JOIN ON,
     HAVING and in a public subquery's WHERE. Scored on the demo (20,000 persons):
     R05-M015 x 94 x M, one person published as 3: the cell non-empty and x F empty, then his
     occupation (11 values), education (4) and income band (10 class-break bands: 200,000 to
     500,000; true 318,450.01), all exact, in 27 queries. Fixed: a value of unknown type
     stands as a condition only when it is a predicate by its form (comparison, IN, BETWEEN,
     LIKE, IS, EXISTS, AND/OR, NOT, TRUE/FALSE, STARTS_WITH); anything else is refused
     before it runs (fail closed).
- W  **A count of persons grouped by their household's size proves hidden household
     counts** (fixed by s43i, :mod:`sqlsdc.planner.coarser_units`). Over persons ⋈
     households the count is of the persons (README), and grouped by ``h.size`` each
     household adds exactly ``size`` rows: the count is size·n_h plus noise of at most
     D = 5, so for sizes 3-7 one n_h fits. The households' own count never shows 1 or 2 and
     their ``SUM(size)`` (the same number) is a pinned sum under the mean floor; this
     spelling has neither. One query: 48 municipality x size household counts told on the
     CLI demo (all exact), 46 of them 1 or 2 households that the households' count hid (34
     on the seed-7 test demo); with ``h.tenure`` added to the GROUP BY, a second query told
     the tenure of all 44 cells proved to hold one household, exactly (0 wrong). The count
     of one table's rows in cells of another confidential table's columns is a sum of that
     table's units' multiplicities, and would need its protection (mean floor, counted by
     the other table's units). Fixed (s43i), fail closed: such a count (and AVG, and a
     group-only release) is refused, naming the other table's columns and what to write
     instead (the households' own COUNT(*) and SUM(size)).
- W  **The small-cells ptable had no published-bits check** (a policy gap; no analyst-side
     leak measured on the demo, see the end of this item). ``policy/validate`` checked the
     rounding window (s41a's :func:`~sqlsdc.mechanisms.ptable_build.check_published_bits`)
     of a rule's magnitude ptable only; its ``small_cells`` ptable (x_delta 1, looked up at
     a = |x_j| in every row from 0) was built and checked for differencing, never for its
     window. ``small_cells: {D: 5, V: 1}`` (the demo counts' D) beside the demo's magnitude
     ptable left 0.0122 keys (entry v = -5 of rows 4 and 5, 6,400 keys each) and
     ``{D: 3, V: 0.5}`` 0.580, both accepted, where the same window under one key in the main
     ptable let one query tell pinned cells' counts (s41a). Fixed: the small-cells ptable is
     checked over all its rows and refused naming itself. Not exploited: under the demo's
     mean floor a pinned small-cells sum above the floor has |x̂| >= 13·x_1 (windows of 2
     keys or more at v = -5), one under it is one contribution of its mean, whose key tells
     nothing of n; the narrow entries hold 1.5e-6 of the keys each. A policy without
     ``mean_before_sum`` would expose what s41a measured on the main ptable.
- H  REMAINDER_FLOOR's 0: the demo has no measure of both signs; ``SUM(income - 500000)`` is
     SUM(income) - 500000·n̂ (the constant moves out), ``SUM(CASE WHEN sex = 'F' THEN income
     ELSE -income END)`` and ``SUM(turnover - employees)`` are refused, ``SUM(-income)`` is
     -SUM(income) to the bit (8 regions): no spelling reaches the crossing, and a 0 shows the
     same for either sign.
- H  scaled sums that overflow: ``SUM(income * c)`` with c = MAX_DOUBLE/t is c·x̂, inf exactly
     when c·x̂ is (R01, t between the true 85,158,741 and the shown 85,139,968: finite), so
     the overflow follows the protected value, never the true sum; AVG likewise; ``income /
     1e-303``, ``income * weight * 1e300`` and CASE-filtered scaled sums alike (4 x 8 cells).
- H  sums over joins (households x persons by size, CTE-wrapped, 7 cells): the persons' count
     rule; a households' column summed over persons is refused (rows repeat); UNION ALL of
     both tables, DISTINCT derived tables and IN subqueries over confidential rows refused.
- H  error oracles: LIKE/ILIKE with ESCAPE (DuckDB raises where a row's pattern ends with the
     escape character or the escape is two characters: an oracle in the raw engine) are
     refused by the allow-list; a column as a LIKE pattern answers; DECIMAL literals of 26-37
     decimals mixed with integer columns (DuckDB fails from 36 decimals for values >= 100)
     are refused as exact arithmetic or typed by the exact-mixing shapes; % and // with such
     divisors compute in DECIMAL(38, s) or DOUBLE, never failing on INTEGER, BIGINT or
     DECIMAL(18, 2) values; LN, SQRT, POW, EXP of DOUBLE give NaN/inf in DuckDB 2.0.
- H  (analysis) top_k 2 (enterprises): a cell whose protected count is under 18 is perturbed
     as one contribution, its mean (one step); above it a pinned sum (``WHERE employees =
     10``) has x_1 = x_2 and |x̂|/|x_delta| >= 13·10/2, windows of 145 keys or more. The
     first step's window is unbounded only for a sum of both signs with x_2 << x_1, whose
     two pinned values' counts the analyst would need apart: not reachable on the demo.
"""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc.demo.build import demo_policy
from sqlsdc.mechanisms.parameters import PTableSpec
from sqlsdc.mechanisms.ptable_build import narrowest_window
from sqlsdc.policy import load_policy


def _with_small_cells(small_cells: dict) -> dict:
    document = demo_policy().document_dict()
    document["protection"]["magnitudes"]["small_cells"] = small_cells
    return document


@pytest.mark.parametrize(
    "small_cells, keys",
    [({"D": 5, "V": 1}, "0.0122"), ({"D": 3, "V": 0.5}, "0.58")],
)
def test_a_small_cells_ptable_whose_rounding_window_holds_no_key_is_refused(small_cells, keys):
    """Accepted before s43a (the small-cells ptable's window was never checked): 0.0122 and
    0.580 keys, under the one key s41a requires of a magnitude ptable."""
    with pytest.raises(sqlsdc.PolicyError) as refused:
        load_policy(_with_small_cells(small_cells))
    message = str(refused.value)
    assert "protection.magnitudes.small_cells: small-cells ptable" in message
    assert f"window of {keys} keys (fewer than one)" in message


def test_small_cells_ptables_that_leave_a_key_in_every_window_are_accepted():
    """test_ckm's small-cells ptable (D 2, V 0.5: 86 keys) and D 4, V 1 (1.10) stay accepted;
    every row counts (a small contribution reaches row 0), and the narrowest entry is the
    small table's own (v = -5 of row 5 for D 5), not the magnitude ptable's."""
    for small_cells, low, high in (({"D": 2, "V": 0.5}, 85, 87), ({"D": 4, "V": 1}, 1.09, 1.1)):
        spec = PTableSpec(**small_cells)
        assert low < narrowest_window(spec, 0.2, 0.5, "small_cells") < high
        policy = load_policy(_with_small_cells(small_cells))
        assert policy.table("persons") is not None
    assert narrowest_window(PTableSpec(D=5, V=1), 0.2, 0.5, "small_cells") == pytest.approx(
        6400 * 2.0**-18 * 0.5,
        rel=1e-12,  # step 1, v = -5 at REMAINDER_FLOOR
    )


# the oldest person of the demo is 94: before s43a each failed in the engine for ``age > 93``
# and answered for ``age > 94``, but the NOT form (refused there as a constant that raises)
INTERVAL_CONDITIONS = [
    "SELECT COUNT(*) FROM persons WHERE age > {a} AND INTERVAL 1 DAY",
    "SELECT COUNT(*) FROM persons WHERE age > {a} AND INTERVAL '1' DAY",
    "SELECT COUNT(*) FROM persons WHERE age > {a} AND (INTERVAL 0 YEAR)",
    "SELECT COUNT(*) FROM persons WHERE NOT (age <= {a} OR NOT INTERVAL 1 DAY)",
    "SELECT COUNT(CASE WHEN age > {a} AND INTERVAL 1 DAY THEN 1 END) FROM persons",
    "SELECT COUNT(*) FROM persons p JOIN households h ON p.household_id = h.household_id "
    "AND p.age > {a} AND INTERVAL 1 DAY",
    "SELECT COUNT(*) FROM persons WHERE age > {a} AND region IN (SELECT region FROM regions "
    "WHERE INTERVAL 1 DAY)",
]


@pytest.mark.parametrize("sql", INTERVAL_CONDITIONS)
@pytest.mark.parametrize("age", [93, 94])
def test_an_interval_standing_as_a_condition_is_refused(ckm_db, sql, age):
    """Before s43a: failed in the engine for ``age > 93`` and answered for ``age > 94``
    (12 of the 14). Now refused alike on both sides, before anything runs."""
    with sqlsdc.connect(ckm_db, "analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation, match="cast to BOOLEAN|raises an error"):
            con.execute(sql.format(a=age))


@pytest.mark.parametrize("sex", ["M", "F"])
def test_a_hidden_one_person_cell_is_not_proved_by_an_interval_condition(ckm_db, sex):
    """R05-M015 x 94 x M holds one person, x F none. Before: failed in the engine for M and
    answered for F, then told his occupation, education and income band (27 queries in
    all). Now refused on both sides, naming the condition."""
    cell = f"municipality = 'R05-M015' AND age = 94 AND sex = '{sex}'"
    with sqlsdc.connect(ckm_db, "analyst") as con:
        with pytest.raises(sqlsdc.PolicyViolation, match="type unknown used as a condition"):
            con.execute(f"SELECT COUNT(*) FROM persons WHERE {cell} AND INTERVAL 1 DAY")


def test_predicates_sqlglot_leaves_untyped_still_stand_as_conditions(ckm_db):
    """What is a truth value by its form stays answered: EXISTS, STARTS_WITH, IS NULL, TRUE."""
    with sqlsdc.connect(ckm_db, "analyst") as con:
        (n,) = con.execute(
            "SELECT COUNT(*) FROM persons WHERE age > 50 AND EXISTS (SELECT 1 FROM regions) "
            "AND NOT STARTS_WITH(occupation, 'zz') AND income IS NOT NULL AND TRUE"
        ).fetchone()
        assert n > 5000


PERSONS_BY_HOUSEHOLD_SIZE = (
    "SELECT p.municipality, h.size, COUNT(*) FROM persons p JOIN households h "
    "ON p.household_id = h.household_id GROUP BY p.municipality, h.size"
)


def test_a_persons_count_by_household_size_does_not_prove_a_hidden_household_count(ckm, raw_ckm):
    """A count of persons over persons ⋈ households is protected as a count of the persons
    (README: "on a join the count is of the rows summed"), but grouped by ``h.size`` every
    household of the cell contributes exactly ``size`` rows: the count is ``size·n_h`` plus
    noise of at most D, so for sizes 3 to 7 one candidate n_h fits. The households' own
    ``COUNT(*)`` never shows 1 or 2 (js 2), and their ``SUM(size)`` (the same number) is a
    pinned sum protected by the mean floor; this spelling has neither. Each household so
    isolated then shows its tenure (``GROUP BY ..., h.tenure``) and its members' incomes."""
    truth = {(m, s): n for m, s, n in raw_ckm.execute(
        "SELECT municipality, size, COUNT(*) FROM households GROUP BY ALL").fetchall()}  # fmt: skip
    hidden = {
        (m, s): n
        for m, s, n in ckm.execute(
            "SELECT municipality, size, COUNT(*) FROM households GROUP BY municipality, size"
        ).fetchall()
    }
    proved = []
    # s43i refused it; s43j protects it as a sum over households (test_redteam_s43j)
    shown_counts = ckm.execute(PERSONS_BY_HOUSEHOLD_SIZE).fetchall()
    assert len(shown_counts) > 300
    for m, s, shown in shown_counts:
        assert (m, s) in hidden  # shown exactly where the households' own count shows it
        candidates = [k for k in range(1, 1000) if abs(shown - s * k) <= 5]
        if candidates == [truth[(m, s)]] and truth[(m, s)] <= 2:
            proved.append((m, s))
    # under a magnitude's noise (up to ~0.8·size per household under the mean floor) one fit
    # within ± D is no proof: it hits by chance, as on the households' own SUM(size)
    assert len(proved) <= 3, f"{len(proved)} hidden counts of 1 or 2 households fit, {proved[:3]}"
