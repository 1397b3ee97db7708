"""Hostile and edge policies: bounded reading, exact numbers, ranges, one pass, and a policy that
validates always yields a working database (ISSUE18 must-have 4)."""

from __future__ import annotations

import time

import cli_fork
import duckdb
import numpy as np
import pytest
import yaml

import sqlsdc
from sqlsdc.policy import load_policy
from sqlsdc.policy.read import MAX_ALIASES, MAX_DEPTH, MAX_POLICY_BYTES
from sqlsdc.tabular.rules import parse_rule

HEAD = (
    "tables:\n  persons:\n    privacy_unit: pid\n    columns:\n      pid: {role: identifier}\n"
    "      region: {role: dimension, domain: [N, S]}\n"
    "      income: {role: measure, bounds: [0, 1000]}\n"
)
USERS = "users:\n  admin: {role: admin}\n  ana: {role: analyst}\n"


def problems(text: str) -> list[str]:
    with pytest.raises(sqlsdc.PolicyError) as info:
        load_policy(text, name="p.yaml")
    return info.value.problems


def dp(counts: str, extra: str = "") -> str:
    return (
        HEAD + f"    protection:\n      counts: {{method: dp, spend: {{{counts}}}}}\n"
        "      magnitudes: {method: dp, spend: {epsilon: 1}}\n" + extra + USERS
    )


def test_alias_bomb_is_refused_fast():
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    started = time.perf_counter()
    found = problems("\n".join(levels) + "\n")
    assert time.perf_counter() - started < 1
    assert found == [
        "p.yaml: line 1, column 1: not valid YAML: the document expands to more than 100000 "
        "values or 32 levels (through aliases)"
    ]
    many = "a: &a x\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 1)) + "]\n"
    assert problems(many) == [
        f"p.yaml: line 2, column 405: not valid YAML: more than {MAX_ALIASES} aliases (*name); "
        "write values out"
    ]


def test_few_aliases_that_expand_exponentially_are_refused():
    levels = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 30)]
    started = time.perf_counter()
    (found,) = problems("\n".join(levels) + "\n")
    assert time.perf_counter() - started < 1
    assert "expands to more than" in found


def test_an_anchor_shared_by_several_tables_is_a_valid_policy(tmp_path):
    """``&dim {role: dimension}`` reused in two tables (yaml.safe_dump writes such aliases for a
    shared dict) was an internal error, KeyError, exit 70: the expansion check visited a node
    before a child it shared with a later one (new user s38)."""

    policy = tmp_path / "p.yaml"
    policy.write_text(
        "tables:\n  people:\n    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "      town: &dim {role: dimension}\n      street: *dim\n"
        "      salary: {role: measure, bounds: [0, 500000]}\n"
        "  shops:\n    privacy_unit: id\n    columns:\n      id: {role: identifier}\n"
        "      city: *dim\n" + USERS
    )
    done = cli_fork.run(["policy", "validate", policy], timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{policy}: valid\n", "")
    shared = {"role": "dimension"}
    document = yaml.safe_dump({"tables": {t: {"privacy_unit": "id", "columns": {
        "id": {"role": "identifier"}, "a": shared, "b": shared}} for t in ("t1", "t2", "t3")},
        "users": {"admin": {"role": "admin"}}})  # fmt: skip
    assert "*id001" in document
    assert load_policy(document).table("t3").column("b").role.value == "dimension"


def test_deep_nesting_and_size_are_refused():
    (found,) = problems("a: " + "[" * 10_000 + "]" * 10_000 + "\n")
    assert f"nested deeper than {MAX_DEPTH} levels" in found
    (found,) = problems("# " + "x" * MAX_POLICY_BYTES + "\n")
    assert f"more than {MAX_POLICY_BYTES}" in found
    deep: dict = {}
    node = deep
    for _ in range(100):
        node["x"] = node = {}
    with pytest.raises(sqlsdc.PolicyError, match="levels"):
        load_policy(deep)


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ('"1/0"', "'1/0' divides by zero"),
        ('"1e-999999999"', "the exponent of '1e-999999999' is beyond +-400"),
        ("1e-300", "'1e-300' is outside the allowed range: at least 1e-06 and at most 1000"),
        ('"1e-7"', "'1e-7' is outside the allowed range: at least 1e-06 and at most 1000"),
        ("1001", "1001 is outside the allowed range: at least 1e-06 and at most 1000"),
        (".inf", "must be a finite number, got inf"),
    ],
)
def test_epsilon_is_parsed_exactly_and_in_range(amount, message):
    started = time.perf_counter()
    found = problems(dp(f"epsilon: {amount}"))
    assert time.perf_counter() - started < 1
    assert found == [f"p.yaml: line 9, column 36: tables.persons.protection.counts.spend."
                     f"epsilon: {message}"]  # fmt: skip


def test_epsilon_zero_is_refused_by_the_schema():
    (found,) = problems(dp("epsilon: 0"))
    assert "tables.persons.protection.counts.spend.epsilon: 0 is not a positive number" in found


def test_every_problem_is_listed_at_once_with_its_line():
    households = "  households:\n    privacy_unit: hid\n    columns:\n      hid: {role: measure}\n"
    text = dp('epsilon: "1/0"', "    dp: {max_rows: 1.0e+30, max_groups: 0}\n" + households)
    text = text.replace("role: dimension,", "role: dimenssion,")
    text += "budgets: [{user: nobody, epsilon: .nan}]\n"
    assert problems(text) == [
        "p.yaml: line 6, column 16: tables.persons.columns.region.role: 'dimenssion' is not one "
        "of: identifier, dimension, measure, weight, hidden",
        "p.yaml: line 9, column 36: tables.persons.protection.counts.spend.epsilon: '1/0' "
        "divides by zero",
        "p.yaml: line 11, column 10: tables.persons.dp.max_rows: 1e+30 is above the maximum "
        "1000000",
        "p.yaml: line 11, column 29: tables.persons.dp.max_groups: 0 is below the minimum 1",
        "p.yaml: line 13, column 5: tables.households.privacy_unit: 'hid' must be a declared "
        "column with role identifier",
        "p.yaml: line 19, column 12: budgets.0.user: user 'nobody' is not declared",
        "p.yaml: line 19, column 26: budgets.0.epsilon: must be a finite number, got nan",
    ]


def test_a_number_yaml_reads_as_text_says_how_to_write_it():
    text = HEAD + USERS + "limits: {statement_timeout_seconds: 1e-9}\n"
    (found,) = problems(text)
    assert found.endswith(
        "limits.statement_timeout_seconds: expected number, got str '1e-9' (YAML reads an "
        "exponent without a dot as text: write e.g. 1.0e-9)"
    )


def test_two_budgets_of_one_user_and_table_are_refused():
    """The later one replaced the earlier without a word (ε 10 then ε 5: the limit was 5)."""
    text = dp("epsilon: 1") + (
        "budgets:\n  - {user: ana, epsilon: 10}\n  - {user: ana, table: '*', epsilon: 5}\n"
    )
    assert problems(text) == [
        "p.yaml: line 16, column 5: budgets.1: user 'ana' on table '*' has a budget already "
        "(budgets.0); give each user and table one budget"
    ]


def test_non_finite_ckm_parameters_and_unbuildable_ptables_are_refused():
    ckm = (
        HEAD + "    protection:\n      counts: {method: ckm, ptable: {D: 1, V: 100}}\n"
        "      magnitudes: {method: ckm, ptable: {D: 4, V: 1, step: 12}, "
        "flex: {fp: .nan, p_small: 0.2, p_large: 0.05}}\n" + USERS
    )
    unbuildable, nan = problems(ckm)  # in one pass: fixing the NaN reveals nothing new
    assert unbuildable.startswith(
        "p.yaml: line 9, column 29: tables.persons.protection.counts.ptable: the ptable cannot "
        "be built: V=100.0 is unreachable"
    )
    assert nan == (
        "p.yaml: line 10, column 72: tables.persons.protection.magnitudes.flex.fp: must be a "
        "finite number, got nan"
    )
    assert problems(ckm.replace("fp: .nan", "fp: 1000")) == [unbuildable]
    wrong_unit = ckm.replace("privacy_unit: pid", "privacy_unit: pidd")
    assert len(problems(wrong_unit)) == 3  # the unit, the NaN and the ptable
    bad_d = ckm.replace("D: 1, V: 100", "D: '1', V: 100")
    assert [p.split(": ")[2] for p in problems(bad_d)] == [
        "tables.persons.protection.counts.ptable.D",  # its shape, not also "cannot be built"
        "tables.persons.protection.magnitudes.flex.fp",
    ]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("freq", "rule 'freq' needs 1 or 2 number(s) (min_freq, safety_range), e.g. freq:3 or "
                 "freq:3,30"),
        ("freq:0", "rule 'freq:0': N must be an integer >= 1, e.g. freq:3 or freq:3,30"),
        ("freq:-3", "rule 'freq:-3': N must be an integer >= 1, e.g. freq:3 or freq:3,30"),
        ("nk:2", "rule 'nk:2' needs 2 number(s) (n, k), e.g. nk:2,85"),
        ("p:0", "rule 'p:0': percentages must be above 0 and at most 100"),
        ("pq:60,50", "rule 'pq:60,50': p must not exceed q, e.g. pq:25,50"),
    ],
)  # fmt: skip
def test_primary_rules_state_numbers_that_protect(rule, message):
    with pytest.raises(sqlsdc.TabularError, match=f"^{message}$".replace("(", r"\(")
                       .replace(")", r"\)")):  # fmt: skip
        parse_rule(rule)
    text = HEAD + (
        f"    protection:\n      counts: {{method: suppress, rules: ['{rule}']}}\n"
        "    suppression: {dimensions: [region]}\n" + USERS
    )
    found = [p for p in problems(text) if "tables.persons.protection.counts.rules.0: " in p]
    assert len(found) == 1  # the schema's pattern, or the rule's own message
    assert "is not a rule" in found[0] or found[0].endswith(message)


def test_a_document_is_validated_once_per_process():
    text = dp("epsilon: 1")
    started = time.perf_counter()
    first = load_policy(text, name="cached.yaml")
    assert load_policy(text, name="cached.yaml") is first
    document = first.document_dict()
    assert load_policy(document, name="d") is load_policy(document, name="d")
    assert time.perf_counter() - started < 5


# --- a policy that validates yields a working database ------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("edge") / "data.duckdb"
    rng = np.random.default_rng(3)
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE persons (pid INTEGER, region VARCHAR, income DOUBLE)")
    con.executemany("INSERT INTO persons VALUES (?, ?, ?)",
                    [(i, str(rng.choice(["N", "S"])), float(rng.integers(0, 1000)))
                     for i in range(400)])  # fmt: skip
    con.close()
    return path


EDGE_POLICIES = {
    "epsilon floor": dp("epsilon: 1e-6"),
    "epsilon ceiling": dp("epsilon: 1000", "    dp: {max_rows: 1000000, max_groups: 1000000}\n"),
    "rho floor": dp("rho: 1e-9", "    dp: {granularity: 1e-6}\n"),
    "rho ceiling": dp("rho: 1000", "    dp: {granularity: 1000}\n"),
    "private groups": dp(
        "epsilon: 1", "    dp: {groups: private, selection: {epsilon: 1e-6, delta: 1e-15}}\n"
    ),
    "ckm small": HEAD
    + "    protection:\n      counts: {method: ckm, ptable: {D: 1, V: 0.5}}\n"
    + USERS,
    "round large": HEAD + "    protection:\n      min_frequency: 1000000\n"
    "      counts: {method: round, base: 1000000}\n" + USERS,
}


@pytest.mark.parametrize("name", EDGE_POLICIES)
def test_an_edge_valid_policy_yields_a_working_database(data, tmp_path, name):
    path = tmp_path / "db.duckdb"
    path.write_bytes(data.read_bytes())
    budget = "budgets: [{user: '*', epsilon: 1000, rho: 1000, delta: 1e-15}]\n"
    text = EDGE_POLICIES[name] + (budget if "method: dp" in EDGE_POLICIES[name] else "")
    sqlsdc.init(path, yaml.safe_load(text))
    with sqlsdc.connect(path, user="ana") as con:
        rows = con.execute(
            "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY region"
        ).fetchall()
    assert len(rows) <= 2
    assert all(n is None or np.isfinite(n) for _, n in rows)


def test_init_and_apply_are_for_admins_only(data, tmp_path):
    path = tmp_path / "db.duckdb"
    path.write_bytes(data.read_bytes())
    document = yaml.safe_load(HEAD + USERS)
    with pytest.raises(sqlsdc.AccessDenied, match="user 'ana' is not an admin in the policy "
                       "being applied to this new database"):  # fmt: skip
        sqlsdc.init(path, document, applied_by="ana")
    sqlsdc.init(path, document, applied_by="admin")
    document["users"]["ana"]["role"] = "admin"  # ana makes herself an admin: refused
    with pytest.raises(sqlsdc.AccessDenied, match="user 'ana' is not an admin in the policy in "
                       "force"):  # fmt: skip
        sqlsdc.init(path, document, applied_by="ana")
    with pytest.raises(sqlsdc.AccessDenied, match="user 'ana' is not an admin"):
        sqlsdc.admin.apply(path, load_policy(document), "ana")


def test_users_whose_names_differ_only_in_case_are_refused():
    """Two principals a typo apart (each with a budget, an audit trail and a server login)."""
    text = HEAD + USERS + "  Ana: {role: analyst}\n"
    (found,) = problems(text)
    assert found.endswith("users: names differ only in case: ana/Ana; give each user one name")


RECURSIVE = [
    "&a [*a]\n",  # the whole document
    "tables: &t {persons: {columns: *t}}\nusers: {x: {role: admin}}\n",
    "a: &x {b: [1, {c: *x}]}\n",
]
_LOAD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # main took 13 GB in a minute
from sqlsdc.errors import PolicyError
from sqlsdc.policy import load_policy
try:
    load_policy(sys.argv[1])
except PolicyError as e:
    print(e)
"""


@pytest.mark.parametrize("text", RECURSIVE)
def test_an_alias_inside_its_own_anchor_is_refused(tmp_path, text):
    """``&a [*a]``: PyYAML registers an anchor before its value's items, so an alias inside
    them makes a cycle, which the expansion check walked for ever, taking all memory (new
    user s44g). In a process of its own, with 2 GiB of address space and a timeout, so that
    the old behaviour fails this test, not the machine."""
    import subprocess
    import sys

    policy = tmp_path / "p.yaml"
    policy.write_text(text, encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", _LOAD, str(policy)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-500:]
    assert "not valid YAML: an alias (*name) inside the value its anchor (&name) names" in (
        done.stdout
    ), done.stdout
