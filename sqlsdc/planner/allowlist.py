"""What SQL the guard lets through: a fail-closed allowlist of node types and functions.

Anything not listed here is refused, whatever it is: new sqlglot node types, unknown functions
(which sqlglot parses as ``Anonymous``), table functions, file paths, settings, metadata.
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.written import written_name

STRUCTURE = (
    exp.Select,
    exp.From,
    exp.Join,
    exp.Where,
    exp.Group,
    exp.Having,
    exp.Order,
    exp.Ordered,
    exp.Limit,
    exp.Offset,
    exp.Subquery,
    exp.With,
    exp.CTE,
    exp.TableAlias,
    exp.Table,
    exp.Column,
    exp.Identifier,
    exp.Alias,
    exp.Star,
    exp.Paren,
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Tuple,
    exp.Distinct,
    exp.Union,
    exp.Intersect,
    exp.Except,
    exp.Cube,
    exp.Rollup,
    exp.GroupingSets,
    exp.Window,
    exp.WindowSpec,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,
    exp.Interval,
    exp.Exists,
)

OPERATORS = (
    exp.And,
    exp.Or,
    exp.Not,
    exp.Neg,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Like,
    exp.ILike,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
    exp.DPipe,
)

SCALAR_FUNCTIONS = (
    exp.Case,
    exp.If,
    exp.Coalesce,
    exp.Nullif,
    exp.Greatest,
    exp.Least,
    exp.Cast,
    exp.TryCast,
    exp.Abs,
    exp.Round,
    exp.Floor,
    exp.Ceil,
    exp.Sign,
    exp.Sqrt,
    exp.Ln,
    exp.Log,
    exp.Exp,
    exp.Pow,
    exp.Lower,
    exp.Upper,
    exp.Length,
    exp.Trim,
    exp.Substring,
    exp.Concat,
    exp.StartsWith,
    exp.Extract,
    exp.DateTrunc,
    exp.TimestampTrunc,
    exp.TimeToStr,
    exp.Year,
    exp.Month,
    exp.Quarter,
    exp.Grouping,
)

# Aggregates over confidential rows: each has a protection mechanism.
PROTECTED_AGGREGATES = (exp.Count, exp.Sum, exp.Avg)

# Aggregates over confidential rows that only differential privacy protects (bounded measures).
DP_AGGREGATES = (
    exp.Stddev,
    exp.StddevSamp,
    exp.StddevPop,
    exp.Variance,
    exp.VariancePop,
    exp.Median,
    exp.Quantile,
    exp.PercentileCont,
    exp.PercentileDisc,
)

# Aggregates and window functions allowed only over public or already protected values (the
# DP aggregates too, except over confidential rows of a table whose magnitudes use DP).
UNPROTECTED_AGGREGATES = (
    exp.Min,
    exp.Max,
    *DP_AGGREGATES,
    exp.RowNumber,
    exp.Rank,
    exp.DenseRank,
    exp.Lag,
    exp.Lead,
    exp.FirstValue,
    exp.LastValue,
)

ALLOWED = STRUCTURE + OPERATORS + SCALAR_FUNCTIONS + PROTECTED_AGGREGATES + UNPROTECTED_AGGREGATES

RESERVED_PREFIX = "__"


def describe(node: exp.Expr) -> str:
    """A user-facing name for a node: the SQL keyword or function name (a function's as the
    statement wrote it, :mod:`sqlsdc.written`)."""
    if isinstance(node, exp.Anonymous):
        return f"function {node.name}()"
    if (written := written_name(node)) is not None:
        return f"function {written}()"
    if isinstance(node, exp.Func):
        called = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\(", node.sql("duckdb"))
        return f"function {(called.group(1) if called else node.sql_name()).lower()}()"
    return type(node).__name__.upper()
