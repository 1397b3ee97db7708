"""Reading cursor statements (sqlsdc.server.cursors): what psycopg, psycopg2, SQLAlchemy and
ODBC drivers send, and the scrolling that is refused."""

from __future__ import annotations

import pytest

from sqlsdc.errors import NotSupportedError, SqlSyntaxError
from sqlsdc.server.cursors import ALL, Close, Declare, Motion, cursor_text, read


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('DECLARE "c" CURSOR WITHOUT HOLD FOR SELECT 1', Declare("c", False, "SELECT 1")),
        (
            'declare "SQL_CUR0x1" cursor with hold for SELECT 2',
            Declare("SQL_CUR0x1", True, "SELECT 2"),
        ),
        ("DECLARE Cur NO SCROLL CURSOR FOR\nSELECT 3", Declare("cur", False, "SELECT 3")),
        ("DECLARE c INSENSITIVE CURSOR WITH HOLD FOR SELECT 4", Declare("c", True, "SELECT 4")),
        ('FETCH FORWARD 100 FROM "My""c"', Motion('My"c', 100, True)),
        ("fetch 100 in c", Motion("c", 100, True)),
        ("FETCH ALL FROM c", Motion("c", ALL, True)),
        ("FETCH FORWARD ALL IN c", Motion("c", ALL, True)),
        ("FETCH NEXT FROM c", Motion("c", 1, True)),
        ("FETCH c", Motion("c", 1, True)),
        ("MOVE 5 IN c", Motion("c", 5, False)),
        ("CLOSE c", Close("c")),
        ("CLOSE ALL", Close(None)),
    ],
)
def test_cursor_statements_are_read(text, expected):
    assert read(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "DECLARE c SCROLL CURSOR FOR SELECT 1",
        "DECLARE c BINARY CURSOR FOR SELECT 1",
        "FETCH BACKWARD 1 FROM c",
        "FETCH PRIOR FROM c",
        "FETCH ABSOLUTE 3 FROM c",
        "MOVE LAST IN c",
    ],
)
def test_scrolling_is_not_supported(text):
    with pytest.raises(NotSupportedError, match="forward only"):
        read(text)


@pytest.mark.parametrize("text", ["DECLARE c", "FETCH -1 FROM c", "FETCH 1 FROM c; SELECT 1",
                                  "CLOSE c d"])  # fmt: skip
def test_unreadable_cursor_statements_are_syntax_errors(text):
    with pytest.raises(SqlSyntaxError, match="cannot read"):
        read(text)


def test_cursor_text_strips_comments_and_semicolons_and_ignores_other_statements():
    assert cursor_text("/* a */ -- b\n FETCH 2 FROM c;") == "FETCH 2 FROM c"
    assert cursor_text("SELECT 1") is None
    assert cursor_text(" ;") is None
