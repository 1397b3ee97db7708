"""The example policies mutated key by key (ISSUE18 must-have 4): a mutant is refused with every
problem at once, each at its line and column, or it loads; never an internal error."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import yaml

import sqlsdc
from sqlsdc.policy import load_policy

EXAMPLES = sorted((Path(__file__).parent.parent / "schemas" / "examples").glob("*.yaml"))
LOCATED = re.compile(r"m\.yaml: line \d+, column \d+: \S")


def leaves(node, path=()):
    """``(path, value)`` of every number of a document (booleans are not numbers here)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, i))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, node


def replaced(document: dict, path: tuple, value) -> dict:
    mutant = copy.deepcopy(document)
    parent = mutant
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    return mutant


def refusal(document: dict) -> list[str]:
    text = yaml.safe_dump(document, allow_unicode=True, sort_keys=False)
    with pytest.raises(sqlsdc.PolicyError) as info:
        load_policy(text, name="m.yaml")
    return info.value.problems


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_non_finite_number_anywhere_is_refused_at_its_line(example):
    """``.inf`` or ``.nan`` in place of each number of each example: refused, every problem
    at its line and column. ``sensitive_below: .inf`` under magnitude CKM was an internal error,
    OverflowError, exit 70 (the published-bits check read it with ``int()``; fails on main)."""
    document = yaml.safe_load(example.read_text("utf-8"))
    numbers = list(leaves(document))
    assert len(numbers) >= 3
    for path, _ in numbers:
        for value in (math.inf, math.nan):
            found = refusal(replaced(document, path, value))
            assert found and all(LOCATED.match(p) for p in found), (path, found)
            assert any(".".join(map(str, path)) in p for p in found), (path, found)


def test_a_public_key_must_be_a_declared_column():
    """``key: nope`` on a public table validated (``sqlsdc policy validate``: valid) and only
    ``policy apply`` refused it, against the database (fails on main)."""
    document = yaml.safe_load(EXAMPLES[0].read_text("utf-8"))
    assert EXAMPLES[0].stem == "demo" and document["tables"]["regions"]["key"] == "region"
    found = refusal(replaced(document, ("tables", "regions", "key"), "nope"))
    assert len(found) == 1
    assert LOCATED.match(found[0])
    assert found[0].endswith("tables.regions.key: 'nope' is not a declared column of this table")
    load_policy(replaced(document, ("tables", "regions", "key"), "REGION"))  # names ignore case


def test_problems_applying_finds_in_the_database_are_at_their_line(tmp_path):
    """What applying a policy finds in the database (a number in the domain of a text column,
    a column the table lacks) named the path only, ``p.yaml: tables...``, where validation's
    problems name the line and column too (fails on main); the table written ``Persons``."""
    import duckdb

    db = tmp_path / "data.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE persons AS SELECT i AS pid, CASE WHEN i % 2 = 0 THEN 'N' ELSE "
                "'S' END AS region, i * 10.0 AS income FROM range(50) t(i)")  # fmt: skip
    con.close()
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "tables:\n  Persons:\n    privacy_unit: pid\n    columns:\n      pid: {role: identifier}\n"
        "      region: {role: dimension, domain: [1, S]}\n"
        "      income: {role: measure, bounds: [0, 1000]}\n"
        "      age: {role: dimension}\n"
        "users:\n  admin: {role: admin}\n",
        encoding="utf-8",
    )
    with pytest.raises(sqlsdc.PolicyError) as info:
        sqlsdc.init(db, policy)
    assert [p.split(": tables.")[0] for p in info.value.problems] == [
        "p.yaml: line 6, column 33",  # domain:
        "p.yaml: line 8, column 7",
    ]


def nodes(node, path=()):
    """``path`` of every key and item of a document, the document's own excluded."""
    if isinstance(node, dict):
        items = node.items()
    else:
        items = enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*path, key)
        yield from nodes(value, (*path, key))


@pytest.mark.slow
def test_every_key_of_the_demo_policy_mutated_is_refused_at_its_line_or_loads():
    """Each key and item of the demo policy set to null, to an empty list, to a unicode word,
    or deleted (980 mutants, about 20 s of CPU): a refusal lists problems each at its line
    and column (a required key missing at the top level: the document's), or the policy
    loads; nothing else (an internal error, a traceback) escapes."""
    document = yaml.safe_load(EXAMPLES[0].read_text("utf-8"))
    refused = loaded = 0
    for path in nodes(document):
        for value in (None, [], "ü名", "delete"):
            mutant = replaced(document, path, value)
            if value == "delete":
                parent = mutant
                for part in path[:-1]:
                    parent = parent[part]
                del parent[path[-1]]
            text = yaml.safe_dump(mutant, allow_unicode=True, sort_keys=False)
            try:
                load_policy(text, name="m.yaml")
                loaded += 1
            except sqlsdc.PolicyError as e:
                refused += 1
                assert all(
                    LOCATED.match(p) or p.startswith("m.yaml: (top level): missing")
                    for p in e.problems
                ), (path, value, e.problems)
    assert refused > 750 and loaded > 100, (refused, loaded)  # 828 and 152


@pytest.mark.parametrize("key", ["[a, b]", "{a: 1}"])
def test_a_key_that_is_a_list_or_mapping_is_refused_at_its_line(key):
    """YAML's complex keys (``? [a, b]``) were an internal error, TypeError: unhashable type,
    exit 70 (the duplicate-key check put every key in a set; fails on main)."""
    text = EXAMPLES[1].read_text("utf-8")
    assert EXAMPLES[1].stem == "minimal" and text.endswith("  owner: {role: admin}\n")
    with pytest.raises(sqlsdc.PolicyError) as info:
        load_policy(f"{text}  ? {key}\n  : {{role: analyst}}\n", name="m.yaml")
    line = text.count("\n") + 1
    assert info.value.problems == [
        f"m.yaml: line {line}, column 5: not valid YAML: a key that is a list or mapping "
        "(? [...]); keys are names"
    ]
