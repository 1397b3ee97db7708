"""PEP 249 completeness of the guarded connection: type objects, constructors, context managers,
parameter counts, and DuckDB-style fetchers (ISSUE18 must-have 7)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import sqlsdc
from sqlsdc.errors import NotFoundError

SQL = "SELECT region, COUNT(*) AS n FROM persons WHERE sex = ? GROUP BY region"


def test_type_objects_compare_with_description_type_codes(analyst):
    with analyst.cursor() as cursor:
        cursor.execute(SQL, ["F"])
        (region, n) = cursor.description
        assert region[1] == sqlsdc.STRING and region[1] != sqlsdc.NUMBER
        assert n[1] == sqlsdc.NUMBER and n[1] != sqlsdc.DATETIME
    assert cursor.description is None  # closed by the with block
    assert (region[1], n[1]) == ("VARCHAR", "BIGINT")  # DuckDB's names, as its cursor gives
    assert sqlsdc.BINARY == "BLOB" and sqlsdc.DATETIME == "TIMESTAMP WITH TIME ZONE"
    assert sqlsdc.NUMBER == "DECIMAL(18,3)" and sqlsdc.DATETIME != "INTERVAL"
    assert sqlsdc.ROWID != "BIGINT" and sqlsdc.STRING != 1


def test_constructors():
    assert sqlsdc.Date(2024, 1, 2) == dt.date(2024, 1, 2)
    assert sqlsdc.Time(3, 4, 5) == dt.time(3, 4, 5)
    assert sqlsdc.Timestamp(2024, 1, 2, 3, 4, 5) == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert sqlsdc.Binary(b"x") == b"x"
    ticks = dt.datetime(2024, 1, 2, 3, 4, 5).timestamp()
    assert sqlsdc.TimestampFromTicks(ticks) == dt.datetime(2024, 1, 2, 3, 4, 5)
    assert sqlsdc.DateFromTicks(ticks) == dt.date(2024, 1, 2)
    assert sqlsdc.TimeFromTicks(ticks) == dt.time(3, 4, 5)


def test_values_of_every_constructor_are_parameters(analyst):
    """sqlsdc.Time and sqlsdc.Binary made values that no statement took ("parameters of type
    time/bytes are not supported"); a byte string is written as escapes, never as SQL text."""
    tricky = sqlsdc.Binary(b"\x00'; SELECT 1 --\xff")
    values = [sqlsdc.Date(2024, 1, 2), sqlsdc.Time(3, 4, 5), sqlsdc.Timestamp(2024, 1, 2, 3),
              tricky, bytearray(b"ab")]  # fmt: skip
    (row,) = analyst.execute("SELECT ? AS d, ? AS t, ? AS ts, ? AS b, ? AS a", values).fetchall()
    assert row == (dt.date(2024, 1, 2), dt.time(3, 4, 5), dt.datetime(2024, 1, 2, 3), tricky, b"ab")
    with pytest.raises(sqlsdc.PolicyViolation, match="could raise an error"):  # fails closed
        analyst.execute(SQL, [b"F"])  # a VARCHAR column against a BLOB


def test_an_aware_datetime_parameter_keeps_its_instant(analyst):
    """03:00 at UTC+1 was cast to a TIMESTAMP as 03:00, an hour off the instant it names."""
    aware = dt.datetime(2024, 1, 2, 3, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    utc = "TIMESTAMPTZ '2024-01-02 02:00:00+00'"
    ((same, value),) = analyst.execute(f"SELECT ? = {utc}, ?", [aware, aware]).fetchall()
    assert same and value == aware


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (["F", "M"], r"the query has 1 parameter\(s\) but 2 were given"),
        ({"sex": "F"}, "parameters given but not in the query: sex"),
    ],
)
def test_extra_parameters_are_refused(analyst, params, message):
    with pytest.raises(sqlsdc.ProgrammingError, match=message):
        analyst.execute(SQL, params)
    with pytest.raises(sqlsdc.ProgrammingError, match=r"has 0 parameter\(s\) but 1 were given"):
        analyst.execute("SELECT COUNT(*) FROM persons", [1])


def test_duckdb_style_fetchers(analyst):
    cursor = analyst.execute(SQL, ["F"])
    assert isinstance(cursor.fetchdf(), pd.DataFrame)
    assert isinstance(cursor.fetch_arrow_table(), pa.Table)
    assert cursor.fetchdf().equals(cursor.df())
    arrays = cursor.fetchnumpy()  # notebooks written for DuckDB call it too
    assert list(arrays) == list(cursor.df().columns) and len(arrays["n"]) == len(cursor.df())
    try:
        import polars  # noqa: F401
    except ImportError:
        with pytest.raises(sqlsdc.NotSupportedError, match="pl\\(\\) needs polars"):
            cursor.pl()
    else:
        assert cursor.pl().shape == cursor.df().shape


def test_parameters_by_the_name_pep_249_and_duckdb_give_them(analyst):
    """``execute(sql, parameters=...)``: polars' ``read_database(..., execute_options=
    {"parameters": [...]})`` passes them so, and got TypeError (new user s38)."""
    expected = analyst.execute(SQL, ["F"]).fetchall()
    assert analyst.execute(SQL, parameters=["F"]).fetchall() == expected
    assert analyst.cursor().execute(SQL, parameters=("F",)).fetchall() == expected
    assert analyst.explain(SQL, parameters=["F"]).sql == analyst.explain(SQL, ["F"]).sql
    try:
        import polars
    except ImportError:
        return
    read = polars.read_database(SQL, connection=analyst, execute_options={"parameters": ["F"]})
    assert read.rows() == expected


def test_a_notebook_shows_explain_as_print_does(analyst):
    """IPython's display protocol (``_repr_pretty_``, what Jupyter calls for the last
    expression of a cell) writes the explanation, not the dataclass (new user s38)."""

    class Printer:  # IPython.lib.pretty's interface, as much as the protocol uses
        written = ""

        def text(self, text):
            self.written += text

    explained = analyst.explain(SQL, ["F"])
    printer = Printer()
    explained._repr_pretty_(printer, cycle=False)
    assert printer.written == str(explained) and printer.written.startswith("columns:\n")


def test_duckdb_2_fetchers_exist(analyst):
    """Every fetcher of a DuckDB 2 connection's result is a cursor's too (a notebook written for
    DuckDB 2 called ``to_arrow_table()``: AttributeError, new user s38), but the chunked one."""
    import duckdb

    raw = duckdb.connect()
    fetchers = {m for m in dir(raw) if m.startswith(("fetch", "to_arrow")) or m in ("df", "pl")}
    cursor = analyst.execute(SQL, ["F"])
    assert sorted(m for m in fetchers - {"fetch_df_chunk"} if not hasattr(cursor, m)) == []
    assert cursor.fetch_df().equals(cursor.df())
    assert cursor.to_arrow_table().equals(cursor.arrow())
    reader = cursor.to_arrow_reader(batch_size=1)
    assert isinstance(reader, pa.RecordBatchReader)
    batches = list(reader)
    assert len(batches) == cursor.rowcount and pa.Table.from_batches(batches) == cursor.arrow()
    with pytest.raises(sqlsdc.ProgrammingError, match="batch_size must be a positive integer"):
        cursor.to_arrow_reader(0)


@pytest.mark.parametrize("statement", [123, None, b"SELECT 1", ["SELECT 1"]])
def test_a_statement_that_is_not_text_is_the_callers_error(analyst, statement):
    """PEP 249's ProgrammingError that says what to pass, from every entry point."""
    entries = (
        analyst.execute,
        analyst.explain,
        analyst.verify,
        lambda sql: analyst.cursor().executemany(sql, [None]),
    )
    for entry in entries:
        with pytest.raises(sqlsdc.ProgrammingError, match="a statement must be a str"):
            entry(statement)


@pytest.mark.parametrize("params", [5, "F", b"F", {"F"}, iter(["F"])])
def test_parameters_that_are_not_a_list_tuple_or_dict_are_the_callers_error(analyst, params):
    """A str or bytes is a sequence of characters or bytes (``"18"`` was 2 parameters, b"F" the
    number 70); an int or an iterator was an internal error, a set had no order."""
    with pytest.raises(sqlsdc.ProgrammingError, match="parameters must be a list or tuple"):
        analyst.execute(SQL, params)


def test_a_closed_cursor_is_unusable(analyst):
    """PEP 249: after close() every operation raises an Error (before, execute() still ran)."""
    with analyst.cursor() as cursor:
        cursor.execute(SQL, ["F"])
    for operation in (
        lambda: cursor.execute(SQL, ["F"]),
        lambda: cursor.executemany(SQL, [["F"]]),
        cursor.fetchone,
        cursor.fetchall,
        cursor.df,
    ):
        with pytest.raises(sqlsdc.InterfaceError, match="the cursor is closed"):
            operation()
    cursor.close()  # closing again is allowed


def test_every_pep249_exception_is_exported():
    names = ("Warning", "Error", "InterfaceError", "DatabaseError", "DataError",
             "OperationalError", "IntegrityError", "InternalError", "ProgrammingError",
             "NotSupportedError")  # fmt: skip
    for name in names:
        assert issubclass(getattr(sqlsdc, name), Exception), name
        assert name == "Warning" or issubclass(getattr(sqlsdc, name), sqlsdc.DatabaseError)


def test_a_closed_connection_refuses_commit(demo_db):
    """PEP 249: after close() every operation raises an Error; commit() returned silently, so a
    script could not tell that it had closed the connection it meant to use."""
    con = sqlsdc.connect(demo_db, user="analyst")
    con.commit()  # open: nothing to commit, and no error
    con.close()
    with pytest.raises(sqlsdc.InterfaceError, match="the connection is closed"):
        con.commit()


def test_fetchmany_with_a_negative_size_is_an_error(analyst):
    """fetchmany(-1) (or arraysize = -1) returned [] as if the result were used up."""
    cursor = analyst.execute(SQL, ["F"])
    with pytest.raises(sqlsdc.ProgrammingError, match="size must be 0 or more, got -1"):
        cursor.fetchmany(-1)
    cursor.arraysize = -2
    with pytest.raises(sqlsdc.ProgrammingError, match="got -2"):
        cursor.fetchmany()
    assert cursor.fetchall()  # nothing was consumed


def test_an_empty_database_path_is_not_the_current_folder():
    """``connect("")`` said "'' is a folder" (Path("") is the current folder)."""
    with pytest.raises(NotFoundError, match="the database path is empty"):
        sqlsdc.connect("", user="analyst")


@pytest.mark.parametrize("batch", [None, 5, "F", {"x": ["F"]}])
def test_executemany_wants_a_sequence_of_parameter_lists(analyst, batch):
    """None (or a number) raised Python's TypeError; a str ran one query per character."""
    with pytest.raises(sqlsdc.ProgrammingError, match="executemany takes a sequence of "):
        analyst.cursor().executemany(SQL, batch)


def test_fetchmany_with_a_size_that_is_no_number_is_the_callers_error(analyst):
    """fetchmany("2") and arraysize = "x" raised Python's TypeError (new user s44g)."""
    cursor = analyst.execute(SQL, ["F"])
    with pytest.raises(sqlsdc.ProgrammingError, match="must be a whole number, got '2'"):
        cursor.fetchmany("2")
    cursor.arraysize = "x"
    with pytest.raises(sqlsdc.ProgrammingError, match="got 'x'"):
        cursor.fetchmany()
    cursor.arraysize = 1
    assert len(cursor.fetchmany(np.int64(2))) == 2  # an integer of any kind is a size


def test_the_optional_pep249_extensions(analyst):
    """callproc, nextset, scroll, rownumber, lastrowid, next() and the connection's exception
    attributes raised AttributeError (new user s44g, issue 18: PEP 249 complete)."""
    cursor = analyst.cursor()
    assert cursor.rownumber is None and cursor.lastrowid is None
    with pytest.raises(sqlsdc.ProgrammingError, match="call execute"):
        cursor.nextset()
    with pytest.raises(sqlsdc.NotSupportedError, match="no stored procedures"):
        cursor.callproc("p", [1])
    cursor.execute("SELECT sex, COUNT(*) AS n FROM persons GROUP BY sex ORDER BY sex")
    every = cursor.fetchall()
    assert len(every) == 2 and cursor.rownumber == 2 and cursor.nextset() is None
    cursor.scroll(0, mode="absolute")
    assert cursor.rownumber == 0 and next(cursor) == every[0] and cursor.rownumber == 1
    cursor.scroll(-1)
    assert cursor.fetchone() == every[0]
    with pytest.raises(IndexError, match="leaves the result of 2 rows"):
        cursor.scroll(5)
    with pytest.raises(sqlsdc.ProgrammingError, match="'relative' or 'absolute'"):
        cursor.scroll(0, mode="sideways")
    assert cursor.rownumber == 1 and next(cursor) == every[1]
    with pytest.raises(StopIteration):
        next(cursor)
    names = ("Warning", "Error", "InterfaceError", "DatabaseError", "DataError",
             "OperationalError", "IntegrityError", "InternalError", "ProgrammingError",
             "NotSupportedError")  # fmt: skip
    assert all(getattr(analyst, name) is getattr(sqlsdc, name) for name in names)
    with pytest.raises(analyst.ProgrammingError):
        analyst.cursor().fetchall()


def test_the_cursors_of_a_closed_connection_are_unusable(demo_db):
    """PEP 249: closing a connection makes its cursors unusable; fetchall() still returned the
    rows of a result fetched before (new user s44g)."""
    con = sqlsdc.connect(demo_db, user="analyst")
    cursor = con.execute(SQL, ["F"])
    con.close()
    for operation in (cursor.fetchall, cursor.fetchone, lambda: cursor.execute(SQL, ["F"])):
        with pytest.raises(sqlsdc.InterfaceError, match="the connection is closed"):
            operation()
