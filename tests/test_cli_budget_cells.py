"""``sqlsdc budget DB cells show|grant|reset``: the policy's cell limits administered as budgets,
through real processes (:mod:`cli_fork`) on a 2,000-person demo built by ``sqlsdc demo``; and
what a cell is free again for (the same data) and counted as (each aggregate of each group)."""

from __future__ import annotations

import json
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import cli_fork
import duckdb
import pytest

import sqlsdc
from sqlsdc.catalog import cell_limit_admin, cell_limits
from sqlsdc.catalog.cell_limits import CellLimitReached
from sqlsdc.demo.build import demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

REGION = "SELECT region, COUNT(*) FROM persons GROUP BY region"  # 8 cells
SEX = "SELECT sex, COUNT(*) FROM persons GROUP BY sex"  # 2
EDUCATION = "SELECT education, COUNT(*) FROM persons GROUP BY education"  # 4
TOTAL = "SELECT COUNT(*) FROM persons"  # 1


def _policy(limits, users=None):
    document = demo_policy().document_dict()
    document["cell_limits"] = limits
    if users:
        document["users"] = {**document["users"], **users}
    return load_policy(document, name="s50c")


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("cells") / "demo.duckdb"
    built = cli_fork.run(["demo", "--db", str(path), "--persons", "2000", "--no-queries"],
                         timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stderr
    return path


def _db(template, tmp_path, limits, users=None):
    path = tmp_path / "demo.duckdb"
    shutil.copy(template, path)
    sqlsdc.admin.apply(path, _policy(limits, users), "admin")
    return path


LIMIT = [{"user": "analyst", "table": "persons", "cells": 10, "per": "day"}]


def cells(db, *args, code=0):
    done = cli_fork.run(["budget", str(db), "cells", *args], timeout=120)
    assert done.returncode == code, (done.stdout, done.stderr)
    return done


def _shown(db, who="analyst"):
    rows = json.loads(cells(db, "--for", who, "--format", "json").stdout)
    return {(r["user_name"], r["table_name"], r["per"]): r for r in rows}


def ask(db, sql, user="analyst") -> int | None:
    """The rows of the answer, None when a cell limit refused it."""
    with sqlsdc.connect(db, user=user) as con:
        try:
            return len(con.execute(sql).fetchall())
        except CellLimitReached:
            return None


def test_show_grant_and_reset_in_subprocesses(template, tmp_path):
    """An admin sees the use, grants cells to a user whose period a refusal ended (they are
    answered again, up to the grant, and a refusal ends it again) and resets it (use 0; cells
    released before stay free). No `cells` command on main: the tests fail there."""
    db = _db(template, tmp_path, LIMIT)
    assert ask(db, REGION) == 8 and ask(db, SEX) == 2  # 10 of 10
    assert ask(db, TOTAL) is None  # passes the limit: refused, the period ended
    row = _shown(db)[("analyst", "persons", "day")]
    assert (row["cells"], row["granted"], row["used"], row["left"], row["ended"]) == (
        10, 0, 10, 0, True)  # fmt: skip

    done = cells(db, "grant", "--for", "analyst", "--cells", "5", "--reason", "Q3 tables",
                 "--as", "admin", "--format", "json")  # fmt: skip
    (report,) = json.loads(done.stdout)
    assert (report["action"], report["user"], report["table"], report["per"],
            report["cells"]) == ("grant", "analyst", "persons", "day", 5)  # fmt: skip
    assert report["before"] == {"cells": 10, "granted": 0, "used": 10, "left": 0, "ended": True}
    assert report["after"] == {"cells": 10, "granted": 5, "used": 10, "left": 5, "ended": False}
    assert ask(db, TOTAL) == 1 and ask(db, EDUCATION) == 4  # 15 of 10 + 5
    assert ask(db, "SELECT COUNT(*) FROM persons WHERE age > 50") is None  # ended again
    assert ask(db, SEX) == 2  # answered before, over the same data: free after the end
    assert _shown(db)[("analyst", "persons", "day")]["ended"] is True
    cells(db, "grant", "--for", "analyst", "--cells", "1", "--reason", "one more")  # lifts it
    row = _shown(db)[("analyst", "persons", "day")]
    assert (row["granted"], row["used"], row["left"], row["ended"]) == (6, 15, 1, False)
    assert ask(db, "SELECT COUNT(*) FROM persons WHERE age > 60") == 1

    text = cells(db, "reset", "--for", "analyst", "--reason", "a test run", "--as", "admin")
    assert "reset the period of user 'analyst' on table 'persons' per day" in text.stdout
    assert "  used: 16 -> 0" in text.stdout and "  left: 0 -> 10" in text.stdout
    assert "  granted: 6 -> 0" in text.stdout
    assert ask(db, REGION) == 8  # released before: free
    assert _shown(db)[("analyst", "persons", "day")]["used"] == 0
    history = json.loads(cells(db, "show", "--history", "--format", "json").stdout)
    assert [(e["action"], e["admin"], e["user_name"], e["cells"], e["reason"]) for e in history
            ] == [("grant", "admin", "analyst", 5, "Q3 tables"),
                  ("grant", "admin", "analyst", 1, "one more"),
                  ("reset", "admin", "analyst", 16, "a test run")]  # fmt: skip
    assert history[0]["seq"] < history[1]["seq"] < history[2]["seq"]


def test_grant_text_and_errors(template, tmp_path):
    """Clear errors with their exit codes: an unknown user (2), a table without a limit of the
    user's (1, naming the limits there are), zero or negative cells (2), a blank reason (2),
    an analyst acting as admin (5), a user with several limits named without --table (2)."""
    limits = [*LIMIT, {"user": "analyst", "table": "households", "cells": 50, "per": "week"},
              {"user": "*", "table": "*", "cells": 100, "per": "week"}]  # fmt: skip
    db = _db(template, tmp_path, limits)
    done = cells(db, "grant", "--for", "analyst", "-t", "persons", "--cells", "1000",
                 "--reason", "study")  # fmt: skip
    assert done.stdout.splitlines()[:3] == [
        done.stdout.splitlines()[0], "  granted: 0 -> 1,000", "  left: 10 -> 1,010"]  # fmt: skip
    assert done.stdout.startswith("granted 1,000 cells to the limit of user 'analyst' on table "
                                  "'persons' per day (10 cells) until ")  # fmt: skip
    unknown = cells(db, "grant", "--for", "bob", "--cells", "5", "--reason", "x", code=2)
    assert "'bob' is not a user of the policy in force (admin, analyst)" in unknown.stderr
    missing = cells(db, "grant", "--for", "analyst", "-t", "enterprises", "--cells", "5",
                    "--reason", "x", code=1)  # fmt: skip
    assert "no cell limit of their own on table 'enterprises'" in missing.stderr
    assert "all users together on all tables per week: 100 cells" in missing.stderr
    for bad in ("0", "-3"):
        wrong = cells(db, "grant", "--for", "analyst", "-t", "persons", "--cells", bad,
                      "--reason", "x", code=2)  # fmt: skip
        assert "--cells" in wrong.stderr
    blank = cells(db, "grant", "--for", "analyst", "-t", "persons", "--cells", "5",
                  "--reason", "  ", code=2)  # fmt: skip
    assert "say why" in blank.stderr
    denied = cells(db, "grant", "--for", "analyst", "-t", "persons", "--cells", "5",
                   "--reason", "x", "--as", "analyst", code=5)  # fmt: skip
    assert "not an admin" in denied.stderr
    several = cells(db, "grant", "--for", "analyst", "--cells", "5", "--reason", "x", code=2)
    assert "has 2 such limits" in several.stderr and "--table and --per" in several.stderr
    nobody = cells(db, "grant", "--for", "*", "-t", "persons", "--cells", "5", "--reason", "x",
                   code=1)  # fmt: skip
    assert "there is no cell limit of all users together on table 'persons'" in nobody.stderr
    assert "its cell limits: user 'analyst' on table 'persons' per day: 10 cells" in nobody.stderr
    shared = cells(db, "grant", "--for", "*", "--cells", "50", "--reason", "x")
    assert "to the limit of all users together on all tables per week" in shared.stdout
    shown = _shown(db)
    assert shown[("analyst", "persons", "day")]["granted"] == 1000
    assert shown[("*", "*", "week")]["granted"] == 50
    assert shown[("analyst", "households", "week")]["granted"] == 0


def test_no_limits_in_the_policy(template, tmp_path):
    """A policy without cell limits: show says so on stderr (no rows), grant and reset fail."""
    db = _db(template, tmp_path, [])
    shown = cells(db)
    assert "(no rows)" in shown.stdout and "no cell limits" in shown.stderr
    for args in (["grant", "--cells", "5"], ["reset"]):
        done = cells(db, *args, "--for", "analyst", "--reason", "x", code=1)
        assert "the policy in force has no cell limits" in done.stderr


def test_help_of_the_subcommands():
    for name, words in (("grant", "current period only"), ("reset", "afresh"),
                        ("show", "LEFT = CELLS + GRANTED - USED")):  # fmt: skip
        done = cli_fork.run(["budget", "cells", name, "--help"], timeout=60)
        assert done.returncode == 0, done.stderr
        assert f"Usage: sqlsdc budget DB cells {name}" in done.stdout
        assert words in " ".join(done.stdout.split())
    # `budget --help` leads to them (on main its text spoke of privacy budgets only)
    done = cli_fork.run(["budget", "--help"], timeout=60)
    text = " ".join(done.stdout.split())
    assert "cell limits" in text and "sqlsdc budget DB cells --help" in text


def _race(db, queries) -> list[int]:
    """The user's queries started at once: the rows of those answered."""
    cons = [sqlsdc.connect(db, user="analyst") for _ in queries]
    barrier = threading.Barrier(len(queries))

    def run(con, sql) -> int | None:
        barrier.wait()
        try:
            return len(con.execute(sql).fetchall())
        except CellLimitReached:
            return None
        finally:
            con.close()

    with ThreadPoolExecutor(len(queries)) as pool:
        return [n for n in pool.map(run, cons, queries) if n is not None]


def _grant(db, count: int) -> None:
    """An admin's grant of ``count`` cells to the analyst's one limit (:data:`LIMIT`)."""
    con = open_database(db)
    policy = _policy(LIMIT)
    try:
        (limit,) = cell_limit_admin.targets(policy, "analyst")
        cell_limit_admin.grant(con, policy, admin="admin", user="analyst", limit=limit,
                               cells=count, reason="more")  # fmt: skip
    finally:
        con.close()


def test_a_grant_is_not_passed_by_queries_at_once(template, tmp_path):
    """With 10 used of 10 and 8 granted, two 8-cell queries of the user at once: one answered,
    never both (16 of 18 cells). Fails on main (no grants: neither is answered)."""
    db = _db(template, tmp_path, LIMIT)
    assert ask(db, REGION) == 8 and ask(db, SEX) == 2
    _grant(db, 8)
    queries = ["SELECT region, COUNT(*) FROM persons WHERE age > 30 GROUP BY region",
               "SELECT region, COUNT(*) FROM persons WHERE age <= 30 GROUP BY region"]  # fmt: skip
    assert _race(db, queries) == [8]


@pytest.mark.parametrize("action", ["reset", "grant"])
def test_a_charge_begun_before_an_admin_change_conflicts(template, tmp_path, action):
    """A reset counts the use from its time, and a charge writes its cells at its own: one
    begun before a reset and committed after would be forgiven; one begun before a grant
    would refuse without it and end the period. Both update the lock row every charge
    counting new cells updates: the charge then conflicts (and is run again, after them)."""
    db = _db(template, tmp_path, LIMIT)
    assert ask(db, SEX) == 2  # the user's lock row is there
    policy = _policy(LIMIT)
    (limit,) = cell_limit_admin.targets(policy, "analyst")
    con = open_database(db)
    charge = con.cursor()
    try:
        charge.execute("BEGIN TRANSACTION")
        charge.execute("SELECT count(*) FROM sqlsdc.cell_allowance").fetchall()  # its snapshot
        if action == "reset":
            cell_limit_admin.reset(con, policy, admin="admin", user="analyst", limits=[limit],
                                   reason="during a charge")  # fmt: skip
        else:
            cell_limit_admin.grant(con, policy, admin="admin", user="analyst", limit=limit,
                                   cells=5, reason="during a charge")  # fmt: skip
        with pytest.raises((duckdb.TransactionException, duckdb.ConstraintException)):
            cell_limits.lock_use(charge, "analyst", sqlsdc.catalog.store.now())
            charge.execute("COMMIT")
    finally:
        charge.close()
        con.close()


def test_a_grant_waits_for_a_charge_in_progress(template, tmp_path):
    """A charge holding the user's lock row (uncommitted) makes a grant run again; if it stays
    busy the grant says so and changes nothing (an operational failure, exit 9), and once the
    charge committed the grant goes through."""
    db = _db(template, tmp_path, LIMIT)
    assert ask(db, SEX) == 2
    policy = _policy(LIMIT)
    (limit,) = cell_limit_admin.targets(policy, "analyst")
    con = open_database(db)
    charge = con.cursor()
    try:
        charge.execute("BEGIN TRANSACTION")
        cell_limits.lock_use(charge, "analyst", sqlsdc.catalog.store.now())
        with pytest.raises(sqlsdc.errors.OperationalError, match="run the command again"):
            cell_limit_admin.grant(con, policy, admin="admin", user="analyst", limit=limit,
                                   cells=5, reason="busy")  # fmt: skip
        assert cell_limit_admin.events(con) == []
        charge.execute("COMMIT")
        change = cell_limit_admin.grant(con, policy, admin="admin", user="analyst",
                                        limit=limit, cells=5, reason="free")  # fmt: skip
        assert (change.before.granted, change.after.granted) == (0, 5)
    finally:
        charge.close()
        con.close()


def test_a_statement_answered_before_is_charged_again_over_new_data(template, tmp_path):
    """A cell is free again over the same data only: after the data changed (one income
    updated), the same count by region describes other data and is charged again (8 + 8 > 10:
    refused). On main it was free forever (answered, 8 used)."""
    db = _db(template, tmp_path, LIMIT)
    assert ask(db, REGION) == 8 and ask(db, REGION) == 8  # the same data: free
    assert _shown(db)[("analyst", "persons", "day")]["used"] == 8
    raw = duckdb.connect(str(db))
    raw.execute("UPDATE persons SET income = income + 1 WHERE rowid = 0")
    raw.close()
    assert ask(db, REGION) is None


def test_cells_are_counted_per_aggregate_and_aggregation(template, tmp_path):
    """A cell is one released value of one group: COUNT(*) and SUM(income) by sex are 4
    cells. The ledger names a cell by its aggregation, aggregates included, so the same
    COUNT(*) beside a SUM is another cell than alone: charged again (2 + 4), fail-closed."""
    db = _db(template, tmp_path, [{"user": "analyst", "table": "persons", "cells": 100}])
    assert ask(db, "SELECT sex, COUNT(*), SUM(income) FROM persons GROUP BY sex") == 2
    assert _shown(db)[("analyst", "persons", "day")]["used"] == 4
    assert ask(db, SEX) == 2
    assert _shown(db)[("analyst", "persons", "day")]["used"] == 6


def test_a_refusal_states_the_cells_granted(template, tmp_path):
    """After a grant, a refusal names the limit the user had: the policy's 10 cells and the
    1,500 granted (numbers of the policy and of an admin, none from the data or the use). On
    main it named 10 cells only, when the user had been answered 14 (s50k)."""
    db = _db(template, tmp_path, LIMIT)
    _grant(db, 1_500)
    assert ask(db, REGION) == 8 and ask(db, SEX) == 2 and ask(db, EDUCATION) == 4
    with sqlsdc.connect(db, user="analyst") as con, pytest.raises(CellLimitReached) as refused:
        con.execute("SELECT municipality, age, COUNT(*) FROM persons GROUP BY municipality, age")
    message = str(refused.value)
    assert "10 distinct cells a day and the 1,500 granted;" in message
    assert "left" not in message and "14" not in message


ISO = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}$"


def _times(value) -> list[str]:
    """The values of ``value`` (JSON) under keys naming a time."""
    if isinstance(value, list):
        return [t for v in value for t in _times(v)]
    if isinstance(value, dict):
        found = [v for k, v in value.items() if k.endswith(("_at", "_start"))]
        return found + [t for v in value.values() for t in _times(v)]
    return []


def test_budget_json_writes_every_time_in_iso_8601(template, tmp_path):
    """Fails on int50: `cells grant --format json` and `budget --history/--ledger --format json`
    wrote `2026-11-29 00:00:00` (Python's text) where `cells show` wrote
    `2026-11-29T00:00:00.000000` (pandas' ISO): every budget command now writes the ISO form."""
    db = _db(template, tmp_path, LIMIT)
    assert ask(db, SEX) == 2
    with sqlsdc.connect(db, "analyst") as con:
        con.execute("SELECT COUNT(*) FROM benefits").fetchall()  # DP: a ledger row
    budget = ["budget", str(db)]
    written = [
        cells(db, "grant", "--for", "analyst", "--cells", "5", "--reason", "r", "--format",
              "json").stdout,
        cells(db, "show", "--format", "json").stdout,
        cells(db, "show", "--history", "--format", "json").stdout,
    ]  # fmt: skip
    for args in (["grant", "--for", "analyst", "--epsilon", "1", "--reason", "r"], ["--history"],
                 ["--ledger"]):  # fmt: skip
        done = cli_fork.run([*budget, *args, "--format", "json"], timeout=120)
        assert done.returncode == 0, done.stderr
        written.append(done.stdout)
    times = [t for text in written for t in _times(json.loads(text))]
    assert len(times) >= 7  # period_start, resets_at; period_start; event_at, period_start; ...
    assert [t for t in times if not re.match(ISO, t)] == []
