"""The guard's work is bounded by the size of the statement (ISSUE18 must-have 6).

Long AND/OR chains are checked in time linear in their length (they are balanced, and large
predicates skip sqlglot's pairwise simplifier), a statement nested too deeply is refused as too
complex instead of failing with RecursionError, a statement longer than the policy's
``limits.max_statement_characters`` is refused before parsing, and the statement timeout counts
the check as well as the engine. Timings are asserted only in ``benchmarks/bench_guard.py``.
"""

from __future__ import annotations

import shutil
import time

import pytest

import sqlsdc
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.guard.parse import MAX_DEPTH, MAX_SELECTS, parse_statement
from sqlsdc.planner.connectors import depth
from sqlsdc.policy import load_policy

TERMS = 1_500  # deeper than Python's recursion limit when left unbalanced
GROUPED = "SELECT region, COUNT(*) AS n FROM persons WHERE {} GROUP BY region ORDER BY region"


def _sorted(rows):
    return sorted(rows, key=repr)


@pytest.mark.parametrize(
    ("condition", "equivalent"),
    [
        (" OR ".join(f"age = {i}" for i in range(TERMS)), f"age BETWEEN 0 AND {TERMS - 1}"),
        (" AND ".join(f"age <> {i}" for i in range(TERMS, 2 * TERMS)), "age < 1500 OR age > 2999"),
        ("age IN (" + ", ".join(str(i) for i in range(TERMS)) + ")", f"age < {TERMS}"),
    ],
    ids=["or-chain", "and-chain", "in-list"],
)
def test_long_chains_are_checked_and_answer_like_their_short_form(analyst, condition, equivalent):
    long_rows = analyst.execute(GROUPED.format(condition)).fetchall()
    short_rows = analyst.execute(GROUPED.format(equivalent)).fetchall()
    assert long_rows == short_rows
    assert len(long_rows) > 1


def test_a_chain_is_balanced_and_keeps_its_meaning():
    condition = " OR ".join(f"x > {i}" for i in range(TERMS))
    tree = parse_statement(f"SELECT 1 FROM t WHERE {condition} AND y = 1")
    assert depth(tree) < 20
    where = tree.args["where"].this
    assert where.sql() == f"{condition} AND y = 1"  # the OR chain under the AND, as written


def test_an_or_chain_in_parentheses_under_and_keeps_its_parentheses():
    condition = "(" + " OR ".join(f"x > {i}" for i in range(40)) + ")"
    sql = f"SELECT 1 FROM t WHERE {' AND '.join([condition] * 20)}"
    assert parse_statement(sql).sql() == sql


@pytest.mark.parametrize("levels", [MAX_DEPTH, 5_000])
def test_deep_nesting_is_refused_as_too_complex(analyst, levels):
    sql = "SELECT COUNT(*) FROM persons WHERE " + "(" * levels + "age = 1" + ")" * levels
    with pytest.raises(sqlsdc.PolicyViolation, match="too complex: it is nested too deeply"):
        analyst.execute(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "WITH "
        + ", ".join(
            f"c{i} AS (SELECT region, COUNT(*) AS n FROM persons WHERE age = {i} GROUP BY region)"
            for i in range(MAX_SELECTS)
        )
        + " SELECT * FROM c0",
        "WITH c0 AS (SELECT * FROM persons), "
        + ", ".join(
            f"c{i} AS (SELECT * FROM c{i - 1} WHERE age > {i})" for i in range(1, MAX_SELECTS)
        )
        + f" SELECT region, COUNT(*) FROM c{MAX_SELECTS - 1} GROUP BY region",
        "SELECT region, COUNT(*) FROM persons WHERE "
        + " OR ".join(
            f"age IN (SELECT age FROM persons WHERE age = {i})" for i in range(MAX_SELECTS)
        )
        + " GROUP BY region",
    ],
    ids=["ctes", "chained-ctes", "subqueries"],
)
def test_a_statement_of_too_many_selects_is_refused_as_too_complex(analyst, sql, monkeypatch):
    """Every SELECT block (the outer one too) is a scope that sqlglot's resolution and the
    analysis walk against the others (CTEs: each sees every one before it), so checking a
    100 KB statement of a thousand CTEs took 16-22 s of CPU (red team s37); more than
    :data:`MAX_SELECTS` blocks are refused right after parsing, before any such pass."""
    from sqlsdc.guard import resolve

    monkeypatch.setattr(resolve, "qualify", lambda *args, **kwargs: pytest.fail("qualified"))
    with pytest.raises(sqlsdc.errors.SqlSyntaxError,
                       match=rf"too complex: it has {MAX_SELECTS + 1} SELECT blocks.*at most "
                             rf"{MAX_SELECTS}"):  # fmt: skip
        analyst.execute(sql)


def test_a_long_arithmetic_chain_is_refused_as_too_complex(analyst):
    sql = "SELECT SUM(" + " + ".join(["income"] * 2_000) + ") FROM persons"
    with pytest.raises(sqlsdc.PolicyViolation, match="too complex"):
        analyst.execute(sql)


@pytest.fixture
def limited_db(pristine_demo_db, tmp_path):
    """The demo database with a policy limiting statements to 2,000 characters."""
    path = tmp_path / "limited.duckdb"
    shutil.copy(pristine_demo_db, path)
    con = open_database(path)
    try:
        document = store.current_policy(con)[1]
    finally:
        con.close()
    document["limits"] = {"max_statement_characters": 2_000}
    sqlsdc.admin.apply(path, load_policy(document), user="admin")
    return path


def test_a_statement_over_the_size_limit_is_refused_before_parsing(limited_db):
    fits = GROUPED.format(" OR ".join(f"age = {i}" for i in range(100)))
    too_long = GROUPED.format(" OR ".join(f"age = {i}" for i in range(300)))
    assert len(fits) <= 2_000 < len(too_long)
    with sqlsdc.connect(limited_db, user="analyst") as con:
        assert con.execute(fits).fetchall()
        with pytest.raises(
            sqlsdc.PolicyViolation,
            match=rf"is {len(too_long):,} characters long; the limit is 2,000.*"
            r"limits.max_statement_characters",
        ):
            con.execute(too_long)


def test_the_size_limit_has_a_default_and_is_validated():
    document = {"tables": {"t": {"kind": "public", "columns": {"a": {"role": "dimension"}}}},
                "users": {"root": {"role": "admin"}}}  # fmt: skip
    assert load_policy(document).max_statement_characters == 1_000_000
    with pytest.raises(sqlsdc.PolicyError, match="max_statement_characters: 10 is below"):
        load_policy({**document, "limits": {"max_statement_characters": 10}}, name="p.yaml")


def test_the_statement_timeout_counts_the_check(demo_db):
    """A check longer than the statement timeout stops the statement with the timeout error,
    before anything runs in the engine."""
    sql = GROUPED.format(" OR ".join(f"age = {i}" for i in range(TERMS)))
    with sqlsdc.connect(demo_db, user="analyst", timeout=1e-6) as con:
        with pytest.raises(sqlsdc.OperationalError, match="longer than the statement timeout"):
            con.execute(sql)


def test_a_statement_is_checked_before_the_database_file_is_taken(demo_db, monkeypatch):
    """A long statement is parsed and checked (its constants evaluated too) while the
    connection holds neither its lock nor the file (released while idle), so it holds up no
    other thread or process; the query checked is the one run (the answer is the
    statement's), and a refusal is audited as before."""
    from sqlsdc.admin import audit
    from sqlsdc.engines import duckdb as engine
    from sqlsdc.guard import pipeline

    seen = []

    def watched(function):
        def watching(*args):
            seen.append((function.__name__, con._db is None, con._lock._is_owned()))
            return function(*args)

        return watching

    for module, name in ((pipeline, "parse_statement"), (pipeline, "analyze"),
                         (pipeline, "plan_query"), (engine, "evaluate_constant")):  # fmt: skip
        monkeypatch.setattr(module, name, watched(getattr(module, name)))
    chain = " OR ".join(f"age = {i}" for i in range(1, TERMS))  # not in the check cache
    sql = GROUPED.format(f"({chain}) AND region <> ('R' || 'X')")  # a constant
    con = sqlsdc.Connection(demo_db, "analyst", idle_release=0.0)
    try:
        con._release_if_idle()  # the file is let go as it would be after idle_release
        assert con._db is None
        rows = con.execute(sql).fetchall()
        names = {name for name, *_ in seen}
        assert names == {"parse_statement", "analyze", "plan_query", "evaluate_constant"}
        assert {(released, held) for _, released, held in seen} == {(True, False)}
        assert rows == con.execute(GROUPED.format(f"age BETWEEN 1 AND {TERMS - 1}")).fetchall()
        with pytest.raises(sqlsdc.errors.SqlSyntaxError):
            con.execute("SELECT region, COUNT(* FROM persons")
        seen.clear()
        con.execute(sql)  # the check cache holds it: nothing to parse or check
        assert seen == []
    finally:
        con.close()
    refused = audit(demo_db, "admin", decision="refused", limit=1)["sql_text"].iloc[0]
    assert refused == "SELECT region, COUNT(* FROM persons"


def test_a_statement_after_a_policy_apply_is_checked_again_without_the_file(
    fresh_demo_db, monkeypatch
):
    """A statement checked early under a policy an admin replaced meanwhile is checked again
    under the new one, still while the connection holds neither the file nor its lock
    (checking it under the file kept every other process waiting for the whole check; red
    team s37); the policy applied is the one the statement is answered and audited under."""
    from sqlsdc.admin import apply, audit
    from sqlsdc.guard import pipeline

    seen = []
    parse = pipeline.parse_statement

    def watching(*args):
        seen.append((con._db is None, con._lock._is_owned()))
        return parse(*args)

    monkeypatch.setattr(pipeline, "parse_statement", watching)
    chain = " OR ".join(f"age = {i}" for i in range(2, TERMS))  # not in the check cache
    sql = GROUPED.format(chain)
    con = sqlsdc.Connection(fresh_demo_db, "analyst", idle_release=0.0)
    try:
        con._release_if_idle()
        reader = open_database(fresh_demo_db, read_only=True)
        try:
            document = store.current_policy(reader)[1]
        finally:
            reader.close()
        document["description"] = "applied while the analyst's connection was idle"
        version = apply(fresh_demo_db, load_policy(document), "admin").version
        assert con._db is None
        rows = con.execute(sql).fetchall()
        assert seen and {s for s in seen} == {(True, False)}
        assert con.policy_version == version
        assert rows == con.execute(GROUPED.format(f"age BETWEEN 2 AND {TERMS - 1}")).fetchall()
    finally:
        con.close()
    entry = audit(fresh_demo_db, "admin", decision="accepted", limit=2).iloc[1]
    assert entry["sql_text"] == sql and entry["policy_version"] == version


def test_the_statement_timeout_counts_the_parse_before_the_file_is_taken(demo_db, monkeypatch):
    from sqlsdc.guard import pipeline

    def slow(sql, limit, *walked, parse=pipeline.parse_statement):
        time.sleep(0.3)
        return parse(sql, limit, *walked)

    checked = []
    monkeypatch.setattr(pipeline, "parse_statement", slow)
    monkeypatch.setattr(pipeline, "analyze", lambda *args: checked.append(args))
    with sqlsdc.connect(demo_db, user="analyst", timeout=0.2) as con:
        with pytest.raises(sqlsdc.OperationalError, match="longer than the statement timeout"):
            con.execute(GROUPED.format("age > 17"))
    assert checked == []  # the check, under the database file, did not begin


def test_a_check_past_the_statement_timeout_stops_at_its_next_pass(demo_db, monkeypatch):
    """The timeout stops a long check between its passes, not after the last one: here the
    planner never runs after an analysis that outlasted it."""
    from sqlsdc.guard import pipeline

    planned, analyze = [], pipeline.analyze

    def slow(*args):
        time.sleep(0.3)
        return analyze(*args)

    monkeypatch.setattr(pipeline, "analyze", slow)
    monkeypatch.setattr(pipeline, "plan_query", lambda *args: planned.append(args))
    with sqlsdc.connect(demo_db, user="analyst", timeout=0.2) as con:
        with pytest.raises(sqlsdc.OperationalError, match="longer than the statement timeout"):
            con.execute(GROUPED.format("age > 18 AND age < 93"))  # not in the check cache
    assert planned == []


def test_an_interrupt_during_the_early_check_stops_the_statement(demo_db, monkeypatch):
    """A cancel (the server's CancelRequest calls ``interrupt``) that arrives while the
    statement is checked, before it takes the file, stops it as it would stop the engine;
    the next statement runs."""
    from sqlsdc.guard import pipeline

    analyze = pipeline.analyze

    def cancelled_meanwhile(*args):
        con.interrupt()
        return analyze(*args)

    sql = GROUPED.format("age > 19 AND age < 94")  # not in the check cache
    with sqlsdc.connect(demo_db, user="analyst") as con:
        monkeypatch.setattr(pipeline, "analyze", cancelled_meanwhile)
        with pytest.raises(sqlsdc.errors.QueryCanceled):
            con.execute(sql)
        monkeypatch.undo()
        assert con.execute(sql).fetchall()


def test_constants_are_evaluated_apart_from_the_file_and_an_internal_error_is_not_sticky():
    """Constants run on a private in-memory instance; one that makes DuckDB fail internally
    is 'raises' (refused), and the next constant gets a working instance."""
    from sqlsdc.engines import duckdb as engine

    with pytest.raises(engine.EngineError):
        engine.evaluate_constant("SELECT TRY_CAST(CAST(repeat('9', 400) AS BIGNUM) AS INT)", 5)
    engine.evaluate_constant("SELECT 1 + 1", 5)
    with pytest.raises(engine.EngineError):
        engine.evaluate_constant("SELECT * FROM read_csv('/etc/passwd')", 5)  # no files
    with pytest.raises(engine.EngineError):
        engine.evaluate_constant("SET TimeZone = 'Asia/Tokyo'", 5)  # settings locked


@pytest.mark.parametrize(
    "tail",
    ["LIMIT -1", "LIMIT 2 OFFSET -1", "LIMIT 'x'", "LIMIT 1e30", "LIMIT ?"],
)
def test_a_limit_duckdb_cannot_take_is_a_clear_syntax_error(analyst, tail):
    """Before, the engine failed and the analyst read 'the engine's message is withheld because
    it could reveal confidential values' for a negative LIMIT."""
    sql = f"SELECT region, COUNT(*) AS n FROM persons GROUP BY region {tail}"
    params = [-3] if "?" in tail else None
    with pytest.raises(sqlsdc.errors.SqlSyntaxError, match=r"(LIMIT|OFFSET) .* is not valid"):
        analyst.execute(sql, params)


@pytest.mark.parametrize("tail", ["LIMIT 2", "LIMIT '2'", "LIMIT 2 OFFSET 1", "LIMIT ?"])
def test_limits_duckdb_takes_still_run(analyst, tail):
    sql = f"SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region {tail}"
    params = [2] if "?" in tail else None
    assert len(analyst.execute(sql, params).fetchall()) in (2, 4)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT region, COUNT(*) FROM persons GROUP BY", "GROUP BY without any expression"),
        ("SELECT region FROM persons WHERE", "WHERE is incomplete (line 1, column 32)"),
        ("SELECT COUNT(*) FROM persons HAVING", "HAVING is incomplete"),
        ("SELECT region, COUNT(*) FROM persons GROUP BY region ORDER BY", "ORDER BY is incomplete"),
        ("SELECT region, COUNT(*) FROM persons GROUP BY region LIMIT", "LIMIT is incomplete"),
    ],
)
def test_an_incomplete_clause_is_a_syntax_error_in_sql_words(analyst, sql, message):
    """Not sqlglot's class names ("Required keyword: 'this' missing for <class
    'sqlglot.expressions.query.Where'>"), and an empty GROUP BY, which sqlglot accepts, is not
    'the expression GROUP BY raises an error'."""
    with pytest.raises(sqlsdc.errors.SqlSyntaxError) as info:
        analyst.execute(sql)
    assert message in str(info.value) and "sqlglot" not in str(info.value)


@pytest.mark.parametrize(
    ("sql", "params", "marker"),
    [
        ("SELECT sex, COUNT(*) FROM persons WHERE region = %s GROUP BY sex", ["R01"], "%s"),
        ("SELECT sex, COUNT(*) FROM persons WHERE region = %(r)s GROUP BY sex", {"r": "R01"},
         "%(r)s"),
    ],
)  # fmt: skip
def test_a_pyformat_parameter_says_which_markers_sqlsdc_takes(analyst, sql, params, marker):
    """psycopg's ``%s`` was "MOD is incomplete (line 1, column 50)" (new user s38); a ``%``
    that parses (a modulo, a literal) is left alone."""
    with pytest.raises(sqlsdc.errors.SqlSyntaxError) as info:
        analyst.execute(sql, params)
    assert f"{marker} is a parameter marker of other drivers" in str(info.value)
    assert info.value.hint.startswith("write ? for each parameter")
    assert analyst.execute(sql.replace(marker, "?"), ["R01"]).fetchall()
    quoted = "SELECT sex, COUNT(*) FROM persons WHERE region = '%s' GROUP BY sex"
    assert analyst.execute(quoted).fetchall() == []
