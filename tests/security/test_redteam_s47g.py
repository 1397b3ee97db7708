"""Red team s47g: the PostgreSQL-protocol server (``sqlsdc serve``) with an analyst's login.

No attack of this session released more through the server than the embedded guarded
connection releases (README "Live BI"); these tests keep the ones that held on the server's
own paths, which the embedded tests do not run:

- DP statements of one user sent at once from 16 server sessions (each its own guarded
  connection, run in the server's thread pool): exactly the statements the budget pays for are
  answered, the others get 53S01, and the spent budget equals the limit.
- Parameters a client can send only through the protocol (a binary ``numeric`` NaN, a text
  ``numeric`` of 1e100000, an untyped text value compared with an integer column) reach the
  guard as values it judges: a measure compared with them is refused (42501), as on an
  embedded connection, never answered.
- A wrong password and an unknown user name fail with the same SQLSTATE and message.
"""

from __future__ import annotations

import struct
import threading
from fractions import Fraction

import dp_persons
import pytest

import sqlsdc
from tests.server.conftest import PASSWORD, add_server_user, start_server, stop_server

psycopg = pytest.importorskip("psycopg")

LIMIT = Fraction(5)  # ana's epsilon: ten COUNT statements at 1/2
SESSIONS = 16


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory):
    """A server over a DP persons database whose analyst ``ana`` has ε = 5."""
    path = dp_persons.build(tmp_path_factory.mktemp("s47g") / "dp.duckdb", LIMIT)
    add_server_user(path, "ana")
    running = start_server(path, "--insecure", "--workers", "8")
    yield running
    stop_server(running)


@pytest.mark.slow
def test_dp_statements_sent_at_once_from_many_sessions_spend_the_budget_once(dp_server):
    """16 sessions of ``ana`` send 16 distinct DP COUNTs (ε = 1/2 each) together: 10 are
    answered, 6 refused for the budget, and the user's budget is spent to exactly ε = 5."""
    sessions = [psycopg.connect(dp_server.dsn("ana"), autocommit=True) for _ in range(SESSIONS)]
    start, outcomes = threading.Barrier(SESSIONS), []

    def ask(i: int) -> None:
        start.wait()
        try:
            sessions[i].execute(f"SELECT region, COUNT(*) FROM persons WHERE age >= {i} "
                                "GROUP BY region").fetchall()  # fmt: skip
            outcomes.append("answered")
        except psycopg.Error as e:
            outcomes.append(e.sqlstate)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(SESSIONS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in sessions:
        session.close()
    assert sorted(outcomes) == ["53S01"] * 6 + ["answered"] * 10, outcomes
    with psycopg.connect(dp_server.dsn("ana"), autocommit=True) as con:
        rows = con.execute("SHOW sqlsdc.budget").fetchall()
    (ana,) = [r for r in rows if r[0] == "ana"]
    assert (Fraction(ana[3]), Fraction(ana[4])) == (LIMIT, 0)


@pytest.fixture(scope="module")
def server(pristine_demo_db, tmp_path_factory, copy_database):
    db = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s47g-demo"))
    add_server_user(db)
    running = start_server(db, "--insecure")
    yield running
    stop_server(running)


def _numeric_nan() -> bytes:
    """PostgreSQL's binary ``numeric`` NaN (``numeric_send``: ndigits, weight, sign 0xC000,
    dscale)."""
    return struct.pack("!hhHh", 0, 0, 0xC000, 0)


@pytest.mark.parametrize(
    ("value", "oid", "binary"),
    [(_numeric_nan(), 1700, True), (b"1e100000", 1700, False), (b"NaN", 701, False)],
    ids=["binary-numeric-nan", "numeric-1e100000", "float8-nan"],
)
def test_protocol_only_parameters_compared_with_a_measure_are_refused(server, value, oid, binary):
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        pgconn = con.pgconn
        pgconn.prepare(b"s", b"SELECT sex, COUNT(*) FROM persons WHERE income > $1 GROUP BY sex",
                       [oid])  # fmt: skip
        result = pgconn.exec_prepared(b"s", [value], [1 if binary else 0])
        assert result.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"42501"
        assert result.ntuples == 0


def test_an_untyped_text_parameter_is_judged_like_the_integer_it_names(server):
    """``age > $1`` with ``'30'`` sent untyped (oid 0) is the embedded ``age > '30'``: the
    same protected cells, not another answer."""
    sql = "SELECT sex, COUNT(*) AS n FROM persons WHERE age > $1 GROUP BY sex ORDER BY sex"
    with psycopg.connect(server.dsn(), autocommit=True) as con:
        result = con.pgconn.exec_params(sql.encode(), [b"30"], [0])
        served = [tuple(result.get_value(r, c).decode() for c in range(2))
                  for r in range(result.ntuples)]  # fmt: skip
    with sqlsdc.connect(server.db, user="analyst") as embedded:
        expected = embedded.execute(sql.replace("$1", "?"), ["30"]).fetchall()
    assert served == [(sex, str(n)) for sex, n in expected]


def test_a_wrong_password_and_an_unknown_user_fail_alike(server):
    errors = []
    for user, password in (("analyst", PASSWORD + "x"), ("no_such_user", PASSWORD)):
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(server.dsn(user, password))
        errors.append(str(caught.value).replace(user, "NAME"))
    assert errors[0] == errors[1]
    assert "28P01" in errors[0] or "password authentication failed" in errors[0]
