"""Red team s44n: today's guard and server changes, as an analyst (round 2).

What broke (fixed here):

- **A timing oracle through LIKE.** The per-row work bound (``rewrite/key_size.py``, s44b)
  counted a LIKE as the sum of its operands' characters, but DuckDB matches a pattern holding
  ``%`` and ``_`` by trying the rest of the pattern at each position of the text: a time of
  their product. ``municipality || '<27,000 a>' LIKE '%a_a_...b'`` (10,801 pattern
  characters; 64,817 counted, under the 65,536 allowed) took 175 ms a row. Behind a CASE
  that keeps the long text to the rows of one person's cell, the CKM count (free, repeatable)
  over the woman of 58 in R03-M023 took 183 ms and over the empty cell of men of 58 took
  6 ms, 5 of 5 paired runs: her existence, and any small count (175 ms a row), read from
  one query each. A LIKE now counts its text's characters times its pattern's; within the
  bound, 300 random patterns of ``%``, ``_`` and letters cost at most 22 us a row.
- **STRFTIME printed more than it was counted.** Its format was sized as its own characters,
  but ``%c`` prints 19: 1,000 of them under 30 nested ``UPPER``/``LOWER`` were counted 62,000
  and processed 570,000 characters a row, and the CKM count over the one woman of 58 in
  R03-M023 was slower than over none in 39 of 40 paired runs (+0.7 ms median; the same shape
  over a 2,000-character literal, which the bound lets through: +0.1 ms, 26 of 40). A format
  now counts 16 characters each (``%Z``'s zone names reach 32 for 2): refused; then 21 of 40.
- **A suppression refusal told a hidden count.** When a table's pattern cannot be made anew
  (s44i: an old pattern's sums pin a count; or forced cells pin a primary), the solvers'
  message names each stuck cell with its exact value (``{'nace': 'A', 'region': 'R1'} = 2
  needs [0, 4] ...``), and the guard passed that TabularError to the analyst whose query
  asked for the pattern: a count of 2 firms read from the refusal. The query is now refused
  without the diagnosis (``sqlsdc publish`` shows it to an administrator).

The attacks that held are listed at the end, one line each, with their numbers.
"""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc.errors import PolicyViolation

TEXT = "a" * 27_000
PATTERN = "%" + "a_" * 5_400 + "b"


def _case_like(sex: str, age: int) -> str:
    return (
        "SELECT COUNT(*) FROM persons WHERE municipality = 'R03-M023' AND (CASE WHEN sex = "
        f"'{sex}' AND age = {age} THEN municipality || '{TEXT}' ELSE 'x' END) LIKE '{PATTERN}'"
    )


@pytest.mark.parametrize(
    "sql",
    [
        _case_like("F", 58),
        f"SELECT region, COUNT(*) FROM persons WHERE occupation || '{TEXT}' ILIKE '{PATTERN}' "
        "GROUP BY region",
        f"SELECT COUNT(*) FROM persons WHERE '{TEXT}' LIKE municipality || '{PATTERN}'",
    ],
    ids=["ckm-case-like", "ckm-ilike", "pattern-from-a-column"],
)
def test_a_long_like_is_refused_outside_dp(ckm_db, tmp_path, copy_database, sql):
    """Each was answered on the integration branch (the first took 183 ms over one person
    and 6 ms over none, 5 of 5 paired runs)."""
    db = copy_database(ckm_db, tmp_path)
    with sqlsdc.connect(db, "analyst") as con:
        with pytest.raises(PolicyViolation, match="computed for every row of the population"):
            con.execute(sql)


def test_a_long_like_is_refused_before_the_dp_charge(ckm_db, tmp_path, copy_database):
    """The same shape over a DP table is refused before anything is paid (answered and
    charged on the integration branch)."""
    db = copy_database(ckm_db, tmp_path)
    sql = (
        f"SELECT scheme, COUNT(*) FROM benefits WHERE amount > 2300 AND scheme || '{TEXT}' "
        f"LIKE '{PATTERN}' GROUP BY scheme"
    )
    with sqlsdc.connect(db, "analyst") as con:
        before = [b.spent.epsilon for b in con.remaining_budget()]
        with pytest.raises(PolicyViolation, match="computed for every row of the population"):
            con.execute(sql)
        assert [b.spent.epsilon for b in con.remaining_budget()] == before


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT(*) FROM persons WHERE municipality LIKE 'R03-M0_%' GROUP BY region",
        "SELECT region, COUNT(*) FROM persons WHERE UPPER(occupation) ILIKE '%a%e_%' AND "
        f"region || '{'x' * 1_000}' LIKE 'R%' GROUP BY region",
    ],
    ids=["prefix-and-underscore", "short-patterns"],
)
def test_short_likes_are_still_answered(ckm_db, tmp_path, copy_database, sql):
    db = copy_database(ckm_db, tmp_path)
    with sqlsdc.connect(db, "analyst") as con:
        assert con.execute(sql).fetchall()


def _nested(value: str, levels: int) -> str:
    for i in range(levels):
        value = f"{'LOWER' if i % 2 else 'UPPER'}({value})"
    return f"LENGTH({value}) > 5"


def _strftime(fmt: str, levels: int) -> str:
    when = "CASE WHEN sex = 'F' AND age = 58 THEN DATE '2020-01-01' END"
    return "SELECT COUNT(*) FROM persons WHERE municipality = 'R03-M023' AND " + _nested(
        f"STRFTIME({when}, '{fmt}')", levels
    )


def test_a_long_strftime_output_is_counted_as_printed(ckm_db, tmp_path, copy_database):
    """A format of 1,000 ``%c`` prints 19,000 characters; counted as 2,000 under 30 nested
    functions it was answered, and the count over one woman was slower than over none in 39
    of 40 paired runs (+0.7 ms median) on the integration branch."""
    db = copy_database(ckm_db, tmp_path)
    with sqlsdc.connect(db, "analyst") as con:
        with pytest.raises(PolicyViolation, match="computed for every row of the population"):
            con.execute(_strftime("%c" * 1_000, 30))
        assert con.execute(_strftime("%Y-%m", 3)).fetchall() is not None


def test_a_suppression_pattern_that_cannot_be_made_refuses_without_its_values(
    suppress_template, tmp_path, copy_database, monkeypatch
):
    """s44i's refusal (an old pattern's sums pin (A, R1) = 2 firms) names the cell with its
    exact value, as the solvers' diagnosis does. In the query path it reached the analyst
    whole: on the integration branch this query raised TabularError "... {'nace': 'A',
    'region': 'R1'} = 2 needs ..." to user analyst. The refusal is raised here from the real
    protect_universe over s44i's constructed table, in place of the demo's universe."""
    from test_redteam_s44i import OLD, _cells, _old_pattern, _universe

    from sqlsdc.engines.duckdb import open_database
    from sqlsdc.tabular import universe_pattern

    universe = _universe(bounds=())
    old = _old_pattern(universe, OLD)
    with pytest.raises(sqlsdc.TabularError) as real:
        universe_pattern.protect_universe(
            universe, _cells({**OLD, ("A", "R2"): [1] * 11}), earlier=old
        )
    secret = "'nace': 'A', 'region': 'R1'} = 2"
    assert secret in str(real.value)

    def refusing(*args, **kwargs):
        raise real.value

    db = copy_database(suppress_template, tmp_path)
    raw = open_database(db)  # new data: the stored pattern is stale, protected anew
    raw.execute(
        "INSERT INTO enterprises SELECT max(enterprise_id) + 1, NULL, 'A', 'R02', 'micro', 3, "
        "100000, 12345 FROM enterprises"
    )
    raw.close()
    monkeypatch.setattr(universe_pattern, "protect_universe", refusing)
    with sqlsdc.connect(db, "analyst") as con:
        with pytest.raises(PolicyViolation, match="cannot be made for the current data") as got:
            con.execute("SELECT nace, COUNT(*) FROM enterprises GROUP BY nace")
    said = [str(got.value), str(got.value.__context__), str(got.value.__cause__)]
    assert not any(secret in text or "needs [" in text for text in said)


# Attacks that held (s44n), one line each:
# - REPEAT, LPAD, RPAD, REPLACE, REGEXP_REPLACE, FORMAT, PRINTF, RANGE, GENERATE_SERIES,
#   STRING_SPLIT, TO_JSON, REGEXP_MATCHES inside a CKM count's WHERE: refused by the function
#   allowlist (12 shapes, 1 query each); CONCAT_WS and CAST(1e300 AS VARCHAR): answered, no
#   growth (17 ms).
# - LIKE patterns within the new bound: 300 random patterns of %, _ and letters over texts of
#   100-600 characters, at most 22 us a row in DuckDB (no exponential backtracking found; 25
#   %-segments with _ over 80 characters: 0.5 ms for the whole query).
# - 60 UNION ALL arms (the most the 64 CKM lookups allow), each 30 UPPER/LOWER over 2,000
#   characters behind a CASE for one person: one vs none slower in 4 of 10 pairs (guard time
#   of ~1 s per statement drowns 3.6 million characters a row); 20 arms: 2 of 3.
# - COUNT(p), COUNT(DISTINCT p), WHERE p IS NOT NULL, p = p, GROUP BY region, p, COUNT(persons),
#   COUNT((p.*)), COUNT(ROW(p.*)), COUNT(COLUMNS(*)): all refused (TABLECOLUMN, ROW, COLUMNS
#   not allowed, or s44a's "every column of p"); GROUP BY ALL with COUNT(*) only: one
#   protected total.
# - Cursor.scroll/rownumber/fetchmany over a result: they move within the released rows
#   only (the protected Arrow table); no hidden row or column reachable (code read).
# - statement_rate: the minute's count depends on the statement's length only, per (database,
#   user): no data-dependent refusal, and one user cannot take another's minute.
# - refusal_rate: only refusals are summarised (accepted, failed and charged outcomes are
#   logged one by one), so a flood of refusals hides no answered query's record; the summary's
#   text is a constant an analyst's own refusal of that text cannot be mistaken for
#   (rows_returned NULL).
# - CLI StatementCommand: an argument starting with "-" and holding a space is moved after
#   "--" as the SQL; the process is the analyst's own (no privilege crossed).
