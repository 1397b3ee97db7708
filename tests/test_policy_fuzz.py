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
