"""Red team s50i: session 50's changes to the cell limits (s50a's memo of what an opening saw,
s50c's data versions and admin grants/resets, s50d's shared identities, s50e's free schema
probes, s50g/h) attacked from the analyst's side, on int50.

Found (not in the cell limits): a DuckDB ``PIVOT`` statement used as a source (``SELECT * FROM
(PIVOT persons ON sex USING COUNT(*)) t``, an alias given) reached sqlglot's ``qualify``, which
failed on it (AssertionError: not a Selectable): an internal error that says "this is a bug in
sqlsdc", where the same PIVOT without an alias, or as a statement, is refused as not allowed.
Nothing ran; no oracle (sqlglot fails on the text alone). Fixed: PIVOT and UNPIVOT anywhere are
refused before name resolution, with what to write instead.

Held (20,000-person demo, one analyst with the demo's limits, 5,000 cells a day on persons):
- schema probes answered from binding (s50e): ``LIMIT 0`` over GROUP BY, ORDER BY ... LIMIT,
  HAVING, a window over aggregates, a UNION ALL of two groupings, ``LIMIT 0 OFFSET 5``,
  ``WHERE 1=0`` around a ranked subquery: 0 rows, 0 cells, nothing run (6 statements); a window
  or an aggregate under ``WHERE 1=0`` at the top, and ``LIMIT (SELECT 0)``: refused (3);
  PIVOT, whose DuckDB binding reads the data for its columns: refused (the finding above).
- the memo (``Known``) only ever holds entries read committed in the answer's snapshot; what
  it charges is added on a later look-up; the answered fingerprint after the COMMIT: no path
  found where it says known for something not charged (a refusal mid-way, a conflict, a
  COMMIT interrupted: each path read in the code; the repeated query costs no statement, 3
  asks measured).
- two connections of the analyst in two threads of one process, each asking new cells that
  fit alone and pass the limit together (52 and 53 cells with 79 left): one answered, the
  other refused, 4,973 of 5,000 used (1 race).
- an admin's grant (CLI, another process, 60 cells with 14 left) while the analyst's queries
  ran: used 5,029 of 5,000 + 60, the refusal after it saw it and ended the day (12 queries).
- the cells' keys hashed in Python (<= 1,024 rows) and read back from the ledger by SQL: the
  same keys for 20 statements of the demo's ledger (``cell_limits._cells`` both ways).
- keys-only GROUP BY (municipality, ``WHERE age = 97``, HAVING, DISTINCT): every group
  charged (182 for 155 municipalities shown); after the refusal ended the day, only statements
  answered before were answered.
- a plain grouping beside a UNION ALL branch of public rows: its groups published as 0 are
  still charged (the test below); ``VALUES`` and a cross join of public tables that would
  pad the answer are refused.
- identities: the ledger's population names the aggregation (COUNT and SUM by sex, a WHERE,
  a LIMIT are four identities), so cells of different statements never share an entry.
"""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import InternalError, PolicyViolation
from tests.security.test_redteam_s49n import template  # noqa: F401 - a fixture
from tests.security.test_redteam_s50d import _fresh, _used

PIVOTS = [
    "SELECT * FROM (PIVOT persons ON sex USING COUNT(*)) t",
    "SELECT * FROM (PIVOT persons ON sex USING SUM(income) GROUP BY municipality) AS p",
    "SELECT * FROM (UNPIVOT households ON size INTO NAME k VALUE v) u",
    "WITH p AS (PIVOT persons ON sex USING COUNT(*)) SELECT * FROM p",
]


@pytest.mark.parametrize("sql", PIVOTS)
def test_a_pivot_source_is_refused_not_a_guard_failure(module_analyst, sql):
    """Fails on int50: an internal error ("the guard failed on this query ... a bug in
    sqlsdc") from sqlglot's qualify, for the aliased forms."""
    with pytest.raises(PolicyViolation, match=r"PIVOT is not allowed") as refused:
        module_analyst.execute(sql)
    assert not isinstance(refused.value, InternalError)
    assert "GROUP BY" in str(refused.value)  # says what to write instead


def test_a_public_branch_does_not_hide_groups_published_as_zero(template, tmp_path):  # noqa: F811
    """A plain grouping's groups published as 0 are counted as the answer's rows fall short of
    its groups; rows of a public UNION ALL branch are not its groups. Held on int50: the
    statement costs at least every group of the persons branch."""
    db = _fresh(template, tmp_path, "union", 100_000)
    persons = "SELECT municipality, COUNT(*) AS n FROM persons WHERE age = 80 GROUP BY municipality"
    with sqlsdc.connect(db, user="analyst") as con:
        rows = con.execute(f"{persons} UNION ALL SELECT name, 1 FROM regions").fetchall()
    raw = duckdb.connect(str(db), read_only=True)
    (groups,) = raw.execute(f"SELECT COUNT(*) FROM ({persons})").fetchone()
    raw.close()
    assert len(rows) >= 8 and groups > 5
    assert _used(db) >= groups
