"""What a DP query pays for, at the limits of its release (red team s35's open faults).

A refusal decidable from the query, the policy and the public domains comes before the
charge: the analyst pays nothing for a query that will be refused, an answer that could pass
the rows a connection returns included (session 36). A released value never fails to fit its
result type after the charge. A bounding report whose shares are public constants is neither
drawn nor paid for. Groups the private selection drops leave nothing in the cell cache, and a
quantile's draw stops at the statement timeout, paid (session 36).
"""

from __future__ import annotations

import time
from fractions import Fraction

import duckdb
import numpy as np
import pandas as pd
import pytest
from test_dp_query import dp_document, make_db, pin_noise, spend_rows

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyViolation, QueryCanceled
from sqlsdc.guard import connection, dp_limits
from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, noisy_quantiles, permute_and_flip
from sqlsdc.mechanisms.prf import KeyedStream


def _ledger(path) -> tuple[list, list]:
    """The spend rows and the audit decisions of the database, in order."""
    con = open_database(path)
    try:
        audit = con.execute("SELECT decision FROM sqlsdc.audit ORDER BY query_id").fetchall()
    finally:
        con.close()
    return spend_rows(path), [d for (d,) in audit]


# --- refusals come before the charge ---------------------------------------------------------


@pytest.fixture(scope="module")
def dp_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("limits") / "dp.duckdb"
    make_db(path, dp_document())
    pin_noise(path)
    return path


def test_a_quantile_too_large_to_compute_is_refused_before_it_is_charged(tmp_path):
    """Income on a grid of 1/100 has 10^7 candidate medians; 8 public cells of region x sex
    make 8 x 10^7 scores, over the limit: refused, and the spend and the ledger unchanged."""
    document = dp_document()
    document["tables"]["persons"]["dp"]["granularity"] = "1/100"
    path = tmp_path / "fine.duckdb"
    make_db(path, document)
    with sqlsdc.connect(path, "ana") as con:
        con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region")  # spends 1/2
        before, spent = _ledger(path), [b.spent for b in con.remaining_budget()]
        with pytest.raises(PolicyViolation, match="too large to compute"):
            con.execute("SELECT region, sex, MEDIAN(income) FROM persons GROUP BY region, sex")
        after = [b.spent for b in con.remaining_budget()]
    spends, decisions = _ledger(path)
    assert after == spent and len(spends) == 1 and spends == before[0]
    assert decisions == [*before[1], "refused"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT CAST(LENGTH(clinic) AS DOUBLE) AS k, COUNT(*) FROM visits GROUP BY k",
        "SELECT region, COUNT(*) AS n FROM persons GROUP BY region HAVING COUNT(*) BETWEEN '3' "
        "AND 5000",
    ],
    ids=["private-key-type", "answer-text"],
)
def test_refusals_decided_by_the_query_come_before_the_charge(dp_db, sql):
    """Private groups by a DOUBLE key (the type of the query, not of the data) and an answer
    whose constants DuckDB cannot bind: both used to be refused after the charge."""
    before = _ledger(dp_db)
    with sqlsdc.connect(dp_db, "ana") as con:
        spent = [b.spent for b in con.remaining_budget()]
        with pytest.raises(PolicyViolation, match="one group each|refuses the text"):
            con.execute(sql)
        assert [b.spent for b in con.remaining_budget()] == spent
    spends, decisions = _ledger(dp_db)
    assert spends == before[0] and decisions == [*before[1], "refused"]


def test_quantiles_of_many_cells_are_scored_in_blocks_with_the_same_values():
    """Private groups take their cells from the data, so their quantiles are never refused once
    paid: the scores are computed a block of cells at a time, with the values of one block."""
    calibration = calibrate(Statistic.QUANTILE, Bounding(lower=0, upper=99),
                            PrivacyCost(epsilon=1))  # fmt: skip
    rng = np.random.default_rng(3)
    cells = np.repeat(np.arange(40), 25)
    histogram = pd.DataFrame({"cell": cells, "bin": rng.integers(0, 100, cells.size),
                              "count": rng.integers(0, 5, cells.size)})  # fmt: skip
    histogram = histogram.sample(frac=1, random_state=1)  # rows of a cell apart
    space, mechanism = CellSpace.of("t", ["cell"]), CellMechanism("x", calibration)

    def medians(limit):
        return noisy_quantiles(histogram, space, mechanism, secret=b"s35 blocks" * 4,
                               policy_version=1, column="q", max_scores=limit)  # fmt: skip

    whole, blocks = medians(None), medians(3 * 100)  # three cells of 100 candidates a block
    assert list(whole.frame["cell"]) == list(blocks.frame["cell"])
    assert whole.values["q"] == blocks.values["q"]


# --- released integers hold every value the noise can take ----------------------------------


@pytest.fixture(scope="module")
def rich_db(tmp_path_factory):
    """12,000 persons of income 10^15 (bounds [0, 10^15]): the exact total, 1.2 x 10^19, and
    the noisy sums at epsilon 10^-5 (sd 1.4 x 10^20) pass BIGINT's 9.2 x 10^18."""
    document = dp_document()
    persons = document["tables"]["persons"]
    persons["columns"]["income"]["bounds"] = [0, 10**15]
    persons["protection"]["magnitudes"]["spend"] = {"epsilon": "1/100000"}
    path = tmp_path_factory.mktemp("rich") / "rich.duckdb"
    make_db(path, document)
    con = open_database(path)
    try:
        con.execute("INSERT INTO persons BY NAME SELECT p.* REPLACE (p.pid + 3000 * t.k AS pid) "
                    "FROM persons AS p, range(1, 4) AS t(k)")  # fmt: skip
        con.execute("UPDATE persons SET income = 1e15")
    finally:
        con.close()
    pin_noise(path)
    return path


def test_sums_beyond_bigint_are_released_as_hugeint(rich_db):
    sql = "SELECT region, SUM(income) AS s FROM persons GROUP BY region"
    with sqlsdc.connect(rich_db, "admin") as con:
        con.set_dp_noise(False)
        (total,) = con.execute("SELECT SUM(income) FROM persons").fetchone()
    with sqlsdc.connect(rich_db, "ana") as con:
        cursor = con.execute(sql)
        sums = dict(cursor.fetchall())
        kinds = [d[1] for d in cursor.description]
        frame = con.execute(sql).df()  # the same cells again, from the cache
    assert total == 12_000 * 10**15 and isinstance(total, int)  # exact, beyond 2^63
    assert kinds == ["VARCHAR", "HUGEINT"]  # as DuckDB's SUM of integers
    assert all(isinstance(v, int) for v in sums.values())
    assert max(abs(v) for v in sums.values()) > 2**63  # the noise passed BIGINT too
    assert frame["s"].tolist() == [float(sums[r]) for r in frame["region"]]  # df(): float64


def test_a_count_or_sum_whose_noise_could_pass_its_type_is_refused_before_the_charge(tmp_path):
    """10^4 groups of 10^6 rows per person and bounds of 10^15 at epsilon 10^-6: the COUNT's
    sd, 1.4 x 10^16, and the SUM's, 1.4 x 10^31, are within 10^8 sd of BIGINT's and HUGEINT's
    ranges."""
    document = dp_document()
    visits = document["tables"]["visits"]
    visits["columns"]["cost"]["bounds"] = [0, 10**15]
    visits["dp"].update(max_groups=10**4, max_rows=10**6)
    visits["protection"] = {kind: {"method": "dp", "spend": {"epsilon": "1/1000000"}}
                            for kind in ("counts", "magnitudes")}  # fmt: skip
    path = tmp_path / "wild.duckdb"
    make_db(path, document)
    with sqlsdc.connect(path, "ana") as con:
        for sql in ("SELECT COUNT(*) FROM visits", "SELECT SUM(cost) FROM visits"):
            with pytest.raises(PolicyViolation, match="could pass the range"):
                con.execute(sql)
        con.execute("SELECT COUNT(*) FROM persons")  # other tables unaffected
    spends, decisions = _ledger(path)
    assert len(spends) == 1 and decisions == ["refused", "refused", "accepted"]


# --- a report of public constants is neither drawn nor paid for ------------------------------


def test_counts_of_a_one_row_table_pay_no_report_and_state_zero_shares_exactly(tmp_path):
    """``persons`` has one row per person and a bounding report: a count can drop nothing (one
    row each) and clamp nothing (no measure), so its shares are 0 whatever the data. The query
    pays the count's epsilon alone; a sum still pays for its report (it clamps)."""
    document = dp_document()
    document["tables"]["persons"]["dp"]["bounding_report"] = {"epsilon": "1/2"}
    path = tmp_path / "report.duckdb"
    make_db(path, document)
    counts = "SELECT region, COUNT(*) AS n, COUNT(DISTINCT pid) AS u FROM persons GROUP BY region"
    with sqlsdc.connect(path, "ana") as con:
        (stage,) = con.explain(counts).dp_stages
        text = str(con.explain(counts))
        accuracy = con.execute(counts).cell_accuracy()
        con.execute("SELECT region, SUM(income) FROM persons GROUP BY region")
    assert stage.report is None and stage.shares_zero
    assert "nothing dropped nor clamped" in text
    assert len(accuracy) == 8  # every cell, the empty domain cell W too
    assert (accuracy["dropped"] == 0).all() and (accuracy["clamped"] == 0).all()
    count_epsilon = Fraction(1, 2)  # counts: {epsilon: 1/2}; COUNT and COUNT(DISTINCT) alike
    spends = [Fraction(epsilon) for _user, epsilon, _rho, _cells in spend_rows(path)]
    assert spends == [2 * count_epsilon, 1 + Fraction(1, 2)]  # the sum: 1, its report: 1/2


# --- groups the private selection drops leave nothing in the cache ---------------------------


def _cached_cells(path) -> list[tuple[str, str, str]]:
    con = open_database(path)
    try:
        # neither the statistics paid nor the record of a private selection's released keys
        # (dp_reuse.release_digest; red team s37b), which lists the released groups only
        return con.execute("SELECT cell, statistic, value FROM sqlsdc.dp_cells "
                           "WHERE cell NOT LIKE '%sqlsdc.dp_statistic%' "
                           "AND statistic <> 'release'").fetchall()  # fmt: skip
    finally:
        con.close()


@pytest.mark.parametrize("rule", ["threshold", "optimal"])
def test_groups_the_selection_drops_are_neither_cached_nor_charged_again(tmp_path, rule):
    """``rare`` has a dozen visits: the selection drops it. Before, its noisy unit count (or
    keep decision 0) and its noisy SUM were cached in ``dp_cells`` with its key, values never
    released that an admin could read back. Now only the cells of released groups are cached;
    asked again, the query is answered the same and costs nothing, and a query that adds a
    statistic pays for that statistic alone."""
    document = dp_document()
    if rule == "optimal":
        del document["tables"]["visits"]["dp"]["min_frequency"]
    path = tmp_path / f"{rule}.duckdb"
    make_db(path, document)
    pin_noise(path)
    sql = "SELECT clinic, COUNT(*) AS n, SUM(cost) AS s FROM visits GROUP BY clinic"
    with sqlsdc.connect(path, "ana") as con:
        (stage,) = con.explain(sql).dp_stages
        first = sorted(con.execute(sql).fetchall())
        spends = spend_rows(path)
        second = sorted(con.execute(sql).fetchall())
        third = sorted(con.execute(sql + " ORDER BY clinic LIMIT 2").fetchall())
    released = {clinic for clinic, _n, _s in first}
    assert released == {"a", "b", "c"} and first == second and third == first[:2]
    cells = _cached_cells(path)
    assert not [cell for cell, _s, _v in cells if '"s:rare"' in cell]  # its key is nowhere
    per_group = len(stage.statistics)  # the selection's count or decision, COUNT(*), SUM
    assert len(cells) == len(released) * per_group
    (selection,) = [s for s in stage.statistics if s.column == stage.units]
    kind = selection.calibration.statistic.value
    decided = [Fraction(v) for _cell, statistic, v in cells if statistic == kind]
    assert len(decided) == len(released)  # the released groups' counts (or decisions, 1)
    assert min(decided) >= stage.selection.threshold
    assert spend_rows(path) == spends and spends[0][3] == len(cells)  # cells: the released ones


# --- the quantile draw stops at the statement timeout ----------------------------------------


class _Stop(Exception):
    pass


def test_a_long_quantile_draw_calls_its_check_and_stops_when_it_raises():
    """One best candidate among 10^6 whose others score far worse: permute-and-flip visits
    about half of them, and calls its check every few thousand visits; a check that raises
    (the statement's timeout) stops the draw there."""
    scores = np.full(10**6, 10**6, dtype=np.int64)
    scores[777_777] = 0
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 3:
            raise _Stop

    stream = KeyedStream(b"s36 quantile timeout" * 2, 1, "test").derive("cell")
    with pytest.raises(_Stop):
        permute_and_flip(scores, Fraction(1, 2), stream, check)
    assert len(calls) == 3


@pytest.fixture(scope="module")
def flat_db(tmp_path_factory):
    """200 persons in 8 regions, all of income 77,777 on a grid of 1/10 over [0, 10^5]: the
    median of each region is one best candidate among 10^6 + 1 (8 x 10^6 scores, under the
    size limit), and its draw takes about half a second of Python per cell (whatever the
    data: sqlsdc.mechanisms.permute_flip), four seconds for the eight."""
    path = tmp_path_factory.mktemp("flat") / "flat.duckdb"
    n = 200
    regions = np.array(list("abcdefgh"))[np.arange(n) % 8]
    persons = pd.DataFrame({"pid": np.arange(n), "region": regions, "income": 77_777.0})
    con = duckdb.connect(str(path))
    con.register("frame", persons)
    con.execute("CREATE TABLE persons AS SELECT * FROM frame")
    con.close()
    dp = {"method": "dp", "spend": {"epsilon": 1}}
    columns = {"pid": {"role": "identifier"},
               "region": {"role": "dimension", "domain": list("abcdefgh")},
               "income": {"role": "measure", "bounds": [0, 100_000]}}  # fmt: skip
    sqlsdc.init(path, {
        "tables": {"persons": {"privacy_unit": "pid", "columns": columns,
                               "protection": {"counts": dp, "magnitudes": dp},
                               "dp": {"granularity": "1/10"}}},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "*", "epsilon": 100}],
    })  # fmt: skip
    return path


def test_the_quantile_draw_stops_at_the_statement_timeout_and_is_charged(flat_db):
    """The engine computes the histograms in milliseconds; the draw, in Python, used to run
    past a 2-second timeout for the whole of its seconds per cell (the engine's interrupt never
    reaches it; a cancel, ``interrupt()``, ends the statement's time the same way). It now
    stops within one chunk of 65,536 candidates of the timeout (tens of milliseconds), with
    the usual QueryCanceled. The query was charged before the draw: the error says so and the
    ledger has its spend."""
    sql = "SELECT region, MEDIAN(income) AS m FROM persons GROUP BY region"
    with sqlsdc.connect(flat_db, "ana", timeout=2.0) as con:
        started = time.process_time()
        with pytest.raises(QueryCanceled, match="statement timeout.*charged"):
            con.execute(sql)
        spent = time.process_time() - started
        assert [b.spent.epsilon for b in con.remaining_budget()][0] == 1
    assert spent < 3.5  # CPU: the eight draws take about 4 s; here at most the 2 s of wall time
    spends, decisions = _ledger(flat_db)
    assert len(spends) == 1 and decisions == ["refused"]  # as every statement timeout


# --- an answer too large is refused before the charge, from data-independent facts ----------


@pytest.fixture
def small_answers(monkeypatch):
    """A connection returns at most 5 rows, and a private selection releases at most 5
    groups per aggregation (as both are 1,000,000)."""
    monkeypatch.setattr(connection, "MAX_ANSWER_ROWS", 5)
    monkeypatch.setattr(connection, "MAX_PRIVATE_GROUPS", 5)
    monkeypatch.setattr(dp_limits, "MAX_PRIVATE_GROUPS", 5)


REGIONS = "(SELECT region, COUNT(*) AS n FROM persons GROUP BY region)"  # 4 public cells
CLINICS = "(SELECT clinic, COUNT(*) AS n FROM visits GROUP BY clinic)"  # private: at most 5
CLINIC_SUMS = "(SELECT clinic, SUM(cost) AS s FROM visits GROUP BY clinic)"


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT a.region, b.clinic FROM {REGIONS} AS a, {CLINICS} AS b",  # 4 x 5
        f"SELECT a.region, l.label FROM {REGIONS} AS a, lookup AS l",  # 4 x 2 public rows
        f"SELECT a.clinic, b.clinic FROM {CLINICS} AS a JOIN {CLINIC_SUMS} AS b "
        "ON a.n > b.s",  # on noisy values: up to 5 x 5
        f"SELECT clinic FROM {CLINICS} AS a UNION ALL SELECT region FROM {REGIONS} AS b",
    ],
    ids=["cross", "public-cross", "value-join", "union"],
)
def test_an_answer_that_may_pass_the_row_cap_is_refused_before_the_charge(
    dp_db, small_answers, sql
):
    """Before, such an answer was stopped as it was read, after the charge: the noisy HAVING
    or the private selection decided its size. Its bound is now known from the public
    domains, the cap of private groups, the public tables' rows and the joins: over the cap,
    it is refused before anything is charged; the spend and the ledger are unchanged."""
    before = _ledger(dp_db)
    with sqlsdc.connect(dp_db, "ana") as con:
        spent = [b.spent for b in con.remaining_budget()]
        with pytest.raises(sqlsdc.AnswerTooLarge, match="refused before the privacy budget"):
            con.execute(sql)
        assert [b.spent for b in con.remaining_budget()] == spent
    spends, decisions = _ledger(dp_db)
    assert spends == before[0] and decisions == [*before[1], "refused"]


@pytest.mark.parametrize(
    "sql, rows",
    [
        (
            f"SELECT a.clinic, a.n, b.s FROM {CLINICS} AS a JOIN {CLINIC_SUMS} AS b "
            "ON a.clinic = b.clinic",
            3,
        ),  # unique on the keys: at most 5
        (
            f"SELECT a.region, l.label FROM {REGIONS} AS a LEFT JOIN lookup AS l "
            "ON a.region = l.code",
            4,
        ),  # the public table's key: at most 4
        (f"SELECT a.region, b.clinic FROM {REGIONS} AS a, {CLINICS} AS b LIMIT 5", 5),
        (f"SELECT COUNT(*) FROM {REGIONS} AS a, {CLINICS} AS b", 1),
        ("SELECT clinic, COUNT(*) FROM visits GROUP BY clinic HAVING COUNT(*) > 0", 3),
    ],
    ids=["keys", "public-key", "limit", "aggregate", "having"],
)
def test_answers_bounded_within_the_cap_are_answered(dp_db, small_answers, sql, rows):
    with sqlsdc.connect(dp_db, "ana") as con:
        assert len(con.execute(sql).fetchall()) == rows


def test_a_selection_beyond_its_cap_keeps_the_groups_of_the_smallest_digests(tmp_path, monkeypatch):
    """At most 2 groups a selection (a, b and c pass it): the same two every time, and only
    their cells are cached; the answer, bounded by 2 rows, is never stopped."""
    monkeypatch.setattr(dp_limits, "MAX_PRIVATE_GROUPS", 2)
    monkeypatch.setattr(connection, "MAX_PRIVATE_GROUPS", 2)
    path = tmp_path / "capped.duckdb"
    make_db(path, dp_document())
    pin_noise(path)
    sql = "SELECT clinic, COUNT(*) AS n FROM visits GROUP BY clinic"
    with sqlsdc.connect(path, "ana") as con:
        (stage,) = con.explain(sql).dp_stages
        first = sorted(con.execute(sql).fetchall())
        again = sorted(con.execute(sql).fetchall())
    assert len(first) == 2 and first == again and {c for c, _n in first} < {"a", "b", "c"}
    assert len(_cached_cells(path)) == 2 * len(stage.statistics)


def test_dp_cells_joined_to_another_method_s_cells_on_their_keys_are_bounded(ckm_db):
    """The demo's benefits (DP, 8 regions) next to persons (cell key method, groups from the
    data) joined on region: the CKM cells are unique on their keys through the p-table's
    lookup, so the answer is bounded by the 8 DP cells; across, it has no bound before the
    charge and is refused unpaid."""
    dp = "(SELECT region, COUNT(*) AS n FROM benefits GROUP BY region)"
    ckm = "(SELECT region, COUNT(*) AS m FROM persons GROUP BY region)"
    with sqlsdc.connect(ckm_db, "analyst") as con:
        for on in ("b.region = p.region", "p.region = b.region"):
            rows = con.execute(f"SELECT b.region, n, m FROM {dp} AS b JOIN {ckm} AS p ON {on}")
            assert len(rows.fetchall()) == 8
            rows = con.execute(f"SELECT p.region, n, m FROM {ckm} AS p JOIN {dp} AS b ON {on}")
            assert len(rows.fetchall()) == 8
        spent = [b.spent for b in con.remaining_budget()]
        with pytest.raises(sqlsdc.AnswerTooLarge, match="any number of rows"):
            con.execute(f"SELECT b.region, n, m FROM {dp} AS b, {ckm} AS p")
        assert [b.spent for b in con.remaining_budget()] == spent
