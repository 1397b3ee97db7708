"""Policy loading, validation, defaults, the typed model and error messages."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import json
import re
from fractions import Fraction
from pathlib import Path

import cli_fork
import jsonschema
import pytest
import yaml

import sqlsdc
from sqlsdc.policy import (
    AggregateKind,
    ColumnRole,
    Method,
    TableKind,
    UserRole,
    load_policy,
    policy_schema,
    validate_document,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "schemas" / "examples").glob("*.yaml"))
DEMO_POLICY = ROOT / "sqlsdc" / "demo" / "policy.yaml"

BASE = {
    "tables": {
        "persons": {
            "privacy_unit": "person_id",
            "columns": {
                "person_id": {"role": "identifier"},
                "household_id": {"role": "identifier", "references": "households.household_id"},
                "region": {"role": "dimension"},
                "municipality": {"role": "dimension"},
                "sex": {"role": "dimension", "domain": ["F", "M"]},
                "income": {"role": "measure", "bounds": [0, 1000000]},
                "weight": {"role": "weight", "bounds": [0, 1000]},
            },
            "hierarchies": {"geography": ["region", "municipality"]},
        },
        "households": {
            "privacy_unit": "household_id",
            "columns": {
                "household_id": {"role": "identifier"},
                "tenure": {"role": "dimension"},
            },
        },
        "regions": {"kind": "public"},
    },
    "users": {"admin": {"role": "admin"}, "analyst": {"role": "analyst"}},
}


def doc(**changes) -> dict:
    """A deep copy of BASE with dotted-path changes applied (value None deletes the key)."""
    document = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = document
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            del node[last]
        else:
            node[last] = value
    return document


def exactly(message: str) -> str:
    """A ``match=`` pattern accepting exactly ``message`` (re.search is used by pytest)."""
    return rf"\A{re.escape(message)}\Z"


def raises_exactly(source, message: str, **kw):
    with pytest.raises(sqlsdc.PolicyError, match=exactly(message)) as info:
        load_policy(source, **kw)
    return info.value


# --- loading from the three kinds of source ---------------------------------------------------


def test_load_from_yaml_file_path(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(BASE), "utf-8")
    for source in (path, str(path)):
        policy = load_policy(source)
        assert policy.source == "policy.yaml"
        assert set(policy.tables) == {"persons", "households", "regions"}


def test_load_from_yaml_text():
    policy = load_policy(yaml.safe_dump(BASE))
    assert policy.source == "<policy>"
    assert policy.table("persons").privacy_unit == "person_id"


def test_load_from_json_text():
    policy = load_policy(json.dumps(BASE), name="p.json")
    assert policy.source == "p.json"
    assert policy.table("regions").is_public


def test_load_from_dict():
    policy = load_policy(copy.deepcopy(BASE))
    assert policy.table("persons").column("income").bounds == (0, 1000000)
    assert dict(policy.document) == BASE


def test_file_text_and_dict_give_the_same_model(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(BASE), "utf-8")
    from_file = load_policy(path, name="x")
    from_text = load_policy(yaml.safe_dump(BASE), name="x")
    from_dict = load_policy(copy.deepcopy(BASE), name="x")
    assert from_file.tables == from_text.tables == from_dict.tables
    assert from_file.users == from_text.users == from_dict.users


# --- meta-test: every shipped example validates ------------------------------------------------


def test_examples_folder_is_not_empty():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("path", [*EXAMPLES, DEMO_POLICY], ids=lambda p: p.name)
def test_every_example_validates(path):
    document = yaml.safe_load(path.read_text("utf-8"))
    jsonschema.Draft202012Validator(policy_schema()).validate(document)
    assert validate_document(document) == []
    policy = load_policy(path)
    assert policy.source == path.name
    assert any(u.role is UserRole.ADMIN for u in policy.users.values())


def test_the_schema_itself_is_valid():
    jsonschema.Draft202012Validator.check_schema(policy_schema())


# --- defaults ----------------------------------------------------------------------------------


def test_min_frequency_defaults_to_10_with_threshold():
    persons = load_policy(doc()).table("persons")
    for kind in AggregateKind:
        assert persons.rule(kind).min_frequency == 10
        assert persons.rule(kind).method is Method.THRESHOLD


def test_top_level_protection_applies_to_every_confidential_table():
    policy = load_policy(doc(protection={"min_frequency": 25}))
    for name in ("persons", "households"):
        for kind in AggregateKind:
            assert policy.table(name).rule(kind).min_frequency == 25


def test_table_protection_overrides_top_level():
    policy = load_policy(
        doc(
            protection={
                "min_frequency": 25,
                "magnitudes": {"method": "threshold", "min_frequency": 40},
            },
            tables__persons__protection={"min_frequency": 5},
            tables__households__protection={"counts": {"method": "threshold", "min_frequency": 3}},
        )
    )
    persons, households = policy.table("persons"), policy.table("households")
    assert persons.rule(AggregateKind.COUNTS).min_frequency == 5
    # the table's own default beats even a kind-specific rule of the top level
    assert persons.rule(AggregateKind.MAGNITUDES).min_frequency == 5
    assert households.rule(AggregateKind.COUNTS).min_frequency == 3
    assert households.rule(AggregateKind.MAGNITUDES).min_frequency == 40


def test_rule_without_min_frequency_uses_the_sections_default():
    policy = load_policy(doc(protection={"min_frequency": 15, "counts": {"method": "threshold"}}))
    assert policy.table("persons").rule(AggregateKind.COUNTS).min_frequency == 15


def test_undeclared_kind_means_confidential():
    policy = load_policy(doc())
    assert policy.table("persons").kind is TableKind.CONFIDENTIAL
    assert not policy.table("persons").is_public
    assert policy.table("regions").kind is TableKind.PUBLIC
    assert [t.name for t in policy.confidential_tables] == ["persons", "households"]


def test_public_tables_have_no_protection_rules():
    assert dict(load_policy(doc()).table("regions").protection) == {}


# --- the typed model ---------------------------------------------------------------------------


def test_model_is_frozen():
    policy = load_policy(doc())
    persons = policy.table("persons")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.source = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        persons.privacy_unit = "region"
    with pytest.raises(dataclasses.FrozenInstanceError):
        persons.column("income").role = ColumnRole.DIMENSION
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.user("admin").role = UserRole.ANALYST
    with pytest.raises(dataclasses.FrozenInstanceError):
        persons.rule(AggregateKind.COUNTS).min_frequency = 1
    with pytest.raises(TypeError):
        policy.tables["x"] = persons
    with pytest.raises(TypeError):
        persons.columns["x"] = persons.column("income")
    with pytest.raises(TypeError):
        persons.protection[AggregateKind.COUNTS] = None
    with pytest.raises(TypeError):
        policy.document["users"] = {}


def test_document_is_not_shared_with_the_callers_dict():
    """The stored document must be the validated one, whatever the caller does afterwards."""
    source = doc()
    policy = load_policy(source)
    source["tables"]["persons"]["kind"] = "public"
    source["users"]["mallory"] = {"role": "admin"}
    assert policy.document["tables"]["persons"].get("kind", "confidential") == "confidential"
    assert "mallory" not in policy.document["users"]


def test_roles_and_kinds_are_enums():
    policy = load_policy(doc())
    persons = policy.table("persons")
    assert persons.column("person_id").role is ColumnRole.IDENTIFIER
    assert persons.column("region").role is ColumnRole.DIMENSION
    assert persons.column("income").role is ColumnRole.MEASURE
    assert persons.column("weight").role is ColumnRole.WEIGHT
    assert policy.user("admin").role is UserRole.ADMIN
    assert policy.user("analyst").role is UserRole.ANALYST
    assert isinstance(persons.kind, TableKind)


def test_column_details_are_tuples():
    persons = load_policy(doc()).table("persons")
    assert persons.column("sex").domain == ("F", "M")
    assert persons.column("income").bounds == (0, 1000000)
    assert persons.column("household_id").references == ("households", "household_id")
    assert persons.hierarchies["geography"] == ("region", "municipality")


def test_names_are_lower_cased():
    document = {
        "tables": {
            "Persons": {
                "privacy_unit": "Person_ID",
                "columns": {
                    "Person_ID": {"role": "identifier"},
                    "HH": {"role": "identifier", "references": "Households.HH_ID"},
                    "Region": {"role": "dimension"},
                    "Town": {"role": "dimension"},
                },
                "hierarchies": {"geo": ["Region", "TOWN"]},
            },
            "Households": {"privacy_unit": "hh_id", "columns": {"HH_ID": {"role": "identifier"}}},
        },
        "users": {"root": {"role": "admin"}},
    }
    policy = load_policy(document)
    assert set(policy.tables) == {"persons", "households"}
    persons = policy.table("PERSONS")
    assert persons is policy.table("persons")
    assert persons.name == "persons"
    assert set(persons.columns) == {"person_id", "hh", "region", "town"}
    assert persons.column("REGION").name == "region"
    assert persons.privacy_unit == "person_id"
    assert persons.hierarchies["geo"] == ("region", "town")
    assert persons.column("hh").references == ("households", "hh_id")


# --- the error type ----------------------------------------------------------------------------


def test_policy_error_hierarchy():
    assert issubclass(sqlsdc.PolicyError, ValueError)
    assert issubclass(sqlsdc.PolicyError, sqlsdc.Error)
    assert issubclass(sqlsdc.PolicyError, sqlsdc.DatabaseError)
    error = raises_exactly(
        doc(users__admin__role="analyst"),
        "<policy>: users: declare at least one user with role admin",
    )
    assert isinstance(error, ValueError) and isinstance(error, sqlsdc.DatabaseError)
    assert error.problems == ["<policy>: users: declare at least one user with role admin"]


# --- error messages: file, dotted path, problem ------------------------------------------------

BOUNDS_MESSAGE = (
    "policy.yaml: tables.persons.columns.income.bounds: lower bound 10 is above upper bound 5"
)


def test_bounds_order_with_name():
    raises_exactly(
        doc(tables__persons__columns__income={"role": "measure", "bounds": [10, 5]}),
        BOUNDS_MESSAGE,
        name="policy.yaml",
    )


def test_bounds_order_from_a_file_named_policy_yaml(tmp_path):
    """A YAML source adds the line and column of the offending key."""
    path = tmp_path / "policy.yaml"
    bad = doc(tables__persons__columns__income={"role": "measure", "bounds": [10, 5]})
    text = yaml.safe_dump(bad, default_flow_style=None, sort_keys=False)
    path.write_text(text, "utf-8")
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if "bounds: [10, 5]" in t)
    located = BOUNDS_MESSAGE.replace("policy.yaml: ", f"policy.yaml: line {line}, column 9: ", 1)
    raises_exactly(path, located)
    raises_exactly(str(path), located)


def test_bounds_message_keeps_the_exact_numbers():
    """``:g`` formatting rounds to 6 digits: 1234567 > 1234566 read '1.23457e+06 > 1.23457e+06'."""
    raises_exactly(
        doc(tables__persons__columns__income={"role": "measure", "bounds": [1234567, 1234566]}),
        "p: tables.persons.columns.income.bounds: lower bound 1234567 is above upper bound 1234566",
        name="p",
    )


def test_bounds_on_an_identifier():
    raises_exactly(
        doc(tables__persons__columns__person_id={"role": "identifier", "bounds": [0, 1]}),
        "p: tables.persons.columns.person_id.bounds: a column with role identifier has no bounds",
        name="p",
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"colour": "red"},
            "(top level): unknown key(s) colour; allowed here: budgets, cell_limits, description, "
            "limits, protection, releases, tables, users, version",
        ),
        (
            {"tables__persons__colums": {}},
            "tables.persons: unknown key(s) colums; allowed here: columns, description, dp, "
            "hierarchies, key, kind, privacy_unit, protection, suppression",
        ),
        (
            {"tables__persons__columns__income__bound": [0, 1]},
            "tables.persons.columns.income: unknown key(s) bound; allowed here: bounds, breaks, "
            "classes_of, description, domain, references, role",
        ),
        (
            {"users__admin__password": "x"},
            "users.admin: unknown key(s) password; allowed here: description, role",
        ),
        (
            {"protection": {"k": 5}},
            "protection: unknown key(s) k; allowed here: counts, magnitudes, min_frequency",
        ),
    ],
    ids=["top", "table", "column", "user", "protection"],
)
def test_unknown_keys(changes, message):
    raises_exactly(doc(**changes), f"policy.yaml: {message}", name="policy.yaml")


def test_bad_column_role():
    raises_exactly(
        doc(tables__persons__columns__region={"role": "category"}),
        "policy.yaml: tables.persons.columns.region.role: 'category' is not one of: identifier, "
        "dimension, measure, weight, hidden",
        name="policy.yaml",
    )


def test_bad_user_role():
    raises_exactly(
        doc(users__analyst__role="root"),
        "policy.yaml: users.analyst.role: 'root' is not one of: admin, analyst",
        name="policy.yaml",
    )


def test_bad_table_kind():
    raises_exactly(
        doc(tables__regions__kind="secret"),
        "policy.yaml: tables.regions.kind: 'secret' is not one of: confidential, public",
        name="policy.yaml",
    )


def test_missing_privacy_unit():
    raises_exactly(
        doc(tables__households__privacy_unit=None),
        "policy.yaml: tables.households: a confidential table needs a privacy_unit",
        name="policy.yaml",
    )


@pytest.mark.parametrize("unit", ["region", "income", "nonexistent"])
def test_privacy_unit_must_be_a_declared_identifier(unit):
    raises_exactly(
        doc(tables__persons__privacy_unit=unit),
        f"policy.yaml: tables.persons.privacy_unit: {unit!r} must be a declared column with role "
        "identifier",
        name="policy.yaml",
    )


def test_privacy_unit_on_a_public_table():
    raises_exactly(
        doc(tables__regions__privacy_unit="region"),
        "policy.yaml: tables.regions.privacy_unit: not used for a public table",
        name="policy.yaml",
    )


def test_reference_to_an_undeclared_table():
    raises_exactly(
        doc(
            tables__persons__columns__household_id={
                "role": "identifier",
                "references": "homes.household_id",
            }
        ),
        "policy.yaml: tables.persons.columns.household_id.references: table 'homes' is not "
        "declared",
        name="policy.yaml",
    )


def test_reference_to_an_undeclared_column():
    raises_exactly(
        doc(
            tables__persons__columns__household_id={
                "role": "identifier",
                "references": "households.hh",
            }
        ),
        "policy.yaml: tables.persons.columns.household_id.references: households.hh is not a "
        "declared identifier column",
        name="policy.yaml",
    )


def test_reference_to_a_non_identifier_column():
    raises_exactly(
        doc(
            tables__persons__columns__household_id={
                "role": "identifier",
                "references": "households.tenure",
            }
        ),
        "policy.yaml: tables.persons.columns.household_id.references: households.tenure is not "
        "a declared identifier column",
        name="policy.yaml",
    )


def test_reference_from_a_non_identifier():
    raises_exactly(
        doc(
            tables__persons__columns__region={
                "role": "dimension",
                "references": "households.household_id",
            }
        ),
        "policy.yaml: tables.persons.columns.region.references: only identifiers may reference "
        "a table",
        name="policy.yaml",
    )


@pytest.mark.parametrize("level", ["income", "person_id", "street"])
def test_hierarchy_levels_must_be_dimensions(level):
    raises_exactly(
        doc(tables__persons__hierarchies={"geography": ["region", level]}),
        f"policy.yaml: tables.persons.hierarchies.geography: {level!r} is not a declared dimension",
        name="policy.yaml",
    )


def test_domain_on_a_measure():
    raises_exactly(
        doc(tables__persons__columns__income={"role": "measure", "domain": [1, 2]}),
        "policy.yaml: tables.persons.columns.income.domain: only dimensions have a domain",
        name="policy.yaml",
    )


def test_no_admin_user():
    raises_exactly(
        doc(users__admin=None),
        "policy.yaml: users: declare at least one user with role admin",
        name="policy.yaml",
    )


def test_missing_required_sections():
    raises_exactly(
        {"tables": BASE["tables"]}, "p: (top level): missing required key(s): users", name="p"
    )


def test_not_a_mapping():
    raises_exactly("- a\n- b\n", "p: (top level): expected object, got list ['a', 'b']", name="p")


def test_invalid_table_name():
    raises_exactly(
        doc(tables__2persons={"kind": "public"}),
        "p: tables.2persons: '2persons' is not a valid name (letters, digits, _; a letter first); "
        'rename the table in the database (ALTER TABLE "2persons" RENAME TO c_2persons) and here',
        name="p",
    )


def test_every_bad_key_name_is_placed_on_its_own_line():
    """Each bad user name was reported on the line of ``users:`` (jsonschema's path of a
    ``propertyNames`` error is the mapping's), so that every one of them said the same line."""
    users = "users:\n  admin: {role: admin}\n  ännä: {role: analyst}\n  a b: {role: analyst}\n"
    rest = {k: v for k, v in BASE.items() if k != "users"}
    text = yaml.safe_dump(rest, sort_keys=False, allow_unicode=True) + users
    lines = text.splitlines()
    bad = "is not a valid name (letters, digits, _; a letter first)"
    with pytest.raises(sqlsdc.PolicyError) as info:
        load_policy(text, name="p")
    assert str(info.value).splitlines() == [
        f"p: line {lines.index('  ännä: {role: analyst}') + 1}, column 3: users.ännä: 'ännä' {bad}",
        f"p: line {lines.index('  a b: {role: analyst}') + 1}, column 3: users.a b: 'a b' {bad}",
    ]


def test_a_csv_header_as_a_column_name_says_how_to_rename_it(tmp_path):
    """A CSV's ``Firm ID`` cannot be named in a policy; the problem now says how to get a name
    it can (new user s38), and the remedy it names works: ``sqlsdc init`` (a real process) on
    the data loaded with ``normalize_names``."""

    import duckdb

    (tmp_path / "f.csv").write_text("Firm ID,NACE,Turnover EUR\n" + "".join(
        f"F{i},{'CG'[i % 2]},{i}.5\n" for i in range(40)))  # fmt: skip
    policy = "tables:\n  firms:\n    privacy_unit: {unit}\n    columns:\n      {unit}: {{role: " \
        "identifier}}\n      nace: {{role: dimension}}\n      {money}: {{role: measure, bounds: " \
        "[0, 100]}}\nusers:\n  chief: {{role: admin}}\n"  # fmt: skip
    (tmp_path / "bad.yaml").write_text(policy.format(unit="Firm ID", money="turnover_eur"))
    (tmp_path / "good.yaml").write_text(policy.format(unit="firm_id", money="turnover_eur"))

    def sqlsdc_cli(*args):
        return cli_fork.run(args, timeout=120, cwd=tmp_path)

    bad = sqlsdc_cli("policy", "validate", "bad.yaml")
    assert bad.returncode == 4
    assert "line 5, column 7: tables.firms.columns.Firm ID: 'Firm ID' is not a valid name " \
        "(letters, digits, _; a letter " \
        'first); rename the column in the database (ALTER TABLE firms RENAME COLUMN "Firm ID" ' \
        "TO firm_id) and here, or load CSV files with read_csv(..., normalize_names = true)" \
        in bad.stderr  # fmt: skip
    with duckdb.connect(tmp_path / "f.duckdb") as con:
        con.execute(f"CREATE TABLE firms AS FROM read_csv('{tmp_path / 'f.csv'}', "
                    "normalize_names = true)")  # fmt: skip
    done = sqlsdc_cli("init", "f.duckdb", "--policy", "good.yaml", "--as", "chief")
    assert done.returncode == 0, done.stderr


def test_invalid_yaml_names_line_and_column(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("tables:\n  persons: {kind: public\nusers: {}\n", "utf-8")
    with pytest.raises(
        sqlsdc.PolicyError, match=r"\Apolicy\.yaml: line \d+, column \d+: not valid YAML: "
    ) as info:
        load_policy(path)
    assert len(info.value.problems) == 1


def test_invalid_yaml_position_is_exact():
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"\Apolicy\.yaml: line 2, column 2: not valid YAML: expected <block "
        r"end>, but found '<block mapping start>'\Z",
    ):
        load_policy("tables: {a: 1}\n users: x\n", name="policy.yaml")


def test_a_database_named_as_the_policy_says_which_comes_first(tmp_path):
    """``policy apply FILE DB`` (swapped): it said the policy file had too many bytes."""
    import duckdb

    db = tmp_path / "data.duckdb"
    duckdb.connect(str(db)).close()
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"\Adata\.duckdb: a DuckDB database, not a "
        r"policy file .* the database comes first",
    ):
        load_policy(db)


def test_a_character_yaml_refuses_is_an_invalid_policy():
    """A NUL or another control character (a binary file named as the policy) was an internal
    error, "a bug in sqlsdc" (exit 70): PyYAML's reader refuses it before parsing starts."""
    with pytest.raises(
        sqlsdc.PolicyError,
        match=r"\Apolicy\.yaml: line 2, column 6: not valid YAML: unacceptable "
        r"character #x0000: special characters are not allowed\Z",
    ):
        load_policy("tables:\n  a: \x00\n", name="policy.yaml")


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n"])
def test_empty_file(tmp_path, text):
    path = tmp_path / "policy.yaml"
    path.write_text(text, "utf-8")
    raises_exactly(path, "policy.yaml: the policy is empty")


def test_missing_file(tmp_path):
    raises_exactly(
        tmp_path / "missing.yaml",
        "missing.yaml: cannot read the policy file: No such file or directory",
    )
    raises_exactly(
        str(tmp_path / "missing.yaml"),
        "missing.yaml: cannot read the policy file: No such file or directory",
    )


def test_unreadable_path_is_a_directory(tmp_path):
    folder = tmp_path / "policies"
    folder.mkdir()
    raises_exactly(folder, "policies: cannot read the policy file: Is a directory")


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"description: caf\xe9\n" + yaml.safe_dump(BASE).encode())
    with pytest.raises(sqlsdc.PolicyError, match=r"\Apolicy\.yaml: "):
        load_policy(path)


def test_duplicate_keys_are_refused():
    """YAML mapping keys must be unique; PyYAML silently keeps the last one."""
    text = (
        "tables:\n"
        "  persons: {kind: public}\n"
        "  persons: {privacy_unit: id, columns: {id: {role: identifier}}}\n"
        "users: {admin: {role: admin}}\n"
    )
    with pytest.raises(sqlsdc.PolicyError, match=r"\Apolicy\.yaml: .*persons"):
        load_policy(text, name="policy.yaml")


def test_all_problems_are_reported_at_once():
    bad = doc(
        tables__persons__columns__income={"role": "measure", "bounds": [10, 5]},
        users__admin=None,
    )
    raises_exactly(
        bad,
        f"{BOUNDS_MESSAGE}\npolicy.yaml: users: declare at least one user with role admin",
        name="policy.yaml",
    )


def test_all_schema_problems_are_reported_at_once():
    bad = doc(tables__persons__columns__region={"role": "category"}, users__analyst__role="root")
    error = raises_exactly(
        bad,
        "p: tables.persons.columns.region.role: 'category' is not one of: identifier, dimension, "
        "measure, weight, hidden\n"
        "p: users.analyst.role: 'root' is not one of: admin, analyst",
        name="p",
    )
    assert len(error.problems) == 2


def test_validate_document_returns_paths_without_file():
    bad = doc(tables__persons__columns__income={"role": "measure", "bounds": [10, 5]})
    assert validate_document(bad) == [
        "tables.persons.columns.income.bounds: lower bound 10 is above upper bound 5"
    ]


def test_ckm_rule_problems_are_reported_together():
    document = {
        "protection": {
            "counts": {"method": "ckm", "top_k": 2},
            "magnitudes": {
                "method": "ckm",
                "ptable": {"D": 5, "V": 1, "js": 2},
                "flex": {"fp": 100, "p_small": 0.05, "p_large": 0.2},
                "epsilon": [0.5, 1],
            },
        },
        "tables": {"t": {"privacy_unit": "id", "columns": {"id": {"role": "identifier"}}}},
        "users": {"a": {"role": "admin"}},
    }
    with pytest.raises(sqlsdc.PolicyError) as caught:
        load_policy(document)
    text = str(caught.value)
    for expected in (
        "protection.counts.ptable: method ckm needs a perturbation table",
        "protection.counts: top_k only apply to magnitudes",
        "protection.magnitudes.flex: p_small must be at least p_large",
        "protection.magnitudes.epsilon: needs top_k = 1 values, got 2",
        "protection.magnitudes.epsilon: must start with 1 and not increase",
        "protection.magnitudes.ptable.js: only count tables have js",
    ):
        assert expected in text


# --- suppression ------------------------------------------------------------------------------

SUPPRESS = {"method": "suppress", "rules": ["freq:3", "nk:1,60"]}


def test_suppress_rule_and_universe_build_the_model():
    policy = load_policy(
        doc(
            tables__persons__protection={"counts": SUPPRESS, "magnitudes": {"method": "suppress"}},
            tables__persons__suppression={"dimensions": ["geography", "sex"], "secondary": "hitas"},
        )
    )
    persons = policy.table("persons")
    assert persons.rule(AggregateKind.COUNTS).method is Method.SUPPRESS
    assert persons.rule(AggregateKind.COUNTS).rules == ("freq:3", "nk:1,60")
    assert persons.rule(AggregateKind.MAGNITUDES).rules == ()
    assert persons.suppression.dimensions == ("geography", "sex")
    assert persons.suppression.secondary.value == "hitas"
    assert persons.suppression.cost == "value"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tables__persons__protection": {"counts": SUPPRESS, "magnitudes": SUPPRESS}},
         "tables.persons: method suppress needs `suppression: {dimensions: [...]}`, the "
         "dimensions (or hierarchies) of the table every release is cut from"),
        ({"tables__persons__suppression": {"dimensions": ["sex"]}},
         "tables.persons.suppression: only used when counts or magnitudes use method suppress"),
        ({"tables__persons__protection": {"counts": SUPPRESS, "magnitudes": SUPPRESS},
          "tables__persons__suppression": {"dimensions": ["income"]}},
         "tables.persons.suppression.dimensions: 'income' is neither a dimension column nor a "
         "hierarchy of this table"),
        ({"tables__persons__protection": {"counts": SUPPRESS, "magnitudes": SUPPRESS},
          "tables__persons__suppression": {"dimensions": ["geography", "region"]}},
         "tables.persons.suppression.dimensions: region appear(s) twice (directly and through a "
         "hierarchy); name each level once"),
        ({"tables__persons__protection": {"counts": {"method": "suppress", "rules": ["nk:1"]},
                                           "magnitudes": SUPPRESS},
          "tables__persons__suppression": {"dimensions": ["sex"]}},
         "tables.persons.protection.counts.rules.0: 'nk:1' is not a rule: freq:N[,R], nk:N,K, "
         "p:P or pq:P,Q"),
        ({"tables__persons__protection": {"counts": {"method": "threshold", "rules": ["freq:3"]}}},
         "tables.persons.protection.counts.rules: only method suppress has primary rules"),
        ({"tables__persons__protection": {"counts": {**SUPPRESS, "ptable": {"D": 2, "V": 1}},
                                           "magnitudes": SUPPRESS},
          "tables__persons__suppression": {"dimensions": ["sex"]}},
         "tables.persons.protection.counts: ptable do not apply to method suppress"),
        ({"tables__regions__suppression": {"dimensions": ["region"]}},
         "tables.regions.suppression: not used for a public table"),
    ],
    ids=["no-universe", "unused-universe", "measure", "twice", "bad-rule", "rules-threshold",
         "ptable", "public"],
)  # fmt: skip
def test_suppression_problems(changes, message):
    raises_exactly(doc(**changes), f"<policy>: {message}")


def test_top_level_suppress_needs_a_universe_on_every_confidential_table():
    with pytest.raises(sqlsdc.PolicyError) as info:
        load_policy(doc(protection={"counts": SUPPRESS, "magnitudes": SUPPRESS}))
    assert "tables.persons: method suppress needs" in str(info.value)
    assert "tables.households: method suppress needs" in str(info.value)


# --- budgets ----------------------------------------------------------------------------------


def test_budgets_are_exact_and_may_limit_delta():
    policy = load_policy(doc(budgets=[{"user": "analyst", "epsilon": 0.1, "delta": "1e-6"},
                                      {"table": "Persons", "delta": 1e-5}]))  # fmt: skip
    first, second = policy.budgets
    assert (first.epsilon, first.rho, first.delta) == (Fraction(1, 10), None, Fraction(1, 10**6))
    assert (second.user, second.table, second.delta) == ("*", "persons", Fraction(1, 10**5))


NOT_AN_AMOUNT = "is not a positive number: write e.g. 0.5, 1e-6 or 1/3"


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        (1, "budgets.0.delta: 1 is outside the allowed range: at least 1e-15 and below 1"),
        ("3/2", "budgets.0.delta: '3/2' is outside the allowed range: at least 1e-15 and below 1"),
        (-1e-6, f"budgets.0.delta: -1e-06 {NOT_AN_AMOUNT}"),
        ("-1e-6", f"budgets.0.delta: '-1e-6' {NOT_AN_AMOUNT}"),
        (0, f"budgets.0.delta: 0 {NOT_AN_AMOUNT}"),
    ],
)
def test_budget_delta_must_be_positive_and_below_one(delta, message):
    raises_exactly(doc(budgets=[{"user": "analyst", "delta": delta}]), f"p: {message}", name="p")


@pytest.mark.parametrize(
    ("amount", "shown"),
    [
        (True, "true"),
        (None, "null"),
        (dt.date(2026, 1, 1), "2026-01-01"),
        ("10e", "'10e'"),
        ([1], "[1]"),
    ],  # fmt: skip
)
def test_an_amount_that_is_no_number_says_what_to_write(amount, shown):
    """An epsilon of ``true``, ``10e`` or a date (YAML's 2026-01-01) said "True is not valid
    under any of the given schemas" (jsonschema's words and Python's repr)."""
    document = doc(budgets=[{"user": "analyst", "epsilon": amount}])
    raises_exactly(document, f"p: budgets.0.epsilon: {shown} {NOT_AN_AMOUNT}", name="p")


def test_a_budget_without_an_amount_names_the_keys_it_needs():
    """It said "{'user': 'analyst'} is not valid under any of the given schemas"."""
    message = "p: budgets.0: names none of epsilon, rho, delta: give at least one"
    raises_exactly(doc(budgets=[{"user": "analyst"}]), message, name="p")


def test_an_empty_value_is_named_as_such():
    """``min_frequency:`` with nothing after it said "got NoneType None"."""
    document = doc(protection={"min_frequency": None})
    expected = r"protection.min_frequency: expected integer, got no value \(null\)"
    with pytest.raises(sqlsdc.PolicyError, match=expected):
        load_policy(document, name="p")
