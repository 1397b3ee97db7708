"""``GROUP BY ()`` and constant group keys (s44q, after red team s44a).

Both were refused as "the expression GROUP BY () raises an error": the constant-evaluation
check evaluated the GROUP BY clause itself as a value. ``GROUP BY ()`` is the grand total (what
DuckDB answers with no GROUP BY: one row, also over no rows) and is now read as that; a constant
key is one group, protected as any group. Each constant key is still evaluated apart from the
data (refused if it raises), so a key that would fail only when some row exists is refused
whether or not rows exist: no error oracle."""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc

SMALL = "WHERE region = 'R08' AND sex = 'F' AND age = 5"  # one person: suppressed
WIDE = "WHERE age < 60"


@pytest.mark.parametrize("where", [SMALL, WIDE, "WHERE age > 200"])
def test_group_by_empty_set_is_the_grand_total(module_analyst, where):
    """Fails on the branch's start (refused). Threshold demo: the same protected row as the
    query with no GROUP BY, a suppressed one included, and one row over no rows."""
    plain = f"SELECT COUNT(*), SUM(income) FROM persons {where}"
    expected = module_analyst.execute(plain).fetchall()
    assert module_analyst.execute(f"{plain} GROUP BY ()").fetchall() == expected
    assert len(expected) == 1


def test_an_empty_set_beside_keys_is_dropped(module_analyst):
    """Fails on the branch's start (refused when no key reads a column)."""
    keyed = "SELECT region, COUNT(*) FROM persons GROUP BY region ORDER BY region"
    with_empty = "SELECT region, COUNT(*) FROM persons GROUP BY (), region ORDER BY region"
    assert module_analyst.execute(with_empty).fetchall() == module_analyst.execute(keyed).fetchall()


def test_a_constant_key_is_one_protected_group(module_analyst, raw):
    """Fails on the branch's start (refused). Threshold demo: a constant key, by position or
    by name, is one group with the grand total's values; a group under the threshold shows its
    key with the values suppressed, as a key that names one region does (``WHERE region =
    'R08' ... GROUP BY region``), and no group over no rows, as that query."""
    total = module_analyst.execute(f"SELECT COUNT(*), SUM(income) FROM persons {WIDE}").fetchone()
    assert total[0] == raw.execute(f"SELECT COUNT(*) FROM persons {WIDE}").fetchone()[0]
    for sql in (
        f"SELECT 1 AS k, COUNT(*), SUM(income) FROM persons {WIDE} GROUP BY 1",
        f"SELECT 'x' AS k, COUNT(*), SUM(income) FROM persons {WIDE} GROUP BY k",
    ):
        (row,) = module_analyst.execute(sql).fetchall()
        assert row[1:] == total
    small = raw.execute(f"SELECT COUNT(*) FROM persons {SMALL}").fetchone()[0]
    assert 0 < small < 10  # under the demo's min_frequency
    for where, shown in ((SMALL, [(None, None)]), (f"{SMALL} AND income < 0", [])):
        by_region = f"SELECT region, COUNT(*), SUM(income) FROM persons {where} GROUP BY region"
        constant = f"SELECT 1 AS k, COUNT(*), SUM(income) FROM persons {where} GROUP BY 1"
        assert [row[1:] for row in module_analyst.execute(by_region).fetchall()] == shown
        assert [row[1:] for row in module_analyst.execute(constant).fetchall()] == shown


def test_a_constant_key_under_the_cell_key_method_has_the_grand_totals_noise(ckm):
    """CKM demo: the constant group's cell is the grand total's cell (same contributors, same
    cell key), so the same noisy value, not a second draw to average."""
    total = ckm.execute(f"SELECT COUNT(*), SUM(income) FROM persons {WIDE}").fetchone()
    (row,) = ckm.execute(
        f"SELECT 1 AS k, COUNT(*), SUM(income) FROM persons {WIDE} GROUP BY 1"
    ).fetchall()
    assert row[1:] == total


ERRING = [
    "CAST('x' AS INTEGER)",
    "9223372036854775807 + 1",
    "CAST(300 AS TINYINT)",
]


@pytest.mark.parametrize("key", ERRING)
def test_a_constant_key_that_raises_is_refused_whether_or_not_rows_exist(module_analyst, key):
    """DuckDB raises on such a key only when some row reaches the GROUP BY (an oracle on
    whether any confidential row meets the WHERE); the guard refuses it, with the same message,
    over no rows and over some, and after ``()`` or as a projection grouped by position."""
    probe = duckdb.connect()
    probe.execute("CREATE TABLE t AS SELECT 1 AS a")
    assert probe.execute(f"SELECT COUNT(*) FROM t WHERE a > 5 GROUP BY {key}").fetchall() == []
    with pytest.raises(duckdb.Error):
        probe.execute(f"SELECT COUNT(*) FROM t GROUP BY {key}").fetchall()
    probe.close()
    messages = set()
    for where in ("WHERE age > 200", "WHERE age < 60", ""):
        for sql in (
            f"SELECT COUNT(*) FROM persons {where} GROUP BY {key}",
            f"SELECT COUNT(*) FROM persons {where} GROUP BY (), {key}",
            f"SELECT {key} AS k, COUNT(*) FROM persons {where} GROUP BY 1",
        ):
            with pytest.raises(sqlsdc.PolicyViolation, match="raises an error") as refused:
                module_analyst.execute(sql)
            messages.add(str(refused.value))
    assert len(messages) == 1


@pytest.mark.parametrize("sets", ["GROUPING SETS (())", "ROLLUP (())", "CUBE (())"])
def test_grouping_sets_of_no_column_say_what_to_write(module_analyst, sets):
    """They were refused as raising an error; now as what they are, with what to write."""
    with pytest.raises(sqlsdc.PolicyViolation, match="names no column.*write no GROUP BY"):
        module_analyst.execute(f"SELECT COUNT(*) FROM persons GROUP BY {sets}")


@pytest.mark.parametrize(
    ("group", "spark"),
    [
        ("GROUP BY ()", "GROUP BY GROUPING SETS (())"),
        ("GROUP BY (), region", "GROUP BY region"),
        (  # s46d: beside its grand total over no rows (engines/spark_sets.py)
            "GROUP BY ROLLUP (region), ()",
            "GROUP BY ROLLUP (region) UNION ALL SELECT COUNT(*) AS n FROM persons AS p "
            "GROUP BY GROUPING SETS (()) HAVING COUNT(*) = 0",
        ),
    ],
)
def test_spark_reads_group_by_empty_set_as_duckdb(group, spark):
    """(s45i.) Fails on the branch's start: ``GROUP BY ()`` reached Spark as written, a syntax
    error there, so the grand total failed on Spark (tests/test_spark_differential.py runs
    these on both engines). Spark's ``GROUPING SETS (())`` is one row over no rows too."""
    from sqlglot import parse_one

    from sqlsdc.engines.spark_translate import to_spark_sql

    tree = parse_one(f"SELECT COUNT(*) AS n FROM persons AS p {group}", read="duckdb")
    assert to_spark_sql(tree).endswith(spark)
