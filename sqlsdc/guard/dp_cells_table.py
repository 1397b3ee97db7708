"""Noisy cells as the Arrow table a stage's relation is registered as: the keys in the engine's
types, each aggregate's released value (post-processed from its statistics: AVG, VAR, STDDEV,
quantiles), whether it is published (the minimum frequency), the noise's sd and 95%
half-width, and the shares of input the bounding dropped and clamped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from sqlsdc.engines.duckdb import mark_wide_integers
from sqlsdc.mechanisms.accountant import Aggregate, ratio_sd
from sqlsdc.mechanisms.dp_cells import (
    average,
    stddev,
    variance,
)
from sqlsdc.rewrite.dp import DpStage

if TYPE_CHECKING:
    pass


WIDE_INTEGER = pa.decimal128(38, 0)
"""The type of a DP SUM over an integral grid, as DuckDB's SUM of integers (HUGEINT; Spark:
DECIMAL(38, 0)): its exact value may pass 2^63 (bounds to 1e15 over 10^4 rows), and its noise
too; the rewrite refuses a calibration whose noise could pass 10^38
(:data:`sqlsdc.rewrite.dp_aggregates.NOISE_MARGIN`)."""
Z95 = 1.959963984540054  # two-sided 95% normal quantile (delta-method intervals of averages)


def _cells_table(frame, noisy, stage: DpStage, noise: bool, key_types: list) -> pa.Table:
    """``__g<j>`` keys (of the engine's types, ``key_types``), then per aggregate ``__a<i>``
    value, ``__p<i>`` published, and the noise's ``__sd<i>`` and ``__hw<i>`` (95% half-width)."""
    n = len(frame)
    columns = {f"__g{j}": _keys(frame[f"__g{j}"], key_types[j])
               for j in range(len(stage.keys))}  # fmt: skip
    withheld = None  # cells below the minimum frequency (without one, none)
    if stage.min_frequency is not None:
        withheld = np.array([v < stage.min_frequency for v in noisy[stage.units]], bool)
    published = pa.array([True] * n if withheld is None else ~withheld, pa.bool_())
    stats = {s.column: s for s in stage.statistics}
    dropped, clamped = _shares(stage, noisy, n)
    wide = set()  # SUMs of integers: exact integers of up to 38 digits, HUGEINT in DuckDB
    for i, output in enumerate(stage.outputs):
        parts = [noisy[c] for c in output.statistics]
        value, sd, half = _output(output, parts, [stats[c] for c in output.statistics], noise)
        if output.aggregate is Aggregate.SUM and output.plan.components[0].unit.denominator == 1:
            wide.add(f"__a{i}")
        kind = WIDE_INTEGER if f"__a{i}" in wide else None
        columns[f"__a{i}"] = pa.array(value, type=kind, mask=withheld)
        columns[f"__p{i}"] = published
        columns[f"__sd{i}"] = pa.array(sd, type=pa.float64())
        columns[f"__hw{i}"] = pa.array(half, type=pa.float64())
        columns[f"__dr{i}"] = dropped
        counted = output.aggregate in (Aggregate.COUNT, Aggregate.COUNT_DISTINCT)
        columns[f"__cl{i}"] = pa.array([0.0] * n) if counted and stage.report else clamped
    if not columns:
        return pa.table({"__none": [None] * n})
    return mark_wide_integers(pa.table(columns), wide)


def _shares(stage: DpStage, noisy: dict, n: int) -> tuple[pa.Array, pa.Array]:
    """Per cell, the shares of its input the bounding dropped and clamped, from the noisy
    bounding report (post-processing: D/(D + C + K) and C/(D + C + K), each clipped to [0, 1];
    NULL where the noisy total is not positive; D = 0 where nothing can be dropped). 0 where
    nothing can be dropped nor clamped (``stage.shares_zero``, no report drawn); NULL without
    a report."""
    if stage.shares_zero:
        zeros = pa.array(np.zeros(n))
        return zeros, zeros
    if stage.report is None:
        empty = pa.nulls(n, pa.float64())
        return empty, empty
    d, c, k = (np.array([float(v) for v in noisy[name]]) if name else np.zeros(n)
               for name in stage.report)  # fmt: skip
    total = d + c + k
    shown = total > 0
    safe = np.where(shown, total, 1.0)
    return tuple(pa.array(np.clip(x / safe, 0.0, 1.0), mask=~shown) for x in (d, c))


def _keys(values: list, engine_type: pa.DataType) -> pa.Array:
    """Group keys with the type the engine gave the column (a month stays INTEGER); keys of a
    declared domain that do not fit that type keep the type Arrow infers for them."""
    try:
        return pa.array(values, type=engine_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return pa.array(values)


def _output(output, parts, stats, noise: bool):
    """Released values of one aggregate with their noise sd and 95% half-width per cell."""
    n = len(parts[0])
    plan = output.plan
    lower, upper = plan.components[0].bounding.lower, plan.components[0].bounding.upper
    zeros = [0.0] * n if not noise else None
    if output.aggregate in (Aggregate.COUNT, Aggregate.COUNT_DISTINCT, Aggregate.SUM):
        values = parts[0]
        integral = stats[0].calibration.unit.denominator == 1
        value = [int(v) for v in values] if integral else [float(v) for v in values]
        return value, zeros or [plan.sd] * n, zeros or [plan.half_width] * n
    if output.aggregate is Aggregate.AVG:  # statistics of (measure - centre): see rewrite.dp
        total = np.array([float(v) for v in parts[0]])
        count = np.array([float(v) for v in parts[1]])
        shifted = average(total, count, lower, upper)
        value = shifted + float(output.centre)
        if not noise:
            return value.tolist(), zeros, zeros
        s_sd, c_sd = (c.sd for c in plan.components)
        sd = [ratio_sd(s_sd, c_sd, c, m) for c, m in zip(count, shifted, strict=True)]
        return value.tolist(), sd, [Z95 * x for x in sd]
    if output.aggregate in (Aggregate.VAR, Aggregate.STDDEV):
        squares, total, count = (np.array([float(v) for v in p]) for p in parts)
        f = variance if output.aggregate is Aggregate.VAR else stddev
        value = f(squares, total, count, lower, upper, ddof=output.ddof)
        return value.tolist(), [None] * n, [None] * n
    return [float(v) for v in parts[0]], [None] * n, [None] * n  # QUANTILE
