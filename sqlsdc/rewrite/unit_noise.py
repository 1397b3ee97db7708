"""A unit's permanent noise factor in SQL (:mod:`sqlsdc.mechanisms.unit_noise`): the cell key
method's rows multiply each contribution by it before anything is aggregated.

The factor is a function of the unit's record key and the secret mix (``sqlsdc.ckm_mix``
joined as ``__mix``, :func:`sqlsdc.rewrite.ckm_mix.join_mix`), computed with the same IEEE
operations as :func:`sqlsdc.mechanisms.unit_noise.factor` (SQRT is correctly rounded on every
engine), so DuckDB, Spark and the Python reference give the same bits.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.mechanisms.ckm import MIX_PRIME
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.mechanisms.unit_noise import salt_name
from sqlsdc.rewrite.ckm_mix import keyed_mix_sql
from sqlsdc.rewrite.sql import cast, mul_expr, number


def unit_factor_sql(record_key: exp.Expr, measure: str, noise: UnitNoise) -> exp.Expr:
    """m = 1 + s·((b − 1) − (b − a)·SQRT(1 − ABS(2u − 1))), u = (y + ½)/p, s = −1 when
    y < (p − 1)/2 (u < ½) else 1: the split triangular's inverse distribution function at the
    unit's uniform (:func:`sqlsdc.mechanisms.unit_noise.factor`)."""
    y = keyed_mix_sql(record_key, salt_name(measure))
    u = exp.Div(
        this=exp.Paren(this=exp.Add(this=cast(y, "DOUBLE"), expression=number(0.5))),
        expression=number(MIX_PRIME),
    )
    t = exp.Sub(this=mul_expr(number(2), u), expression=number(1))
    root = exp.Sqrt(this=exp.Sub(this=number(1), expression=exp.Abs(this=t)))
    spread = exp.Sub(this=number(noise.b - 1), expression=mul_expr(number(noise.b - noise.a), root))
    below = exp.LT(this=y.copy(), expression=number((MIX_PRIME - 1) // 2))
    sign = exp.Case(ifs=[exp.If(this=below, true=number(-1))], default=number(1))
    return exp.Paren(this=exp.Add(this=number(1), expression=mul_expr(sign, spread)))


def noised(
    value: exp.Expr, record_key: exp.Expr, measures: tuple[str, ...], noise: UnitNoise
) -> exp.Expr:
    """``value`` times the factor of its unit for each column of ``measures`` (``table.column``):
    the contribution every CKM magnitude adds up. A product of a measure and a weight
    (``income * weight``) is x·m_x·w·m_w, the product of the two noised columns: one factor per
    column, never one per product, which would be a second, independent factor on x (red team
    s45l: ``SUM(income * weight) / SUM(weight)`` averaged with ``SUM(income)``)."""
    if not measures:
        raise ValueError("a unit-noised value needs the columns it is a function of")
    result = cast(value, "DOUBLE")
    for measure in measures:
        result = mul_expr(result, unit_factor_sql(record_key.copy(), measure, noise))
    return result
