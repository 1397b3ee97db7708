"""Red-team round of session 30 (fourth), with an analyst's connection (and an admin acting in
between), against what was merged in the hour before: a statement parsed before the database
file is taken, the tables read taken from the table check, ``?::TYPE`` placeholders and
undecodable text.

What succeeded, and was closed:

* a str parameter holding a lone surrogate (an undecodable byte kept by ``surrogateescape``)
  passed ``check_unicode`` (which reads the statement only) and reached the engine inside the
  check: the analyst got an InternalError "this is a bug in sqlsdc" quoting the engine
  binding's own TypeError text (``?::VARCHAR``) or Python's UnicodeEncodeError. A parameter
  that is not UTF-8 is now refused as a bad parameter (ProgrammingError), before the engine.
* a parameter *name* holding a lone surrogate (``{"\\udcff": 1}``) made the refusal's audit
  write fail (``record_query`` escaped the statement, not the reason that quotes the name): the
  analyst got an engine failure instead of the refusal, and the audit log a ``failed`` entry
  with the engine's text instead of the refusal. The reason is now escaped as the statement is.
* a number parameter of a subclass of int, float or Decimal (numpy's float64 is one) was
  written into the statement run with its own ``__str__``: SQL text the check had taken for a
  constant. ``age > ?`` bound to an int whose text was ``0 AND (CASE WHEN person_id = 7 AND
  income > x THEN CAST('x' AS INTEGER) ELSE 1 END) = 1`` failed in the engine exactly when
  that person's income was above x: an error oracle on one person's value, ~20 queries to
  read it to the unit. Parameters are now converted to their built-in type first (str
  subclasses too, though sqlglot quotes strings).
* a parameter whose ``repr`` fails (an int of more than 4,300 digits, an object whose
  ``__repr__`` raises) escaped the early parse (the check cache's key) as a bare ValueError,
  unaudited (it escaped the check under the lock the same way before). It is now no cache
  key, and the check refuses it as a bad parameter, audited.
* a statement given as a str subclass equal to every string and hashed as another
  statement was answered from the check cache with that statement's check: the analyst got
  the other statement's answer and the audit log recorded the innocuous text (with the other
  query's fingerprint only). A statement is now taken as a built-in str.
* a list subclass whose iteration (the check cache's key) listed other values than its
  ``__getitem__`` bound poisoned the process's check cache: another connection asking
  ``age > ?`` with [18] got the answer for 90 (integrity, not a leak: a checked query ran).
  A read-only mapping (``types.MappingProxyType``, any Mapping not a dict) was keyed by its
  names only, so ``$a`` bound to 19 then to 91 got the first answer twice. Only built-in
  lists, tuples and dicts are cache keys now.
* a named placeholder beside numbered ones (``region = :r AND age > ?``, ``$r`` with ``$1``)
  was bound to the next value in the order of the tree, a value a ``?`` or ``$n`` also took:
  one value in two places and no error (no leak: the check and the engine see one bound
  tree). Numbered and named parameters in one statement are now refused.

What held (one test each below): a statement parsed under the policy of the last opening is
checked again under a policy an admin applied between the parse and the check (a lower
``limits.max_statement_characters`` refuses it; a higher one lets through what the old one
refused; a user removed meanwhile is refused); two threads on one connection each get their
own statement's answer or refusal, audited under their own text, and a parse that outlasts
the timeout stops its own statement only; a failure of the early parse
that is not a refusal (MemoryError) is refused as a guard failure and audited, and an interrupt
(KeyboardInterrupt) leaves the connection usable and the cycle collector on; a per-table budget
is charged for a declared table read through a CTE, a nested CTE in a HAVING subquery, a
UNION ALL branch, upper case or a quoted name; ``?::TYPE`` counts with the other ``?`` in the
order of the text, and ``?::`` in strings, quoted names and comments is no placeholder.

Observed, not changed: a KeyboardInterrupt during the early parse is not audited (nor was it
during the check under the lock before); nothing has run or been charged then. The server's
catalog queries (``sqlsdc/server/catalog.py``) write int parameters with ``str`` too, but
their values are decoded from the wire as built-in types.
"""

from __future__ import annotations

import decimal
import gc
import shutil
import threading
import time
import types

import duckdb
import pytest

import sqlsdc
from sqlsdc.admin import audit
from sqlsdc.catalog import store
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

GROUPED = "SELECT region, COUNT(*) AS n FROM persons WHERE {} GROUP BY region ORDER BY region"


def _document(path) -> dict:
    con = open_database(path)
    try:
        return store.current_policy(con)[1]
    finally:
        con.close()


def _apply(path, **changes) -> None:
    document = _document(path) | changes
    sqlsdc.admin.apply(path, load_policy(document), user="admin")


def _between_parse_and_check(monkeypatch, action):
    """Run ``action`` once, right after the connection's early parse (no lock, no file)."""
    from sqlsdc.guard import pipeline

    parse, done = pipeline.parse_statement, []

    def parse_then_act(sql, limit, *walked):
        try:
            return parse(sql, limit, *walked)
        finally:
            if not done:
                done.append(action())

    monkeypatch.setattr(pipeline, "parse_statement", parse_then_act)
    return done


def _released(path, **kwargs) -> sqlsdc.Connection:
    """An analyst's connection that has let its file go, as after ``idle_release``."""
    con = sqlsdc.Connection(path, "analyst", idle_release=0.0, **kwargs)
    con._release_if_idle()
    assert con._db is None
    return con


# --- what succeeded, closed ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("SELECT region, COUNT(*) FROM persons WHERE region = ? GROUP BY region", ["\udcff"]),
        ("SELECT region, COUNT(*) FROM persons WHERE region <> ?::VARCHAR GROUP BY region",
         ["R0\ud801"]),
        ("SELECT region, COUNT(*) FROM persons WHERE region <> $x GROUP BY region",
         {"x": "R\udc80"}),
    ],
)  # fmt: skip
def test_a_parameter_that_is_not_utf8_is_refused_as_a_bad_parameter(demo_db, sql, params):
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.ProgrammingError, match="parameter is not UTF-8 text") as e:
            con.execute(sql, params)
        assert "bug" not in str(e.value) and "_duckdb" not in str(e.value)
        clean = {"x": "R01"} if isinstance(params, dict) else ["R01"]
        assert con.execute(sql, clean).fetchall()  # the connection answers on


def test_a_parameter_name_that_is_not_utf8_is_refused_and_audited_as_refused(demo_db):
    sql = "SELECT region, COUNT(*) FROM persons WHERE region <> 'x' GROUP BY region -- s30d"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.ProgrammingError, match="parameters given but not in the"):
            con.execute(sql, {"\udcff": 1})
    entry = audit(demo_db, "admin", limit=1).iloc[0]
    logged = f"{sql}\n-- parameters: $\\udcff = 1"  # its values, escaped (s46g)
    assert (entry["sql_text"], entry["decision"]) == (logged, "refused")
    assert "\\udcff" in entry["reason"]


@pytest.mark.parametrize(
    ("condition", "params"),
    [
        ("region = :r AND age > ?", ["R01"]),  # :r took the value of the ? too
        ("age > ? AND region = :r", [30]),
        ("region = $r AND age > $1", ["R01"]),
    ],
)
def test_a_named_parameter_beside_numbered_ones_is_refused(demo_db, condition, params):
    """A named placeholder among numbered ones was bound to the next value in the order of
    the tree, a value a ``?`` or ``$n`` took too: one value in two places, no error."""
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.ProgrammingError, match="mixes numbered parameters"):
            con.execute(GROUPED.format(condition), params)


def _lying(base, text: str):
    """A subclass of ``base`` whose ``str`` and ``repr`` are ``text``."""
    return type(f"Lying{base.__name__}", (base,), {"__str__": lambda s: text,
                                                     "__repr__": lambda s: text})  # fmt: skip


ORACLE = "0 AND (CASE WHEN person_id = 7 AND income > {} THEN CAST('x' AS INTEGER) ELSE 1 END) = 1"


@pytest.mark.parametrize("base", [int, float, decimal.Decimal])
def test_a_number_parameter_is_bound_as_its_value_not_its_text(demo_db, base):
    """An int (float, Decimal) subclass whose ``__str__`` was SQL wrote that SQL into the
    statement run, where the check saw a constant: ``age > ?`` bound to ``0 AND <fails when
    person 7 earns more than x>`` told, by an engine failure or an answer, whether one
    person's income was above x (an error oracle, a bisection away from the value)."""
    sql = "SELECT region, COUNT(*) FROM persons WHERE age > ? GROUP BY region ORDER BY region"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        plain = con.execute(sql, [base(0)]).fetchall()
        for x in (0, 10**9):
            lying = _lying(base, ORACLE.format(x))(0)
            assert con.execute(sql, [lying]).fetchall() == plain
        text = "' OR 1 = 1 --"
        assert "OR 1 = 1" not in con.explain(sql.replace("age > ?", "region = ?"),
                                             [_lying(str, text)("R01")]).sql  # fmt: skip


class Unwritable:
    def __repr__(self):
        raise ValueError("no text")


@pytest.mark.parametrize(
    ("value", "shown"),
    [(10**5000, "<int value>"), (Unwritable(), "<Unwritable value>")],
    ids=["5000 digits", "no repr"],
)
def test_a_parameter_that_cannot_be_written_is_refused_and_audited(demo_db, value, shown):
    """``repr`` of a 5,000-digit int raises ValueError, as a value whose ``repr`` fails: it
    escaped the early parse (the check cache's key) before any audit entry was written."""
    sql = "SELECT region, COUNT(*) FROM persons WHERE income > ? GROUP BY region -- s30d"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.ProgrammingError):
            con.execute(sql, [value])
    entry = audit(demo_db, "admin", limit=1).iloc[0]
    logged = f"{sql}\n-- parameters: {shown}"  # by its type's name, never its repr (s46g)
    assert (entry["sql_text"], entry["decision"]) == (logged, "refused")


def test_a_statement_given_as_a_str_subclass_is_checked_and_audited_as_its_own_text(demo_db):
    """A str subclass equal to everything, hashed as another statement: the check cache
    answered it with that statement's check, and the audit log recorded the innocuous text
    beside the other statement's answer."""
    asked = "SELECT region, SUM(income) FROM persons WHERE age > 64 GROUP BY region ORDER BY 1"
    logged = "SELECT region, COUNT(*) FROM persons GROUP BY region ORDER BY region"

    class Posing(str):
        __hash__ = lambda self: hash(asked)  # noqa: E731
        __eq__ = lambda self, other: True  # noqa: E731
        __ne__ = lambda self, other: False  # noqa: E731

    with sqlsdc.connect(demo_db, user="analyst") as con:
        sums = con.execute(asked).fetchall()
        counts = con.execute(Posing(logged)).fetchall()
        assert counts == con.execute(logged).fetchall() != sums
        assert con.explain(Posing(logged)).sql == con.explain(logged).sql


def test_parameters_that_bind_other_values_than_they_list_do_not_poison_the_check_cache(
    demo_db,
):
    """A list subclass listing 18 (its iteration, the cache's key) but binding 90 (its
    ``__getitem__``): its check was kept under the key of 18, and another connection of the
    process asking ``age > ?`` with a plain [18] got the answer for 90."""

    class Binds90(list):
        def __getitem__(self, index):
            return 90

    sql = "SELECT region, COUNT(*) FROM persons WHERE age > ? GROUP BY region ORDER BY region"
    with sqlsdc.connect(demo_db, user="analyst") as attacker:
        over_90 = attacker.execute(sql, Binds90([18])).fetchall()
    with sqlsdc.connect(demo_db, user="analyst") as victim:
        over_18 = victim.execute(sql, [18]).fetchall()
        assert over_18 == victim.execute(sql.replace("?", "18")).fetchall() != over_90


def test_a_read_only_mapping_of_parameters_is_bound_by_its_values(demo_db):
    """A Mapping that is not a dict (``MappingProxyType``) was frozen by iterating over it,
    its names only: ``$a`` bound to 18 and then to 90 was one cache key, and the second got
    the first's answer."""
    sql = "SELECT region, COUNT(*) FROM persons WHERE age > $a GROUP BY region ORDER BY region"
    with sqlsdc.connect(demo_db, user="analyst") as con:
        for age in (19, 91):
            bound = con.execute(sql, types.MappingProxyType({"a": age})).fetchall()
            assert bound == con.execute(sql.replace("$a", str(age))).fetchall()


# --- what held -----------------------------------------------------------------------------


def test_a_lower_statement_limit_applied_between_parse_and_check_refuses(
    fresh_demo_db, monkeypatch
):
    """Parsed under a limit of 100,000 characters with no lock and no file; the admin lowers
    it to 2,000 before the statement takes the file: the new limit refuses it, audited."""
    long = GROUPED.format(" OR ".join(f"age = {i}" for i in range(300)))
    assert len(long) > 2_000
    con = _released(fresh_demo_db)
    try:
        done = _between_parse_and_check(
            monkeypatch, lambda: _apply(fresh_demo_db, limits={"max_statement_characters": 2_000})
        )
        with pytest.raises(sqlsdc.PolicyViolation, match="the limit is 2,000"):
            con.execute(long)
        assert done and con.policy_version == 2
    finally:
        con.close()
    entry = audit(fresh_demo_db, "admin", limit=1).iloc[0]
    assert (entry["sql_text"], entry["decision"], entry["policy_version"]) == (long, "refused", 2)


def test_a_parse_refused_under_an_old_limit_is_checked_under_a_new_one(fresh_demo_db, monkeypatch):
    long = GROUPED.format(" OR ".join(f"age = {i}" for i in range(300)))
    _apply(fresh_demo_db, limits={"max_statement_characters": 2_000})
    con = _released(fresh_demo_db)
    try:
        _between_parse_and_check(
            monkeypatch, lambda: _apply(fresh_demo_db, limits={"max_statement_characters": 100_000})
        )
        assert con.execute(long).fetchall()
    finally:
        con.close()


def test_a_user_removed_between_parse_and_check_is_refused(fresh_demo_db, monkeypatch):
    document = _document(fresh_demo_db)
    users = {k: v for k, v in document["users"].items() if k != "analyst"}
    budgets = [b for b in document["budgets"] if b["user"] != "analyst"]
    con = _released(fresh_demo_db)
    try:
        _between_parse_and_check(
            monkeypatch, lambda: _apply(fresh_demo_db, users=users, budgets=budgets)
        )
        with pytest.raises(sqlsdc.AccessDenied, match="not declared"):
            con.execute(GROUPED.format("age > 17"))
    finally:
        con.close()


def test_two_threads_on_one_connection_get_and_audit_their_own_statements(demo_db, monkeypatch):
    """One thread's statement is refused by its parse while the other's is parsed, checked
    and run: neither gets the other's answer or refusal, each is audited under its text."""
    from sqlsdc.guard import pipeline

    broken = "SELECT region, COUNT(* FROM persons -- s30d thread"
    good = GROUPED.format("age > 18 AND age < 90")
    parse, both_parsing = pipeline.parse_statement, threading.Barrier(2, timeout=5)

    def in_step(sql, limit, *walked):
        both_parsing.wait()  # the two parses overlap, outside the connection's lock
        return parse(sql, limit, *walked)

    monkeypatch.setattr(pipeline, "parse_statement", in_step)
    outcomes: dict[str, object] = {}
    with sqlsdc.connect(demo_db, user="analyst") as con:

        def run(sql):
            try:
                outcomes[sql] = con.execute(sql).fetchall()
            except sqlsdc.Error as e:
                outcomes[sql] = e

        threads = [threading.Thread(target=run, args=(s,)) for s in (broken, good)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        monkeypatch.undo()
        expected = con.execute(good).fetchall()
    assert isinstance(outcomes[broken], sqlsdc.errors.SqlSyntaxError)
    assert outcomes[good] == expected
    log = audit(demo_db, "admin", limit=3)
    decisions = dict(zip(log["sql_text"], log["decision"], strict=True))
    assert decisions[broken] == "refused" and decisions[good] == "accepted"


def test_a_slow_parse_is_charged_to_its_own_statement_only(demo_db, monkeypatch):
    """Thread A's parse outlasts the statement timeout; thread B, on the same connection,
    runs its statement meanwhile (A holds no lock while parsing): B is answered, A is
    stopped, and A's stop is audited under A's text."""
    from sqlsdc.guard import pipeline

    slow_sql = GROUPED.format("age > 22 AND age < 105")
    fast_sql = GROUPED.format("age > 23 AND age < 106")
    parse, parsing = pipeline.parse_statement, threading.Event()

    def slow_for_a(sql, limit, *walked):
        if sql == slow_sql:
            parsing.set()
            time.sleep(0.8)
        return parse(sql, limit, *walked)

    monkeypatch.setattr(pipeline, "parse_statement", slow_for_a)
    outcomes: dict[str, object] = {}
    with sqlsdc.connect(demo_db, user="analyst", timeout=0.6) as con:

        def run(sql):
            try:
                outcomes[sql] = con.execute(sql).fetchall()
            except sqlsdc.Error as e:
                outcomes[sql] = e

        a = threading.Thread(target=run, args=(slow_sql,))
        a.start()
        assert parsing.wait(5)
        run(fast_sql)
        a.join(10)
    assert isinstance(outcomes[fast_sql], list) and outcomes[fast_sql]
    assert isinstance(outcomes[slow_sql], sqlsdc.errors.QueryCanceled)
    log = audit(demo_db, "admin", limit=2)
    decisions = dict(zip(log["sql_text"], log["decision"], strict=True))
    assert decisions[fast_sql] == "accepted" and decisions[slow_sql] != "accepted"


def test_a_memory_error_in_the_early_parse_is_refused_and_audited(demo_db, monkeypatch):
    from sqlsdc.guard import pipeline

    def exhausted(sql, limit, *walked):
        raise MemoryError("no memory left")

    sql = GROUPED.format("age > 20 AND age < 103")
    monkeypatch.setattr(pipeline, "parse_statement", exhausted)
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(sqlsdc.errors.InternalError, match="MemoryError"):
            con.execute(sql)
        monkeypatch.undo()
        assert con.execute(sql).fetchall()
    refused = audit(demo_db, "admin", decision="refused", limit=1).iloc[0]
    assert refused["sql_text"] == sql and "MemoryError" in refused["reason"]


def test_an_interrupt_in_the_early_parse_leaves_the_connection_usable(demo_db, monkeypatch):
    from sqlsdc.guard import pipeline

    def interrupted(sql, limit, *walked):
        raise KeyboardInterrupt

    sql = GROUPED.format("age > 21 AND age < 104")
    monkeypatch.setattr(pipeline, "parse_statement", interrupted)
    with sqlsdc.connect(demo_db, user="analyst") as con:
        with pytest.raises(KeyboardInterrupt):
            con.execute(sql)
        assert gc.isenabled() and not con._lock._is_owned()
        monkeypatch.undo()
        assert con.execute(sql).fetchall()


def _two_dp_tables(path) -> None:
    """Tables t and u (DP, 2,000 persons each) with a budget of their own each."""
    con = duckdb.connect(str(path))
    for name in ("t", "u"):
        con.execute(f"CREATE TABLE {name} (pid BIGINT, g VARCHAR, m INTEGER)")
        con.execute(
            f"INSERT INTO {name} SELECT i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END, i % 100 "
            "FROM range(2000) AS r(i)"
        )
    con.close()
    columns = {
        "pid": {"role": "identifier"},
        "g": {"role": "dimension", "domain": ["a", "b"]},
        "m": {"role": "measure", "bounds": [0, 100]},
    }
    dp = {
        "privacy_unit": "pid",
        "columns": columns,
        "protection": {"counts": {"method": "dp", "spend": {"epsilon": "1/2"}}},
        "dp": {"granularity": 10},
    }
    sqlsdc.init(path, {
        "tables": {"t": dp, "u": dp},
        "users": {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}},
        "budgets": [{"user": "*", "epsilon": 1000, "delta": "1e-3"},
                    {"user": "*", "table": "t", "epsilon": 50, "delta": "1e-3"},
                    {"user": "*", "table": "u", "epsilon": 50, "delta": "1e-3"}],
    })  # fmt: skip


@pytest.fixture(scope="module")
def two_dp_tables(tmp_path_factory):
    """:func:`_two_dp_tables`, built once for the module: each case charges a copy."""
    path = tmp_path_factory.mktemp("s30d") / "two.duckdb"
    _two_dp_tables(path)
    return path


@pytest.mark.parametrize(
    "sql",
    [
        "WITH x AS (SELECT * FROM U) SELECT g, COUNT(*) FROM x GROUP BY g",
        'SELECT g, COUNT(*) FROM "U" GROUP BY g',
        "FROM u SELECT g, COUNT(*) GROUP BY g",
        "SELECT g, COUNT(*) FROM t GROUP BY g "
        'HAVING COUNT(*) > (WITH q AS (SELECT * FROM "u") SELECT COUNT(*) FROM q)',
        "SELECT g, COUNT(*) FROM t GROUP BY g UNION ALL SELECT g, COUNT(*) FROM u GROUP BY g",
        "WITH a AS (SELECT g, COUNT(*) AS n FROM t GROUP BY g) "
        "SELECT * FROM a JOIN (WITH b AS (SELECT * FROM u) SELECT g, COUNT(*) AS k FROM b "
        "GROUP BY g) AS c USING (g)",
    ],
)
def test_a_table_read_in_any_part_of_a_dp_query_is_charged_its_budget(two_dp_tables, tmp_path, sql):
    path = tmp_path / "two.duckdb"
    shutil.copy(two_dp_tables, path)
    with sqlsdc.connect(path, user="analyst") as con:
        read = set(con.explain(sql).tables)
        con.execute(sql).fetchall()
        spent = {b.key.table: b.spent.epsilon for b in con.remaining_budget()}
    assert "u" in read and read <= {"t", "u"}
    assert spent["*"] > 0
    assert {t for t in ("t", "u") if spent[t] == spent["*"]} == read
    assert {t for t in ("t", "u") if spent[t] == 0} == {"t", "u"} - read


def test_a_cast_placeholder_takes_its_value_in_the_order_of_the_text(demo_db):
    """``?::TYPE`` is the next ``?``; ``?::`` in a string, a quoted name or a comment is no
    placeholder; ``?::`` mixed with ``$n`` is refused."""
    from sqlsdc.guard.parse import number_placeholders

    text = "SELECT '?::', \"?::\", ?::INT /* ?:: */, ? -- ?::\n, ?::DATE"
    assert number_placeholders(text) == (
        "SELECT '?::', \"?::\", $1::INT /* ?:: */, $2 -- ?::\n, $3::DATE"
    )
    with sqlsdc.connect(demo_db, user="analyst") as con:
        cast = ("SELECT region, COUNT(*) FROM persons WHERE age > ?::INTEGER "
                "AND region <> ? AND age < ?::BIGINT GROUP BY region ORDER BY region")  # fmt: skip
        plain = cast.replace("?::INTEGER", "?").replace("?::BIGINT", "?")
        assert (
            con.execute(cast, [30, "R01", 60]).fetchall()
            == con.execute(plain, [30, "R01", 60]).fetchall()
        )
        assert "'R01'" not in con.execute(cast, [30, "R01", 60]).query.sql.split("age")[0]
        with pytest.raises(sqlsdc.ProgrammingError, match="mixes"):
            con.execute(cast.replace("age < ?", "age < $3"), [30, "R01", 60])
        with pytest.raises(sqlsdc.ProgrammingError, match="3 parameter"):
            con.execute(cast, [30, "R01"])
