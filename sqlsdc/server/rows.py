"""An answer as protocol messages: its RowDescription and DataRows, each column in the
format the client asked (text or binary, :mod:`sqlsdc.server.types`)."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import pyarrow as pa

from sqlsdc.server import codec, types
from sqlsdc.server.sqlstate import StatementError


def column_formats(formats, count: int) -> list[int]:
    if not formats:
        return [0] * count
    if len(formats) == 1:
        return [formats[0]] * count
    if len(formats) != count:
        raise StatementError("08P01", f"{len(formats)} result formats for {count} columns")
    return list(formats)


def description(table_or_names, formats, text_only: bool) -> bytes:
    if isinstance(table_or_names, pa.Table):
        schema = table_or_names.schema
        names, oids = schema.names, [types.oid_of(f.type) for f in schema]
    else:
        names, oids = list(table_or_names), [types.TEXT] * len(table_or_names)
    if text_only:
        oids = [types.TEXT] * len(names)
    codes = column_formats(formats, len(names))
    return codec.row_description([(n, o, types.size_of(o), c)
                                  for n, o, c in zip(names, oids, codes, strict=True)])  # fmt: skip


def data_rows(table: pa.Table, formats, text_only: bool) -> bytes:
    """The DataRow messages of ``table``, one after the other (run in the thread pool).

    Raises:
        StatementError: 22008 for a value the encoders cannot write (a date or timestamp
            outside years 1-9999 or infinite: Python's datetime cannot hold it); the statement
            fails, the session goes on (an OverflowError escaping here would end it as FATAL
            XX000).
    """
    with sendable():
        return b"".join(codec.data_row(row) for row in encode(table, formats, text_only))


@contextmanager
def sendable():
    """Map what the encoders cannot write (Python's datetime holds years 1 to 9999 only) to
    StatementError 22008: the statement fails, the session goes on."""
    try:
        yield
    except (OverflowError, ValueError):
        raise StatementError(
            "22008", "a value of the answer cannot be sent: dates and timestamps must lie in "
            "years 1 to 9999 (infinity and BC dates are not supported)",
            "cast the column to text, or filter such values out",
        ) from None  # fmt: skip


def encode(table: pa.Table, formats, text_only: bool):
    """The DataRow values of ``table``, column by column, in each column's format."""
    codes = column_formats(formats, table.num_columns)
    columns = []
    for column, code in zip(table.columns, codes, strict=True):
        oid = types.TEXT if text_only else types.oid_of(column.type)
        encode = partial(types.binary_value if code == 1 else types.text_value, oid=oid)
        if text_only:
            real = types.oid_of(column.type)
            encode = partial(lambda v, real: types.text_value(v, real), real=real)
        columns.append([None if v is None else encode(v) for v in column.to_pylist()])
    return zip(*columns, strict=True) if columns else iter(())
