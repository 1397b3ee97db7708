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
group keeps its column for sqlglot's passes; the others are taken out (:meth:`detach`) while a
pass runs and get a copy of the first one's column as that pass left it (:meth:`attach`), node
for node what the pass would have made of theirs, types included (shared, as
:func:`~sqlsdc.engines.trees.copy_tree` shares them; the parser's positions are the first
operand's, and nothing reads them). Between the passes every operand has its own column, so
every check of the guard still sees every node.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import copy_tree, nodes

GROUP_FROM = 16  # groups of more operands are resolved once (as chains are balanced from 16)


class RepeatedColumns:
    """The ranges of a tree whose column is resolved as its group's first one's."""

    def __init__(self, tree: exp.Expr):
        self.pairs: list[tuple[exp.Expr, exp.Expr]] = []  # (range, its group's first)
        for node in nodes(tree):
            if isinstance(node, exp.Connector) and type(node.parent) is not type(node):
                self._add_chain(node)

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

    def detach(self) -> None:
        """Take the columns of the grouped ranges but the first of each group out."""
        for between, _first in self.pairs:
            between.args["this"] = None

    def attach(self) -> None:
        """Give every grouped range a copy of its group's first column as it is now."""
        for between, first in self.pairs:
            column = copy_tree(first.this)
            column.parent, column.arg_key, column.index = between, "this", None
            between.args["this"] = column


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
