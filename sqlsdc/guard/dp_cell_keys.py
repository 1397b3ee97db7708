"""A DP stage's cells as plain Python columns: their keys (as the values the cells' identities
encode), the space and mechanisms of their statistics, the grid of public domains, and which
exact cells may be released as groups at all (keys Python holds one value per group of).

Shared by the price before the charge (:mod:`sqlsdc.guard.dp_pricing`), the answers from the
cache (:mod:`sqlsdc.guard.dp_reuse`) and the release (:mod:`sqlsdc.guard.dp_release`).
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.accountant import Statistic
from sqlsdc.mechanisms.dp_cells import (
    CellMechanism,
    CellSpace,
)
from sqlsdc.rewrite.dp import DpStage

if TYPE_CHECKING:
    import pandas as pd


Domains = dict[str, list[list] | None]


@dataclass
class _Cells:
    """One stage's cells as plain columns, one value per cell: the ``__g<j>`` keys (Python
    values, NULL as None) and the exact statistics (integers in grid units). A handful of
    cells go through as lists: a pandas frame of 8 cells cost more (0.5-1 ms per query) than
    drawing their noise."""

    columns: dict[str, list]
    n: int

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> list:
        return self.columns[name]

    def where(self, keep: list[bool]) -> _Cells:
        """The cells where ``keep`` is true, in order."""
        columns = {c: [v for v, k in zip(values, keep, strict=True) if k]
                   for c, values in self.columns.items()}  # fmt: skip
        return _Cells(columns, sum(map(bool, keep)))

    def keys_frame(self, keys: list[str]) -> pd.DataFrame:
        """The key columns as a frame of Python values (object dtype), one row per cell."""
        import pandas as pd

        return pd.DataFrame({k: self.columns[k] for k in keys}, index=range(self.n), dtype=object)


def _space(stage: DpStage, data_versions: dict[str, str]) -> CellSpace:
    return CellSpace.of(
        stage.table,
        {f"__g{j}": name for j, name in enumerate(stage.keys)},
        scope=stage.scope,
        data_version=data_versions[stage.table],
    )


def _mechanisms(stage: DpStage) -> dict[str, CellMechanism]:
    """The stage's additive statistics (quantiles are drawn from histograms) by column."""
    return {s.column: CellMechanism(s.measure, s.calibration) for s in stage.statistics
            if s.calibration.statistic is not Statistic.QUANTILE}  # fmt: skip


def _all_mechanisms(stage: DpStage) -> dict[str, CellMechanism]:
    """Every statistic of the stage, quantiles included, by column."""
    return {s.column: CellMechanism(s.measure, s.calibration) for s in stage.statistics}


def _grid_keys(stage: DpStage, stage_domains: list[list]) -> dict[str, list]:
    """The ``__g<j>`` key columns of the public domains' product, one row per cell."""
    grid = list(itertools.product(*stage_domains))
    return {f"__g{j}": [key[j] for key in grid] for j in range(len(stage.keys))}


def _representable(exact_cells: pa.Table, stage: DpStage, private: bool) -> pa.Table:
    """The exact cells whose group keys become distinct Python values; the others dropped.

    Keys become Python values (to encode each cell's identity, to complete public domains), and
    that must neither fail for some values only (the error would tell, exactly and whatever
    the noise, whether a group with such a key exists: DuckDB's dates and timestamps reach far
    beyond Python's years 1 to 9999, 'infinity' among them) nor give two groups one identity
    (one noise on two exact values reveals their difference). So keys of dates and timestamps
    outside Python's range are dropped, as keys outside a public domain are: whether a cell
    is dropped depends on its key, never on its count. Private groups (keys from the data)
    of a type whose Python values are not one per group are refused, by the type alone:
    floats (the NaN and the NULL group would be one cell) and times (``24:00:00`` is
    ``00:00:00`` in Python, TIMETZ loses its offset)."""
    keep = None
    for j in range(len(stage.keys)):
        column = exact_cells.column(f"__g{j}")
        if private:  # checked before the charge (check_private_keys); kept here in depth
            _check_private_key(column.type)
        inside = _in_python_range(column)
        if inside is not None:
            keep = inside if keep is None else pc.and_(keep, inside)
    return exact_cells if keep is None else exact_cells.filter(keep)


def _check_private_key(kind: pa.DataType) -> None:
    if not _distinct_in_python(kind):
        raise PolicyViolation(
            f"a DP group key of type {kind} is not released as groups from the data (its "
            "values do not name one group each)",
            "cast the key to VARCHAR, or group by a dimension with a declared domain",
        )


def _distinct_in_python(kind: pa.DataType) -> bool:
    """Whether distinct keys of this type are distinct Python values of one canonical text
    each (:func:`sqlsdc.mechanisms.dp_cells.encode_key_value`)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    checks = (pa.types.is_null, pa.types.is_boolean, pa.types.is_integer, pa.types.is_decimal,
              pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
              pa.types.is_large_binary, pa.types.is_date, pa.types.is_timestamp)  # fmt: skip
    return any(check(kind) for check in checks) or kind == pa.string_view()


_EPOCH = dt.datetime(1970, 1, 1)
_PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}


def _in_python_range(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """Per value, whether Python's dates and datetimes hold it (NULL: yes); None for types
    without such a limit. Timestamps with a time zone keep a day's margin for its offset."""
    kind = column.type
    if pa.types.is_date32(kind):
        low, high, values = dt.date.min, dt.date.max, pc.cast(column, pa.int32())
        low, high = ((d - _EPOCH.date()).days for d in (low, high))
    elif pa.types.is_date64(kind):
        days = [(d - _EPOCH.date()).days for d in (dt.date.min, dt.date.max)]
        low, high, values = days[0] * 86_400_000, days[1] * 86_400_000, pc.cast(column, pa.int64())
    elif pa.types.is_timestamp(kind):
        margin = dt.timedelta(days=1 if kind.tz else 0)
        per = _PER_SECOND[kind.unit]
        low, high = (
            (t - _EPOCH) // dt.timedelta(microseconds=1) * per // 10**6
            for t in (dt.datetime.min + margin, dt.datetime.max - margin)
        )
        low, high = max(low, -(2**63) + 1), min(high, 2**63 - 1)  # -2**63: pandas' NaT
        values = pc.cast(column, pa.int64())
    else:
        return None
    inside = pc.and_(pc.greater_equal(values, low), pc.less_equal(values, high))
    return pc.fill_null(inside, True)


def _exact_types(dtype: pa.DataType):
    """Keep exact integers and decimals as Python objects (HUGEINT sums come as decimals)."""
    import pandas as pd

    if pa.types.is_decimal(dtype) or pa.types.is_integer(dtype):
        return pd.ArrowDtype(dtype)
    return None


def _complete(exact_cells: pa.Table, stage: DpStage, domains: list[list] | None) -> _Cells:
    """The exact cells as exact integers (grid units); over public domains, one cell per
    domain cell (absent cells count 0; others dropped)."""
    stats = [s.column for s in stage.statistics
             if s.calibration.statistic is not Statistic.QUANTILE]  # fmt: skip
    keys = [f"__g{j}" for j in range(len(stage.keys))]
    if domains is None or not keys:
        exact = exact_cells.to_pandas(types_mapper=_exact_types)
        columns = {c: [_exact_int(v) for v in exact[c].tolist()] for c in stats}
        # keys as Python values, NULL as None: pandas makes a NULL timestamp NaT and a NULL
        # string NaN (its ``str`` dtype), which Arrow cannot take back to the type
        columns.update((key, exact_cells.column(key).to_pylist()) for key in keys)
        return _Cells(columns, exact_cells.num_rows)
    values = {c: [_exact_int(v) for v in exact_cells.column(c).to_pylist()] for c in stats}
    present = list(zip(*(exact_cells.column(k).to_pylist() for k in keys), strict=True))
    found = list(zip(*values.values(), strict=True)) if stats else [()] * len(present)
    lookup = dict(zip(present, found, strict=True))
    columns = _grid_keys(stage, domains)
    zeros = (0,) * len(stats)
    plain = _grid_keys(stage, [[_plain(v) for v in d] for d in domains])  # columns' values
    rows = [lookup.get(key, zeros) for key in zip(*plain.values(), strict=True)]
    columns.update((c, [row[i] for row in rows]) for i, c in enumerate(stats))
    return _Cells(columns, len(rows))


def _exact_int(value) -> int:
    import pandas as pd

    return 0 if value is None or value is pd.NA else int(value)


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value
