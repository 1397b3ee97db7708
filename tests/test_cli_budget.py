"""``sqlsdc budget`` through real processes (forked with sqlsdc imported, :mod:`cli_fork`; the
exit codes through a new interpreter are ``tests/test_cli_errors.py``'s) and click's runner, on
real DuckDB files."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction

import cli_fork
import duckdb
import pytest
from click.testing import CliRunner
from sqlsdc.cli.main import cli

import sqlsdc
from sqlsdc.catalog import budget
from sqlsdc.catalog.budget import BudgetKey
from sqlsdc.engines.duckdb import open_database
from sqlsdc.mechanisms.accountant import PrivacyCost

POLICY = {
    "tables": {
        "persons": {
            "privacy_unit": "id",
            "columns": {"id": {"role": "identifier"}, "region": {"role": "dimension"}},
        }
    },
    "users": {"root": {"role": "admin"}, "alice": {"role": "analyst"}},
}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The small database, built once for the module: each test changes a copy."""
    path = tmp_path_factory.mktemp("budget") / "small.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE persons AS SELECT i AS id, 'r' || (i % 3) AS region "
                "FROM range(30) t(i)")  # fmt: skip
    con.close()
    sqlsdc.init(path, POLICY, applied_by="root")
    return path


@pytest.fixture
def db(template, tmp_path):
    path = tmp_path / template.name
    shutil.copy(template, path)
    return path


def sqlsdc_cli(*args):
    return cli_fork.run(["budget", *args], timeout=120)


def run(*args, code=0):
    result = CliRunner().invoke(cli, ["budget", *map(str, args)], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


def _spend(db, user, eps):
    con = open_database(db)
    try:
        budget.charge(con, user=user, tables=["persons"], cost=PrivacyCost(epsilon=eps),
                      query_id=1, limits=None, sql="SELECT 1")  # fmt: skip
    finally:
        con.close()


def test_grant_show_and_reset_in_subprocesses(db):
    granted = sqlsdc_cli(db, "grant", "--user", "alice", "--epsilon", "1.5", "--reason",
                         "pilot study", "--admin", "root")  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    assert "granted epsilon 1.5 to user 'alice' on all tables" in granted.stdout
    _spend(db, "alice", Fraction(1, 2))
    shown = sqlsdc_cli(db, "--user", "alice", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == [
        {"user": "alice", "table": "*", "epsilon_limit": "1.5", "epsilon_spent": "0.5",
         "epsilon_remaining": "1", "rho_limit": None, "rho_spent": "0", "rho_remaining": None,
         "delta_limit": None, "delta_spent": "0", "delta_remaining": None}
    ]  # fmt: skip
    reset = run(db, "reset", "--user", "alice", "--reason", "new quarter", "--admin", "root")
    assert "reset the spending of user 'alice' on all tables" in reset.output
    assert "  epsilon: limit 1.5 -> 1.5; spent 0.5 -> 0; remaining 1 -> 1.5" in reset.output
    header, row = run(db).output.splitlines()
    assert header.split() == [
        "user",
        "table",
        "epsilon_limit",
        "epsilon_spent",
        "epsilon_remaining",
        "rho_limit",
        "rho_spent",
        "rho_remaining",
        "delta_limit",
        "delta_spent",
        "delta_remaining",
    ]
    assert row.split() == ["alice", "*", "1.5", "0", "1.5", "-", "0", "-", "-", "0", "-"]


def test_delta_grants_in_subprocesses(db, sqlsdc_in_process):
    granted = sqlsdc_cli(db, "grant", "--user", "alice", "--epsilon", "1", "--delta", "1e-6",
                         "--reason", "private groups", "--admin", "root")  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    assert "granted epsilon 1, delta 0.000001 to user 'alice' on all tables" in granted.stdout
    assert "  epsilon: limit none -> 1; remaining none -> 1" in granted.stdout
    assert "  delta: limit none -> 0.000001; remaining none -> 0.000001" in granted.stdout
    spent = PrivacyCost(epsilon=Fraction(1, 2), delta=Fraction(1, 4 * 10**6))
    con = open_database(db)
    try:
        budget.charge(con, user="alice", tables=["persons"], cost=spent, query_id=1, limits=None,
                      sql="SELECT 1")  # fmt: skip
    finally:
        con.close()
    shown = sqlsdc_in_process("budget", db, "--user", "alice", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert (row["delta_limit"], row["delta_spent"], row["delta_remaining"]) == (
        "0.000001", "0.00000025", "0.00000075")  # fmt: skip
    history = json.loads(run(db, "--history", "--format", "json").output)
    assert [(h["epsilon"], h["rho"], h["delta"]) for h in history] == [("1", None, "0.000001")]
    ledger = json.loads(run(db, "--ledger", "--format", "json").output)
    assert [(r["epsilon"], r["delta"]) for r in ledger] == [("0.5", "0.00000025")]  # as above
    third = run(db, "grant", "--for", "alice", "--epsilon", "1/3", "--reason", "r", "--admin",
                "root", "--format", "json")  # fmt: skip
    assert json.loads(third.output) == {
        "action": "grant", "event": 3, "user": "alice", "table": "*",
        "epsilon": "1/3", "rho": None, "delta": None,  # exact: no finite decimal
        "before": {"epsilon_limit": "1", "epsilon_spent": "0.5", "epsilon_remaining": "0.5",
                   "rho_limit": None, "rho_spent": "0", "rho_remaining": None,
                   "delta_limit": "0.000001", "delta_spent": "0.00000025",
                   "delta_remaining": "0.00000075"},
        "after": {"epsilon_limit": "4/3", "epsilon_spent": "0.5", "epsilon_remaining": "5/6",
                  "rho_limit": None, "rho_spent": "0", "rho_remaining": None,
                  "delta_limit": "0.000001", "delta_spent": "0.00000025",
                  "delta_remaining": "0.00000075"},
        "notes": [],  # (alice, *): no table that is not under DP
    }  # fmt: skip
    for change in (("set", "--epsilon", "2"), ("reset",)):
        done = json.loads(run(db, *change[:1], "--for", "alice", *change[1:], "--reason", "r",
                              "--admin", "root", "--format", "json").output)  # fmt: skip
        assert (done["action"], done["user"], done["after"]["epsilon_limit"]) == (
            change[0], "alice", "2")  # fmt: skip
    assert done["epsilon"] is None and done["after"]["epsilon_remaining"] == "2"


def test_refusals_have_meaningful_exit_codes_in_subprocesses(db, tmp_path):
    denied = sqlsdc_cli(db, "grant", "--user", "alice", "--epsilon", "1", "--reason", "x",
                        "--admin", "alice")  # fmt: skip
    assert denied.returncode == 5
    assert "access denied: user 'alice' is not an admin" in denied.stderr
    assert "Traceback" not in denied.stderr
    plain = tmp_path / "plain.duckdb"
    duckdb.connect(str(plain)).close()
    missing = sqlsdc_cli(plain)
    assert missing.returncode == 8 and "has no sqlsdc catalog" in missing.stderr


def test_grant_adds_to_the_allowance_and_shows_before_and_after(db, tmp_path):
    """ISSUE18: a grant to (analyst, *) under a shared (*, *) budget cut 48.8 to 0.8."""
    run(db, "grant", "--for", "*", "--epsilon", "50", "--reason", "all", "--as", "root")
    _spend(db, "alice", Fraction(6, 5))
    refused = run(db, "grant", "--for", "alice", "--epsilon", "2", "--reason", "more", "--as",
                  "root", code=1)  # fmt: skip
    assert "has no ε budget of its own; its ε is bounded by all users on all tables" in (
        refused.output)  # fmt: skip
    added = run(db, "grant", "--for", "*", "--epsilon", "2", "--reason", "more", "--as", "root")
    assert "  epsilon: limit 50 -> 52; remaining 48.8 -> 50.8" in added.output


def test_table_and_all_users_budgets(db):
    run(db, "grant", "--table", "persons", "--rho", "1/3", "--reason", "all analysts",
        "--admin", "root")  # fmt: skip
    refused = run(db, "grant", "--user", "alice", "--table", "PERSONS", "--epsilon", "2", "--rho",
                  "0.25", "--reason", "project", "--admin", "root", code=1)  # fmt: skip
    assert (
        "user 'alice' on table 'persons' has no ρ budget of its own; its ρ is bounded by all "
        "users on table 'persons'" in refused.output
    )
    run(db, "grant", "--for", "alice", "--table", "PERSONS", "--epsilon", "2",
        "--reason", "project", "--as", "root")  # fmt: skip
    rows = json.loads(run(db, "--format", "json").output)
    assert [(r["user"], r["table"], r["epsilon_limit"], r["rho_limit"]) for r in rows] == [
        ("*", "persons", None, "1/3"),
        ("alice", "persons", "2", None),
    ]
    history = json.loads(run(db, "--history", "--format", "json").output)
    assert [(h["action"], h["admin"], h["reason"]) for h in history] == [
        ("grant", "root", "all analysts"),
        ("grant", "root", "project"),
    ]
    _spend(db, "alice", Fraction(1, 3))
    ledger = json.loads(run(db, "--ledger", "--format", "json").output)
    assert [(r["user_name"], r["epsilon"], r["tables"]) for r in ledger] == [
        ("alice", "1/3", ["persons"])
    ]
    con = open_database(db)
    try:
        (status,) = [s for s in budget.budget_status(con) if s.key == BudgetKey("alice", "persons")]
        assert status.remaining.epsilon == Fraction(5, 3)
    finally:
        con.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (["grant", "--user", "alice", "--reason", "x"], "give --epsilon, --rho and/or --delta"),
        (["grant", "--user", "alice", "--epsilon", "-1", "--reason", "x"], "must be > 0"),
        (["grant", "--user", "alice", "--delta", "1", "--reason", "x"],
         "Invalid value for --delta: delta must be below 1, got 1"),
        (["grant", "--user", "alice", "--delta", "0", "--reason", "x"], "delta must be > 0"),
        (["grant", "--user", "alice", "--epsilon", "lots", "--reason", "x"], "must be a number"),
        (["grant", "--user", "alice", "--epsilon", "1"], "Missing option '--reason'"),
        (["grant", "--user", "mallory", "--epsilon", "1", "--reason", "x"],
         "'mallory' is not a user of the policy in force (alice, root)"),
        (["reset", "--reason", "x"], "name the budget: --user NAME and/or --table NAME"),
        (["set", "--for", "alice", "--reason", "x"], "give --epsilon, --rho and/or --delta"),
        (["set", "--epsilon", "1", "--reason", "x"], "name whose limit to set: --for USER"),
        (["set", "--for", "alice", "--epsilon", "-1", "--reason", "x"], "must be >= 0"),
        (["set", "--for", "alice", "--delta", "1", "--reason", "x"], "delta must be below 1"),
        (["set", "--for", "mallory", "--epsilon", "1", "--reason", "x"],
         "Invalid value for --for: 'mallory' is not a user of the policy in force"),
    ],
)  # fmt: skip
def test_usage_errors_exit_2(db, args, message):
    result = CliRunner().invoke(cli, ["budget", str(db), *args, "--admin", "root"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_help(db):
    for args in ([], [db, "grant"], [db, "set"], [db, "reset"]):
        result = CliRunner().invoke(cli, ["budget", *map(str, args), "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output
    assert "budget" in CliRunner().invoke(cli, ["--help"]).output


def test_subcommand_help_misplaced_database_and_two_listings(db, tmp_path):
    """`budget grant --help` showed the group's help ("grant" read as DB), `budget NEW.duckdb
    grant --help` failed on the missing file, and `budget grant DB --epsilon 1` said
    "No such option '--epsilon'"; --history --ledger showed the history alone."""
    cases = {"grant": ["grant"], "set": [tmp_path / "none.duckdb", "set"], "reset": ["reset", db]}
    for name, args in cases.items():
        result = CliRunner().invoke(cli, ["budget", *map(str, args), "--help"])
        assert result.exit_code == 0, result.output
        assert f"Usage: cli budget DB {name} [OPTIONS]" in result.output, result.output
    both = CliRunner().invoke(cli, ["budget", str(db), "--history", "--ledger"])
    assert both.exit_code == 2 and "--history and --ledger are two listings" in both.output
    for name in ("grant", "set", "reset"):
        grant = ["--for", "alice", "--epsilon", "1", "--reason", "x"]
        result = CliRunner().invoke(cli, ["budget", name, str(db), *grant])
        assert result.exit_code == 2
        assert f"name the database first: sqlsdc budget DB {name} [OPTIONS]" in result.output


def test_set_gives_a_user_an_allowance_of_their_own_under_a_shared_budget(db):
    """ISSUE18 must-have 7: the per-user cap that ``grant`` refuses under a shared budget is
    set, shown before -> after and recorded with its reason; the shared budget still binds."""
    run(db, "grant", "--for", "*", "--epsilon", "50", "--reason", "all", "--as", "root")
    _spend(db, "alice", Fraction(6, 5))
    done = sqlsdc_cli(db, "set", "--for", "alice", "--epsilon", "5", "--reason", "pilot study",
                      "--as", "root")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "set the limit of user 'alice' on all tables to epsilon 5 (event 3)",
        "  epsilon: limit none -> 5; remaining none -> 3.8",
    ]
    lower = run(db, "set", "--for", "alice", "--epsilon", "2", "--rho", "1/4",
                "--reason", "smaller", "--as", "root")  # fmt: skip
    assert "  epsilon: limit 5 -> 2; remaining 3.8 -> 0.8" in lower.output
    assert "  rho: limit none -> 0.25; remaining none -> 0.25" in lower.output
    more = run(db, "grant", "--for", "alice", "--epsilon", "1", "--reason", "more",
               "--as", "root")  # fmt: skip
    assert "  epsilon: limit 2 -> 3; remaining 0.8 -> 1.8" in more.output  # grants add to it
    history = json.loads(run(db, "--history", "--format", "json").output)
    events = [(h["action"], h["user_name"], h["epsilon"], h["rho"], h["reason"]) for h in history]
    assert events == [
        ("grant", "*", "50", None, "all"),
        ("set", "alice", "5", None, "pilot study"),
        ("set", "alice", "2", "0.25", "smaller"),  # as the lines above write it
        ("grant", "alice", "1", None, "more"),
    ]  # fmt: skip
    with pytest.raises(sqlsdc.BudgetExhausted):
        _spend(db, "alice", Fraction(2))  # 1.8 left of alice's own 3
    _spend(db, "alice", Fraction(9, 5))
    shared = [r for r in json.loads(run(db, "--format", "json").output) if r["user"] == "*"]
    assert shared[0]["epsilon_remaining"] == "47"  # the shared budget was charged too


def test_set_upgrades_a_catalog_made_before_it(db):
    """Catalogs whose event table only admits 'grant' and 'reset' are rebuilt with their rows."""
    run(db, "grant", "--for", "alice", "--epsilon", "1", "--reason", "old", "--as", "root")
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE old_events AS SELECT * FROM sqlsdc.budget_events")
    con.execute("DROP TABLE sqlsdc.budget_events")
    con.execute(
        "CREATE TABLE sqlsdc.budget_events (seq BIGINT PRIMARY KEY, event_at TIMESTAMP NOT NULL, "
        "admin VARCHAR NOT NULL, action VARCHAR NOT NULL CHECK (action IN ('grant', 'reset')), "
        "user_name VARCHAR NOT NULL, table_name VARCHAR NOT NULL, epsilon VARCHAR, rho VARCHAR, "
        "reason VARCHAR NOT NULL, delta VARCHAR)"
    )
    con.execute("INSERT INTO sqlsdc.budget_events BY NAME SELECT * FROM old_events")
    con.execute("DROP TABLE old_events")
    con.close()
    done = run(db, "set", "--for", "alice", "--epsilon", "1/2", "--reason", "cap", "--as", "root")
    assert "  epsilon: limit 1 -> 0.5; remaining 1 -> 0.5" in done.output
    history = json.loads(run(db, "--history", "--format", "json").output)
    assert [(h["action"], h["reason"]) for h in history] == [("grant", "old"), ("set", "cap")]


def test_admin_commands_take_the_acting_admin_as_as_in_budget(db, tmp_path, sqlsdc_in_process):
    for spelling in ("--as", "--admin", "--user", "-u"):  # the denial below is a real process
        done = sqlsdc_in_process("audit", db, spelling, "root")
        assert done.returncode == 0, (spelling, done.stderr)
    denied = cli_fork.run(["audit", db, "--as", "alice"], timeout=120)
    assert denied.returncode == 5
    assert "access denied: user 'alice' is not an admin" in denied.stderr
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(POLICY))
    applied = CliRunner().invoke(cli, ["policy", "apply", str(db), str(policy), "--as", "root"])
    assert applied.exit_code == 0, applied.output
    assert "policy version 2 applied" in applied.output


def test_grant_and_set_stay_within_the_limits_a_policy_may_set(db):
    """A budget in the policy may allow at most ε 10^6 and ρ 10^6; a grant took (alice, *) to
    ε 1,000,000,011 and `set` to any number, a limit no policy would validate."""
    run(db, "grant", "--for", "alice", "--epsilon", "999990", "--reason", "r", "--as", "root")
    over = run(db, "grant", "--for", "alice", "--epsilon", "11", "--reason", "r", "--as", "root",
               code=1)  # fmt: skip
    assert "ε limit would be 1000001, above 1000000, the most a budget may allow" in over.output
    over = run(db, "set", "--for", "alice", "--rho", "2000000", "--reason", "r", "--as", "root",
               code=2)  # an amount no budget may have: a usage error  # fmt: skip
    assert "rho must be at most 1000000, the most a budget may allow, got 2000000" in over.output
    run(db, "grant", "--for", "alice", "--epsilon", "10", "--reason", "r", "--as", "root")


def test_a_reset_says_what_was_spent_when_nothing_remained(db):
    """A budget spent and then set to 0 (a revoked analyst) remains 0 after a reset: the reset
    clears what was spent, and says so (it said "nothing was spent: remaining unchanged",
    new user s39); a reset of a budget nothing was charged to still says that."""
    run(db, "grant", "--for", "alice", "--epsilon", "1", "--reason", "study", "--as", "root")
    _spend(db, "alice", Fraction(3, 10))
    run(db, "set", "--for", "alice", "--epsilon", "0", "--reason", "revoke", "--as", "root")
    reset = run(db, "reset", "--for", "alice", "--reason", "new quarter", "--as", "root")
    assert "  epsilon: limit 0 -> 0; spent 0.3 -> 0; remaining 0 -> 0" in reset.output
    assert "nothing was spent" not in reset.output
    again = run(db, "reset", "--for", "alice", "--reason", "twice", "--as", "root")
    assert "  nothing was spent: remaining unchanged" in again.output


def test_revoking_a_user_as_the_readme_says(db, tmp_path, sqlsdc_in_process):
    """README, "Revoking a user": a policy without the user refuses its queries (exit 5) and
    keeps what it did on record (audit, ledger, history)."""
    run(db, "grant", "--for", "alice", "--epsilon", "1", "--reason", "study", "--as", "root")
    asked = sqlsdc_in_process("query", db, "--user", "alice", "SELECT COUNT(*) FROM persons")
    assert asked.returncode == 0, asked.stderr
    con = open_database(db)
    try:  # a charge, as a DP query records it (its own audit entry: a query id not yet used)
        budget.charge(con, user="alice", tables=["persons"], query_id=1000, limits=None,
                      cost=PrivacyCost(epsilon=Fraction(3, 10)), sql="SELECT 1")  # fmt: skip
    finally:
        con.close()
    policy = tmp_path / "revoked.json"
    policy.write_text(json.dumps({**POLICY, "users": {"root": {"role": "admin"}}}))
    applied = sqlsdc_in_process("policy", "apply", db, policy, "--as", "root")
    assert applied.returncode == 0, applied.stderr
    refused = sqlsdc_in_process("query", db, "--user", "alice", "SELECT COUNT(*) FROM persons")
    assert refused.returncode == 5
    assert "access denied: user 'alice' is not declared in the policy" in refused.stderr
    audit = sqlsdc_in_process("audit", db, "--as", "root", "--who", "alice", "--format", "json")
    assert [e["decision"] for e in json.loads(audit.stdout)][-1] == "accepted"
    ledger = json.loads(run(db, "--ledger", "--for", "alice", "--format", "json").output)
    assert [c["epsilon"] for c in ledger] == ["0.3"]
    history = json.loads(run(db, "--history", "--for", "alice", "--format", "json").output)
    assert [h["action"] for h in history] == ["grant"]
    status = run(db, "--for", "alice", code=2)  # no budget applies to a user who is gone
    assert "what a former user was charged and granted: --ledger --for alice" in status.output


def test_ledger_says_when_it_shows_only_the_newest_charges(db, sqlsdc_in_process):
    """``--ledger`` listed the newest 100 charges without a word; ``--limit N`` sets how many
    and a note on stderr says when there are more (new user s39)."""
    run(db, "grant", "--for", "alice", "--epsilon", "1", "--reason", "study", "--as", "root")
    con = open_database(db)
    try:
        for query_id in (1001, 1002, 1003):
            budget.charge(con, user="alice", tables=["persons"], query_id=query_id, limits=None,
                          cost=PrivacyCost(epsilon=Fraction(1, 10)), sql="SELECT 1")  # fmt: skip
    finally:
        con.close()
    two = sqlsdc_in_process("budget", db, "--ledger", "--limit", "2", "--format", "json")
    assert [c["query_id"] for c in json.loads(two.stdout)] == [1003, 1002]
    assert "the newest 2 charges; --limit N for more" in two.stderr
    every = sqlsdc_in_process("budget", db, "--ledger", "--limit", "3", "--format", "json")
    assert [c["query_id"] for c in json.loads(every.stdout)] == [1003, 1002, 1001]
    assert every.stderr == ""
    alone = sqlsdc_in_process("budget", db, "--limit", "2")
    assert alone.returncode == 2 and "--limit is for --ledger" in alone.stderr


def test_a_grant_of_a_kind_no_table_spends_says_so(db):
    """``grant --rho`` where no table spends ρ printed "rho: limit none -> 1" and nothing else,
    as if ρ could now be spent (new user s44g, issue 18): the limit is recorded with a note,
    in the text (stderr) and in --format json; once a table spends ρ, no note."""
    from sqlsdc.admin import apply
    from sqlsdc.policy import load_policy

    grant = ["grant", "--for", "alice", "--rho", "1", "--reason", "zCDP pilot", "--as", "root"]
    text = sqlsdc_cli(db, *grant)
    assert text.returncode == 0, text.stderr
    assert "  rho: limit none -> 1; remaining none -> 1" in text.stdout
    note = ("no table spends rho under the policy in force: the limit is recorded but allows "
            "nothing until a policy version spends it (`spend: {rho: ...}`)")  # fmt: skip
    assert f"  note: {note}" in text.stderr
    shown = json.loads(sqlsdc_cli(db, *grant, "--format", "json").stdout)
    assert shown["notes"] == [note] and shown["after"]["rho_limit"] == "2"
    delta = sqlsdc_cli(db, *grant[:3], "--delta", "1e-6", *grant[5:], "--format", "json")
    assert json.loads(delta.stdout)["notes"] == [note.replace("rho", "delta").replace(
        "`spend: {delta: ...}`", "`groups: private`")]  # fmt: skip
    zcdp = json.loads(json.dumps(POLICY))
    zcdp["tables"]["persons"]["protection"] = {"counts": {"method": "dp", "spend": {"rho": 0.1}}}
    zcdp["tables"]["persons"]["columns"]["region"]["domain"] = ["r0", "r1", "r2"]
    apply(db, load_policy(zcdp), "root")
    spent = json.loads(sqlsdc_cli(db, *grant, "--format", "json").stdout)
    assert spent["notes"] == [] and spent["after"]["rho_limit"] == "3"
    assert "note" not in sqlsdc_cli(db, *grant).stderr
