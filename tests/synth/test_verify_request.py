"""A verification request is rebuilt from its SELECT list, output, WHERE and GROUP BY alone
(:func:`sqlsdc.synth.request.parse_request`): any other part is refused, never answered as if
it were not there (s50k)."""

from __future__ import annotations

import pytest

from sqlsdc.errors import PolicyViolation
from sqlsdc.synth.request import parse_request

IGNORED = [  # each was answered as the whole output's count on main
    ("WITH o AS (SELECT 1) SELECT COUNT(*) FROM syn_persons", "WITH is not allowed"),
    (
        "WITH syn_persons AS (SELECT * FROM syn_persons WHERE age > 90) "
        "SELECT COUNT(*) FROM syn_persons",
        "WITH is not allowed",
    ),  # fmt: skip
    ("SELECT COUNT(*) FROM syn_persons USING SAMPLE 10%", "SAMPLE is not allowed"),
    ("SELECT COUNT(*) FROM syn_persons TABLESAMPLE (10 PERCENT)", "takes no SAMPLE"),
    ("SELECT COUNT(a) FROM syn_persons AS s(a, b)", "cannot be renamed"),
]


@pytest.mark.parametrize(("sql", "reason"), IGNORED)
def test_a_part_the_request_does_not_read_is_refused(sql, reason):
    with pytest.raises(PolicyViolation, match=reason):
        parse_request(sql)


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT COUNT(*) FROM syn_persons HAVING COUNT(*) > 1", "HAVING is not allowed"),
        ("SELECT DISTINCT COUNT(*) FROM syn_persons", "DISTINCT is not allowed"),
        ("SELECT COUNT(*) FROM syn_persons LIMIT 1", "LIMIT is not allowed"),
        ("SELECT COUNT(*) FROM syn_persons a JOIN syn_persons b ON a.x = b.x", "JOINS"),
    ],
)
def test_the_refusals_of_before_hold(sql, reason):
    with pytest.raises(PolicyViolation, match=reason):
        parse_request(sql)


def test_an_alias_of_the_output_is_the_output():
    aliased = parse_request("SELECT sex, COUNT(*) FROM syn_persons s WHERE age > 3 GROUP BY sex")
    plain = parse_request("SELECT sex, COUNT(*) FROM syn_persons WHERE age > 3 GROUP BY sex")
    assert aliased.canonical == plain.canonical
    assert aliased.table == "protected.syn_persons"
