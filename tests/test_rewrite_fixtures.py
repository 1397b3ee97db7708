"""Golden fixtures of the threshold rewrite (sqlglot-style input/expected pairs)."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def load_pairs(name: str) -> list[tuple[str, str, str]]:
    """``(title, input SQL, expected SQL)`` from a fixture file of commented statement pairs."""
    pairs, title, statements = [], "", []
    for line in (FIXTURES / name).read_text().splitlines():
        if line.startswith("--"):
            title = line[2:].strip()
        elif line.strip():
            statements.append(line.strip().rstrip(";"))
            if len(statements) == 2:
                pairs.append((title, *statements))
                statements = []
    return pairs


PAIRS = load_pairs("threshold.sql")


def test_fixture_file_is_complete():
    assert len(PAIRS) >= 8


@pytest.mark.parametrize("title, sql, expected", PAIRS, ids=[p[0] for p in PAIRS])
def test_rewrite(analyst, raw, title, sql, expected):
    assert analyst.explain(sql).sql == expected
    # the expected SQL runs on DuckDB and has the query's columns plus status columns
    protected = raw.sql(expected).to_arrow_table()
    original = raw.sql(sql).to_arrow_table()
    assert protected.column_names[: original.num_columns] == original.column_names
    assert protected.num_rows == original.num_rows
