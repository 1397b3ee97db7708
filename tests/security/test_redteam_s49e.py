"""Red team s49e: the live BI path, ``sqlsdc serve`` through the client libraries BI tools use
(psycopg 3, psycopg2, pg8000, asyncpg, SQLAlchemy's postgresql dialect, pandas.read_sql), as
an analyst with a server login.

No attack of this round released more than the embedded guarded connection releases. What
held (each tried against a 20,000-person demo served with ``--insecure``):

- connect-time introspection of SQLAlchemy (``inspect``: tables, views, schemas, columns, keys,
  indexes, constraints, comments, enums, sequences, ``MetaData.reflect``) with psycopg,
  psycopg2 and pg8000, and 38 catalog probes BI tools send (``version()``, ``current_schema()``,
  ``current_setting``, ``pg_backend_pid()``, ``pg_total_relation_size``, ``reltuples``,
  ``pg_stats``, ``pg_stat_user_tables``, ``pg_settings``, ``pg_roles``, ``pg_database``,
  ``information_schema.columns``, ``'persons'::regclass``): no row count, size, statistic, other
  user or setting of the server; ``SELECT * FROM persons LIMIT 0`` / ``WHERE 1=0`` refused as
  row-level (a Metabase-style column probe of an aggregate works);
- Describe of a prepared statement never executed: without parameters it runs the statement
  through the guard and is charged as an execution (the Bind then takes that answer: no second
  charge); with parameters it plans with NULLs and reads nothing
  (``test_describing_a_dp_statement_charges_it_once``);
- a partial Execute (max rows 1, then 1, then all) of a DP portal: one charge, the rows of one
  answer; a re-Parse or Close of the statement drops the kept answer;
- pipelining before Sync with an error in the middle: the statements before it answered and
  charged, the ones after it neither run nor charged
  (``test_a_pipelined_statement_after_an_error_is_neither_run_nor_charged``);
- 30 parameter type and format combinations against ``age > $1`` (bytea, json, jsonb binary,
  interval, date, bool, float4 NaN and binary infinity, text with NUL and invalid UTF-8, an
  unknown OID 99999, uuid, inet, an int8 beyond 2^63, a numeric of 1e400, wrong-length binary
  int2/int4, timestamps out of range, 1- and 2-dimensional arrays): each read as a value the
  guard judges (refused 42501 when a cast could fail on confidential values, 22P02 for a value
  the server cannot read, 08P01 for a list outside ``= ANY``), none an internal error, none an
  answer the embedded connection would not give;
- cross-user timing through the server's shared text caches (``_for_the_guard``,
  ``unqualified``, ``postgres_names``: 1 to 3 ms of parsing saved when another user sent the
  same text): 120 statements, half of them sent first by the admin, the analyst's one-shot
  timing of each told them apart no better than chance (AUC 0.42; medians 306 and 291 ms,
  standard deviations 100 to 320 ms): the guard's own check, per user, drowns it;
- cancel requests: only with the session's 32-bit random key (compared in constant time); a
  wrong key cancels nothing and is answered like a right one (read, not timed);
- malformed extended-protocol messages (5 result formats for 2 columns, format code 7: 08P01
  and the session goes on; Execute with max rows -5: all rows; Describe or Close of kind X,
  a Query of invalid UTF-8: FATAL 08P01, since s49j ERROR 22021 and the session goes on as
  in PostgreSQL), none an internal error;
- SCRAM read again (nonce, channel-binding flag, authorization identity, decoy keys of an
  unknown name): nothing new; failed logins stay bounded at 10 a name and 30 an address;
- revoking a user (policy applied without it) while its session holds a cursor WITH HOLD:
  its next data or catalog statement is refused, but FETCH goes on handing out the rows of
  the answer computed before (3 more rows read after the apply). Those rows were released
  and audited when the cursor was declared, as PostgreSQL's open cursors survive a REVOKE:
  nothing beyond what the user had been answered, so no fix here.

Usability failures a BI user hit, fixed here:

- SQLAlchemy's ``.limit(3)`` on pg8000 (and asyncpg's dialect) writes ``LIMIT $1::INTEGER``;
  these clients describe the statement before binding it, the server planned it with NULL,
  and ``LIMIT CAST(NULL AS INT)`` was refused as a computed limit: every ``.limit()`` query
  failed on those drivers (tests/server/test_bi_clients.py::
  ``test_sqlalchemy_limit_and_offset_are_answered[pg8000]``);
- asyncpg's ``fetch("... WHERE age > $1", 40)`` and ``LIMIT $1`` were refused by asyncpg
  itself ("expected str, got int"): the server described every untyped parameter as text
  where PostgreSQL types it by the column it is compared with (int8 for LIMIT/OFFSET)
  (``test_asyncpg_sends_integers_where_postgresql_types_them``);
- psql's ``\\copy (SELECT ...) TO 'file.csv' CSV HEADER`` and psycopg's ``cursor.copy()``
  were refused ("COPY statements are not allowed"): ``COPY (query) TO STDOUT`` now writes the
  query's protected answer, the query judged by the guard as any statement; the row-level
  ``COPY (SELECT * FROM persons)``, ``COPY persons`` and ``COPY ... FROM STDIN`` are still
  refused (tests/server/test_copy_out.py).
"""

from __future__ import annotations

import asyncio
from fractions import Fraction

import dp_persons
import pytest

import sqlsdc
from tests.server.conftest import PASSWORD, add_server_user, start_server, stop_server

psycopg = pytest.importorskip("psycopg")

DP_COUNT = Fraction(1, 2)  # what one COUNT costs ana (tests/dp_persons.py)


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory):
    """A server over the small DP persons database, its analyst ``ana``."""
    path = dp_persons.build(tmp_path_factory.mktemp("s49e-dp") / "dp.duckdb", 30)
    add_server_user(path, "ana")
    running = start_server(path, "--insecure")
    yield running
    stop_server(running)


@pytest.fixture(scope="module")
def server_db(pristine_demo_db, tmp_path_factory, copy_database):
    """The demo with the analyst's login, for the shared ``server`` fixture."""
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s49e"))
    add_server_user(db)
    return db


def _spent(con) -> Fraction:
    """ana's epsilon spent, as ``SHOW sqlsdc.budget`` lists it."""
    cursor = con.execute("SHOW sqlsdc.budget")
    names = [d.name for d in cursor.description]
    (row,) = [r for r in (dict(zip(names, row, strict=True)) for row in cursor.fetchall())
              if r["user"] == "ana"]  # fmt: skip
    return Fraction(row["epsilon_spent"])


def test_describing_a_dp_statement_charges_it_once(dp_server):
    """Describe of a statement never executed runs it through the guard (charged); the Bind
    and Execute that follow take that answer without a second charge."""
    sql = b"SELECT region, COUNT(*) AS n FROM persons WHERE age < 30 GROUP BY region"
    with psycopg.connect(dp_server.dsn("ana"), autocommit=True) as con:
        before = _spent(con)
        pgconn = con.pgconn
        assert pgconn.prepare(b"s", sql).status == psycopg.pq.ExecStatus.COMMAND_OK
        described = pgconn.describe_prepared(b"s")
        assert described.status == psycopg.pq.ExecStatus.COMMAND_OK and described.nfields == 2
        assert _spent(con) == before + DP_COUNT
        result = pgconn.exec_prepared(b"s", [])
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK and result.ntuples > 0
        assert _spent(con) == before + DP_COUNT


def test_a_pipelined_statement_after_an_error_is_neither_run_nor_charged(dp_server):
    first = b"SELECT region, COUNT(*) AS n FROM persons WHERE age >= 60 GROUP BY region"
    after = b"SELECT region, COUNT(*) AS n FROM persons WHERE age < 60 GROUP BY region"
    with psycopg.connect(dp_server.dsn("ana"), autocommit=True) as con:
        before = _spent(con)
        pgconn = con.pgconn
        pgconn.enter_pipeline_mode()
        for sql in (first, b"SELECT pid FROM persons", after):
            pgconn.send_query_params(sql, None)
        pgconn.pipeline_sync()
        statuses = []
        while True:
            pgconn.consume_input()
            result = pgconn.get_result()
            if result is None:
                continue
            statuses.append(result.status)
            if result.status == psycopg.pq.ExecStatus.PIPELINE_SYNC:
                break
        pgconn.exit_pipeline_mode()
        status = psycopg.pq.ExecStatus
        assert statuses == [status.TUPLES_OK, status.FATAL_ERROR, status.PIPELINE_ABORTED,
                            status.PIPELINE_SYNC]  # fmt: skip
        assert _spent(con) == before + DP_COUNT
        con.execute(after.decode()).fetchall()  # never run: asked now, it is charged
        assert _spent(con) == before + 2 * DP_COUNT


def test_asyncpg_sends_integers_where_postgresql_types_them(server):
    """asyncpg encodes each parameter by the type the server describes: described as text,
    ``age > $1`` with 40 and ``LIMIT $1`` with 2 were refused by asyncpg ("expected str, got
    int"; fails on main). Typed as PostgreSQL types them, the protected cells are the
    embedded connection's."""
    asyncpg = pytest.importorskip("asyncpg")
    sql = (
        "SELECT sex, COUNT(*) AS n FROM persons WHERE age > $1 AND age BETWEEN $2 AND $3 "
        "GROUP BY sex ORDER BY sex LIMIT $4"
    )

    async def fetch():
        con = await asyncpg.connect(host=server.host, port=server.port, user="analyst",
                                    password=PASSWORD, database="demo", ssl=False)  # fmt: skip
        try:
            statement = await con.prepare(sql)
            kinds = [t.name for t in statement.get_parameters()]
            return kinds, [tuple(r) for r in await statement.fetch(40, 30, 90, 2)]
        finally:
            await con.close()

    kinds, rows = asyncio.run(fetch())
    assert kinds == ["int4", "int4", "int4", "int8"]
    with sqlsdc.connect(server.db, user="analyst") as embedded:
        expected = embedded.execute(sql.replace("$1", "40").replace("$2", "30")
                                    .replace("$3", "90").replace("$4", "2")).fetchall()  # fmt: skip
    assert [(sex, int(n)) for sex, n in rows] == expected and len(rows) == 2
