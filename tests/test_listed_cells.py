"""The answer over noisy cells given as list parameters (:mod:`sqlsdc.guard.listed_cells`) is
the answer over the registered cells: the same rows, values and types, or the registered path
where lists cannot give them."""

from __future__ import annotations

import datetime as dt
import shutil
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from test_dp_query import dp_document, make_db

import sqlsdc
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_schema, duckdb_sql
from sqlsdc.guard import connection as guard_connection
from sqlsdc.guard import listed_cells
from sqlsdc.guard.listed_cells import listed

CELLS = pa.table({
    "__g0": pa.array(["R01", "é \"q\"", None]),
    "__g1": pa.array([1, -2, None], pa.int8()),
    "__g2": pa.array([2**64 - 1, 0, 5], pa.uint64()),
    "__g3": pa.array([dt.date(2020, 1, 2), None, dt.date(1, 1, 1)]),
    "__g4": pa.array([dt.datetime(2020, 1, 2, 3, 4, 5, 123456), None, None], pa.timestamp("us")),
    "__a0": pa.array([10, None, -3]),
    "__a1": pa.array([1.1, float("nan"), -0.0], pa.float32()),
    "__a2": pa.array([1 / 3, 1e300, None]),
    "__a3": pa.array([Decimal("1.500"), Decimal("-0.001"), None], pa.decimal128(18, 3)),
    "__a4": pa.array([Decimal("1234567890123456789012345678.0123456789"), Decimal("-1E-10"),
                      None], pa.decimal128(38, 10)),  # fmt: skip
    "__p0": pa.array([True, None, False]),
})  # fmt: skip
ANSWER = (
    "SELECT __cells.__g0 AS g, __cells.* EXCLUDE (__g0), __cells.__a0 + 1 AS more FROM "
    "(SELECT * FROM __sqlsdc_dp_cells_0) AS __cells JOIN __sqlsdc_dp_cells_1 AS other "
    "ON other.n = __cells.__g1 ORDER BY 1, 2, 3"
)
OTHER = pa.table({"n": pa.array([1, -2], pa.int8())})


def _same(a: pa.Table, b: pa.Table) -> bool:
    """The same types and values, NaN and -0.0 included (Arrow's equality: NaN != NaN)."""
    return a.schema == b.schema and repr(a.to_pylist()) == repr(b.to_pylist())


def _registered(con, sql, relations):
    for name, table in relations.items():
        engine.register(con, name, table)
    try:
        return engine.run(con, sql)
    finally:
        for name in relations:
            con.unregister(name)


def test_lists_give_the_registered_answer_for_every_plain_type():
    """Two relations (one read through a subquery, one joined under an alias), keys and
    values of every type the lists take, NULLs, NaN and -0.0: the same Arrow table."""
    relations = {"__sqlsdc_dp_cells_0": CELLS, "__sqlsdc_dp_cells_1": OTHER}
    sql = duckdb_sql.to_sql(sqlglot.parse_one(ANSWER, dialect="duckdb"))  # as the guard prints it
    con = duckdb.connect()
    try:
        text, checked, params = listed(sql, relations)
        assert duckdb_schema.tables_read_by(con, checked) == set()  # no table, no view: DuckDB says
        assert "$" not in checked and "$1" in text and len(params) == 12
        by_lists = engine.run(con, text, params=params)
        by_views = _registered(con, sql, relations)
        assert _same(by_lists, by_views) and by_lists.num_rows == 2
        views = "SELECT count(*) FROM duckdb_views() WHERE view_name LIKE '__sqlsdc%'"
        assert con.execute(views).fetchone() == (0,)
    finally:
        con.close()


@pytest.mark.parametrize(
    "relations",
    [
        {
            "__sqlsdc_dp_cells_0": pa.table(
                {"x": pa.array([Decimal(1)], pa.decimal128(38, 0)).cast(pa.decimal128(38, 0))}
            )
        },  # fmt: skip
        {"__sqlsdc_dp_cells_0": pa.table({"x": list(range(listed_cells.LISTED_ROWS + 1))})},
        {"__sqlsdc_dp_cells_0": pa.table({"x": pa.array([1], pa.timestamp("ns"))})},
        {"__sqlsdc_dp_cells_0": pa.table({"x": [[1, 2]]})},
    ],
    ids=["wide-integer", "many-rows", "nanoseconds", "nested"],
)
def test_cells_lists_cannot_give_exactly_stay_registered(relations):
    table = relations["__sqlsdc_dp_cells_0"]
    if table.column_names == ["x"] and pa.types.is_decimal(table.field(0).type):
        field = table.field(0).with_metadata({b"sqlsdc.engine_type": b"HUGEINT"})
        relations = {"__sqlsdc_dp_cells_0": table.cast(pa.schema([field]))}
    assert listed("SELECT x FROM __sqlsdc_dp_cells_0", relations) is None


def test_a_text_that_does_not_print_back_or_names_no_relation_stays_registered():
    relations = {"__sqlsdc_dp_cells_0": pa.table({"x": [1]})}
    assert listed("select x from __sqlsdc_dp_cells_0", relations) is None  # prints otherwise
    assert listed("SELECT 1 AS x", relations) is None  # the relation is not read by name
    long = f"SELECT x FROM __sqlsdc_dp_cells_0 WHERE x <> '{'y' * listed_cells.LISTED_CHARACTERS}'"
    assert listed(long, relations) is None  # not kept: memory
    assert listed("SELECT x FROM __sqlsdc_dp_cells_0", relations)[0] == (
        'SELECT x FROM (SELECT UNNEST(CAST($1 AS BIGINT[])) AS "x") AS __sqlsdc_dp_cells_0'
    )


def _counting(register, names: list):
    def counted(con, name, table):
        names.append(name)
        return register(con, name, table)

    return counted


@pytest.fixture(scope="module")
def dp_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("listed") / "dp.duckdb"
    make_db(path, dp_document())
    return path


QUERIES = [
    "SELECT region, COUNT(*) AS n FROM persons GROUP BY region",
    "SELECT region, AVG(income) AS m, SUM(income) AS s FROM persons GROUP BY region",
    "SELECT COUNT(*) AS n FROM persons",
    "SELECT clinic, COUNT(*) AS n FROM visits GROUP BY clinic",  # private groups
]


def test_a_dp_answer_is_the_same_over_lists_and_over_registered_cells(dp_source, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    """The same questions by two users of copies of one database, one with the lists and one
    with registered cells only: the same rows and types (the noise is a function of the
    cell and the user, so the user is the same in both copies)."""
    answers = {}
    for label in ("lists", "views"):
        db = tmp_path / f"{label}.duckdb"
        shutil.copy(dp_source, db)
        if label == "views":
            monkeypatch.setattr(guard_connection, "listed", lambda sql, relations: None)
        registered = []
        monkeypatch.setattr(engine, "register", _counting(engine.register, registered))
        with sqlsdc.connect(db, "ana") as con:
            answers[label] = [con.execute(sql).fetch_arrow_table() for sql in QUERIES]
        # with lists, only the SUM's cells (HUGEINT: its values arrive as Decimal) registered
        assert len(registered) == (1 if label == "lists" else len(QUERIES))
    for by_lists, by_views in zip(answers["lists"], answers["views"], strict=True):
        assert _same(by_lists, by_views)
