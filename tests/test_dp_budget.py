"""Enforced privacy budgets in the catalog: limits, grants, resets, the spend ledger, the cache
of released cells, concurrency and crash safety (real DuckDB files, a real killed process)."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import threading
from fractions import Fraction

import cli_fork
import pandas as pd
import pytest

from sqlsdc.catalog import budget, budget_admin, budget_tables, dp_cache
from sqlsdc.catalog.budget import ALL, BudgetKey
from sqlsdc.catalog.store import ensure_catalog
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import BudgetExhausted, Error
from sqlsdc.mechanisms.accountant import (
    Bounding,
    BudgetLimit,
    PrivacyCost,
    Statistic,
    calibrate,
)
from sqlsdc.mechanisms.dp_cells import (
    CellMechanism,
    CellRecord,
    CellSpace,
    add_noise,
    statistic_identity,
)

SECRET = b"sqlsdc test secret - budgets 0001"
HAIR = Fraction(1, 10**30)
EPS = PrivacyCost(epsilon=Fraction(1, 4))
ALICE = {BudgetKey("alice"): BudgetLimit(epsilon=1)}
SQL = "SELECT region, COUNT(*) FROM persons GROUP BY region"  # the statement charged


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "budget.duckdb"
    con = open_database(path)
    ensure_catalog(con)
    con.close()
    return path


@pytest.fixture
def con(db):
    c = open_database(db)
    yield c
    c.close()


def _charge(con, cost=EPS, user="alice", tables=("persons",), limits=ALICE, **kw):
    return budget.charge(con, user=user, tables=tables, cost=cost, query_id=kw.pop("qid", 1),
                         limits=limits, sql=kw.pop("sql", SQL), **kw)  # fmt: skip


def _ledger_rows(con) -> int:
    return con.execute("SELECT count(*) FROM sqlsdc.budget_spend").fetchone()[0]


def test_spending_exactly_the_budget_then_a_hair_more(con):
    for _ in range(3):
        _charge(con)
    _charge(con, PrivacyCost(epsilon=Fraction(1, 4) - HAIR))
    with pytest.raises(BudgetExhausted, match=r"only ε = 1/1000.*0 \(~1e-30\) remains") as info:
        _charge(con, PrivacyCost(epsilon=2 * HAIR))
    assert info.value.requested == PrivacyCost(epsilon=2 * HAIR)
    assert info.value.remaining.epsilon == HAIR
    _charge(con, PrivacyCost(epsilon=HAIR))  # exactly the rest
    (status,) = budget.budget_status(con, ALICE)
    assert status.spent.epsilon == 1 and status.remaining.epsilon == 0
    assert _ledger_rows(con) == 5


def test_a_budget_shows_its_amounts_as_every_output_writes_them(con):
    """``con.remaining_budget()`` in a notebook showed ``Fraction(22, 5)`` (new user s38)."""
    limits = {
        BudgetKey("alice"): BudgetLimit(epsilon=Fraction(5, 2)),
        BudgetKey(ALL, "persons"): BudgetLimit(epsilon=5, delta=Fraction(1, 10**6)),
    }
    _charge(con, PrivacyCost(epsilon=Fraction(1, 3)), limits=limits)
    statuses = {s.key: repr(s) for s in budget.budget_status(con, limits)}
    assert statuses == {
        BudgetKey("alice"): "<budget of user 'alice' on all tables: epsilon limit 2.5, spent "
        "1/3 (~0.333333), remaining 13/6 (~2.16667)>",
        BudgetKey(ALL, "persons"): "<budget of all users on table 'persons': epsilon limit 5, "
        "spent 1/3 (~0.333333), remaining 14/3 (~4.66667); delta limit 0.000001, spent 0, "
        "remaining 0.000001>",
    }
    shown = {s.key: repr(s) for s in budget.budget_status(con, {BudgetKey("bob"): BudgetLimit()})}
    assert shown[BudgetKey("bob")] == "<budget of user 'bob' on all tables: no limit>"


def test_exhaustion_message_says_what_remains(con):
    _charge(con, PrivacyCost(epsilon=Fraction(3, 4)))
    with pytest.raises(BudgetExhausted) as info:
        _charge(con, PrivacyCost(epsilon=Fraction(1, 2)))
    message = str(info.value)
    assert "user 'alice' on all tables" in message
    assert "needs ε = 0.5 but only ε = 0.25 remains (limit 1, spent 0.75)" in message
    assert "sqlsdc budget DB grant" in message and SECRET.decode() not in message
    assert _ledger_rows(con) == 1  # the refused charge recorded nothing


def test_no_budget_means_no_spending(con):
    with pytest.raises(BudgetExhausted, match=r"no ε budget applies to user 'bob'.*fail closed"
                       r".*sqlsdc budget DB grant --for bob --epsilon AMOUNT"):  # fmt: skip
        _charge(con, user="bob")  # --for: the spelling every command's --help gives
    # an epsilon budget does not allow rho spending
    with pytest.raises(BudgetExhausted, match="no ρ budget applies"):
        _charge(con, PrivacyCost(rho=Fraction(1, 10)))
    assert _ledger_rows(con) == 0
    assert budget.charge(con, user="bob", tables=["t"], cost=PrivacyCost(), query_id=1,
                         sql=SQL) is None  # fmt: skip


def test_every_applicable_key_must_allow_the_charge(con):
    limits = {
        BudgetKey("alice"): BudgetLimit(epsilon=1),
        BudgetKey("bob"): BudgetLimit(epsilon=1),
        BudgetKey(ALL, "persons"): BudgetLimit(epsilon=Fraction(3, 4)),  # all users together
        BudgetKey("alice", "households"): BudgetLimit(epsilon=Fraction(1, 4)),
    }
    _charge(con, limits=limits)  # alice on persons
    _charge(con, user="bob", limits=limits)  # bob on persons
    _charge(con, user="bob", tables=["persons", "households"], limits=limits)
    with pytest.raises(BudgetExhausted, match="all users on table 'persons'"):
        _charge(con, limits=limits)  # persons is used up by alice and bob together
    _charge(con, tables=["households"], limits=limits)
    with pytest.raises(BudgetExhausted, match="user 'alice' on table 'households'"):
        _charge(con, tables=["Households"], limits=limits)  # table names are case-insensitive
    spent = {s.key: s.spent.epsilon for s in budget.budget_status(con, limits)}
    assert spent[BudgetKey(ALL, "persons")] == Fraction(3, 4)
    assert spent[BudgetKey("bob")] == Fraction(1, 2)
    mine = {s.key for s in budget.budget_status(con, limits, user="alice")}
    assert mine == {BudgetKey("alice"), BudgetKey(ALL, "persons"), BudgetKey("alice", "households")}


def test_rho_is_accounted_separately(con):
    limits = {BudgetKey("alice"): BudgetLimit(epsilon=1, rho=Fraction(1, 2))}
    _charge(con, PrivacyCost(epsilon=1), limits=limits)
    _charge(con, PrivacyCost(rho=Fraction(1, 2)), limits=limits)
    with pytest.raises(BudgetExhausted, match="needs ρ = 0.1 but only ρ = 0 remains"):
        _charge(con, PrivacyCost(rho=Fraction(1, 10)), limits=limits)


def test_grants_and_resets_have_an_audit_trail(con):
    with pytest.raises(BudgetExhausted):
        _charge(con, limits=None)
    budget_admin.grant(con, admin="root", key=BudgetKey("alice"), cost=PrivacyCost(epsilon="0.5"),
                       reason="pilot study")  # fmt: skip
    _charge(con, limits=None)
    _charge(con, limits=None)
    with pytest.raises(BudgetExhausted, match="only ε = 0 remains"):
        _charge(con, limits=None)
    budget_admin.grant(con, admin="root", key=BudgetKey("alice"), cost=EPS, reason="more")
    _charge(con, limits=None)
    # a policy limit and the grants add up
    (status,) = budget.budget_status(con, ALICE)
    assert status.limit.epsilon == Fraction(7, 4) and status.spent.epsilon == Fraction(3, 4)
    budget_admin.reset(con, admin="root", key=BudgetKey("alice"), reason="new quarter")
    (status,) = budget.budget_status(con, ALICE)
    assert status.spent.epsilon == 0 and status.remaining.epsilon == Fraction(7, 4)
    events = budget_admin.budget_events(con, user="alice")
    assert [(e["action"], e["admin"], e["reason"], e["epsilon"]) for e in events] == [
        ("grant", "root", "pilot study", "1/2"),
        ("grant", "root", "more", "1/4"),
        ("reset", "root", "new quarter", None),
    ]
    assert len(budget_admin.spend_ledger(con, user="alice")) == 3  # the ledger keeps everything


def test_a_reset_applies_to_its_key_only(con):
    limits = {BudgetKey("alice"): BudgetLimit(epsilon=1), BudgetKey(ALL, "persons"):
              BudgetLimit(epsilon=Fraction(1, 2))}  # fmt: skip
    _charge(con, limits=limits)
    _charge(con, limits=limits)
    budget_admin.reset(con, admin="root", key=BudgetKey("alice"), reason="new quarter")
    with pytest.raises(BudgetExhausted, match="all users on table 'persons'"):
        _charge(con, limits=limits)


# --- delta of private group selection --------------------------------------------------------


MICRO = Fraction(1, 10**6)
SELECTION = PrivacyCost(epsilon=Fraction(1, 100), delta=MICRO)


def test_delta_adds_up_and_is_refused_exactly_past_its_limit(con):
    limits = {BudgetKey("alice"): BudgetLimit(epsilon=1, delta=4 * MICRO)}
    _charge(con, SELECTION, limits=limits)
    _charge(con, 2 * SELECTION, limits=limits)
    _charge(con, PrivacyCost(delta=MICRO - HAIR), limits=limits)
    refused = (r"needs δ = 1/50{29} \(~2e-30\) but only δ = 1/10{30} \(~1e-30\) remains "
               r"\(limit 0.000004, spent")  # more than 15 places: a fraction  # fmt: skip
    with pytest.raises(BudgetExhausted, match=refused) as info:
        _charge(con, PrivacyCost(epsilon=Fraction(1, 100), delta=2 * HAIR), limits=limits)
    assert info.value.requested.delta == 2 * HAIR and info.value.remaining.delta == HAIR
    _charge(con, PrivacyCost(delta=HAIR), limits=limits)  # exactly the rest
    (status,) = budget.budget_status(con, limits)
    assert status.spent == PrivacyCost(epsilon=Fraction(3, 100), delta=4 * MICRO)
    assert status.remaining == BudgetLimit(epsilon=Fraction(97, 100), delta=0)
    assert [r["delta"] for r in budget_admin.spend_ledger(con)] == [
        str(HAIR), str(MICRO - HAIR), str(2 * MICRO), str(MICRO)]  # fmt: skip
    assert _ledger_rows(con) == 4


def test_delta_without_a_delta_budget_is_refused(con):
    """An epsilon budget does not allow delta spending: a private-selection query needs one."""
    with pytest.raises(BudgetExhausted, match=r"no δ budget applies to user 'alice' on persons, "
                       r"so this query's δ = 0.000001 cannot be spent \(fail closed\).*"
                       r"--delta AMOUNT") as info:  # fmt: skip
        _charge(con, SELECTION)
    assert info.value.remaining == BudgetLimit(epsilon=1, rho=0, delta=0)
    assert _ledger_rows(con) == 0


def test_delta_grants_raise_the_limit_and_are_in_the_audit_trail(con):
    budget_admin.grant(con, admin="root", key=BudgetKey("alice"), cost=PrivacyCost(delta=MICRO),
                       reason="private groups")  # fmt: skip
    _charge(con, SELECTION)
    with pytest.raises(BudgetExhausted, match="only δ = 0 remains"):
        _charge(con, SELECTION)
    budget_admin.grant(con, admin="root", key=BudgetKey("alice"),
                       cost=PrivacyCost(epsilon=1, delta=MICRO), reason="more")  # fmt: skip
    _charge(con, SELECTION)
    (status,) = budget.budget_status(con, ALICE)
    assert status.limit == BudgetLimit(epsilon=2, delta=2 * MICRO)
    assert status.spent.delta == 2 * MICRO
    events = budget_admin.budget_events(con, user="alice")
    assert [(e["epsilon"], e["delta"]) for e in events] == [(None, "1/1000000"),
                                                           ("1", "1/1000000")]  # fmt: skip
    with pytest.raises(ValueError, match="a delta grant must be below 1"):
        budget_admin.grant(con, admin="root", key=BudgetKey("alice"), cost=PrivacyCost(delta=1),
                           reason="too much")  # fmt: skip


def _old_catalog(path):
    """A catalog from before delta was accounted: no ``delta`` column in the ledger or the
    events, rows written positionally as that version did."""
    con = open_database(path)
    ensure_catalog(con)
    for table in ("budget_spend", "budget_events"):
        con.execute(f"ALTER TABLE sqlsdc.{table} DROP COLUMN delta")
    con.execute("INSERT INTO sqlsdc.budget_events VALUES (1, now(), 'root', 'grant', 'alice', "
                "'*', '1/2', NULL, 'pilot')")  # fmt: skip
    con.execute("INSERT INTO sqlsdc.budget_spend VALUES (2, 7, now(), 'alice', ['persons'], "
                "'1/4', '0', 3, 1)")  # fmt: skip
    con.execute("SELECT nextval('sqlsdc.budget_seq') FROM range(2)")  # seq 1 and 2 are taken
    con.close()


def test_an_older_catalog_gets_the_delta_columns_with_its_rows_kept(tmp_path):
    path = tmp_path / "old.duckdb"
    _old_catalog(path)
    con = open_database(path, read_only=True)  # cannot migrate: reads the old layout as δ = 0
    try:
        (status,) = budget.budget_status(con)
        assert status.spent == PrivacyCost(epsilon=Fraction(1, 4))
        assert status.limit == BudgetLimit(epsilon=Fraction(1, 2))
        assert [r["delta"] for r in budget_admin.spend_ledger(con)] == ["0"]
    finally:
        con.close()
    con = open_database(path)
    try:
        budget_tables.ensure_budget_catalog(con)
        (row,) = budget_admin.spend_ledger(con)
        assert (row["query_id"], row["epsilon"], row["delta"], row["cells"]) == (7, "1/4", "0", 3)
        (event,) = budget_admin.budget_events(con)
        assert (event["epsilon"], event["delta"], event["reason"]) == ("1/2", None, "pilot")
        limits = {BudgetKey("alice"): BudgetLimit(delta=MICRO)}
        _charge(con, SELECTION, limits=limits, qid=8)
        (status,) = budget.budget_status(con, limits)
        assert status.spent == PrivacyCost(epsilon=Fraction(1, 4) + Fraction(1, 100),
                                           delta=MICRO)  # fmt: skip
        assert status.limit == BudgetLimit(epsilon=Fraction(1, 2), delta=MICRO)
    finally:
        con.close()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda c: budget_admin.grant(c, admin="root", key=BudgetKey("a"), cost=PrivacyCost(),
                                      reason="x"), "needs a positive epsilon, rho or delta"),
        (lambda c: budget_admin.grant(c, admin="root", key=BudgetKey("a"), cost=EPS, reason=" "),
         "needs a reason"),
        (lambda c: budget_admin.reset(c, admin="", key=BudgetKey("a"), reason="x"),
         "acting administrator"),
        (lambda c: BudgetKey(""), "non-empty name"),
        (lambda c: _charge(c, tables=[]), "needs the tables the query reads"),
        (lambda c: _charge(c, tables=["*"]), "'\\*' is not a table name"),
        (lambda c: _charge(c, cost=PrivacyCost(), cells=["x"]), "must be paid for"),
    ],
)  # fmt: skip
def test_administration_errors(con, call, match):
    with pytest.raises(ValueError, match=match):
        call(con)


# --- consistent noise: the cache of released cells -------------------------------------------


def _count_cells(n=3, scale=1):
    cal = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1, scale)))
    frame = pd.DataFrame({"region": [f"r{i}" for i in range(n)], "n": [10 * i for i in range(n)]})
    return frame, CellSpace.of("persons", ["region"]), {"n": CellMechanism("*", cal)}


def _ask(con, frame, space, mechanisms, user="alice", qid=1):
    """What the pipeline does: look up, draw what is new, charge, and only then return."""
    out = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3,
                    cached=lambda d: dp_cache.cached_cells(con, user, 3, d))  # fmt: skip
    cost = mechanisms["n"].calibration.cost if out.new_cells else PrivacyCost()
    budget.charge(con, user=user, tables=["persons"], cost=cost, query_id=qid, limits={
                  BudgetKey("alice"): BudgetLimit(epsilon=10), BudgetKey("bob"): BudgetLimit(
                  epsilon=10)}, cells=out.new_cells,
                  policy_version=3, sql=SQL)  # fmt: skip
    return out


def test_asking_the_same_cells_again_costs_nothing_and_gives_the_same_values(con):
    frame, space, mechanisms = _count_cells()
    first = _ask(con, frame, space, mechanisms)
    assert len(first.new_cells) == 3 and _ledger_rows(con) == 1
    second = _ask(con, frame.iloc[::-1], space, mechanisms, qid=2)
    assert second.reused == 3 and not second.new_cells and _ledger_rows(con) == 1
    assert second.values["n"] == first.values["n"][::-1]
    # the data changed: the cached value is still what alice gets
    changed = frame.assign(n=frame["n"] + 5)
    third = _ask(con, changed, space, mechanisms, qid=3)
    assert third.values["n"] == first.values["n"] and _ledger_rows(con) == 1
    # another user pays for the same cells and sees the same values
    bob = _ask(con, frame, space, mechanisms, user="bob", qid=4)
    assert bob.values["n"] == first.values["n"] and _ledger_rows(con) == 2
    # one more cell: charged once more, the three old ones come from the cache
    more = _ask(con, _count_cells(4)[0], space, mechanisms, qid=5)
    assert more.reused == 3 and len(more.new_cells) == 1 and _ledger_rows(con) == 3
    stored = con.execute("SELECT user_name, count(*) FROM sqlsdc.dp_cells GROUP BY ALL "
                         "ORDER BY 1").fetchall()  # fmt: skip
    assert stored == [("alice", 4), ("bob", 3)]


def test_statistics_paid_by_a_concurrent_query_are_not_paid_twice(con):
    """Two queries of one user (in two processes) price the same new statistics before
    either has charged; the second charge meets them cached (a key conflict), and on its retry
    finds every one paid: it is not charged (what it draws is a function of the cells: the
    values the first query released). Some paid and some not: it is charged in full
    (conservative)."""
    frame, space, mechanisms = _count_cells()
    drawn = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3)
    assert _charge(con, cells=drawn.new_cells, policy_version=3, qid=1) is not None
    assert _charge(con, cells=drawn.new_cells, policy_version=3, qid=2) is None
    assert _ledger_rows(con) == 1
    assert con.execute("SELECT count(*) FROM sqlsdc.dp_cells").fetchone()[0] == 3
    assert budget.spent(con, BudgetKey("alice")).epsilon == EPS.epsilon
    more = add_noise(_count_cells(4)[0], space, mechanisms, secret=SECRET, policy_version=3)
    assert _charge(con, cells=more.new_cells, policy_version=3, qid=3) is not None
    assert con.execute("SELECT count(*) FROM sqlsdc.dp_cells").fetchone()[0] == 4
    assert budget.spent(con, BudgetKey("alice")).epsilon == 2 * EPS.epsilon


def test_a_cache_of_an_older_catalog_is_keyed_with_its_rows_kept(tmp_path):
    """Catalogs made before ``dp_cells`` had its one-column key are rebuilt on first use."""
    path = tmp_path / "old.duckdb"
    con = open_database(path)
    ensure_catalog(con)
    frame, space, mechanisms = _count_cells()
    first = _ask(con, frame, space, mechanisms)
    con.execute("DROP TABLE sqlsdc.dp_cells")
    con.execute(
        """CREATE TABLE sqlsdc.dp_cells (user_name VARCHAR NOT NULL, policy_version INTEGER
        NOT NULL, cell_hash VARCHAR NOT NULL, cell VARCHAR NOT NULL, column_name VARCHAR NOT
        NULL, statistic VARCHAR NOT NULL, value VARCHAR NOT NULL, query_id BIGINT NOT NULL,
        released_at TIMESTAMP NOT NULL, PRIMARY KEY (user_name, policy_version, cell_hash))"""
    )
    for cell in first.new_cells:
        con.execute(
            "INSERT INTO sqlsdc.dp_cells VALUES ('alice', 3, ?, ?, 'n', 'count', ?, 1, now())",
            [cell.identity.digest, cell.identity.text, str(cell.value)],
        )
    con.close()
    con = open_database(path)
    assert (
        dp_cache.cached_cells(con, "alice", 3, [c.identity.digest for c in first.new_cells]) == {}
    )
    budget_tables.ensure_budget_catalog(con)
    again = _ask(con, frame, space, mechanisms, qid=2)
    assert again.reused == 3 and not again.new_cells and _ledger_rows(con) == 1
    assert again.values["n"] == first.values["n"]
    con.close()


def test_refused_charges_cache_nothing(con):
    frame, space, mechanisms = _count_cells(scale=Fraction(1, 20))  # epsilon 20 > alice's 10
    with pytest.raises(BudgetExhausted):
        _ask(con, frame, space, mechanisms)
    assert con.execute("SELECT count(*) FROM sqlsdc.dp_cells").fetchone()[0] == 0
    assert dp_cache.cached_cells(con, "alice", 3, ["0" * 64]) == {}


def test_cells_need_a_policy_version(con):
    frame, space, mechanisms = _count_cells()
    out = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3)
    with pytest.raises(ValueError, match="needs the policy version"):
        _charge(con, cells=out.new_cells)


# --- concurrency and crash safety ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kept_state", "one_statement"),
    [(False, False), (True, False), (True, True)],
    ids=["read-each-time", "kept-state", "kept-state-one-statement"],
)
def test_concurrent_charges_never_overspend(db, kept_state, one_statement, monkeypatch):
    """Two connections charge 1/10 eight times each under a limit of 1. With a kept state and
    no query id (a guarded connection's charge), a charge is sent as one statement decided on
    the state, which a concurrent charge makes stale: it is then decided afresh."""
    limit = {BudgetKey("alice"): BudgetLimit(epsilon=1)}
    tenth = PrivacyCost(epsilon=Fraction(1, 10))
    outcomes: list[str] = []
    lock = threading.Lock()
    sent: list[bool] = []  # whether each one-statement charge stood
    known = budget._charge_known

    def watched(*args):
        row = known(*args)
        sent.append(row is not None)
        return row

    monkeypatch.setattr(budget, "_charge_known", watched)

    def worker():
        con = open_database(db)
        state = budget.BudgetState() if kept_state else None  # as a guarded connection keeps
        try:
            for _ in range(8):
                try:
                    _charge(con, tenth, limits=limit, state=state,
                            qid=None if one_statement else 1)  # fmt: skip
                    result = "charged"
                except BudgetExhausted:
                    result = "refused"
                with lock:
                    outcomes.append(result)
        finally:
            con.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["charged"] * 10 + ["refused"] * 6
    assert any(sent) == one_statement
    con = open_database(db)
    try:
        (status,) = budget.budget_status(con, limit)
        assert status.spent.epsilon == 1 and _ledger_rows(con) == 10
    finally:
        con.close()


CRASHING_QUERY = textwrap.dedent(
    """
    import sys, time
    from fractions import Fraction
    import pandas as pd
    from sqlsdc.catalog.budget import BudgetKey, charge
    from sqlsdc.engines.duckdb import open_database
    from sqlsdc.mechanisms.accountant import (Bounding, BudgetLimit, PrivacyCost, Statistic,
                                              calibrate)
    from sqlsdc.mechanisms.dp_cells import CellMechanism, CellSpace, add_noise

    con = open_database(sys.argv[1])
    cal = calibrate(Statistic.COUNT, Bounding(), PrivacyCost(epsilon=Fraction(1, 4)))
    frame = pd.DataFrame({"region": ["N", "S"], "n": [10, 20]})
    out = add_noise(frame, CellSpace.of("persons", ["region"]), {"n": CellMechanism("*", cal)},
                    secret=bytes.fromhex(sys.argv[2]), policy_version=3)
    charge(con, user="alice", tables=["persons"], cost=cal.cost, query_id=42,
           limits={BudgetKey("alice"): BudgetLimit(epsilon=1)}, cells=out.new_cells,
           policy_version=3, sql="SELECT region, COUNT(*) FROM persons GROUP BY region")
    print("charged", ",".join(str(v) for v in out.values["n"]), flush=True)
    time.sleep(600)  # computing and returning the result; the test kills us here
    """
)


def test_a_process_killed_after_the_charge_leaves_the_spend_recorded(db):
    process = cli_fork.popen(  # its own process, forked with sqlsdc imported
        [db, SECRET.hex()], code=CRASHING_QUERY, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert line.startswith("charged "), process.stderr.read()
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    released = [Fraction(v) for v in line.split()[1].split(",")]
    con = open_database(db)  # replays DuckDB's write-ahead log
    try:
        (row,) = budget_admin.spend_ledger(con, user="alice")
        assert (row["query_id"], row["epsilon"], row["cells"]) == (42, "1/4", 2)
        cached = con.execute("SELECT value FROM sqlsdc.dp_cells ORDER BY cell").fetchall()
        assert sorted(Fraction(v) for (v,) in cached) == sorted(released)
    finally:
        con.close()


def test_charging_on_a_read_only_connection_fails_cleanly(db):
    con = open_database(db, read_only=True)
    try:
        with pytest.raises(Error, match="could not record the privacy spend|read-only"):
            _charge(con)
    finally:
        con.close()


# --- cells recorded after a charge that was made before computing them -----------------------


def test_cache_cells_caches_paid_cells_once_and_counts_them_on_the_charge(con):
    frame, space, mechanisms = _count_cells()
    out = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3)
    paid = _charge(con, cost=mechanisms["n"].calibration.cost, cells=[], policy_version=3)
    dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=1, cells=out.new_cells,
                         paid_by=paid)  # fmt: skip
    dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=2,
                         cells=out.new_cells + out.new_cells, again=True)  # fmt: skip
    cached = dp_cache.cached_cells(con, "alice", 3, [c.identity.digest for c in out.new_cells])
    assert cached == {c.identity.digest: c.value for c in out.new_cells}
    assert con.execute("SELECT cells FROM sqlsdc.budget_spend").fetchall() == [(3,)]
    assert con.execute("SELECT count(*) FROM sqlsdc.dp_cells").fetchone()[0] == 3
    assert _ledger_rows(con) == 1  # recording cells spends nothing


def test_the_charges_statistics_are_cached_with_its_cells_and_not_counted(con):
    """The guard caches a charge's statistics with the cells it drew (a statistic counts as
    paid for a later asking only from then on): found by the look-up, value 0, and the
    ledger row counts the cells alone, on the retry too (cells cached by then left out)."""
    frame, space, mechanisms = _count_cells()
    out = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3)
    ident = statistic_identity(space, mechanisms["n"], None)
    stat = CellRecord(ident, "n", mechanisms["n"].calibration.statistic, Fraction(0))
    paid = _charge(con, cost=mechanisms["n"].calibration.cost, policy_version=3)
    assert dp_cache.cached_cells(con, "alice", 3, [ident.digest]) == {}  # charged, not paid
    first, rest = out.new_cells[:1], out.new_cells[1:]
    dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=1, cells=first,
                         paid_by=paid, statistics=[stat])  # fmt: skip
    assert dp_cache.cached_cells(con, "alice", 3, [ident.digest]) == {ident.digest: 0}
    assert con.execute("SELECT cells FROM sqlsdc.budget_spend").fetchall() == [(1,)]
    dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=1, cells=first + rest,
                         paid_by=paid, again=True, statistics=[stat])  # fmt: skip
    assert con.execute("SELECT cells FROM sqlsdc.budget_spend").fetchall() == [(len(rest),)]
    assert con.execute("SELECT count(*) FROM sqlsdc.dp_cells").fetchone()[0] == 4


def test_one_cell_is_cached_as_the_same_row_as_among_others(db):
    """One cell (a charge's statistic) is written as a row of values, not unnested lists: the
    same row as when it is written among others, and the retry's INSERT OR IGNORE skips it."""
    frame, space, mechanisms = _count_cells(3)
    out = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3)
    first = out.new_cells[0]
    rows = {}
    for label, cells in (("among", out.new_cells), ("alone", [first])):
        con = open_database(db)
        try:
            con.execute("DELETE FROM sqlsdc.dp_cells")
            dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=7, cells=cells)
            if label == "alone":
                dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=8, cells=[first],
                                     again=True)  # fmt: skip
            rows[label] = con.execute(
                "SELECT * EXCLUDE (released_at), typeof(entry), typeof(released_at) FROM "
                "sqlsdc.dp_cells WHERE cell_hash = ?",
                [first.identity.digest],
            ).fetchall()
        finally:
            con.close()
    assert len(rows["alone"]) == 1 and rows["alone"] == rows["among"]
    con = open_database(db)  # the row written alone is found
    try:
        found = dp_cache.cached_cells(con, "alice", 3, [first.identity.digest])
    finally:
        con.close()
    assert found == {first.identity.digest: first.value}


@pytest.mark.parametrize("n", [3, dp_cache._LISTED_ENTRIES + 1, 700])
def test_large_results_are_cached_and_found_as_small_ones_are(db, n, monkeypatch):
    """Over ``_LISTED_ENTRIES`` cells, the cache is read and written through a registered
    Arrow table instead of list parameters: the same rows (the cells of a listed write, time
    aside), the same look-ups, the retry of a write that met a concurrent one included, and
    nothing left registered."""
    frame, space, mechanisms = _count_cells(n)
    out = add_noise(frame, space, mechanisms, secret=SECRET, policy_version=3)
    digests = [c.identity.digest for c in out.new_cells]
    written = {}
    for listed in (10**6, dp_cache._LISTED_ENTRIES):
        monkeypatch.setattr(dp_cache, "_LISTED_ENTRIES", listed)
        con = open_database(db)
        try:
            con.execute("DELETE FROM sqlsdc.dp_cells")
            paid = _charge(con, cost=mechanisms["n"].calibration.cost, cells=[], policy_version=3,
                           limits={BudgetKey("alice"): BudgetLimit(epsilon=10)})  # fmt: skip
            half = out.new_cells[: n // 2]
            dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=1, cells=half,
                                 paid_by=paid)  # fmt: skip
            assert dp_cache.cached_cells(con, "bob", 3, digests) == {}
            dp_cache.cache_cells(con, user="alice", policy_version=3, query_id=1,
                                 cells=out.new_cells, again=True)  # fmt: skip
            found = dp_cache.cached_cells(con, "alice", 3, digests)
            assert found == {c.identity.digest: c.value for c in out.new_cells}
            written[listed] = sorted(con.execute(
                "SELECT * EXCLUDE (released_at) FROM sqlsdc.dp_cells").fetchall())  # fmt: skip
            assert con.execute("SELECT count(*) FROM duckdb_views() WHERE temporary "
                               "AND view_name LIKE '__sqlsdc%'").fetchone() == (0,)  # fmt: skip
        finally:
            con.close()
    assert len(written[10**6]) == n and written[10**6] == written[dp_cache._LISTED_ENTRIES]


def test_spent_is_the_same_summed_per_key_or_joined_in_one_pass(con, monkeypatch):
    """A charge sums its few keys with a filter each; `sqlsdc budget` over many keys joins
    them with the ledger in one pass: the totals must not depend on which ran."""
    wide = {BudgetKey(ALL): BudgetLimit(epsilon=Fraction(100), rho=Fraction(100),
                                        delta=Fraction(1, 1000))}  # fmt: skip
    _charge(con, limits=wide)
    _charge(con, PrivacyCost(epsilon=Fraction(1, 3)), user="bob", tables=("persons", "benefits"),
            limits=wide)  # fmt: skip
    budget_admin.reset(con, admin="root", key=BudgetKey("alice"), reason="new quarter")
    _charge(con, PrivacyCost(epsilon=Fraction(1, 7), delta=Fraction(1, 10**6)), limits=wide)
    _charge(con, PrivacyCost(rho=Fraction(1, 5)), user="bob", tables=("benefits",), limits=wide)
    keys = [BudgetKey(ALL), BudgetKey("alice"), BudgetKey("bob"), BudgetKey(ALL, "benefits"),
            BudgetKey("bob", "persons"), BudgetKey("carol")]  # fmt: skip
    apart = budget._spent(con, keys)
    monkeypatch.setattr(budget, "_KEYS_APART", 0)
    assert budget._spent(con, keys) == apart
    assert apart[BudgetKey("alice")] == PrivacyCost(
        epsilon=Fraction(1, 7), delta=Fraction(1, 10**6)
    )
    assert apart[BudgetKey(ALL, "benefits")] == PrivacyCost(
        epsilon=Fraction(1, 3), rho=Fraction(1, 5)
    )
    assert apart[BudgetKey("carol")] == PrivacyCost()


def test_a_kept_budget_state_is_read_again_after_anyone_elses_write(con, monkeypatch):
    """A connection's BudgetState skips reading the events and summing the ledger only while
    nothing but its own charges wrote them: another charge, a reset, a set or a grant makes the
    next charge read again, and it decides exactly as a charge that reads everything."""
    reads = []
    real_events = budget._events
    monkeypatch.setattr(budget, "_events", lambda c: reads.append(1) or real_events(c))
    alice, persons = BudgetKey("alice"), BudgetKey(ALL, "persons")
    limits = {alice: BudgetLimit(epsilon=1), persons: BudgetLimit(epsilon=2)}
    state = budget.BudgetState()
    quarter = Fraction(1, 4)

    def spent_now():
        return {
            s.key: s.spent.epsilon for s in budget.budget_status(con, limits) if s.key in limits
        }

    _charge(con, limits=limits, state=state)
    _charge(con, limits=limits, state=state)
    assert len(reads) == 1
    assert {k: v.epsilon for k, v in state.spent.items()} == {alice: 2 * quarter,
                                                              persons: 2 * quarter}  # fmt: skip
    _charge(con, user="bob", limits=limits)  # another connection: reads, and writes
    _charge(con, limits=limits, state=state)
    assert len(reads) == 3  # bob's charge read, and this one read again
    assert (
        {k: v.epsilon for k, v in state.spent.items()}
        == spent_now()
        == {alice: 3 * quarter, persons: 4 * quarter}
    )
    with pytest.raises(BudgetExhausted):  # alice has 1/4 left
        _charge(con, PrivacyCost(epsilon=Fraction(1, 2)), limits=limits, state=state)
    before = len(reads)
    _charge(con, limits=limits, state=state)  # the refusal wrote nothing: the state holds
    assert len(reads) == before and spent_now()[alice] == 1

    budget_admin.reset(con, admin="root", key=alice, reason="new quarter")
    _charge(con, limits=limits, state=state)  # read again: alice starts afresh
    assert state.spent[alice].epsilon == quarter == spent_now()[alice]
    budget_admin.set_limit(con, admin="root", key=alice, limit=BudgetLimit(epsilon=quarter),
                           reason="pilot over")  # fmt: skip
    with pytest.raises(BudgetExhausted):
        _charge(con, limits=limits, state=state)
    budget_admin.grant(
        con, admin="root", key=alice, cost=PrivacyCost(epsilon=quarter), reason="more"
    )
    _charge(con, limits=limits, state=state)
    assert spent_now() == {alice: 2 * quarter, persons: 7 * quarter}
    with pytest.raises(BudgetExhausted):  # (*, persons) has 1/4 left
        _charge(con, PrivacyCost(epsilon=Fraction(1, 2)), user="carol", limits=limits,
                state=state)  # fmt: skip
    _charge(con, user="carol", limits=limits, state=state)
    assert spent_now()[persons] == 2


def test_every_administrators_event_counts_as_a_write_of_the_budget_tables(con):
    """The counter a kept BudgetState is checked against moves with grants, sets and resets,
    each in the transaction of its event (a failed one moves nothing)."""

    def writes():
        return con.execute("SELECT charges FROM sqlsdc.budget_lock").fetchall()

    assert writes() == []
    budget_admin.grant(con, admin="root", key=BudgetKey("alice"), cost=EPS, reason="start",
                       limits=ALICE)  # fmt: skip
    budget_admin.set_limit(con, admin="root", key=BudgetKey("bob"), limit=BudgetLimit(epsilon=1),
                           reason="own allowance")  # fmt: skip
    budget_admin.reset(con, admin="root", key=BudgetKey("alice"), reason="new quarter")
    _charge(con)
    assert writes() == [(4,)]
    with pytest.raises(ValueError, match="no ε budget of its own"):
        budget_admin.grant(con, admin="root", key=BudgetKey("alice", "persons"), cost=EPS,
                           reason="would cut", limits=ALICE)  # fmt: skip
    assert writes() == [(4,)] and len(budget_admin.budget_events(con)) == 3


def test_an_up_to_date_catalog_runs_no_create_statement_again(tmp_path):
    """A second ``ensure_catalog`` reads what the catalog has and creates nothing (session 44:
    it ran its 22 ``CREATE ... IF NOT EXISTS`` and four column probes at every opening), and a
    dropped table is created again."""
    con = open_database(tmp_path / "c.duckdb")
    try:
        ensure_catalog(con)
        con.execute("DROP TABLE sqlsdc.server_users")
        ran = []
        real = type(con).execute
        type(con).execute = lambda self, sql, *a, **k: ran.append(sql) or real(self, sql, *a, **k)
        try:
            ensure_catalog(con)
        finally:
            type(con).execute = real
        created = [s.split("(")[0].split()[-1] for s in ran if s.startswith("CREATE")]
        assert created == ["sqlsdc", "sqlsdc.server_users"]  # the schema, the dropped table
        assert len(ran) <= 6
        ensure_catalog(con)  # idempotent
        assert con.execute("SELECT count(*) FROM sqlsdc.server_users").fetchone() == (0,)
    finally:
        con.close()
