"""One column resolved once for a long chain of comparisons of it (ISSUE18 must-have 6).

``age BETWEEN 0 AND 9 OR age BETWEEN 20 AND 29 OR ...`` names one column once per operand, and
sqlglot resolves every one of them alike: ``qualify`` finds its table and ``annotate_types``
its type, each walking the scope and looking the name up in the schema, which is most of their
time on such a chain (a 100 KB OR of ranges: 3,500 columns). Every operand of a chain is in the
same scope as the others (AND and OR are no scope boundaries), so the same name written the
same way resolves the same way in each: to the table, name and type of the first operand's
column, or to the same expansion of an output alias.

:class:`RepeatedColumns` finds, in every AND/OR chain of more than :data:`GROUP_FROM`
operands, the ranges (``BETWEEN``) of a plain column written alike (same name, same qualifier,
same quoting, no comments): a range is a BOOLEAN whatever its column (other comparisons are
typed from their operands, so they are not grouped). The first of each
group keeps its column for sqlglot's passes; the others are taken out (:meth:`detach`, before
``qualify``) and get a copy of the first one's column as both passes left it (:meth:`attach`,
after ``annotate_types``), node for node what the passes would have made of theirs, types
included (shared, as :func:`~sqlsdc.engines.trees.copy_tree` shares them; the parser's
positions are the first operand's, and nothing reads them). The checks that run between the
two passes (names reserved or left unqualified, the allowlist of node classes) read the first
one's column, of which the copies are node for node the same, in the same chain; every check
of the analysis, after the passes, sees every operand's own column. (Putting the columns back
after ``qualify`` and taking them out again for ``annotate_types`` would copy every column
once more: 25 ms on a 100 KB chain of ranges.)

Likewise the values of a long IN list of literals (what chains of equalities become at parse,
:mod:`sqlsdc.planner.connectors`): neither pass has anything to resolve in a literal, and
``annotate_types`` gives each the type of its spelling alone (a string VARCHAR, an integer INT,
another number DOUBLE; :func:`_literal_type`). All but the first are taken out while a pass runs
and put back after it, typed so after type inference; so are the literal bounds of the
grouped ranges but the first (a range's type does not depend on its bounds, and a literal's
on nothing else).

Neither is done inside a projection of any SELECT (:func:`_in_projection`): ``qualify``
copies a projection where an output alias or position names it (``WHERE young``, ``GROUP BY
1``), and a copy made while the values are set aside keeps a range with no column or an IN
list of its first value alone: ``SELECT age IN (0, ..., 19) AS young ... WHERE young``
counted ``age IN (0)``.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree, nodes, of_kind
from sqlsdc.errors import InternalError

GROUP_FROM = 16  # groups of more operands are resolved once (as chains are balanced from 16)
T = exp.DType


class RepeatedColumns:
    """The ranges of a tree whose column is resolved as its group's first one's."""

    def __init__(self, tree: exp.Expr, walked: list[exp.Expr] | None = None):
        """``walked``: ``nodes(tree)``, when the caller has it."""
        self.pairs: list[tuple[exp.Expr, exp.Expr]] = []  # (range, its group's first)
        self.lists: list[tuple[exp.In, list[exp.Literal]]] = []  # (IN, its values)
        self.bounds: list[tuple[exp.Expr, str, exp.Literal]] = []  # (range, key, literal)
        self._taken: list[exp.Expr] = []  # the columns taken out, replaced when put back
        walked = nodes(tree) if walked is None else walked
        for node in of_kind(walked, exp.Connector):
            if type(node.parent) is not type(node) and not _in_projection(node):
                self._add_chain(node)
        for node in of_kind(walked, exp.In):  # no connector is an IN: each list in walk order
            if type(node) is exp.In:
                values = node.args.get("expressions") or []
                if (
                    len(values) > GROUP_FROM
                    and all(type(v) is exp.Literal for v in values)
                    and not _in_projection(node)
                ):
                    self.lists.append((node, values))

    def _add_chain(self, chain: exp.Connector) -> None:
        operands = list(chain.flatten(unnest=False))
        if len(operands) <= GROUP_FROM:
            return
        groups: dict[tuple, list[exp.Expr]] = {}
        for operand in operands:
            key = _written(operand)
            if key is not None:
                groups.setdefault(key, []).append(operand)
        for members in groups.values():
            if len(members) > GROUP_FROM:
                self.pairs += [(member, members[0]) for member in members[1:]]
                self.bounds += [
                    (member, key, bound)
                    for member in members[1:]
                    for key in ("low", "high")
                    if type(bound := member.args.get(key)) is exp.Literal
                ]

    def detach(self) -> None:
        """Take the columns of the grouped ranges but the first of each group out, and the
        values of the IN lists but the first."""
        for between, _first in self.pairs:
            self._taken.append(between.args["this"])
            between.args["this"] = None
        for between, key, _bound in self.bounds:
            between.args[key] = None
        for listed, values in self.lists:
            listed.args["expressions"] = values[:1]

    def attach(self) -> None:
        """Give every grouped range a copy of its group's first column as it is now, and
        every IN list its values back, typed as type inference types them."""
        for between, first in self.pairs:
            column = copy_tree(first.this)
            column.parent, column.arg_key, column.index = between, "this", None
            between.args["this"] = column
        # the columns taken out are read by nothing any more: taken apart, so that reference
        # counting frees them, not the cycle collector (a column and its identifiers are a
        # cycle: 10,000s of objects after a long chain of ranges); a grouped column has only
        # identifiers below it (``_written``), so dropping its arguments breaks every cycle
        for column in self._taken:
            column.args.clear()
        self._taken.clear()
        types: dict[object, exp.DataType] = {}
        for between, key, bound in self.bounds:
            if between.args.get(key) is not None or bound.parent is not between:
                raise InternalError("a range changed while its bounds were set aside")
            between.args[key] = bound
            _type_literal(bound, types)
        for listed, values in self.lists:
            kept = listed.args.get("expressions") or []
            if len(kept) != 1 or kept[0] is not values[0] or values[0].parent is not listed:
                raise InternalError("an IN list changed while its values were set aside")
            listed.args["expressions"] = values
            for value in values[1:]:
                _type_literal(value, types)


def _in_projection(node: exp.Expr) -> bool:
    """Whether ``node`` is inside an output expression of a SELECT, at any depth (a
    subquery in a projection is copied with it)."""
    while node.parent is not None:
        if node.arg_key == "expressions" and isinstance(node.parent, exp.Select):
            return True
        node = node.parent
    return False


def _written(operand: exp.Expr) -> tuple | None:
    """How the column of a range of a plain column is written, or None for any other operand
    (the bounds of a range stay where they are)."""
    if type(operand) is not exp.Between:
        return None
    column = operand.this
    if type(column) is not exp.Column or column.comments:
        return None
    parts = []
    for key, value in column.args.items():
        if value is None:
            continue
        if key not in ("this", "table") or type(value) is not exp.Identifier or value.comments:
            return None
        if any(v is not None for k, v in value.args.items() if k not in ("this", "quoted")):
            return None
        parts.append((key, value.this, bool(value.args.get("quoted"))))
    return tuple(sorted(parts))


def _type_literal(literal: exp.Literal, types: dict[object, exp.DataType]) -> None:
    """Type ``literal`` as ``annotate_types`` does (type and meta). ``types``: the types given
    so far, by spelling and by kind, one object per kind shared by the literals of one check
    as copies of a tree share their originals' (:func:`~sqlsdc.engines.trees.copy_tree`:
    nothing changes a type in place), instead of one new type object per value."""
    spelled = (literal.is_string, literal.this)
    shared = types.get(spelled)
    if shared is None:
        kind = _literal_type(literal)
        shared = types.get(kind)
        if shared is None:
            shared = types[kind] = kind.into_expr()
        types[spelled] = shared
    literal._type = shared
    literal.meta["nonnull"] = True


def _literal_type(literal: exp.Literal) -> exp.DType:
    """The type sqlglot's ``annotate_types`` gives a literal (its rule for DuckDB too): a
    string VARCHAR, a number INT when ``is_int`` (``int()`` reads its text, as sqlglot's
    ``to_py`` tries first; written out, without the properties' calls), else DOUBLE."""
    if literal.args.get("is_string"):
        return T.VARCHAR
    try:
        int(literal.this)
    except ValueError:
        return T.DOUBLE
    return T.INT
