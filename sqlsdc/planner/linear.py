"""The linear form of a SUM or AVG argument: ``a·x + b`` on the rows a filter keeps.

Protection that is relative to a value's magnitude — the flex function's amplitude
``x_δ = x_1·m(|x_1|)`` and its threshold fp (Geyer, Tent, Reiffert, Giessing, PSD 2022, §2 and
cellKey ``ck_flexparams``; digest ``seed_2022_part1.md`` §6.1(c)), rounding bases, dominance
rules — must not depend on a scale the analyst picks. ``SUM(income * 0.001)`` moves every
contribution below fp, where ``m = p_small`` is constant, so ``x̂ / x`` becomes the same factor
for every value of a cell and a ratio with ``SUM(income * 0 + 1)`` cancels the noise. So every
SUM/AVG argument is reduced here to

    value = scale · core + offset     on the rows where ``conditions`` hold and core is not NULL

with ``scale`` and ``offset`` exact constants (:class:`fractions.Fraction`), ``core`` one column
(or a column times a weight) with no constant factor, and ``conditions`` the single-branch
``CASE WHEN`` / ``IF`` filters. The guard then asks the mechanism for ``SUM(core)`` and
``COUNT(core)`` only and applies ``scale`` and ``offset`` to the protected values
(``a·SUM(x) + b·COUNT(x)``, ``a·AVG(x) + b``); an argument without a core (``1``,
``income * 0``, ``age - age``, ``CASE WHEN c THEN 1 END``) becomes a COUNT. The decomposition is
pure: it reads the tree and builds nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

from sqlglot import exp

from sqlsdc.mechanisms.accountant import parse_exact
from sqlsdc.planner.allowlist import describe

DIALECT = "duckdb"


class NotLinear(Exception):
    """The argument is not of the form a·x + b; ``str()`` says why."""


@dataclass
class LinearForm:
    """``Σ terms[k].coefficient · terms[k].core + offset`` on the rows where ``conditions``
    hold; ``null`` when the value is NULL on every row."""

    terms: dict[str, tuple[exp.Expr, Fraction]] = field(default_factory=dict)
    offset: Fraction = Fraction(0)
    conditions: list[exp.Expr] = field(default_factory=list)
    null: bool = False

    def scaled(self, factor: Fraction) -> LinearForm:
        terms = {k: (core, _in_range(c * factor)) for k, (core, c) in self.terms.items()}
        return LinearForm(terms, _in_range(self.offset * factor), self.conditions, self.null)

    def plus(self, other: LinearForm) -> LinearForm:
        terms = dict(self.terms)
        for key, (core, c) in other.terms.items():
            terms[key] = (core, terms[key][1] + c) if key in terms else (core, c)
        return LinearForm(
            terms,
            self.offset + other.offset,
            self.conditions + other.conditions,
            self.null or other.null,
        )

    @property
    def core(self) -> exp.Expr | None:
        """The one core with a nonzero coefficient, or None (then the value is a constant)."""
        live = [core for core, c in self.terms.values() if c != 0]
        return live[0] if live else None

    @property
    def scale(self) -> Fraction:
        return next((c for _core, c in self.terms.values() if c != 0), Fraction(0))

    @property
    def present(self) -> list[exp.Expr]:
        """Every core the value needs non-NULL, including those whose coefficients cancel."""
        return [core for core, _c in self.terms.values()]


ColumnKind = Callable[[exp.Column], str]  # "value" | "weight"; raises NotLinear otherwise


def linear_form(node: exp.Expr, kind: ColumnKind) -> LinearForm:
    """Decompose ``node``; raise :class:`NotLinear` if it is not affine in one core.

    Allowed: numeric value columns and weights; ``+``, ``-`` and unary minus; multiplication by
    a constant or by a weight (``income * weight``); division by a nonzero constant; numeric
    casts (dropped: the value is the column's); ``CASE WHEN c THEN v END`` and ``IF(c, v)``
    without ELSE (a filter); NULL. Constants are folded exactly from numeric literals.
    """
    form = _decompose(node, kind)
    if len({k for k, (_core, c) in form.terms.items() if c != 0}) > 1:
        raise NotLinear("it adds several columns; write SUM(x) + SUM(y) instead")
    cores = form.terms
    live = form.core
    if live is not None and len(cores) > 1:
        raise NotLinear("columns in it cancel out; remove them")
    if live is None and len(cores) > 1:
        raise NotLinear("it is a constant built from several columns; use COUNT(*)")
    return form


def constant(node: exp.Expr) -> Fraction:
    """The exact value of a constant numeric expression; NotLinear if it is anything else."""
    node = _unwrap(node)
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return exact_number(node.this)
        except ValueError as error:
            raise NotLinear(f"{node.sql(DIALECT)[:40]} is not a number {RANGE_TEXT}") from error
    if isinstance(node, exp.Neg):
        return -constant(node.this)
    if isinstance(node, (exp.Cast, exp.TryCast)) and _keeps_value(node):
        return constant(node.this)
    if isinstance(node, exp.Add):
        return _in_range(constant(node.left) + constant(node.right))
    if isinstance(node, exp.Sub):
        return _in_range(constant(node.left) - constant(node.right))
    if isinstance(node, exp.Mul):
        return _in_range(constant(node.left) * constant(node.right))
    if isinstance(node, exp.Div):
        divisor = constant(node.right)
        if divisor == 0:
            raise NotLinear("it divides by zero")
        return _in_range(constant(node.left) / divisor)
    raise NotLinear(f"the constant {node.sql(DIALECT)[:40]} is not a plain number; write it out")


EXACT_BITS = 2048
"""The most bits of the numerator or denominator of an exact constant: more than DOUBLE's
range and precision need (2^±1074), and few enough that arithmetic on it is instant."""
_LARGEST = Fraction(sys.float_info.max)
RANGE_TEXT = "within the range of DOUBLE (at most about 1.8e308 in magnitude)"


def exact_number(text: str) -> Fraction:
    """The exact value of a numeric literal's text, read by the bounded
    :func:`~sqlsdc.mechanisms.accountant.parse_exact` (``Fraction("1e999999999")`` would
    compute 10^999999999, minutes of CPU and gigabytes while the guard holds the connection:
    red team s29).

    Raises:
        ValueError: not a number, or one outside DOUBLE's range.
    """
    if "/" in text:
        raise ValueError(text[:40])
    text = text.replace(".e", "e").replace(".E", "E").removesuffix(".")  # 5. and 1.e3
    return _in_range(parse_exact(text, "constant"), error=ValueError)


def _in_range(value: Fraction, error: type[Exception] = NotLinear) -> Fraction:
    """``value`` if it is within DOUBLE's range, as the scale and offset applied to protected
    values in the engine must be, and its numerator and denominator have at most
    :data:`EXACT_BITS` bits."""
    bits = max(value.numerator.bit_length(), value.denominator.bit_length())
    if bits > EXACT_BITS or abs(value) > _LARGEST:
        raise error(f"a constant is not {RANGE_TEXT}")
    return value


def _keeps_value(cast: exp.Cast | exp.TryCast) -> bool:
    """A cast that leaves every number as it is (to within DOUBLE precision): to DOUBLE.
    Narrower targets round, truncate or (TRY_CAST) turn large values into NULL, so the sum of
    the cast values is not the sum of the values."""
    return cast.to.is_type(exp.DataType.Type.DOUBLE)


def is_constant(node: exp.Expr) -> bool:
    return not any(isinstance(n, (exp.Column, exp.Subquery, exp.Select)) for n in node.walk())


def _decompose(node: exp.Expr, kind: ColumnKind) -> LinearForm:
    node = _unwrap(node)
    if isinstance(node, exp.Null):
        return LinearForm(null=True)
    if is_constant(node):
        if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(_unwrap(node.this), exp.Null):
            return LinearForm(null=True)
        return LinearForm(offset=constant(node))
    if isinstance(node, exp.Column):
        kind(node)
        return LinearForm({_key(node): (node, Fraction(1))})
    if isinstance(node, exp.Neg):
        return _decompose(node.this, kind).scaled(Fraction(-1))
    if isinstance(node, exp.Add):
        return _decompose(node.left, kind).plus(_decompose(node.right, kind))
    if isinstance(node, exp.Sub):
        right = _decompose(node.right, kind).scaled(Fraction(-1))
        return _decompose(node.left, kind).plus(right)
    if isinstance(node, (exp.Cast, exp.TryCast)) and _keeps_value(node):
        return _decompose(node.this, kind)
    if isinstance(node, (exp.Cast, exp.TryCast)):
        raise NotLinear(
            f"{node.sql(DIALECT)[:60]} can change the values (rounding, or NULL where they do not "
            "fit); cast to DOUBLE"
        )
    if isinstance(node, exp.Mul):
        for factor, other in ((node.left, node.right), (node.right, node.left)):
            if is_constant(factor):
                return _decompose(other, kind).scaled(constant(factor))
        left, right = _decompose(node.left, kind), _decompose(node.right, kind)
        for factor, other in ((left, right), (right, left)):
            weight = _bare_weight(factor, kind)
            if weight is not None:
                return _weighted(other, weight, kind).scaled(factor.scale)
        raise NotLinear("a product of two values that are not a constant or a weight")
    if isinstance(node, exp.Div):
        if is_constant(node.right):
            divisor = constant(node.right)
            if divisor == 0:
                raise NotLinear("it divides by zero")
            return _decompose(node.left, kind).scaled(1 / divisor)
        raise NotLinear("division by a value that is not a constant")
    if isinstance(node, exp.Case):
        ifs, default = node.args.get("ifs") or [], node.args.get("default")
        if node.this is None and len(ifs) == 1 and (default is None or _is_null(default)):
            return _filtered(ifs[0].this, _decompose(ifs[0].args["true"], kind))
        if node.this is not None:
            raise NotLinear(
                f"a simple CASE ({node.this.sql('duckdb')[:40]} WHEN ...) is not read as a "
                "filter; write it as CASE WHEN condition THEN measure END"
            )
        raise NotLinear("CASE with more than one branch or an ELSE pads the cell with other values")
    if isinstance(node, exp.If):
        false = node.args.get("false")
        if false is None or _is_null(false):
            return _filtered(node.this, _decompose(node.args["true"], kind))
        raise NotLinear("IF with an ELSE value pads the cell with other values")
    raise NotLinear(f"{describe(node)} transforms the values")


def _bare_weight(form: LinearForm, kind: ColumnKind) -> exp.Column | None:
    """The weight column of a form that is ``c · weight`` and nothing else."""
    if len(form.terms) != 1 or form.offset != 0 or form.conditions or form.null:
        return None
    ((core, _c),) = form.terms.values()
    return core if isinstance(core, exp.Column) and kind(core) == "weight" else None


def _weighted(form: LinearForm, weight: exp.Column, kind: ColumnKind) -> LinearForm:
    """``weight · form``: each core times the weight, the offset a coefficient of the weight.

    A core that is itself a weight (``weight * weight``) is refused like a longer product: its
    square is no value times a weight, and its statistic, named by its base columns, would be
    the weight's own, so the two sums drew one noise and their ratio in a cell of one person
    was that person's exact weight (red team s37a)."""
    terms = {}
    for key, (core, c) in form.terms.items():
        if any(isinstance(n, exp.Mul) for n in core.walk()) or kind(core) == "weight":
            raise NotLinear("a product of several weights")
        product = exp.Mul(this=_in_double(core), expression=_in_double(weight))
        terms[f"{key}*{_key(weight)}"] = (product, c)
    if form.offset != 0:
        terms[_key(weight)] = (weight, form.offset)
    return LinearForm(terms, Fraction(0), form.conditions, form.null)


def _in_double(column: exp.Expr) -> exp.Expr:
    """A factor of a product, read as DOUBLE when stored as 32-bit FLOAT: the engines multiply
    FLOAT by anything but DOUBLE in 32 bits, which overflow to infinity past 3.4e38, far below
    the magnitudes :mod:`sqlsdc.guard.summable` lets through (red team s29), so the cell
    holding such a product would tell it."""
    if column.type is not None and column.type.this is exp.DataType.Type.FLOAT:
        return exp.cast(column.copy(), "DOUBLE")
    return column.copy()


def _filtered(condition: exp.Expr, form: LinearForm) -> LinearForm:
    return LinearForm(form.terms, form.offset, [condition, *form.conditions], form.null)


def _key(node: exp.Expr) -> str:
    return node.sql(DIALECT)


def _is_null(node: exp.Expr) -> bool:
    return isinstance(_unwrap(node), exp.Null)


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node
