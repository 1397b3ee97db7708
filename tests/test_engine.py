"""The DuckDB engine: hardened connections (defence in depth below the guard) and function
qualification against shadowing macros (ecosystem.md §2.1)."""

from __future__ import annotations

import os

import duckdb
import pytest
import sqlglot
from sqlglot import exp

import sqlsdc
from sqlsdc.engines.duckdb import harden, open_database, system_functions
from sqlsdc.engines.duckdb_schema import base_tables, described, table_schemas
from sqlsdc.engines.duckdb_sql import to_sql


def parse_one(sql: str):
    return sqlglot.parse_one(sql, read="duckdb")


LOCKED = "the configuration has been locked"
NO_FILES = "file system operations are disabled by configuration"


def make_table(con) -> None:
    con.execute(
        "CREATE TABLE t AS SELECT range AS id, range * 1.37::DOUBLE AS x, range % 3 AS g, "
        "'s' || range AS s FROM range(100)"
    )


@pytest.fixture
def path(tmp_path):
    return tmp_path / "engine.duckdb"


@pytest.fixture
def hardened(path):
    con = open_database(path)
    make_table(con)
    harden(con)
    yield con
    con.close()


@pytest.fixture(scope="module")
def builtins(tmp_path_factory):
    con = open_database(tmp_path_factory.mktemp("builtins") / "b.duckdb")
    try:
        return system_functions(con)
    finally:
        con.close()


@pytest.fixture
def clean():
    """An ordinary in-memory DuckDB with the same table and no macros, for expected values."""
    con = duckdb.connect()
    make_table(con)
    yield con
    con.close()


# --- open_database -----------------------------------------------------------------------------


def test_open_database_locks_extensions_and_replacement_scans(path):
    con = open_database(path)
    try:
        settings = dict(
            con.execute(
                "SELECT name, value FROM duckdb_settings() WHERE name IN ("
                "'autoinstall_known_extensions', 'autoload_known_extensions', "
                "'allow_community_extensions', 'allow_unsigned_extensions', "
                "'python_enable_replacements', 'allow_persistent_secrets')"
            ).fetchall()
        )
    finally:
        con.close()
    assert len(settings) == 6
    assert set(settings.values()) == {"false"}


def test_replacement_scans_are_off(path):
    secret_frame = duckdb.connect().execute("SELECT 42 AS answer").df()  # noqa: F841
    con = open_database(path)
    try:
        with pytest.raises(duckdb.CatalogException, match="secret_frame"):
            con.execute("SELECT * FROM secret_frame")
    finally:
        con.close()


def test_a_folder_is_not_a_database(tmp_path):
    """It was "database . does not exist", about a folder that exists."""
    with pytest.raises(sqlsdc.errors.NotFoundError, match=r"is a folder, not a database file"):
        sqlsdc.connect(tmp_path, user="analyst")


def test_open_database_errors(tmp_path):
    with pytest.raises(sqlsdc.Error, match=r"does not exist; create it with `sqlsdc init`"):
        open_database(tmp_path / "missing.duckdb", read_only=True)
    with pytest.raises(sqlsdc.Error, match=r"folder .*nowhere does not exist"):
        open_database(tmp_path / "nowhere" / "x.duckdb")
    assert not (tmp_path / "missing.duckdb").exists()


# --- harden: defence in depth on the raw connection -------------------------------------------


def test_read_csv_works_before_and_fails_after_hardening(path, tmp_path):
    csv = tmp_path / "leak.csv"
    csv.write_text("a,b\n1,2\n", "utf-8")
    con = open_database(path)
    try:
        assert con.execute(f"SELECT * FROM read_csv('{csv}')").fetchall() == [(1, 2)]
        harden(con)
        with pytest.raises(duckdb.PermissionException, match=NO_FILES):
            con.execute(f"SELECT * FROM read_csv('{csv}')")
        with pytest.raises(duckdb.PermissionException, match=NO_FILES):
            con.execute(f"SELECT * FROM '{csv}'")
        with pytest.raises(duckdb.PermissionException, match=NO_FILES):
            con.execute("SELECT * FROM read_text('/etc/hostname')")
    finally:
        con.close()


def test_copy_to_fails(hardened, tmp_path):
    target = tmp_path / "out.csv"
    with pytest.raises(duckdb.PermissionException, match=NO_FILES):
        hardened.execute(f"COPY t TO '{target}' (FORMAT csv)")
    with pytest.raises(duckdb.PermissionException, match=NO_FILES):
        hardened.execute(f"COPY (SELECT * FROM t) TO '{target}'")
    with pytest.raises(duckdb.PermissionException, match=NO_FILES):
        hardened.execute(f"EXPORT DATABASE '{tmp_path / 'export'}'")
    assert not target.exists()
    assert not (tmp_path / "export").exists()


def test_attach_of_another_file_fails(hardened, tmp_path):
    other = tmp_path / "other.duckdb"
    setup = duckdb.connect(str(other))
    setup.execute("CREATE TABLE stolen AS SELECT 1 AS x")
    setup.close()
    with pytest.raises(duckdb.PermissionException, match=NO_FILES):
        hardened.execute(f"ATTACH '{other}' AS other")
    with pytest.raises(duckdb.PermissionException, match=NO_FILES):
        hardened.execute(f"ATTACH '{tmp_path / 'new.duckdb'}' AS fresh")
    assert not (tmp_path / "new.duckdb").exists()


@pytest.mark.parametrize(
    "statement",
    [
        "SET enable_external_access = true",
        "SET GLOBAL enable_external_access = true",
        "RESET enable_external_access",
        "SET lock_configuration = false",
        "SET allowed_directories = ['/']",
        "SET autoinstall_known_extensions = true",
        "SET allow_unsigned_extensions = true",
        "SET python_enable_replacements = true",
    ],
)
def test_settings_cannot_be_changed_back(hardened, statement):
    with pytest.raises(duckdb.InvalidInputException, match=LOCKED):
        hardened.execute(statement)
    setting = hardened.execute("SELECT current_setting('enable_external_access')").fetchall()
    assert setting == [(False,)]


def test_install_fails(hardened):
    with pytest.raises(duckdb.PermissionException, match=NO_FILES):
        hardened.execute("INSTALL httpfs")


def test_load_of_an_external_extension_fails(hardened):
    with pytest.raises(duckdb.PermissionException, match="Loading external extensions is disabled"):
        hardened.execute("LOAD httpfs")


def test_hardened_connection_still_reads_its_own_tables(hardened):
    assert hardened.execute("SELECT count(*), sum(id) FROM t").fetchall() == [(100, 4950)]
    import pyarrow as pa

    hardened.register("batch", pa.table({"k": [1, 2]}))  # sqlsdc's own batches still work
    try:
        assert hardened.execute("SELECT sum(k) FROM batch").fetchall() == [(3,)]
    finally:
        hardened.unregister("batch")


def test_harden_twice_and_shared_instance(hardened, path):
    harden(hardened)  # a no-op on a locked instance
    second = open_database(path)  # same file, same process: the same (locked) instance
    try:
        harden(second)
        locked = second.execute("SELECT current_setting('lock_configuration')").fetchall()
        assert locked == [(True,)]
        with pytest.raises(duckdb.InvalidInputException, match=LOCKED):
            second.execute("SET enable_external_access = true")
    finally:
        second.close()


def test_harden_refuses_an_instance_locked_open(path):
    con = open_database(path)
    try:
        con.execute("SET lock_configuration = true")
        with pytest.raises(sqlsdc.Error, match="locked with external access enabled"):
            harden(con)
    finally:
        con.close()


# --- catalog helpers ---------------------------------------------------------------------------


def test_table_schemas_and_base_tables(path):
    con = open_database(path)
    try:
        con.execute('CREATE TABLE "People" ("Id" BIGINT, "Town" VARCHAR)')
        con.execute("CREATE VIEW v AS SELECT * FROM people")
        con.execute("CREATE SCHEMA other")
        con.execute("CREATE TABLE other.hidden (x INT)")
        assert table_schemas(con) == {
            "people": {"id": "BIGINT", "town": "VARCHAR"},
            "v": {"id": "BIGINT", "town": "VARCHAR"},
        }
        assert base_tables(con) == {"people"}
    finally:
        con.close()


def test_described_tables_have_the_listings_types_and_their_keys(path):
    """``described`` (one ``DESCRIBE`` per named table, no catalog listing) spells every type
    as ``information_schema.columns`` does, leaves out what does not exist, and reads the
    database's own table under a temporary view of the same name."""
    con = open_database(path)
    try:
        con.execute("CREATE TYPE mood AS ENUM ('a', 'b')")
        con.execute(
            'CREATE TABLE "Mixed" ("Id" BIGINT PRIMARY KEY, u UNION(n INT, s VARCHAR), '
            'a INTEGER[3], m MAP(VARCHAR, INT), s STRUCT("a b" INT), t TIMESTAMPTZ, '
            "d DECIMAL(38, 10), e mood, h UHUGEINT, i INTERVAL, j JSON, "
            "c VARCHAR COLLATE NOCASE, k INTEGER, l INTEGER, UNIQUE (k, l))"
        )
        con.execute('CREATE VIEW v AS SELECT "Id" + 1 AS x, t FROM mixed')
        con.execute("CREATE TEMP VIEW v AS SELECT 1 AS shadow")
        found = described(con, ["mixed", "v", "absent"])
        assert set(found) == {"mixed", "v"}
        listed = con.execute(
            "SELECT lower(table_name), column_name, data_type FROM information_schema.columns "
            "WHERE table_catalog = current_database() AND table_schema = 'main'"
        ).fetchall()
        assert sorted((t, c, kind) for t, rows in found.items() for c, kind, _k in rows) == sorted(
            listed
        )
        keys = {c: key for c, _kind, key in found["mixed"]}
        assert keys["Id"] == "PRI" and keys["k"] == keys["l"] == "UNI" and keys["u"] is None
    finally:
        con.close()


# --- function qualification ---------------------------------------------------------------------


def qualified(sql: str, builtins=None) -> str:
    return to_sql(parse_one(sql))


def test_system_functions_lists_builtins(builtins):
    assert {"sum", "count", "avg", "round", "abs", "least"} <= builtins
    assert "read_csv" not in builtins  # table functions are never called as scalars
    assert "cast" not in builtins


def test_sum_is_qualified(builtins):
    assert qualified("SELECT SUM(x) FROM t", builtins) == "SELECT system.main.SUM(x) FROM t"
    assert qualified("SELECT COUNT(*) FROM t", builtins) == "SELECT system.main.COUNT(*) FROM t"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT CAST(x AS INT) FROM t",
        "SELECT COALESCE(x, 0) FROM t",
        "SELECT CASE WHEN g = 1 THEN x END FROM t",
        "SELECT my_macro(x) FROM t",
    ],
    ids=["cast", "coalesce", "case", "unknown"],
)
def test_left_alone(builtins, sql):
    assert qualified(sql, builtins) == parse_one(sql).sql("duckdb")


def test_qualify_does_not_change_the_callers_tree(builtins):
    tree = parse_one("SELECT SUM(x) FROM t")
    before = tree.sql("duckdb")
    to_sql(tree)
    assert tree.sql("duckdb") == before


def test_window_aggregates_are_qualified_and_run(hardened):
    assert to_sql(parse_one("SELECT SUM(x) OVER () FROM t")) == (
        "SELECT system.main.SUM(x) OVER () FROM t"
    )
    assert hardened.execute("SELECT system.main.COUNT(*) OVER () FROM range(3)").fetchall() == [
        (3,),
        (3,),
        (3,),
    ]


def test_qualified_sql_runs_and_matches(hardened, clean, builtins):
    for sql in [
        "SELECT g, SUM(x), COUNT(*), AVG(x) FROM t GROUP BY g ORDER BY g",
        "SELECT g, SUM(x) OVER (PARTITION BY g) AS w, SUM(x + 1) AS v FROM t GROUP BY g, x, id "
        "ORDER BY id",
        "SELECT COUNT(DISTINCT g), MEDIAN(x), ARG_MAX(x, id) FROM t",
        "SELECT LEAST(id, 5), GREATEST(id, 5), ABS(x - 50), LENGTH(s) FROM t ORDER BY id",
    ]:
        generated = to_sql(parse_one(sql))
        assert "system.main." in generated
        assert rounded(hardened.execute(generated).fetchall()) == rounded(
            clean.execute(sql).fetchall()
        )


def rounded(rows):
    """Parallel float sums may differ in the last bits between runs."""
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


# --- the function-shadowing attack (ecosystem.md §2.1) -----------------------------------------


@pytest.fixture
def shadowed(path):
    """A database whose owner planted macros named like built-ins, then hardened."""
    con = open_database(path)
    make_table(con)
    con.execute("CREATE MACRO round(a, b) AS a")
    con.execute("CREATE MACRO abs(a) AS 42")
    con.execute("CREATE MACRO sum(a) AS 42")
    con.execute("CREATE MACRO var_pop(a) AS 42")
    con.execute("CREATE MACRO least(a, b) AS 1000")
    harden(con)
    yield con
    con.close()


def test_round_macro_does_not_change_generated_query(shadowed, clean):
    sql = "SELECT id, ROUND(x, 1) AS r FROM t WHERE id < 10 ORDER BY id"
    expected = clean.execute(sql).fetchall()
    assert shadowed.execute(sql).fetchall() != expected  # the attack works on plain SQL
    generated = to_sql(parse_one(sql))
    assert "system.main.ROUND(x, 1)" in generated
    assert shadowed.execute(generated).fetchall() == expected


def test_macros_do_not_change_generated_aggregates(shadowed, clean):
    sql = "SELECT g, SUM(x) AS s FROM t GROUP BY g ORDER BY g"
    generated = to_sql(parse_one(sql))
    assert shadowed.execute(generated).fetchall() == clean.execute(sql).fetchall()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT ABS(ROUND(x, 0)) AS v FROM t WHERE id = 1",
        "SELECT ROUND(SUM(x), 1) AS v FROM t",
        "SELECT ROUND(ABS(x), 0) AS v FROM t WHERE id = 1",
    ],
    ids=["round-in-abs", "sum-in-round", "abs-in-round"],
)
def test_nested_calls_are_qualified_too(shadowed, clean, sql):
    """sqlglot's transform does not descend into a replaced node: inner calls stay unqualified."""
    generated = to_sql(parse_one(sql))
    assert shadowed.execute(generated).fetchall() == clean.execute(sql).fetchall(), generated


def test_builtins_generated_under_another_name_are_qualified(shadowed, clean):
    sql = "SELECT VAR_POP(x) AS v FROM t"
    generated = to_sql(parse_one(sql))
    assert shadowed.execute(generated).fetchall() == clean.execute(sql).fetchall(), generated


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT VAR_POP(x) FROM t",
        "SELECT QUANTILE_CONT(x, 0.5) FROM t",
        "SELECT APPROX_COUNT_DISTINCT(x) FROM t",
        "SELECT STRING_AGG(s, ',') FROM t",
        "SELECT STDDEV_SAMP(x) FROM t",
        "SELECT DATE_TRUNC('month', DATE '2020-01-05')",
    ],
)
def test_every_builtin_call_is_qualified(builtins, sql):
    assert "system.main." in qualified(sql, builtins)


def least_of_unit_counts() -> exp.Expr:
    """``LEAST`` as the threshold rewrite builds it for joins (NULL-propagating, not parsed)."""
    counts = [exp.Count(this=exp.Distinct(expressions=[exp.column(c)])) for c in ("id", "g")]
    return exp.select(exp.alias_(exp.Least(this=counts[0], expressions=counts[1:]), "n")).from_("t")


def unqualified_calls(sql: str, name: str) -> int:
    return sql.upper().count(f"{name}(") - sql.upper().count(f"SYSTEM.MAIN.{name}(")


def test_least_is_qualified_however_it_was_built(hardened, clean, builtins):
    """Parsed ``LEAST(a, b)`` and the rewrite's NULL-propagating ``exp.Least`` must both come out
    as valid SQL calling the built-in, whichever of the two is qualified first."""
    parsed = "SELECT LEAST(COUNT(DISTINCT id), COUNT(DISTINCT g)) AS n FROM t"
    for sql in (
        to_sql(parse_one(parsed)),
        to_sql(least_of_unit_counts()),
        to_sql(parse_one(parsed)),
    ):
        assert hardened.execute(sql).fetchall() == [(3,)], sql
        assert unqualified_calls(sql, "LEAST") == 0, sql


def test_least_macro_does_not_change_the_join_unit_count(shadowed):
    generated = to_sql(least_of_unit_counts())
    assert shadowed.execute(generated).fetchall() == [(3,)], generated


def test_sqlglots_compiled_build_is_refused_with_a_remedy(demo_db, monkeypatch):
    """Under sqlglot's compiled build (``sqlglotc``) a Python subclass of its generator cannot
    be instantiated; a connection says so before any query instead of failing every check."""
    from sqlsdc.engines import duckdb_sql

    def compiled(self, *args, **kwargs):  # what mypyc's compiled base class raises
        raise TypeError("interpreted classes cannot inherit from compiled")

    monkeypatch.setattr(duckdb_sql._QualifiedGenerator, "__init__", compiled)
    with pytest.raises(sqlsdc.InterfaceError, match=r"(?s)compiled build.*pip uninstall sqlglotc"):
        sqlsdc.connect(demo_db, user="analyst")


_INTERRUPTED = """
import sys, duckdb
from sqlsdc.engines.duckdb import run
con = duckdb.connect()
print("ready", flush=True)
try:
    run(con, "SELECT i % 1000 AS g, COUNT(*) FROM range(300000000000) t(i) GROUP BY g")
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
    sys.exit(0)
print("the statement ended", flush=True)
"""


def test_ctrl_c_during_a_statement_is_a_keyboard_interrupt():
    """DuckDB 2.0 takes SIGINT itself and raises RuntimeError("Query interrupted"), which reached
    a user of `sqlsdc query` or `sqlsdc protect` as "internal error ... a bug in sqlsdc"; and
    mostly it did not stop the statement at all: Python noted the signal and raised
    KeyboardInterrupt when the statement ended (3e9 rows took 25 s of CPU, 50 s under load, in
    8 of 12 tries signalled from 0 to 3 s in). A process of its own gets the signal half a
    second into a statement of an hour (sent to the test's own process, a signal that came
    after the statement ended would stop the test run): only an interrupt ends it within the
    timeout."""
    import signal
    import subprocess
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-c", _INTERRUPTED], stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    try:
        assert process.stdout.readline() == "ready\n"
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert output.strip() == "KeyboardInterrupt" and process.returncode == 0


def test_ctrl_c_interrupts_only_under_the_default_handler_of_the_main_thread():
    """:func:`sqlsdc.engines.ctrl_c.interrupting` replaces Python's default SIGINT handler for
    its block and puts it back; an application's own handler and other threads (the server's
    workers, where Python delivers no signal) are left alone."""
    import signal

    calls = []
    # a library may have put its own handler in place (PySpark does, in a worker that ran
    # tests/test_spark.py before): this test starts from Python's default and restores it
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _check_interrupting(calls)
    finally:
        signal.signal(signal.SIGINT, outer)


def _check_interrupting(calls: list) -> None:
    import signal
    import threading

    from sqlsdc.engines.ctrl_c import interrupting

    with interrupting(lambda: calls.append("interrupt")) as pressed:
        signal.raise_signal(signal.SIGINT)
        assert pressed == [signal.SIGINT] and calls == ["interrupt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

    def own(number, frame):
        calls.append("own")

    previous = signal.signal(signal.SIGINT, own)
    try:
        with interrupting(lambda: calls.append("interrupt")) as pressed:
            signal.raise_signal(signal.SIGINT)
        assert pressed == [] and calls == ["interrupt", "own"]
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, previous)

    def in_a_thread():
        with interrupting(lambda: None) as pressed:
            calls.append(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
        calls.append(pressed)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert calls[-2:] == [True, []]


def test_an_interrupt_is_audited_as_such():
    from sqlsdc.catalog.store import audit_reason

    assert audit_reason(KeyboardInterrupt()) == "interrupted (Ctrl-C)"  # was "KeyboardInterrupt: "
    assert audit_reason(RuntimeError("Query interrupted")) == "interrupted (Ctrl-C)"
    assert audit_reason(RuntimeError("other")) == "RuntimeError: other"


_SCRATCH_WORK = """
import sys, duckdb
made = []
real_connect = duckdb.connect
def counted(database=":memory:", *args, **kwargs):
    made.append(str(database))
    return real_connect(database, *args, **kwargs)
duckdb.connect = counted
from sqlsdc.engines import duckdb as engine
con = engine.open_database(sys.argv[1])
engine.harden(con)  # as a guarded connection's
sql = "SELECT TIMESTAMPTZ '2024-01-01 00:00:00+00' AS t, 1::HUGEINT AS h, 2.5::DECIMAL(9,2) AS d"
print(engine.result_schema(con, sql) == con.execute(sql).to_arrow_table().schema)
engine.builtin_functions()
engine.evaluate_constant("SELECT 1 + 1", 5)
engine.parsed("SELECT 2")
con.close()
print(made.count(":memory:"))
"""


def test_one_private_instance_names_types_as_the_files_connection_does(tmp_path):
    """Constants, type names, parsing and the built-in functions share one private in-memory
    instance per process (each instance's start and end cost ~15-20 ms of CPU; a process made
    three), hardened as every file's: under TZ=Europe/Berlin the type reader (an unhardened
    instance of its own) named a TIMESTAMPTZ column ``tz=Europe/Berlin`` where the guarded
    connection's own answer is UTC, so Spark's answers were typed unlike DuckDB's."""
    import cli_fork

    env = dict(os.environ, TZ="Europe/Berlin")
    done = cli_fork.run([str(tmp_path / "tz.duckdb")], code=_SCRATCH_WORK, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1"]
