"""The cursor of a guarded connection: PEP 249 over a protected result, with ``df()``,
``arrow()``, ``cell_status()`` and ``explain()``.

The connection checks, protects and runs each statement
(:meth:`sqlsdc.guard.connection.Connection._execute`); the cursor holds its answer and hands it
out as DuckDB's own cursor would: rows with DuckDB's Python conversions (a HUGEINT is an
``int``, an INTERVAL a ``timedelta``), DataFrames typed as its ``df()`` types them, the cells'
status and the accuracy of what was released.
"""

from __future__ import annotations

import datetime as dt
import operator
from statistics import NormalDist
from typing import TYPE_CHECKING

import pyarrow as pa

from sqlsdc.engines import duckdb as engine
from sqlsdc.errors import InterfaceError, NotSupportedError, ProgrammingError
from sqlsdc.guard.pipeline import ProtectedQuery
from sqlsdc.guard.postprocess import accuracy, cell_status, dp_accuracy
from sqlsdc.guard.values import frame, python_list

if TYPE_CHECKING:
    import pandas as pd

    from sqlsdc.guard.connection import Connection


class Cursor:
    """PEP 249 cursor over a protected result, with ``df()``, ``arrow()`` and ``cell_status()``."""

    arraysize = 1
    lastrowid = None  # PEP 249 extension: guarded results have no row ids

    def __init__(self, connection: Connection):
        self.connection = connection
        self._result: pa.Table | None = None
        self._whole: pa.Table | None = None  # the result with its hidden columns
        self._status: pd.DataFrame | None = None  # made from it when first asked for
        self._position = 0
        self._query: ProtectedQuery | None = None  # the guard's (shared) checked query
        self._shown: ProtectedQuery | None = None  # the caller's copy of it
        self.query_id: int | None = None
        self._closed = False

    @property
    def description(self):
        if self._result is None:
            return None
        schema = self._result.schema
        kinds = zip(schema, engine.type_names(schema), strict=True)
        return [(f.name, kind, None, None, None, None, None) for f, kind in kinds]  # as DuckDB

    @property
    def rowcount(self) -> int:
        return -1 if self._result is None else self._result.num_rows

    def execute(self, sql: str, parameters=None) -> Cursor:
        """Run ``sql`` through the guard with ``parameters`` (a list or tuple for ``?`` and
        ``$1``, a dict for ``$name``), named as PEP 249 and DuckDB name them: polars'
        ``read_database(..., execute_options={"parameters": [...]})`` passes them by that
        name (tests/test_dbapi.py)."""
        self._check_open()
        # the previous statement's result goes first: a refused or failed statement left it in
        # place, and fetchall(), description and cell_accuracy() answered the old query's
        # cells as if they were the new one's (red team s45j); DuckDB's cursor has no result
        self._result = self._whole = self._query = self._shown = self._status = None
        self.query_id = None
        self._position = 0
        result, query, query_id, whole = self.connection._execute(sql, parameters)
        self._result, self._query, self.query_id, self._whole = result, query, query_id, whole
        return self

    def executemany(self, sql: str, seq_of_params) -> Cursor:
        self._check_open()
        if isinstance(seq_of_params, str | bytes | dict) or not hasattr(seq_of_params, "__iter__"):
            # None raised Python's TypeError; a str or dict ran once per character or key
            raise ProgrammingError(
                "executemany takes a sequence of parameter lists, e.g. [['F'], ['M']], not "
                f"{type(seq_of_params).__name__}"
            )
        for params in seq_of_params:
            self.execute(sql, params)
        return self

    def fetchone(self):
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple]:
        table = self._require_result()
        size = self.arraysize if size is None else size
        try:  # fetchmany("5") or arraysize = "x" raised Python's TypeError (new user s44g)
            size = operator.index(size)
        except TypeError:
            raise ProgrammingError(
                f"fetchmany size (or arraysize) must be a whole number, got {size!r}"
            ) from None
        if size < 0:  # table.slice read it as "no rows": fetchmany(-1) looked like the end
            raise ProgrammingError(f"fetchmany size must be 0 or more, got {size}")
        chunk = table.slice(self._position, size)
        self._position += chunk.num_rows
        return _rows(chunk)

    def fetchall(self) -> list[tuple]:
        table = self._require_result()
        chunk = table.slice(self._position)
        self._position = table.num_rows
        return _rows(chunk)

    def df(self) -> pd.DataFrame:
        return _frame(self._require_result())

    def arrow(self) -> pa.Table:
        return engine.without_marks(self._require_result())

    def fetchdf(self) -> pd.DataFrame:
        """The result as a pandas DataFrame (DuckDB's name for :meth:`df`)."""
        return self.df()

    def fetch_arrow_table(self) -> pa.Table:
        """The result as an Arrow table (DuckDB's name for :meth:`arrow`)."""
        return self.arrow()

    def fetch_df(self) -> pd.DataFrame:
        """The result as a pandas DataFrame (DuckDB 2's name for :meth:`df`)."""
        return self.df()

    def to_arrow_table(self, batch_size: int = 131072) -> pa.Table:
        """The result as an Arrow table (DuckDB 2's name for :meth:`arrow`, which has no
        ``fetch_arrow_table`` any more; ``batch_size`` is accepted as DuckDB's is)."""
        return self.arrow()

    def to_arrow_reader(self, batch_size: int = 131072) -> pa.RecordBatchReader:
        """The result as an Arrow stream of batches of at most ``batch_size`` rows (DuckDB 2's
        reader, which polars, DataFusion and Arrow writers consume)."""
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ProgrammingError("batch_size must be a positive integer, e.g. 131072")
        table = self.arrow()
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(batch_size))

    def fetchnumpy(self) -> dict:
        """The result as ``{column: numpy array}`` (DuckDB's :meth:`fetchnumpy`; NULL as the
        missing value of the column's pandas type, as in :meth:`df`)."""
        frame = self.df()
        return {str(name): frame.iloc[:, i].to_numpy() for i, name in enumerate(frame.columns)}

    def pl(self):
        """The result as a polars DataFrame (polars is optional: ``pip install polars``)."""
        try:
            import polars
        except ImportError:
            raise NotSupportedError(
                "pl() needs polars, which is not installed; `pip install polars`, or use df() "
                "(pandas) or arrow()"
            ) from None
        return polars.from_arrow(self.arrow())

    def cell_status(self) -> pd.DataFrame:
        """Per result cell: ``published`` or ``suppressed`` for protected aggregates, ``key``
        for group keys, ``public`` for public values, ``derived`` for values computed from
        protected cells (suppressed when NULL)."""
        self._require_result()
        if self._status is None:
            self._status = cell_status(self._whole, self._query)
        return self._status

    def cell_accuracy(self, level: float = 0.95) -> pd.DataFrame:
        """Accuracy of every noisy cell in the result, one row per cell.

        Columns: ``row``, ``column``, ``value`` (published), ``variance`` (of the noise),
        ``low``/``high``: an interval around the value that holds the true (bounded) value with
        probability ``level``.

        CKM counts: from the noise distribution of the ptable's general row (exact for true
        counts at or above its last row, conservative bounds ±D hold for all); CKM magnitude
        cells are not listed: their noise scales with the largest contribution, which must stay
        secret. DP cells: COUNT and SUM intervals are exact quantiles of the discrete Laplace or
        Gaussian noise at level 0.95 (other levels: normal approximation z·sd); AVG intervals
        are delta-method approximations; VAR, STDDEV and quantiles are not listed.

        The interval covers the noise only. What the bounding did to a DP cell's input comes
        with it: ``dropped`` and ``clamped`` are the shares of the cell's input rows that the
        row caps removed and that were clamped to the measure's bounds (each unit's rows
        weighted so that it counts once), released with noise at the policy's
        ``dp.bounding_report`` spend (charged with the query) and NaN when the policy does not
        report them. A large share means the exact answer can lie far outside the interval
        (the bounded value is biased). CKM rows have NaN there.
        """
        import pandas as pd

        if not 0 < level < 1:
            raise ProgrammingError("level must be between 0 and 1, e.g. 0.95")
        ckm = accuracy(self._require_result(), self._query, level)
        dp = dp_accuracy(self._whole, self._query)
        if dp is None or dp.empty:
            return ckm
        if level != 0.95:
            dp["half_width"] = NormalDist().inv_cdf((1 + level) / 2) * dp["sd"]
        dp["variance"] = dp["sd"] ** 2
        dp["low"], dp["high"] = dp["value"] - dp["half_width"], dp["value"] + dp["half_width"]
        dp = dp[["row", "column", "value", "variance", "low", "high", "dropped", "clamped"]]
        return pd.concat([ckm, dp], ignore_index=True) if not ckm.empty else dp

    @property
    def query(self) -> ProtectedQuery | None:
        """The checked query of the last statement (a copy of the guard's, made once)."""
        if self._shown is None and self._query is not None:
            self._shown = self._query.detached()
        return self._shown

    def explain(self) -> ProtectedQuery:
        if self._query is None:
            raise ProgrammingError("no query has been executed on this cursor")
        return self.query

    @property
    def rownumber(self) -> int | None:
        """PEP 249 extension: the index of the next row to fetch, None before a result."""
        return None if self._result is None or self._closed else self._position

    def scroll(self, value: int, mode: str = "relative") -> None:
        """PEP 249 extension: move the position by ``value`` rows (``mode="absolute"``: to
        row ``value``). Leaving the result raises IndexError and does not move."""
        table = self._require_result()
        if mode not in ("relative", "absolute"):
            raise ProgrammingError(f"scroll mode must be 'relative' or 'absolute', not {mode!r}")
        try:
            target = operator.index(value) + (self._position if mode == "relative" else 0)
        except TypeError:
            raise ProgrammingError(f"scroll takes a whole number, got {value!r}") from None
        if not 0 <= target <= table.num_rows:
            raise IndexError(f"scroll to row {target} leaves the result of {table.num_rows} rows")
        self._position = target

    def callproc(self, procname, parameters=None):
        """PEP 249: a guarded connection has no stored procedures (it raised AttributeError)."""
        self._check_open()
        raise NotSupportedError("guarded connections have no stored procedures: run a SELECT "
                                "with execute()")  # fmt: skip

    def nextset(self) -> None:
        """PEP 249: there is one result set per statement (several statements are refused), so
        no next one: None (it raised AttributeError)."""
        self._require_result()
        return None

    def setinputsizes(self, sizes) -> None:
        """PEP 249 no-op."""

    def setoutputsize(self, size, column=None) -> None:
        """PEP 249 no-op."""

    def close(self) -> None:
        """PEP 249: the cursor is unusable from now on (every operation raises)."""
        self._result = self._whole = self._status = None
        self._closed = True

    def __iter__(self):
        return iter(self.fetchall())

    def __next__(self):
        """PEP 249 extension ``next()``: ``fetchone()``, with StopIteration at the end."""
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed; open another with connection.cursor()")
        if getattr(self.connection, "_closed", False):  # PEP 249: its cursors too (fetchall
            raise InterfaceError("the connection is closed")  # still answered: s44g)

    def _require_result(self) -> pa.Table:
        self._check_open()
        if self._result is None:
            raise ProgrammingError(
                "no result: call execute() first (a statement that raised has none)"
            )
        return self._result


def _rows(table: pa.Table) -> list[tuple]:
    """Python rows with DuckDB's own conversions (a HUGEINT is an ``int``, not a ``Decimal``)."""
    columns = [_python_values(c, f) for c, f in zip(table.columns, table.schema, strict=True)]
    return list(zip(*columns, strict=True)) if columns else []


def _python_values(column: pa.ChunkedArray, field: pa.Field) -> list:
    values = python_list(column)
    if engine.is_wide_integer(field):
        return [None if v is None else int(v) for v in values]
    if pa.types.is_interval(field.type):
        return [None if v is None else _timedelta(v) for v in values]
    return values


def _timedelta(interval) -> dt.timedelta:
    """An INTERVAL as DuckDB's Python API gives it: a timedelta with a month as 30 days."""
    days = interval.months * 30 + interval.days
    return dt.timedelta(days=days, microseconds=interval.nanoseconds // 1000)


def _frame(table: pa.Table) -> pd.DataFrame:
    """A DataFrame typed as DuckDB's ``df()`` types it: decimals (and HUGEINT) as float64."""
    decimals = [i for i, f in enumerate(table.schema) if pa.types.is_decimal(f.type)]
    for i in decimals:
        table = table.set_column(i, table.field(i).with_type(pa.float64()),
                                 table.column(i).cast(pa.float64()))  # fmt: skip
    for i, field in enumerate(table.schema):
        if pa.types.is_interval(field.type):  # DuckDB's df(): timedelta64, not DateOffset
            values = pa.array(_python_values(table.column(i), field), pa.duration("us"))
            table = table.set_column(i, field.with_type(pa.duration("us")), values)
    return frame(table)
