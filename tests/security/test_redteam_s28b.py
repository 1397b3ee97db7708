"""Red-team round of session 28 (second), against the canonical identity of a DP population
(``planner/identity``) and the name resolution it relies on: every canonicalisation step asked
whether two queries of different answers could get one identity (one noise over two exact
values gives two colluding analysts, or one analyst and a rephrasing, the exact difference).

What succeeded, and was closed: two outputs of one name in a derived table (DuckDB reads
``q.x_1`` as the second ``x``, sqlglot and the guard as the output written ``x_1``: a grouping
by income checked as one by sex, released in the clear under CKM and with the noise of the
population by sex under DP); an output alias in the ORDER BY of a described query (``ORDER
BY x`` was written ``"?"."x"`` beside a select list without names, so two queries that swap
the aliases of two outputs, and limit to other rows, had one description); a number literal
of more than 38 digits with a decimal point (a DOUBLE to DuckDB, exact once normalised:
``x > 1.000...0`` had the identity of ``x > 1``). Each test asserts the safe outcome.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from contextlib import closing
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import build_scope
from test_dp_query import dp_document, make_db
from test_redteam_s28 import _scope

import sqlsdc
from sqlsdc.engines.duckdb import open_database
from sqlsdc.engines.duckdb_schema import data_version
from sqlsdc.guard.parse import parse_statement
from sqlsdc.planner.identity import aggregation_identity


@pytest.fixture(scope="module")
def dp_db(tmp_path_factory):
    """Users ana and bob, DP counts of persons (``test_dp_query``)."""
    path = tmp_path_factory.mktemp("s28b") / "dp.duckdb"
    make_db(path, dp_document())
    return path


@pytest.fixture(scope="module")
def ana(dp_db):
    with closing(sqlsdc.connect(dp_db, "ana")) as con:
        yield con


@pytest.fixture(scope="module")
def raw(dp_db):
    with closing(open_database(dp_db)) as con:  # sqlsdc's settings: one instance per file
        yield con


COUNTS = "SELECT sex, COUNT(*) FROM persons WHERE {} GROUP BY sex"


# --- two outputs of one name: DuckDB renames the second ---------------------------------------


def test_duckdb_reads_a_renamed_duplicate_as_the_second_output():
    """Why the guard refuses: DuckDB names the outputs x, x_1, x_1_1 and binds ``q.x_1`` to
    the second ``x``, where sqlglot binds it to the output written ``x_1``."""
    con = duckdb.connect()
    sql = "SELECT q.x_1 FROM (SELECT 'code' AS x, 'label' AS x, 'third' AS x_1) AS q"
    assert con.execute(sql).fetchall() == [("label",)]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT q.x_1, COUNT(*) FROM (SELECT pid, sex AS x, income AS x, sex AS x_1 "
        "FROM persons) AS q GROUP BY q.x_1",
        "SELECT q.x, COUNT(*) FROM (SELECT pid, income AS x, sex AS X FROM persons) AS q "
        "GROUP BY q.x",
        "WITH q AS (SELECT pid, sex AS x, income AS x, sex AS x_1 FROM persons) "
        "SELECT q.x_1, COUNT(*) FROM q GROUP BY q.x_1",
        "SELECT q.sex, COUNT(*) FROM (SELECT income, sex FROM persons) AS q(sex) GROUP BY q.sex",
        "SELECT sex, COUNT(*) FROM persons WHERE region IN (SELECT x_1 FROM (SELECT code AS x, "
        "label AS x, code AS x_1 FROM lookup UNION ALL SELECT code, code, code FROM lookup)) "
        "GROUP BY sex",
    ],
    ids=["derived", "case", "cte", "alias-list", "set-operation"],
)
def test_two_outputs_of_one_name_in_a_derived_table_are_refused(ana, sql):
    """Grouping by ``q.x_1`` was checked as a grouping by sex and ran as one by income: the
    DP cells of sex got the noise of the population by sex over exact counts of 0."""
    with pytest.raises(sqlsdc.PolicyViolation, match="two outputs of a derived table"):
        ana.explain(sql)


def test_repeated_names_that_name_nothing_are_allowed(ana):
    """The result's own headings and a later part of a set operation name nothing."""
    assert ana.explain("SELECT sex AS x, region AS x, COUNT(*) FROM persons GROUP BY 1, 2")
    sql = COUNTS.format("region IN (SELECT x FROM (SELECT code AS x, label AS y FROM lookup "
                        "UNION ALL SELECT code, code FROM lookup))")  # fmt: skip
    assert _scope(ana, sql)


def test_duplicate_names_do_not_release_a_measure_under_ckm(analyst):
    """The demo's counts use the cell key method: the grouping ran by income and released
    income values as keys."""
    with pytest.raises(sqlsdc.PolicyViolation, match="two outputs of a derived table"):
        analyst.execute(
            "SELECT q.x_1, COUNT(*) FROM (SELECT person_id, sex AS x, income AS x, sex AS x_1 "
            "FROM persons) AS q GROUP BY q.x_1"
        )


def test_duckdb_renames_a_table_s_first_columns_by_an_alias_list():
    con = duckdb.connect()
    con.execute("CREATE TABLE persons AS SELECT 7 AS pid, 'm' AS sex")
    assert con.execute("SELECT p.sex FROM persons AS p(sex)").fetchall() == [(7,)]


@pytest.mark.parametrize(
    "source",
    ["persons AS p(sex)", "persons p(x, y)", "(SELECT 1) AS d JOIN persons AS p(sex) ON TRUE"],
)
def test_column_aliases_on_a_table_are_refused(ana, source):
    """``persons AS p(sex)`` names the first column, the identifier, ``sex``: grouped by
    ``p.sex``, checked as a grouping by sex, it ran as one by the identifier."""
    with pytest.raises(sqlsdc.PolicyViolation, match="column aliases on a table"):
        ana.explain(f"SELECT p.sex, COUNT(*) FROM {source} GROUP BY p.sex")


def test_column_aliases_on_a_table_release_no_identifier_under_ckm(analyst):
    with pytest.raises(sqlsdc.PolicyViolation, match="column aliases on a table"):
        analyst.execute("SELECT p.sex, COUNT(*) FROM persons AS p(sex) GROUP BY p.sex")


def test_column_aliases_on_a_derived_table_rename_its_outputs(ana, raw):
    sql = "SELECT q.x, COUNT(*) FROM (SELECT sex, income FROM persons) AS q(x) GROUP BY q.x"
    plain = "SELECT sex, COUNT(*) FROM persons GROUP BY sex"
    assert sorted(raw.execute(sql).fetchall()) == sorted(raw.execute(plain).fetchall())
    assert _scope(ana, sql) == _scope(ana, plain)


# --- an output alias in ORDER BY of a described query ------------------------------------------

FIRST = "CASE WHEN code = 'N' THEN 'z' ELSE 'a' END"  # sorts S first, where code sorts N first


@pytest.mark.parametrize(
    "template",
    [
        "region IN (SELECT {a} FROM (SELECT code AS {a}, {f} AS {b} FROM lookup "
        "ORDER BY x LIMIT 1))",
        "region IN (SELECT {a} FROM (SELECT code AS {a}, {f} AS {b} FROM lookup UNION ALL "
        "SELECT code, {f} FROM lookup ORDER BY x LIMIT 1))",
    ],
    ids=["select", "set-operation"],
)
def test_an_order_by_alias_names_its_output_in_the_identity(ana, raw, template):
    """ORDER BY x over outputs whose aliases are swapped: other rows, so other populations
    (region N and region S), which had one identity and so one noise."""
    by_code = COUNTS.format(template.format(a="x", b="y", f=FIRST))
    by_case = COUNTS.format(template.format(a="y", b="x", f=FIRST))
    assert raw.execute(by_code).fetchall() != raw.execute(by_case).fetchall()
    assert _scope(ana, by_code) != _scope(ana, by_case)


def test_an_order_by_alias_and_its_position_are_one_identity(ana):
    by_name = COUNTS.format(f"region IN (SELECT x FROM (SELECT code AS x, {FIRST} AS y FROM "
                            "lookup ORDER BY y LIMIT 1))")  # fmt: skip
    assert _scope(ana, by_name) == _scope(ana, by_name.replace("ORDER BY y", "ORDER BY 2"))


def test_duckdb_reads_a_name_inside_an_order_by_expression_as_a_column():
    """Alone, ``label`` is the output (lookup.code); inside ``label || ''``, the column."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE lookup AS SELECT * FROM (VALUES ('N', 'b'), ('S', 'a')) v(code, label)"
    )
    select = "SELECT code AS label FROM lookup ORDER BY {} LIMIT 1"
    assert con.execute(select.format("label")).fetchall() == [("N",)]
    assert con.execute(select.format("label || ''")).fetchall() == [("S",)]


@pytest.mark.parametrize(
    "order", ["label || ''", "-LENGTH(label)", "CASE WHEN label = 'N' THEN 0 END, label"]
)
def test_an_output_name_inside_an_order_by_expression_is_refused(ana, order):
    """The identity (and sqlglot) read it as the output, DuckDB as the column of that name:
    ``ORDER BY label || ''`` over ``code AS label`` ordered by the label and had the identity
    of an order by the code; a hidden column of that name would have been read."""
    sql = COUNTS.format(
        f"region IN (SELECT label FROM (SELECT code AS label, label AS x FROM lookup "
        f"ORDER BY {order} LIMIT 1))"
    )
    with pytest.raises(sqlsdc.PolicyViolation, match="inside an ORDER BY expression"):
        ana.explain(sql)


def test_an_output_that_is_its_own_column_may_stand_in_an_order_by_expression(ana):
    """``code`` of ``SELECT code`` is read alike as the output and as the column."""
    within = "region IN (SELECT code FROM (SELECT code, label FROM lookup ORDER BY {} LIMIT 1))"
    by_expression = _scope(ana, COUNTS.format(within.format("code || ''")))
    assert by_expression != _scope(ana, COUNTS.format(within.format("label || ''")))


# --- number literals that DuckDB reads as DOUBLE ----------------------------------------------

SCHEMA = {"t": {"region": "VARCHAR", "month": "INT", "amount": "DOUBLE"}}
LONG = "1." + "0" * 40  # 41 digits: a DOUBLE to DuckDB; 1.0 and 1 are DECIMAL and INTEGER
FINE = "TRY_CAST(CAST(age AS VARCHAR) || '.00000000000000000001' AS DECIMAL(38, 20))"


def _predicates(where: str) -> list[str]:
    sql = f"SELECT region, COUNT(*) FROM t WHERE {where} GROUP BY region"
    tree = qualify(parse_statement(sql), schema=SCHEMA, dialect="duckdb")
    annotate_types(tree, schema=SCHEMA)
    return json.loads(aggregation_identity(build_scope(tree)).population.text)["predicates"]


def test_duckdb_compares_a_long_literal_as_a_double():
    con = duckdb.connect()
    assert con.execute(f"SELECT typeof({LONG}), typeof(1.{'0' * 37})").fetchone() == (
        "DOUBLE",
        "DECIMAL(38,37)",
    )
    fine = "CAST('1.00000000000000000001' AS DECIMAL(38, 20))"
    assert con.execute(f"SELECT {fine} > {LONG}, {fine} > 1").fetchone() == (False, True)


@pytest.mark.parametrize("literal", [LONG, "0" * 39 + "1.5", "1.5" + "0" * 40])
def test_a_double_literal_keeps_its_spelling(literal):
    short = format(float(literal), "g")
    assert _predicates(f"month > {literal}") != _predicates(f"month > {short}")
    assert _predicates("month > 1.0") == _predicates("month > 1")  # DECIMAL and INTEGER: one


def test_a_long_literal_and_its_short_form_get_two_noises(ana, raw):
    long, short = COUNTS.format(f"{FINE} > {LONG}"), COUNTS.format(f"{FINE} > 1")
    assert raw.execute(long).fetchall() != raw.execute(short).fetchall()
    assert _scope(ana, long) != _scope(ana, short)


# --- a CTE read twice in one block ------------------------------------------------------------

JOINED = {"t": {"region": "VARCHAR", "month": "INT"}, "l": {"code": "VARCHAR", "label": "VARCHAR"}}


def _population(sql: str) -> str:
    tree = qualify(parse_statement(sql), schema=JOINED, dialect="duckdb")
    annotate_types(tree, schema=JOINED)
    return aggregation_identity(build_scope(tree)).population.text


def test_a_cte_read_twice_keeps_its_two_readings_apart():
    """One scope has one set of column resolutions: both readings of ``c`` took the second's,
    so ``a.code`` read as ``b.code`` and the population was that of t.region = 'N' with an
    unconstrained l, not of every region of l."""
    twice = (
        "WITH c AS (SELECT * FROM l) SELECT t.region, COUNT(*) FROM t "
        "JOIN c AS a ON t.region = a.code JOIN c AS b ON b.code = 'N' GROUP BY t.region"
    )
    only_n = (
        "SELECT t.region, COUNT(*) FROM t JOIN l AS a ON TRUE "
        "JOIN l AS b ON t.region = b.code AND b.code = 'N' GROUP BY t.region"
    )
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES ('N', 1), ('S', 2)) AS v(region, month)")
    con.execute("CREATE TABLE l AS SELECT * FROM (VALUES ('N', 'n'), ('S', 's')) AS v(code, label)")
    assert con.execute(twice).fetchall() != con.execute(only_n).fetchall()
    assert _population(twice) != _population(only_n)


# --- parameters that are not finite numbers -----------------------------------------------------


def test_a_non_finite_parameter_is_a_double_not_a_name(ana):
    """``inf`` and ``nan`` were bound as bare number literals, which DuckDB reads as column
    names (a column of that name, hidden ones too, would be read; none: the engine fails)."""
    assert duckdb.connect().execute("SELECT inf FROM (SELECT 7 AS inf)").fetchall() == [(7,)]
    sql = "SELECT sex, COUNT(*) FROM persons WHERE income < ? GROUP BY sex"
    for value, spelled in ((float("inf"), "'inf'"), (Decimal("-Infinity"), "'-inf'"),
                           (float("nan"), "'nan'"), (Decimal("sNaN"), "'nan'")):  # fmt: skip
        assert len(ana.execute(sql, (value,)).fetchall()) == 2
        (stage,) = ana.explain(sql, (value,)).dp_stages
        assert f"CAST({spelled} AS DOUBLE)" in stage.sql


# --- the session's time zone: one question, one value in every process --------------------------

TZ_QUESTION = (
    "SELECT sex, COUNT(*) FROM persons WHERE age < 10 OR EXTRACT(hour FROM TIMESTAMPTZ "
    "'2020-01-01 00:00:00+00') = 9 GROUP BY sex ORDER BY sex"
)
TZ_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import sqlsdc
from test_dp_query import dp_document, make_db
make_db(sys.argv[1], dp_document())
con = sqlsdc.connect(sys.argv[1], "admin")
con.set_dp_noise(False)
print(repr((con.execute({sql!r}).fetchall(), con.explain({sql!r}).dp_stages[0].scope)))
"""


def test_a_process_s_time_zone_does_not_change_a_cell(dp_db, tmp_path):
    """DuckDB takes the session's time zone from the process (TZ): the hour of a TIMESTAMPTZ,
    its date and its truncation differ between processes while the question, its identity and
    so its noise are the same; two analysts in two processes got two exact values under one
    noise. The guard's engine sets UTC."""
    tests = str(Path(__file__).resolve().parents[1])
    script = TZ_SCRIPT.format(tests=tests, sql=TZ_QUESTION)
    env = {**os.environ, "TZ": "Asia/Tokyo"}
    command = [sys.executable, "-c", script, str(tmp_path / "tokyo.duckdb")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=True)
    tokyo_rows, tokyo_scope = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    con = sqlsdc.connect(dp_db, "admin")
    try:
        con.set_dp_noise(False)
        here = con.execute(TZ_QUESTION).fetchall()
        assert tokyo_scope == con.explain(TZ_QUESTION).dp_stages[0].scope  # one noise...
    finally:
        con.close()
    assert tokyo_rows == here  # ...over one exact value


# --- the data version of a table with a column of its own name ----------------------------------


def test_a_column_named_as_its_table_does_not_freeze_the_data_version():
    """``hash("visits")`` of a table with a column ``visits`` is the hash of that column: an
    update of any other column kept the version, so the old noise came back over the new
    exact value (two analysts, before and after, had the exact change)."""
    con = duckdb.connect()
    con.execute("CREATE TABLE visits (visits INTEGER, cost DOUBLE)")
    con.execute("CREATE TABLE plain (n INTEGER, cost DECIMAL(9, 1))")  # no float: test_redteam_s28d
    con.execute("INSERT INTO visits VALUES (1, 1.0)")
    con.execute("INSERT INTO plain VALUES (1, 1.0)")
    before = data_version(con, "visits")
    con.execute("UPDATE visits SET cost = 999")
    assert data_version(con, "visits") != before
    (row_hash,) = con.execute("SELECT hash(plain) FROM plain").fetchone()
    assert data_version(con, "plain") == f"1:{row_hash}:{row_hash}"  # as before the fix


# --- a column the identity cannot resolve is an error, not its verbatim text ---------------------


def test_an_unresolved_column_fails_closed():
    """A correlated column (the analysis refuses the query before, this is the identity alone)
    was written ``"?t"."region"``: the alias as written, whatever it stood for, so two
    meanings of ``t`` shared one text."""
    correlated = (
        "SELECT t.region, COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM l WHERE l.code = t.region) "
        "GROUP BY t.region"
    )
    with pytest.raises(sqlsdc.InternalError, match="could not be resolved for the cell identity"):
        _population(correlated)
