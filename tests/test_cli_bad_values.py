"""Out-of-range values on the command line end in a message and their class's exit code, never
in "a bug in sqlsdc" (exit 70), a hang, a silently ignored argument or a server that refuses
every session (ISSUE18 must-have 3): huge integers (10**20), NaN and overflowing numbers,
unknown names. Real processes (:mod:`cli_fork`) on a copy of the demo database."""

from __future__ import annotations

import shlex

import cli_fork
import pytest
from sqlsdc.cli import errors

HUGE = 10**20
COUNT = '--sql "SELECT region, sex, COUNT(*) AS n FROM persons GROUP BY region, sex"'
ROUND = '--sql "SELECT region, COUNT(*) AS n FROM persons GROUP BY region" --method round'
SYNTH = "synthesize {db} --from persons --into s --method"
NOISE = "anonymize {db} --from persons --into a --step"
DP_IPF = f"{SYNTH} dp-ipf --columns sex,age --bins"
BUDGET = "budget {db} %s --for analyst --reason x"

CASES = [  # (command, exit code, words of the message), and what happened before
    (f"audit {{db}} --limit {HUGE}", errors.USAGE, "1<=x<=1000000"),  # the engine's overflow
    (f"demo --db {{tmp}}/d.duckdb --persons {HUGE}", errors.USAGE, "100<=x<="),  # numpy's
    ("demo --db {tmp}/d.duckdb --persons 100 --seed -1", errors.USAGE, "x>=0"),  # numpy's
    (f"protect {{db}} {ROUND} --into r --base {HUGE}", errors.USAGE, "2<=x<=1000000"),
    (
        f"protect {{db}} {ROUND} --into r --base 5 --time-limit nan",
        errors.USAGE,
        "not a finite number of seconds",
    ),  # fmt: skip
    (
        "serve {db} --insecure --port 0 --statement-timeout nan",
        errors.USAGE,
        "not a finite number of seconds",
    ),  # the server ran and refused every session  # fmt: skip
    (
        "serve {db} --insecure --port 0 --idle-timeout nan",
        errors.USAGE,
        "not a finite number of seconds",
    ),  # fmt: skip
    (
        "serve {db} --insecure --port 0 --write-timeout nan",
        errors.USAGE,
        "not a finite number of seconds",
    ),  # fmt: skip
    ("serve {db} --insecure --port 0 --write-timeout 0", errors.USAGE, "x>0"),
    (f"{NOISE} noise:income:c=nan", errors.ERROR, "c='nan' is not a finite number"),
    (f"{NOISE} noise:income:c=1e308", errors.ERROR, "noise with c=1e+308 cannot be drawn"),
    (f"{NOISE} recode:age:breaks=0/nan/100", errors.ERROR, "a /-separated list of finite"),
    (
        f"{NOISE} noise:income:c=0.1 --keys region,sexx",
        errors.ERROR,
        "key column(s) ['sexx'] are not in the data",
    ),  # dropped: the risk looked lower  # fmt: skip
    (
        f"{SYNTH} parametric --columns sex,age --copies {HUGE}",
        errors.ERROR,
        "--copies must be from 1 to 1000",
    ),  # a loop for hours  # fmt: skip
    (
        f"{SYNTH} parametric --columns sex,age --rows {HUGE}",
        errors.ERROR,
        "--rows from 0 to 100,000,000",
    ),  # fmt: skip
    (f"{SYNTH} parametric --columns sex,age --max-cells -5", errors.USAGE, "x>=1"),
    (f"{SYNTH} parametric --columns sex,age --option bogus=1", errors.ERROR, "unknown: bogus"),
    (
        f"{SYNTH} cart --columns sex,age --option min_leaf=nan",
        errors.ERROR,
        "min_leaf must be a whole number, got 'nan'",
    ),  # fmt: skip
    (
        f"{SYNTH} cart --columns sex,age --option min_leaf={HUGE}",
        errors.ERROR,
        "min_leaf must be from 1 to 1,000,000,000",
    ),  # fmt: skip
    (f"{DP_IPF} age=0,50,111 --epsilon nan", errors.USAGE, "epsilon: must be a number"),  # 1
    (
        "verify {db} --user analyst --sql 'SELECT 1' --epsilon 1/0",
        errors.USAGE,
        "'1/0' divides by zero",
    ),  # as budget grant's --epsilon (exit 1 in synthesize and verify)  # fmt: skip
    (f"{DP_IPF} age=0,nan,111 --epsilon 1", errors.ERROR, "--bins age: must be a number"),
    (
        f"{DP_IPF} age=0,50,111 --epsilon 1 --option min_leaf=3",
        errors.ERROR,
        "method dp-ipf takes no option",
    ),  # ignored without a word  # fmt: skip
    (
        BUDGET % "grant" + " --rho 1e-400",
        errors.USAGE,
        "rho must be at least 1e-09",
    ),  # granted: a 400-digit limit in every listing  # fmt: skip
    (
        BUDGET % "set" + " --epsilon 1e400",
        errors.USAGE,
        "epsilon must be at most 1000000",
    ),  # 401 digits in the message  # fmt: skip
    ("budget {db} reset --for analyst --reason ' '", errors.USAGE, "say why"),
    ("budget {db} --for nobody", errors.USAGE, "'nobody' is not a user of the policy in force"),
    # an empty path (an unset shell variable) was read as the current folder
    ("query '' --user analyst 'SELECT 1'", errors.USAGE, "'' is an empty path"),  # "a folder"
    ("init '' --policy {db}", errors.USAGE, "'' is an empty path"),  # "cannot open database ."
    ("demo --db '' --persons 100", errors.USAGE, "'' is an empty path"),  # " exists" (exit 1)
    ("publish {db} '' --for analyst", errors.USAGE, "'' is an empty path"),  # ". is no regular"
    ("policy validate ''", errors.USAGE, "'' is an empty path"),  # "file  does not exist"
    ("audit ''", errors.USAGE, "'' is an empty path"),  # "database  does not exist"
    # a malformed --rule or --into is a usage error, before the database is opened (exit 1)
    (f"protect {{db}} {COUNT} --into p --rule freq:0", errors.USAGE, "Invalid value for '--rule'"),
    (f"protect {{db}} {COUNT} --into p --rule freq", errors.USAGE, "needs 1 or 2 number(s)"),
    (f"protect {{db}} {COUNT} --into p --rule bogus", errors.USAGE, "unknown rule 'bogus'"),
    (f"protect {{db}} {COUNT} --into 'a b'", errors.USAGE, "'a b' must be a plain name"),
    (f"{NOISE} noise:income:c=0.1 --into 'x;y'", errors.USAGE, "'x;y' must be a plain name"),
    # a malformed --step, as a malformed --rule: exit 1 after the database was opened (s44g)
    (f"{NOISE} bogus:income", errors.USAGE, "unknown step 'bogus'; use one of"),
    (f"{NOISE} pram:sex", errors.USAGE, "'--step' / '--steps': step pram needs p=..."),
    (f"{NOISE} pram:sex:p", errors.USAGE, "parameter 'p' is not NAME=VALUE"),
    # a list that names no column was read as the option left out: every column synthesised
    (f"{SYNTH} parametric --columns ''", errors.USAGE, "'' names no column"),
    (f"{SYNTH} parametric --columns ' , '", errors.USAGE, "' , ' names no column"),
    (f"{NOISE} noise:income:c=0.1 --keys ''", errors.USAGE, "'' names no column"),
    ("synth-report {db} --table s --keys ''", errors.USAGE, "'' names no column"),
    (
        "audit {db} --since 2030-01-01 --until 2020-01-01",
        errors.USAGE,
        "2030-01-01 00:00:00 is not before --until 2020-01-01 00:00:00",
    ),  # "(no rows)", exit 0, as if nothing had been logged  # fmt: skip
]


@pytest.fixture(scope="module")
def db(pristine_demo_db, tmp_path_factory, copy_database):
    return copy_database(pristine_demo_db, tmp_path_factory.mktemp("bad_values"))


@pytest.mark.parametrize("command, code, words", CASES, ids=[c[0][:60] for c in CASES])
def test_out_of_range_values_are_clear_errors(command, code, words, db, tmp_path):
    argv = shlex.split(command.format(db=db, tmp=tmp_path))
    result = cli_fork.run(argv, timeout=60)  # a hang (a server, a loop over 10**20) fails
    assert result.returncode == code, (result.returncode, result.stderr[-600:])
    assert words in result.stderr and "Traceback" not in result.stderr, result.stderr[-600:]
    assert "RuntimeWarning" not in result.stderr  # numpy's overflow warnings stay inside


def test_validate_as_json_reports_an_invalid_policy_on_stdout(tmp_path):
    """``policy validate --format json`` wrote nothing on stdout for an invalid policy (only
    the text on stderr), so a script parsing stdout failed on empty input."""
    import json

    policy = tmp_path / "p.yaml"
    policy.write_text("users:\n  chief: {role: admin}\n  a b: {role: analyst}\n", encoding="utf-8")
    result = cli_fork.run(["policy", "validate", str(policy), "--format", "json"], timeout=60)
    assert result.returncode == errors.INVALID_POLICY
    report = json.loads(result.stdout)
    assert report["file"] == str(policy) and report["valid"] is False
    assert report["problems"][0] == "p.yaml: (top level): missing required key(s): tables"
    assert report["problems"][1].startswith("p.yaml: line 3, column 3: users.a b: 'a b' is not")
    assert report["problems"] == result.stderr.splitlines()[1:]  # the same lines as on stderr


@pytest.mark.parametrize("command", ["init", "apply"])
def test_init_and_apply_as_json_report_an_invalid_policy_on_stdout(command, db, tmp_path):
    """``init`` and ``policy apply`` with --format json printed nothing on stdout for an
    invalid policy (new user s44g): the same object as ``policy validate``'s, exit code 4;
    init creates no file. A policy that does not fit the data is reported so too."""
    import json

    policy = tmp_path / "p.yaml"
    policy.write_text("tables:\n  persons:\n    columns:\n      age: {role: bogus}\n"
                      "users: {admin: {role: admin}}\nfoo: 1\n", encoding="utf-8")  # fmt: skip
    new = tmp_path / "new.duckdb"
    argv = (["init", str(new), "--policy", str(policy)] if command == "init"
            else ["policy", "apply", str(db), str(policy)])  # fmt: skip
    result = cli_fork.run([*argv, "--format", "json"], timeout=60)
    assert result.returncode == errors.INVALID_POLICY, result.stderr
    report = json.loads(result.stdout)
    assert report["file"] == str(policy) and report["valid"] is False
    assert report["problems"][0].startswith("p.yaml: (top level): unknown key(s) foo")
    assert "'bogus' is not one of" in report["problems"][1]
    assert report["problems"] == result.stderr.splitlines()[1:]  # the same lines as on stderr
    assert not new.exists()
    if command == "apply":  # valid, but a column the table does not have
        policy.write_text("tables:\n  persons:\n    privacy_unit: person_id\n    columns:\n"
                          "      person_id: {role: identifier}\n      nosuch: {role: dimension}\n"
                          "users: {admin: {role: admin}}\n", encoding="utf-8")  # fmt: skip
        result = cli_fork.run([*argv, "--format", "json"], timeout=60)
        assert result.returncode == errors.INVALID_POLICY, result.stderr
        (problem,) = json.loads(result.stdout)["problems"]
        assert "tables.persons.columns.nosuch: no such column in the table" in problem
