"""Red team s49h: the Spark engine gives the same protected answers as DuckDB, nothing more.

Attacked as an analyst with ``run_protected`` on a local Spark session (JDK 17, Spark 4.3,
``local[1]``) beside the DuckDB path over the same file and secret: the demo (20,000 persons,
CKM and threshold), a DP table of 600 rows with DATE, TIMESTAMP, TIMESTAMP WITH TIME ZONE,
BOOLEAN, DECIMAL, TINYINT and SMALLINT dimensions, and one of extreme values (INTEGER, BIGINT,
SMALLINT, TINYINT and UINTEGER at their limits, DECIMAL(18, 3) and (38, 0) at theirs, ±DBL_MAX,
NaN, ±inf, -0.0, 5e-324).

Found (fixed here): **Spark substituted variables in the SQL text, string literals included.**
``spark.sql.variable.substitute`` is on by default: before parsing, Spark replaces
``${env:NAME}`` by the server process's environment variable, ``${system:name}`` by a JVM
property and ``${sparkconf:key}`` or ``${key}`` by a Spark setting, wherever they appear. The
guard sees a constant text, DuckDB answers the literal, Spark the server's values:
``SELECT '${env:S49H_SECRET}' AS h, COUNT(*) AS n FROM persons`` answered ``hunter2-token``
(an environment variable of the server), ``'${system:user.name}'`` ``root``,
``'${spark.sql.ansi.enabled}'`` ``true``: one query each for any environment variable (cloud
credentials such as ``AWS_SECRET_ACCESS_KEY`` included), JVM property or session setting
(Spark redacts the values of settings named like secrets, not the environment). In a
condition it changed the rows counted under the DuckDB cell's identity and noise:
``... AND '${spark.sql.ansi.enabled}' <> 'true'`` was every row on DuckDB and none on Spark,
the two DP answers exactly 200 apart in each of the 3 cells (the noise cancelled). The engine
now pins ``spark.sql.variable.substitute=false`` with its other settings
(:data:`sqlsdc.engines.spark.SESSION`), and refuses a session that turns it back on. The
tests of it below fail on main.

Found (fixed here): **a session reading backslashes as written.** The translation doubles a
text literal's backslashes for Spark, whose literals unescape them (s44k); a session with
``spark.sql.parser.escapedStringLiterals=true`` (a setting :data:`~sqlsdc.engines.spark.SESSION`
did not pin, as it pins the time zone and the legacy settings) kept both, so ``s <> 'a\\b'``
held every row on Spark and half on DuckDB under one DP cell identity: the two answers were
exactly 100 apart in each of the 3 cells (the rows of ``'a\\b'``). The setting is pinned
(``false``); a session that sets it is refused before the charge. Like s40c's findings it needs
code in the engine's session (an analyst who sends SQL only cannot set it).

Found (fixed here): **a DP query grouped by a private TIMESTAMP key paid on Spark and answered
nothing.** The noisy cells are registered on Spark from Arrow, which Spark reads as instants:
the answer's key came back ``timestamp[us, tz=UTC]`` and DuckDB's ``timestamp[us]`` refused it
after the charge (ε 2, δ 10⁻⁶ on the test's table, every time, where DuckDB answered 4 keys).
Not a leak (the drawn cells were cached, so DuckDB answered them again for free), but not the
same answer and charge as DuckDB's (issue 17 must-have 6). The cells keep their TIMESTAMP as
Spark's TIMESTAMP_NTZ (``SparkEngine.register_cells``); DATE, TIMESTAMP WITH TIME ZONE,
BOOLEAN and DECIMAL private keys gave DuckDB's cells already.

What held (tried, no test added; raw on both engines through ``SparkEngine.run`` and through
the guard on each, the same secret):

- Text against dates and times, 96 literals: DuckDB and Spark read ``'2024-01-01 (BC)'`` as
  different days (no row against 43 rows of 2024-01-01), and Spark alone reads ``'2024-01'``,
  ``'2024'``, ``'+2024-01-01'``, ``'2024-01-01 foo'``, ``'2024-01-01 AD'``, ``'2024-01-01T05'``,
  ``'today'``, where DuckDB reads ``'infinity'``, ``'2024/01/01'`` and ``'... 24:00:00'`` and Spark
  fails; the guard accepts only ``YYYY-MM-DD[ HH:MM[:SS[.ffffff]]]`` of years 1-9999 against a
  date or time (``planner.totality._temporal_text``), and those read alike (time zones
  ``+05``, ``Z``, ``UTC``, ``Europe/Paris``, ``EST`` and fractions past microseconds too);
  typed literals (``DATE '2024-01-01 (BC)'``) are refused on Spark (casts to DATE untested).
- Text against BOOLEAN: ``' true '`` (Spark trims) and ``'on'`` differ, the guard admits only
  ``true false t f 1 0``, which read alike.
- Overflow and error oracles at the types' limits, 74 conditions: ``-x``, ``ABS``, ``x + 1``,
  ``x * 2``, ``x - 1`` of the extreme integers answer on DuckDB (its optimizer moves the constant)
  and fail on Spark; ``dv * dv``, ``uv + 1``, ``-uv`` the reverse; ROUND(int, -1), casts to
  narrower types and DECIMAL overflow fail on both. The guard refuses all 44 of them (totality
  without bounds); the 30 it accepts (``//``, ``%``, casts to HUGEINT, ROUND/FLOOR/SQRT/``%``/``*``
  of ±DBL_MAX, NaN, ±inf, GREATEST across integer widths, CASE/COALESCE past TINYINT, IN and
  BETWEEN past the type) gave DuckDB's DP cells on Spark, noise and all.
- Text literals with quotes (``'it''s'``), backslashes, tabs, ``'${x}'``, NFC/NFD, ``ß``
  against ``ss``, empty and blank (25 conditions): alike, ``U&''`` and ``E''`` refused on Spark.
- Number spellings (``1_000``, ``.5``, ``5.``, ``1E-3``, ``00012``, ``9223372036854775808``):
  Spark gets DuckDB's value; ``0x10``, ``0b101``, ``0o17``, ``1D`` do not parse.
- Comments: a ``/*+ REPARTITION(100000) */`` or ``/*+ BROADCAST(t) */`` hint is written
  ``/* + ... */`` for Spark, a comment, not a hint (4 shapes).
- Aliases: GROUP BY, HAVING and ORDER BY naming an output alias that is also a column
  (12 shapes): alike, but for which tied rows a LIMIT keeps (released cells both).
- The DP cache across engines: a cell paid on DuckDB and asked on Spark (and the reverse)
  was the same value and no second charge; 8 threads charging on one Spark engine paid
  8 × 1/10, the ledger 24 rows for 8 queries of 3 cells.
- Private keys of DATE, TIMESTAMP WITH TIME ZONE, BOOLEAN, DECIMAL and CAST(b AS VARCHAR):
  DuckDB's cells and charge; DOUBLE keys refused on both.
- ``spark.sql.parser.quotedRegexColumnNames=true``: the same DP answer (one shape).

Noticed, not changed: DuckDB converts a HUGEINT or DECIMAL(38, s) value to DOUBLE in two
roundings (the high 64 bits, then the sum): 71 of 20,000 values between 10^30 and 10^38 differ
in the last bit from the correctly rounded DOUBLE (none of 20,000 between 2^64 and 2^90: the
high half must pass 2^53, values past 2^117 ≈ 1.7·10^35). Spark's BigDecimal conversion is
correctly rounded (not checked here on Spark), so a condition comparing such a column with a
DOUBLE could hold a row on one engine only; it needs stored numbers of 36 to 38 digits and an
attacker who knows one to the last digit.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from spark_events import events_policy, events_sql
from spark_session import local_session, skip_without_jdk

import sqlsdc
from sqlsdc.errors import NotSupportedError

pytest.importorskip("pyspark.errors", reason="the Spark tests need the spark extra")
skip_without_jdk()

from sqlsdc.engines.spark import SparkEngine  # noqa: E402
from sqlsdc.guard.spark import run_protected  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
    pytest.mark.slow,  # a JVM of its own (~13 s of CPU to start and warm); CI runs it
]

SECRET_SETTING = "spark.hadoop.fs.s3a.endpoint"  # a server's setting (Spark itself redacts the
SECRET = "s49h-internal.example"  # values of keys named secret, password, token, access key)


@pytest.fixture(scope="module")
def spark():
    session = local_session("sqlsdc-redteam-s49h")
    yield session
    session.stop()


@pytest.fixture()
def events(tmp_path) -> Path:
    path = tmp_path / "events.duckdb"
    with duckdb.connect(str(path)) as raw:
        raw.execute(events_sql(10))
    sqlsdc.init(path, events_policy(10, ("ana", "bob")))
    return path


@pytest.fixture()
def engine(spark, events):
    engine = SparkEngine(spark.newSession())
    engine.session.conf.set(SECRET_SETTING, SECRET)  # a session holding a credential
    engine.load_duckdb(events, ["events"])
    yield engine
    engine.close()


SUBSTITUTED = {
    "a setting in the select list": (
        f"SELECT k, '${{{SECRET_SETTING}}}' AS h, COUNT(*) AS n FROM events GROUP BY k ORDER BY k"
    ),
    "a JVM property in the select list": (
        "SELECT k, '${system:java.home}' AS h, COUNT(*) AS n FROM events GROUP BY k ORDER BY k"
    ),
    "a setting in a condition": (
        "SELECT k, COUNT(*) AS n FROM events "
        "WHERE k IN (0, 1, 2) AND '${spark.sql.ansi.enabled}' <> 'true' GROUP BY k ORDER BY k"
    ),
}


@pytest.mark.parametrize("sql", SUBSTITUTED.values(), ids=SUBSTITUTED.keys())
def test_spark_reads_variables_as_text(engine, events, sql):
    with sqlsdc.connect(events, "ana") as con:
        duck = con.execute(sql).fetchall()
    with sqlsdc.connect(events, "bob") as con:
        rows = [tuple(r.values()) for r in run_protected(con, engine, sql).to_pylist()]
    # main: the credential, the JDK's path, and all rows against none (exact, under one noise)
    assert SECRET not in repr(rows)
    assert rows == duck


def test_a_session_substituting_variables_is_refused(engine, events):
    engine.session.conf.set("spark.sql.variable.substitute", "true")
    with sqlsdc.connect(events, "bob") as con, pytest.raises(NotSupportedError, match="env"):
        run_protected(con, engine, SUBSTITUTED["a setting in the select list"])
    with sqlsdc.connect(events, "bob") as con:
        assert all(b.spent.epsilon == 0 for b in con.remaining_budget())  # refused unpaid


BACKSLASHES = (
    "CREATE TABLE t AS SELECT (i % 60)::BIGINT AS pid, (i % 3)::INTEGER AS k, "
    "['a\\b', 'c'][i % 2 + 1] AS s FROM range(600) r(i)"
)


def test_a_session_reading_backslashes_as_written_is_refused(spark, tmp_path):
    """``spark.sql.parser.escapedStringLiterals=true`` kept the backslashes the translation
    doubles for Spark: ``s <> 'a\\b'`` held every row on Spark, half of them on DuckDB, under
    one DP cell identity (main: the answers were exactly 100 apart in each of the 3 cells)."""
    path = tmp_path / "text.duckdb"
    with duckdb.connect(str(path)) as raw:
        raw.execute(BACKSLASHES)
    policy = events_policy(10, ("bob",))
    columns = policy["tables"]["events"]["columns"]
    columns.pop("v")
    columns["s"] = {"role": "dimension", "domain": ["a\\b", "c"]}
    policy["tables"] = {"t": policy["tables"]["events"]}
    sqlsdc.init(path, policy)
    engine = SparkEngine(spark.newSession())
    try:
        engine.load_duckdb(path, ["t"])
        engine.session.conf.set("spark.sql.parser.escapedStringLiterals", "true")
        sql = "SELECT k, COUNT(*) AS n FROM t WHERE s <> 'a\\b' GROUP BY k ORDER BY k"
        with sqlsdc.connect(path, "bob") as con, pytest.raises(NotSupportedError, match="backsl"):
            run_protected(con, engine, sql)
        with sqlsdc.connect(path, "bob") as con:
            assert all(b.spent.epsilon == 0 for b in con.remaining_budget())
    finally:
        engine.close()


TIMES = (
    "CREATE TABLE t AS SELECT (i % 2000)::BIGINT AS pid, (i % 3)::INTEGER AS k, "
    "TIMESTAMP '2024-01-01 00:00:00' + to_minutes((i % 4) * 37) AS ts FROM range(4000) r(i)"
)  # 500 persons per time: each selected whatever the secret


def test_a_private_timestamp_key_answers_on_spark_as_on_duckdb(spark, tmp_path):
    """The noisy cells of a DP query grouped by a private TIMESTAMP key were registered on
    Spark as instants, and the answer's key came back ``timestamp[us, tz=UTC]``, which
    DuckDB's ``timestamp[us]`` refused after the charge: on main bob paid ε = 2 and δ = 10⁻⁶
    and was answered nothing, every time, where ana's DuckDB answer had the cells."""
    path = tmp_path / "times.duckdb"
    with duckdb.connect(str(path)) as raw:
        raw.execute(TIMES)
    policy = events_policy(10, ("ana", "bob"))
    table = policy["tables"].pop("events")
    table["columns"] = {
        "pid": {"role": "identifier"},
        "k": {"role": "dimension", "domain": [0, 1, 2]},
        "ts": {"role": "dimension"},
    }
    table["protection"]["counts"]["spend"] = {"epsilon": 1}
    table["dp"] = {"max_groups": 4, "max_rows": 10, "groups": "private",
                   "selection": {"epsilon": 1, "delta": "1e-6"}}  # fmt: skip
    policy["tables"] = {"t": table}
    policy["budgets"] = [{"user": "*", "epsilon": 1000, "delta": "1e-2"}]
    sqlsdc.init(path, policy)
    sql = "SELECT ts, COUNT(*) AS n FROM t GROUP BY ts ORDER BY ts"
    engine = SparkEngine(spark.newSession())
    try:
        engine.load_duckdb(path, ["t"])
        with sqlsdc.connect(path, "ana") as con:
            duck = con.execute(sql).fetchall()
            ana = [b.spent for b in con.remaining_budget() if b.key.user == "ana"]
        with sqlsdc.connect(path, "bob") as con:
            rows = [tuple(r.values()) for r in run_protected(con, engine, sql).to_pylist()]
            bob = [b.spent for b in con.remaining_budget() if b.key.user == "bob"]
        assert len(duck) == 4 and rows == duck  # the same keys and noisy counts
        assert bob == ana  # the same charge
    finally:
        engine.close()
