"""Canonical conditions: the sorted, deduplicated conjuncts of a population's predicates.

A condition is simplified under three-valued logic with sqlglot's ``simplify`` (on its logical
skeleton only, every value an opaque placeholder: :func:`_logic`), put in conjunctive normal
form when small, then its OR operands and IN lists are sorted and its number literals written
in their shortest exact form, so that two spellings of one population print one text
(:mod:`sqlsdc.planner.identity`).
"""

from __future__ import annotations

import itertools
from decimal import Context, Decimal, InvalidOperation

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.optimizer.normalize import normalization_distance, normalize
from sqlglot.optimizer.simplify import simplify

from sqlsdc.engines.trees import nodes, of_kind, release
from sqlsdc.planner.canonical_text import _SET_OPERATIONS, DIALECT, _sha, _unwrap
from sqlsdc.planner.connectors import balanced

MAX_CNF_DISTANCE = 64  # larger conditions keep their (simplified) shape rather than blow up
MAX_SIMPLIFY_NODES = 2_000  # larger conditions are not simplified (sqlglot's simplify compares
# the operands of a connector pairwise: quadratic); they keep their shape, a finer identity
_OPAQUE = "\x00value"  # the table of the placeholders simplify sees instead of values
_FLIPPED = {exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT,
            exp.LTE: exp.GTE}  # fmt: skip


def _conjuncts(conditions: list[exp.Expr]) -> list[str]:
    """Sorted, deduplicated canonical conjuncts of the AND of ``conditions`` (fresh trees the
    caller hands over; they are changed)."""
    if not conditions:
        return []
    combined = exp.and_(*conditions, copy=False)
    used = [combined]  # every tree built here: only the texts are kept
    if _size(combined, MAX_SIMPLIFY_NODES + 1) <= MAX_SIMPLIFY_NODES:
        try:
            values: dict[str, exp.Expr] = {}
            simplified = simplify(_logic(combined, values), dialect=DIALECT)
            if normalization_distance(simplified, max_=MAX_CNF_DISTANCE) <= MAX_CNF_DISTANCE:
                simplified = simplify(normalize(simplified), dialect=DIALECT)
            used.append(simplified)
            combined = _with_values(simplified, values)
        except Exception:  # noqa: BLE001 - a simplifier failure keeps the unsimplified shape
            pass
    generator = _ReusingGenerator(dialect=Dialect.get_or_raise(DIALECT))
    parts = list(combined.flatten()) if isinstance(combined, exp.And) else [combined]
    texts = set()
    used += [combined, *parts]
    for part in parts:
        part = _unwrap(part)
        if isinstance(part, exp.Boolean) and part.this:
            continue  # TRUE constrains nothing
        changed: list[exp.Expr] = []
        literals: list[exp.Literal] = []
        canonical = _sort_commutative(part, generator, used, changed, literals)
        canonical = _normalise_literals(canonical, changed, literals)
        generator.forget(changed)
        used.append(canonical)
        texts.add(generator.generate(canonical, copy=False))
        generator.known.clear()
    release(used)
    return sorted(texts)


class _ReusingGenerator(Dialect.get_or_raise(DIALECT).generator_class):
    """DuckDB's generator that reuses the text of the OR operands it printed to sort them
    when it prints the sorted condition: a long OR chain is printed once, not twice.

    ``known`` maps ``id(node)`` to ``(node, text)``; an entry holds its node, so the id is
    not reused while it lives. :meth:`forget` drops the entries of a changed node's
    ancestors, whose text would not be that of the changed tree."""

    def __init__(self, **options):
        super().__init__(**options)
        self.known: dict[int, tuple[exp.Expr, str]] = {}

    def remember(self, node: exp.Expr) -> str:
        """The text of ``node`` (a node with a parent) as :meth:`generate` prints it."""
        text = self.sql(node)
        self.known[id(node)] = (node, text)
        return text.strip()  # what ``generate`` returns; ``sql`` prints nested nodes unstripped

    def forget(self, changed: list[exp.Expr]) -> None:
        for node in changed:
            while node is not None:
                self.known.pop(id(node), None)
                node = node.parent

    def sql(self, expression, key=None, comment=True) -> str:
        if key is None and comment:
            known = self.known.get(id(expression))
            if known is not None and known[0] is expression:
                return known[1]
        return super().sql(expression, key, comment)


def _logic(condition: exp.Expr, values: dict[str, exp.Expr]) -> exp.Expr:
    """The logical skeleton of ``condition`` for sqlglot's ``simplify``: AND, OR, NOT, TRUE,
    FALSE and comparisons (BETWEEN too), with every value and every other predicate replaced
    by an opaque placeholder column, one per distinct canonical text (``values``: placeholder
    name -> the node it stands for).

    simplify then applies only the laws of three-valued logic and of comparisons (absorption,
    De Morgan, ``NOT m < 6`` is ``m >= 6``, CNF). It never sees a value: its folding of
    constants follows Python, not DuckDB (``1.0 / 3 * 3 = 1`` is FALSE to it and TRUE to
    DuckDB; ``DATE '2020-01-31' + INTERVAL 36 HOUR`` loses its hours), so a folded condition
    could name another population. A new tree; ``condition`` is not changed."""

    def placeholder(node: exp.Expr) -> exp.Column:
        text = node.sql(DIALECT)
        name = _sha(text)  # whole: two values must never share a placeholder
        values.setdefault(name, node)
        return exp.column(exp.to_identifier(name, quoted=True),
                          table=exp.to_identifier(_OPAQUE, quoted=True))  # fmt: skip

    def skeleton(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.And, exp.Or)):
            return node.__class__(this=skeleton(node.this), expression=skeleton(node.expression))
        if isinstance(node, (exp.Not, exp.Paren)):
            return node.__class__(this=skeleton(node.this))
        if isinstance(node, exp.Boolean):
            return exp.Boolean(this=node.this)
        if type(node) in _FLIPPED:
            return type(node)(this=placeholder(node.left), expression=placeholder(node.right))
        if type(node) is exp.Between and not node.args.get("symmetric"):
            return exp.Between(this=placeholder(node.this), low=placeholder(node.args["low"]),
                               high=placeholder(node.args["high"]))  # fmt: skip
        return placeholder(node)

    return skeleton(condition)


def _constant(node: exp.Expr) -> bool:
    """No column and no subquery in ``node``."""
    return not any(isinstance(n, (exp.Column, exp.Query, *_SET_OPERATIONS)) for n in node.walk())


def _with_values(skeleton: exp.Expr, values: dict[str, exp.Expr]) -> exp.Expr:
    """``skeleton`` (changed in place) with a copy of its value for every placeholder, and
    every comparison of a constant with another value written with the constant on the right
    (``6 > m`` is ``m < 6``; simplify orders two placeholders as it likes)."""
    walked = nodes(skeleton)
    for column in [n for n in walked if isinstance(n, exp.Column)]:
        value = values[column.name].copy()
        if column is skeleton:
            return value
        column.replace(value)
    for comparison in [n for n in walked if type(n) in _FLIPPED]:
        left, right = comparison.left, comparison.right
        if _constant(left) and not _constant(right):
            flipped = _FLIPPED[type(comparison)](this=right, expression=left)
            if comparison is skeleton:
                return flipped
            comparison.replace(flipped)
    return skeleton


def _size(node: exp.Expr, at_most: int) -> int:
    """The number of nodes of ``node``, counted up to ``at_most`` (a huge condition is not
    walked to the end only to learn that it is too large)."""
    return sum(1 for _ in itertools.islice(node.walk(), at_most))


def _sort_commutative(
    node: exp.Expr,
    generator: _ReusingGenerator,
    replaced: list[exp.Expr],
    changed: list[exp.Expr],
    literals: list[exp.Literal],
) -> exp.Expr:
    """``node`` (changed in place) with OR operands sorted (commutative under three-valued
    logic) and IN lists sorted and deduplicated; the OR chains it replaced are appended to
    ``replaced``, the nested OR chains and IN predicates it changed to ``changed``, and its
    literals to ``literals`` (sorting moves operands and drops repeated ones, and creates no
    literal). The generator remembers the text of every OR operand."""
    walked = nodes(node)  # the OR chains are rebuilt from their operands: the INs stay
    ins = of_kind(walked, exp.In)
    literals += of_kind(walked, exp.Literal)
    for part in of_kind(walked, exp.Or):
        if isinstance(part.parent, exp.Or):
            continue
        texts = {generator.remember(o): o for o in part.flatten()}
        operands = [
            exp.paren(o, copy=False) if isinstance(o, exp.Connector) else o
            for _t, o in sorted(texts.items())
        ]
        joined = balanced(exp.Or, operands)
        replaced.append(part)
        if part is node:
            node = joined
        else:
            part.replace(joined)
            changed.append(joined)  # inside an operand of an OR chain sorted before
    for part in ins:
        values = part.args.get("expressions")
        if values:
            unique = sorted({generator.generate(v, copy=False): v for v in values}.items())
            part.set("expressions", [v for _t, v in unique])
            changed.append(part)
    return node


_NUMERIC = exp.DataType.NUMERIC_TYPES


def _normalise_literals(
    node: exp.Expr,
    changed: list[exp.Expr] | None = None,
    literals: list[exp.Literal] | None = None,
) -> exp.Expr:
    """Number literals compared with a numeric column are written in their shortest exact
    decimal form (``6.0`` and ``6`` are one value there; against a text column they are not,
    so other literals keep their spelling). Literals DuckDB types DOUBLE keep their spelling:
    an exponent, or more than 38 digits with a decimal point (a DECIMAL holds 38), are
    compared after rounding to a double. A literal already in that form and without
    comments is kept, untyped like the new one it stands for (it prints the same); the new
    literals are appended to ``changed``. ``literals``: the literals of ``node``, when the
    caller has them, and maybe some it dropped (whose changes print nowhere)."""
    found = [n for n in nodes(node) if isinstance(n, exp.Literal)] if literals is None else literals
    for literal in found:
        if literal.is_string or not isinstance(literal.parent, exp.Binary):
            continue
        parent = literal.parent
        other = parent.right if parent.left is literal else parent.left
        if not isinstance(parent, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
            continue
        if other.type is None or other.type.this not in _NUMERIC:  # is_type, built-ins
            continue
        text = literal.this
        if "e" in text.lower() or ("." in text and sum(c.isdigit() for c in text) > 38):
            continue  # a DOUBLE to DuckDB (so are more than 38 digits with a point, zeros too:
            # ``x > 1.000...0`` compares x rounded to a double, ``x > 1`` exactly)
        try:
            value = Decimal(text)
        except InvalidOperation:
            continue
        # exact: the default context would round to 28 digits, and 1.00000000000000000000000000001
        # (DECIMAL(30,29) to DuckDB, above 1) would read as 1
        shortest = format(value.normalize(Context(prec=max(len(value.as_tuple().digits), 1))), "f")
        if shortest == text and not literal.comments:
            literal.type = None  # as the new literal would be: a later comparison reads it
            continue
        new = exp.Literal.number(shortest)
        literal.replace(new)
        if changed is not None:
            changed.append(new)
    return node
