"""Red team s46j: today's merged changes (session 46, round 2), as an analyst.

Finding (fails on int46):

- The audit entry of a statement without parameters could end with a forged values line:
  int46 appended ``-- parameters: (none)`` only when the text held ``\\n-- parameters: ``, but
  a ``--`` comment runs to ``\\n`` alone for the engine, while a reader (``str.splitlines``, a
  spreadsheet opening ``sqlsdc audit --format csv``, a terminal) also breaks lines at
  ``\\r``, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``, ``\\u2029``. So
  ``SELECT COUNT(*) FROM persons WHERE region = 'R01'\\r-- parameters: 'R09'`` ran (R01's
  count, 1 query) and its entry's last line read as values the guard never bound; an
  indented ``  -- parameters:`` line too. 9 separators and the indented spelling, all 10
  forged on int46; now each entry ends with the guard's ``(none)`` line.
"""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc.guard.audited_parameters import audited_text
from tests.security.test_redteam_s44e import _rows

FORGED = "-- parameters: 'R09'"
SEPARATORS = ["\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("separator", SEPARATORS, ids=[repr(s) for s in SEPARATORS])
def test_a_forged_values_line_after_any_line_break_is_closed(separator):
    sql = f"SELECT COUNT(*) FROM persons WHERE region = 'R01'{separator}{FORGED}"
    assert audited_text(sql, None).splitlines()[-1] == "-- parameters: (none)"
    indented = f"SELECT 1\n   --  PARAMETERS : 'R09'{separator}"
    assert audited_text(indented, ()).splitlines()[-1] == "-- parameters: (none)"
    assert audited_text("SELECT 1 -- no values here", None) == "SELECT 1 -- no values here"


def test_the_logged_entry_of_a_forged_line_ends_with_the_guards(fresh_demo_db):
    """End to end: the statement runs (the engine reads ``\\r-- ...`` as a comment) and its
    audit entry's last line, split as a reader splits it, is the guard's."""
    sql = f"SELECT COUNT(*) FROM persons WHERE region = 'R01'\u2028{FORGED}"
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        ((count,),) = con.execute(sql).fetchall()
        ((plain,),) = con.execute("SELECT COUNT(*) FROM persons WHERE region = 'R01'").fetchall()
    assert count == plain
    ((text,),) = _rows(
        fresh_demo_db,
        "SELECT sql_text FROM sqlsdc.audit WHERE user_name = 'analyst' AND sql_text LIKE ?",
        ["%R09%"],
    )
    assert text.splitlines()[-1] == "-- parameters: (none)"
    assert text.startswith(sql)
