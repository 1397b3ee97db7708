"""The catalog reads of a DP query: the cells of public domains are looked up with the
statistics (one look-up, not two), and a charge reuses its connection's budget state while
nobody else wrote; the answers stay those of a query that reads everything afresh."""

from __future__ import annotations

import pytest
from test_dp_query import dp_document, make_db, spend_rows

import sqlsdc
import sqlsdc.admin
from sqlsdc.catalog import dp_cache
from sqlsdc.engines.duckdb import open_database
from sqlsdc.guard import dp_charge
from sqlsdc.guard.dp_limits import PREFETCHED_CELLS
from sqlsdc.guard.dp_pricing import prefetching
from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, Statistic, calibrate
from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, cell_digests, cell_identity
from sqlsdc.policy import load_policy


@pytest.fixture
def dp_db(tmp_path):
    path = tmp_path / "dp.duckdb"
    make_db(path, dp_document())
    return path


def _counting(monkeypatch) -> list[int]:
    """How many digests each catalog look-up of cached cells asks for."""
    calls: list[int] = []
    real = dp_cache.cached_cells

    def counted(con, user, version, digests):
        digests = list(digests)
        calls.append(len(digests))
        return real(con, user, version, digests)

    monkeypatch.setattr("sqlsdc.guard.dp_charge.cached_cells", counted)
    return calls


def test_a_query_over_public_domains_looks_its_cells_up_with_its_statistic(dp_db, monkeypatch):
    calls = _counting(monkeypatch)
    sql = "SELECT region, sex, COUNT(*) FROM persons GROUP BY region, sex ORDER BY 1, 2"
    with sqlsdc.connect(dp_db, "ana") as con:
        first = con.execute(sql).fetchall()
        assert calls == [1 + 4 * 2]  # the statistic and the 8 cells of the domains' grid
        assert con.execute(sql).fetchall() == first  # cached: one look-up again, nothing paid
        assert calls == [9, 9]
        spent = {s.key: s.spent for s in con.remaining_budget()}
    with sqlsdc.connect(dp_db, "ana") as again:  # a new opening reads everything afresh
        assert again.execute(sql).fetchall() == first
        assert {s.key: s.spent for s in again.remaining_budget()} == spent


def test_private_groups_are_looked_up_once_their_exact_cells_are_known(dp_db, monkeypatch):
    calls = _counting(monkeypatch)
    with sqlsdc.connect(dp_db, "ana") as con:
        con.execute("SELECT clinic, COUNT(*) FROM visits GROUP BY clinic").fetchall()
    assert len(calls) == 2 and calls[0] < calls[1]  # the statistics; the groups found then


def test_prefetching_asks_for_the_expected_cells_once_and_never_twice():
    asked: list[list[str]] = []

    def lookup(digests):
        asked.append(list(digests))
        return {d: 7 for d in digests if d.startswith("c")}

    count = CellMechanism("*", calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1)))
    space = CellSpace.of("t", {"__g0": "region"}, data_version="1:2")
    stage = _Stage(relation="r", keys=("region",), table="t", scope="s",
                   statistics=(_Stat("__s0", "*", count.calibration),))  # fmt: skip
    cached = prefetching(lookup, [stage], data_versions={"t": "1:2"}, domains={"r": [["N", "S"]]})
    scoped = CellSpace.of("t", {"__g0": "region"}, scope="s", data_version="1:2")
    cells = cell_digests({"__g0": ["N", "S"]}, scoped, {"__s0": count})
    assert cached(["stat"]) == {}
    assert asked == [["stat", *cells]]
    assert cached(cells) == {} and cached(["stat"]) == {} and len(asked) == 1
    assert cached(["c-other"]) == {"c-other": 7} and asked[-1] == ["c-other"]
    assert cell_digests({"__g0": ["N"]}, space, {"__s0": count}) == [
        cell_identity(space, count, {"__g0": "N"}).digest
    ]


def test_prefetching_stops_at_its_limit():
    count = CellMechanism("*", calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=1)))
    stage = _Stage(relation="r", keys=("k",), table="t", scope="s",
                   statistics=(_Stat("__s0", "*", count.calibration),))  # fmt: skip
    asked: list[list[str]] = []
    big = [list(range(PREFETCHED_CELLS + 1))]
    prefetching(lambda d: asked.append(list(d)) or {}, [stage], data_versions={"t": "v"},
                domains={"r": big})(["stat"])  # fmt: skip
    assert asked == [["stat"]]


class _Stat:
    def __init__(self, column, measure, calibration):
        self.column, self.measure, self.calibration = column, measure, calibration


class _Stage:
    def __init__(self, *, relation, keys, table, scope, statistics):
        self.relation, self.keys, self.table, self.scope = relation, keys, table, scope
        self.statistics = statistics


def _engine_texts(monkeypatch) -> list[str]:
    """The SQL texts the guard runs through ``engines.duckdb.run`` (exact cells, answers)."""
    from sqlsdc.engines import duckdb as engine

    texts: list[str] = []
    real = engine.run

    def run(con, sql, *args, **kwargs):
        texts.append(sql)
        return real(con, sql, *args, **kwargs)

    monkeypatch.setattr(engine, "run", run)
    return texts


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, sex, COUNT(*) AS n, SUM(income) AS s FROM persons "
        "WHERE age > 30 GROUP BY region, sex ORDER BY 1, 2",
        "SELECT sex, AVG(income) AS mean FROM persons GROUP BY sex ORDER BY 1",
    ],
    ids=["count-and-sum", "average"],
)
def test_a_repeated_query_is_answered_from_the_cache_without_its_exact_cells(
    dp_db, monkeypatch, sql
):
    texts = _engine_texts(monkeypatch)
    with sqlsdc.connect(dp_db, "ana") as con:
        first = con.execute(sql)
        values, schema, accuracy = first.fetchall(), first.arrow().schema, first.cell_accuracy()
        ran_first = len(texts)
        # income scanned once per opening (sqlsdc.guard.summable), the exact cells, then the
        # answer over the noisy ones
        assert ran_first == 3
        spent = [s.spent for s in con.remaining_budget()]
        again = con.execute(sql)
        assert len(texts) == ran_first + 1  # the answer only
        assert again.fetchall() == values and again.arrow().schema == schema
        assert again.cell_accuracy().equals(accuracy)
        assert [s.spent for s in con.remaining_budget()] == spent
    with sqlsdc.connect(dp_db, "ana") as other:  # a new opening: key types unknown, computed
        assert other.execute(sql).fetchall() == values
        assert len(texts) == ran_first + 1 + 3


def test_cells_not_all_released_before_are_computed(dp_db, monkeypatch):
    """A filter seen before with a new aggregate: the cached counts alone do not answer it."""
    texts = _engine_texts(monkeypatch)
    with sqlsdc.connect(dp_db, "ana") as con:
        con.execute("SELECT sex, COUNT(*) FROM persons GROUP BY sex").fetchall()
        counts = len(texts)
        both = con.execute("SELECT sex, COUNT(*), SUM(income) FROM persons GROUP BY sex")
        assert len(texts) == counts + 3 and len(both.fetchall()) == 2  # income scanned first
        private = "SELECT clinic, COUNT(*) FROM visits GROUP BY clinic ORDER BY 1"
        first = con.execute(private).fetchall()
        ran = len(texts)
        assert con.execute(private).fetchall() == first
        # private groups: the groups released before and their cells answer, without the
        # exact cells, whose running time told a population of one row from an empty one
        # when they ran again at every asking (red team s37b)
        assert len(texts) == ran + 1


def test_other_guarded_connections_open_in_the_process_keep_the_cache_answering(dp_db, monkeypatch):
    """Guarded connections never write the tables' data, so several open at once in one
    process (a server's sessions) do not make each DP query read its data versions again: a
    repeated query is still answered from the cache. A connection that may write data, opened
    meanwhile, makes the next query compute again."""
    texts = _engine_texts(monkeypatch)
    sql = "SELECT sex, COUNT(*) FROM persons GROUP BY sex ORDER BY 1"
    with sqlsdc.connect(dp_db, "ana") as ana, sqlsdc.connect(dp_db, "bob") as bob:
        first = ana.execute(sql).fetchall()
        bob.execute(sql).fetchall()
        ran = len(texts)
        assert ana.execute(sql).fetchall() == first and len(texts) == ran + 1
        open_database(dp_db).close()  # an admin's connection (it could have changed data)
        assert ana.execute(sql).fetchall() == first and len(texts) == ran + 3


def test_the_first_dp_query_of_an_opening_does_not_read_the_policy_version_again(
    dp_db, monkeypatch
):
    """The opening has just read the policy in force, so its first DP query does not read the
    version again; a connection that may write the file (an admin's), opened in the process
    since, makes the next DP query read it."""
    checked: list[int] = []
    real = dp_charge.check_policy

    def check(con, version):
        checked.append(version)
        return real(con, version)

    monkeypatch.setattr(dp_charge, "check_policy", check)
    sql = "SELECT sex, COUNT(*) FROM persons GROUP BY sex ORDER BY 1"
    with sqlsdc.Connection(dp_db, "ana", idle_release=None) as con:
        first = con.execute(sql).fetchall()
        assert checked == []
        open_database(dp_db).close()
        assert con.execute(sql).fetchall() == first
        assert checked == [con.policy_version]


def test_a_policy_applied_in_the_process_after_the_opening_stops_the_first_charge(tmp_path):
    """A policy an admin applies in the process between a connection's opening and its first
    DP query: that query is refused before anything is charged, the next one runs under the
    new policy."""
    path = tmp_path / "applied.duckdb"
    make_db(path, dp_document())
    sql = "SELECT sex, COUNT(*) FROM persons GROUP BY sex ORDER BY 1"
    with sqlsdc.Connection(path, "ana", idle_release=None) as con:
        version = con.policy_version
        newer = dp_document(user="*", epsilon=500, rho=100, delta="1e-3")
        sqlsdc.admin.apply(path, load_policy(newer), user="admin")
        with pytest.raises(sqlsdc.OperationalError, match=f"version {version + 1} was applied"):
            con.execute(sql)
        assert spend_rows(path, "ana") == []
        assert len(con.execute(sql).fetchall()) == 2
        assert con.policy_version == version + 1
    assert len(spend_rows(path, "ana")) == 1


def test_a_dp_stage_names_the_tables_its_exact_cells_read(dp_db):
    """Found once by the check (``DpStage.reads``; the names of its CTEs too, which declare
    nothing): the declared ones name the data versions in its cells' identities."""
    with sqlsdc.connect(dp_db, "ana") as con:
        alone = con.explain("SELECT sex, COUNT(*) FROM persons GROUP BY sex")
        joined = con.explain(
            "SELECT p.sex, COUNT(*) FROM persons p JOIN lookup l ON p.region = l.code "
            "WHERE l.label = 'north' GROUP BY p.sex"
        )
    (one,), (both,) = alone.dp_stages, joined.dp_stages
    assert "persons" in one.reads and "lookup" not in one.reads
    assert {"persons", "lookup"} <= both.reads and "visits" not in both.reads
