"""Python values of a result, for every value DuckDB can store.

Python's ``date``, ``datetime`` and ``time`` hold years 1-9999 and times below 24:00; DuckDB
holds dates to year 5877641, timestamps to 294247, infinities and ``24:00:00``. Converting
such a value raised (``OverflowError``), so a released group key holding one made the query
fail where another answered, telling the value's range (the threshold rule releases the keys
of the cells it suppresses): an error oracle found by the sweep of
``tests/security/test_error_oracle_sweep.py``, and a traceback for the analyst. As DuckDB's
own client does, values outside Python's range come back as their text.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

_CONVERSION_ERRORS = (OverflowError, ValueError, pa.ArrowInvalid)
_INFINITIES = {
    "date": {2**31 - 1: dt.date.max, -(2**31 - 1): dt.date.min},
    "timestamp": {2**63 - 1: dt.datetime.max, -(2**63 - 1): dt.datetime.min},
}


def python_list(column: pa.ChunkedArray) -> list:
    """``column.to_pylist()``; dates and times outside Python's range as text."""
    try:
        return column.to_pylist()
    except _CONVERSION_ERRORS:
        return [_python(value) for value in column]


def frame(table: pa.Table) -> pd.DataFrame:
    """``table.to_pandas()``; if a value is outside pandas' range, the columns as Python values."""
    import pandas as pd

    try:
        return table.to_pandas()
    except _CONVERSION_ERRORS:
        columns = {name: python_list(table.column(i)) for i, name in enumerate(table.column_names)}
        return pd.DataFrame(columns, columns=table.column_names)


def _python(value: pa.Scalar):
    try:
        return value.as_py()
    except _CONVERSION_ERRORS:
        return _text(value)


def _text(value: pa.Scalar):
    """ISO text of a date, timestamp or time Python cannot hold (numpy's calendar spans them);
    DuckDB's infinities are Python's largest and smallest, as DuckDB's client gives them."""
    kind = value.type
    if pa.types.is_date32(kind):
        infinite = _INFINITIES["date"].get(value.value)
        return infinite if infinite is not None else str(np.datetime64(value.value, "D"))
    if pa.types.is_timestamp(kind):
        infinite = _INFINITIES["timestamp"].get(value.value)
        if infinite is not None:
            return infinite if kind.tz is None else infinite.replace(tzinfo=dt.UTC)
        return str(np.datetime64(value.value, kind.unit)).replace("T", " ")
    if pa.types.is_time(kind):
        return "24:00:00"  # the one time of day Python has not
    return str(value)
