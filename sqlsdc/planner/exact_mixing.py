"""Whether comparing or mixing exact numbers of different types can fail in DuckDB.

DuckDB compares ``a = b``, ``a IN (b, c)``, ``a BETWEEN b AND c`` and chooses among
``CASE``/``COALESCE``/``GREATEST``/``LEAST``/``NULLIF`` values by casting every exact number to
one common type: the wider integer type, or a DECIMAL with as many integer digits and as many
decimals as the widest operand has. A DECIMAL holds at most 38 digits, so when the operands
need more the common type is too narrow, and the cast fails for the stored values that do not
fit: ``hugeint_col > 0.5`` (DECIMAL(38,1)) fails for a value beyond 10^37, ``dec38_col = 1.5``
for a DECIMAL(38,0) beyond 10^37, ``uhugeint_col = bigint_col`` for an UHUGEINT beyond 2^127
(no signed type holds it). Whether the query fails would tell whether a row of the cells holds
such a value: an error oracle (found by the sweep of ``tests/security/test_error_oracle_sweep.py``).

This module computes each operand's *shape* (integer digits, decimals, sign) from the types of
DuckDB 2.0 and refuses a mix that needs more than 38 digits, or an UHUGEINT with a signed value.
A float among the operands makes the common type DOUBLE, which holds every exact number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

from sqlglot import exp

T = exp.DataType.Type
MAX_DECIMAL_DIGITS = 38

_INTEGER_DIGITS = {
    T.TINYINT: 3,
    T.SMALLINT: 5,
    T.INT: 10,
    T.BIGINT: 19,
    T.INT128: 39,
    T.UTINYINT: 3,
    T.USMALLINT: 5,
    T.UINT: 10,
    T.UBIGINT: 20,
    T.UINT128: 39,
}
_UNSIGNED = {T.UTINYINT, T.USMALLINT, T.UINT, T.UBIGINT, T.UINT128}
_CHOICES = (exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif)


@dataclass(frozen=True)
class Shape:
    """What an exact number needs: integer digits, decimals, and which kinds of sign."""

    digits: int
    scale: int = 0
    decimal: bool = False  # a DECIMAL type or literal (not an integer type)
    signed: bool = False  # may be negative, or is of a signed type
    unsigned128: bool = False  # an UHUGEINT: no signed type holds its values
    wide_literal: bool = False  # an integer literal of over 38 digits (HUGEINT, UHUGEINT, BIGNUM)

    def join(self, other: Shape) -> Shape:
        return Shape(
            max(self.digits, other.digits),
            max(self.scale, other.scale),
            self.decimal or other.decimal,
            self.signed or other.signed,
            self.unsigned128 or other.unsigned128,
            self.wide_literal or other.wide_literal,
        )


_INTEGER_SHAPES = {  # shapes are values (frozen): one per integer type
    kind: Shape(digits, signed=kind not in _UNSIGNED, unsigned128=kind is T.UINT128)
    for kind, digits in _INTEGER_DIGITS.items()
}
_BIGINT = Shape(19, signed=True)  # DuckDB's type of YEAR(), LENGTH(), EXTRACT(...)
ENGINE_TYPED = "sqlsdc_engine_typed"  # meta of a constant whose type the engine gave
DERIVED = "sqlsdc_derived"  # meta of a derived table's column: (family, shape) of its value


def _type_shape(dtype: exp.DataType | None) -> Shape | None:
    if dtype is None:
        return None
    if dtype.this in _INTEGER_SHAPES:
        return _INTEGER_SHAPES[dtype.this]
    if dtype.this is T.DECIMAL:
        params = [p.this for p in dtype.expressions if isinstance(p, exp.DataTypeParam)]
        values = [int(p.this) for p in params if isinstance(p, exp.Literal)]
        precision, scale = {0: (18, 3), 1: (*values, 0)}.get(len(values), values[:2])
        return Shape(max(precision - scale, 0), scale, decimal=True, signed=True)
    return None


@lru_cache(maxsize=4096)
def _number_shape(text: str, negative: bool) -> Shape | None:
    """The shape of a number literal written ``text`` (``-text`` when ``negative``), as
    DuckDB reads it: a function of the spelling alone, so shared by every literal spelled
    alike (a long chain of ranges has thousands)."""
    whole, _, fraction = text.lstrip("+").partition(".")
    digits = len(whole.lstrip("0")) or 1
    found = Shape(digits, len(fraction), decimal=bool(fraction), signed=negative)
    if found.digits + found.scale <= MAX_DECIMAL_DIGITS:
        return found
    # beyond 38 digits DuckDB reads a number with a point as a DOUBLE, an integer as a
    # HUGEINT, UHUGEINT or BIGNUM, which it casts to the other operands' type row by row
    return None if found.decimal else replace(found, wide_literal=True)


def shape(node: exp.Expr, family: Callable[[exp.Expr], str | None]) -> Shape | None:
    """The shape of an exact number, or None for a value of another family (``family`` is
    :func:`sqlsdc.planner.totality.family`); a choice among values (CASE, COALESCE...) has the
    shape of their common type, None when one of them is a float."""
    if type(node) is exp.Column:  # the commonest operand, decided as below
        if family(node) not in ("integer", "decimal"):
            return None
        meta = node.meta
        if DERIVED in meta:
            return meta[DERIVED][1] or _UNKNOWN_CONSTANT
        if not (meta.get(ENGINE_TYPED) and _type_shape(node.type) is not None):
            return _type_shape(node.type) or _BIGINT  # a column is no constant
    elif type(node) is exp.Literal:  # the other commonest operand, decided as below
        if family(node) not in ("integer", "decimal"):
            return None
        if not node.is_string and not (
            node.meta.get(ENGINE_TYPED) and _type_shape(node.type) is not None
        ):
            return _number_shape(str(node.this), False)
    node = node.unnest()
    if isinstance(node, exp.Select):  # a scalar subquery (``unnest`` gives its SELECT)
        values = [e.unalias() for e in node.expressions]
        return shape(values[0], family) if len(values) == 1 else None
    if family(node) not in ("integer", "decimal"):
        return None
    if isinstance(node, exp.Column) and DERIVED in node.meta:
        return node.meta[DERIVED][1] or _UNKNOWN_CONSTANT  # its value's (total_checks)
    if node.meta.get(ENGINE_TYPED) and _type_shape(node.type) is not None:
        return _type_shape(node.type)  # a constant, as the engine typed it
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this.unnest()
    if isinstance(node, exp.Literal) and not node.is_string:
        return _number_shape(str(node.this), negative)
    if isinstance(node, _CHOICES):
        values = [v for v in _choice_values(node) if family(v) != "null"]
        shapes = [shape(v, family) for v in values]
        if not shapes or None in shapes:
            return None
        joined = shapes[0]
        for s in shapes[1:]:
            joined = joined.join(s)
        return joined
    if isinstance(node, (exp.IntDiv, exp.Mod)):
        return shape(node.this, family)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        return _arithmetic_shape(node, family)  # exact arithmetic reads no column (totality)
    if not isinstance(node, (exp.Cast, exp.TryCast)) and not node.find(*_NOT_CONSTANT):
        return _UNKNOWN_CONSTANT
    dtype = node.to if isinstance(node, (exp.Cast, exp.TryCast)) else node.type
    found = _type_shape(dtype) or _BIGINT
    return found.join(Shape(0, signed=True)) if negative else found


def _arithmetic_shape(node: exp.Add | exp.Sub | exp.Mul, family) -> Shape:
    """At least the shape DuckDB gives a sum, difference or product of exact constants: a
    sum needs one more digit than its widest term, a product the digits and decimals of both
    factors (DuckDB 2.0 types ``1.000 * 1`` DECIMAL(38, 3))."""
    left, right = shape(node.left, family), shape(node.right, family)
    if left is None or right is None:
        return _UNKNOWN_CONSTANT
    joined = left.join(right)
    if isinstance(node, exp.Mul):
        return replace(joined, digits=left.digits + right.digits, scale=left.scale + right.scale)
    return replace(joined, digits=joined.digits + 1, signed=True)


_NOT_CONSTANT = (exp.Column, exp.AggFunc, exp.Window, exp.Subquery, exp.Select)

# An exact constant whose type sqlglot does not know and the engine did not give (inside a
# subquery, which its own scope evaluates): as wide as a DECIMAL gets, so mixing it with any
# other exact number is refused rather than guessed.
_UNKNOWN_CONSTANT = Shape(MAX_DECIMAL_DIGITS, MAX_DECIMAL_DIGITS, decimal=True, signed=True)


def _choice_values(node: exp.Expr) -> list[exp.Expr]:
    if isinstance(node, exp.Case):
        values = [i.args.get("true") for i in node.args.get("ifs", [])]
        return [v for v in [*values, node.args.get("default")] if v is not None]
    if isinstance(node, exp.If):
        return [v for v in (node.args.get("true"), node.args.get("false")) if v is not None]
    return [node.this, *node.expressions] if not isinstance(node, exp.Nullif) else [node.this]


def mixing_problem(shapes: list[Shape]) -> str | None:
    """Why casting exact numbers of these shapes to one common type can fail, or None."""
    wide = unsigned128 = signed = decimal = False
    for s in shapes:  # one pass for the flags; shapes all alike are checked only on a problem
        wide = wide or s.wide_literal
        unsigned128 = unsigned128 or s.unsigned128
        signed = signed or s.signed
        decimal = decimal or s.decimal
    if wide:
        problem = (
            "an integer literal of more than 38 digits is a HUGEINT, UHUGEINT or BIGNUM, which "
            "does not convert to every other exact type"
        )
    elif unsigned128 and signed:
        problem = "no common type holds both UHUGEINT and signed values"
    elif (
        decimal
        and (needed := max(s.digits for s in shapes) + max(s.scale for s in shapes))
        > MAX_DECIMAL_DIGITS
    ):
        problem = (
            f"their common DECIMAL type would need {needed} digits (at most "
            f"{MAX_DECIMAL_DIGITS}), so large values cannot be cast to it"
        )
    else:
        return None
    return problem if len(set(shapes)) > 1 else None  # one shape: nothing is cast


def mixing(
    values: list[exp.Expr],
    family: Callable[[exp.Expr], str | None],
    families: list[str | None] | None = None,
) -> str | None:
    """Why comparing or choosing among ``values`` can fail when DuckDB casts their exact
    numbers to one common type, or None (no exact numbers, or a float among them: DOUBLE).
    ``families``: ``[family(v) for v in values]``, when the caller has them."""
    if families is None:
        families = [family(v) for v in values]
    if "float" in families:
        return None
    shapes = []
    for value, found in zip(values, families, strict=True):
        if found == "integer" or found == "decimal":
            value_shape = shape(value, family)
            if value_shape is None:  # a choice with a float inside: DOUBLE
                return None
            shapes.append(value_shape)
    return mixing_problem(shapes)
