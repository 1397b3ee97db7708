"""Balanced AND/OR trees, so that no pass needs one stack frame per operand of a long chain.

``a OR b OR c OR d`` parses as ``((a OR b) OR c) OR d``: n operands nest n deep, and every
recursive pass (ours, sqlglot's generator, copier and simplifier) would need n stack frames.
AND and OR are associative under SQL's three-valued logic, so a chain can be rebuilt as a tree
of depth log2(n) over the same operands in the same order. Operands are nested only in
connectors of their own kind, so the SQL generated from the tree says the same without
parentheses.

In a long chain, the equalities of one column with literals of one kind become one IN list
(``x = 1 OR x = 2 OR ...`` is ``x IN (1, 2, ...)``, ``x <> 1 AND x <> 2 AND ...`` is
``NOT x IN (1, 2, ...)``): SQL defines IN by those comparisons, and an IN list of literals is a
few leaves where the chain is a subtree per operand for every later pass to walk. BI tools send
multi-value filters written either way.

Example:
    >>> import sqlglot
    >>> chain = " OR ".join(f"x > {i}" for i in range(100))
    >>> balanced = balance_connectors(sqlglot.parse_one(chain))
    >>> balanced.sql() == chain, depth(balanced) < 12
    (True, True)
    >>> balance_connectors(sqlglot.parse_one(" OR ".join(f"x = {i}" for i in range(20)))).sql()
    'x IN (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19)'
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.engines.trees import nodes, release

BALANCE_FROM = 16  # chains with more operands are rebuilt; shorter ones keep the parser's shape
_DIGITS = re.compile(r"[0-9]+")
_BIGINT_LIMIT = 2**63  # integer literals beyond BIGINT would widen a whole list to another type


def balance_connectors(tree: exp.Expr) -> exp.Expr:
    """``tree`` with every AND and OR chain of more than :data:`BALANCE_FROM` operands
    balanced (mutates ``tree``; returns the new root when the root itself is a chain)."""
    chains = [
        node
        for node in nodes(tree)
        if isinstance(node, exp.Connector) and type(node.parent) is not type(node)
    ]
    for chain in chains:
        operands = list(chain.flatten(unnest=False))
        if len(operands) > BALANCE_FROM:
            joined = balanced(type(chain), fold_comparisons(type(chain), operands))
            if chain is not tree:
                chain.replace(joined)
            _detach(chain)
            if chain is tree:
                return joined
    return tree


def fold_comparisons(kind: type[exp.Connector], operands: list[exp.Expr]) -> list[exp.Expr]:
    """``operands`` of an OR (AND) chain with every group of more than :data:`BALANCE_FROM`
    ``column = literal`` (``column <> literal``) on one column with literals of one kind
    replaced, where its first member stood, by ``column IN (literals)`` (``NOT column IN``).

    Literals are strings, or integers within BIGINT, so that the list has the type each
    comparison has and DuckDB compares every value as the comparison did (a list mixing kinds
    or widths is typed as a whole). The chain's other operands keep their order.
    """
    comparison = exp.EQ if kind is exp.Or else exp.NEQ
    groups: dict[tuple, list[tuple[exp.Expr, exp.Expr]]] = {}
    keys = []
    for operand in operands:
        key = _foldable(operand, comparison)
        keys.append(key)
        if key is not None:
            groups.setdefault(key, []).append(_column_and_literal(operand))
    lists = {k: members for k, members in groups.items() if len(members) > BALANCE_FROM}
    folded = []
    for operand, key in zip(operands, keys, strict=True):
        if key not in lists:
            folded.append(operand)
        elif lists[key] is not None:  # the group's first member: the list takes its place
            folded.append(_in_list(lists[key], negated=kind is exp.And))
            lists[key] = None
    return folded


def _foldable(operand: exp.Expr, comparison: type[exp.Binary]) -> tuple | None:
    """The group of ``column <comparison> literal`` (either side): the column's parts and the
    literal's kind; None for any other operand."""
    if type(operand) is not comparison or operand.comments:
        return None
    pair = _column_and_literal(operand)
    if pair is None:
        return None
    column, literal = pair
    parts = column.parts
    if column.comments or not all(type(p) is exp.Identifier for p in parts):
        return None
    return (*((p.this, p.quoted) for p in parts), literal.is_string)


def _column_and_literal(comparison: exp.Expr) -> tuple[exp.Column, exp.Expr] | None:
    left, right = comparison.this, comparison.expression
    if type(left) is not exp.Column:
        left, right = right, left
    if type(left) is not exp.Column or not _plain_literal(right):
        return None
    return left, right


def _plain_literal(node: exp.Expr) -> bool:
    """A string literal, or an integer literal (signed) within BIGINT."""
    negative = type(node) is exp.Neg
    literal = node.this if negative else node
    if type(literal) is not exp.Literal or literal.comments or node.comments:
        return False
    if literal.is_string:
        return not negative
    text = literal.this
    return (
        len(text) < 20
        and bool(_DIGITS.fullmatch(text))
        and int(text) <= _BIGINT_LIMIT - (not negative)
    )


def _in_list(members: list[tuple[exp.Column, exp.Expr]], negated: bool) -> exp.Expr:
    """``column IN (literals)`` (or its negation) over the members' own nodes. The comparisons
    they came from, and their other copies of the column, are taken apart so that reference
    counting frees them."""
    comparisons = [column.parent for column, _literal in members]
    listed = exp.In(this=members[0][0], expressions=[literal for _column, literal in members])
    release(comparisons)  # enters only the children still theirs: the other columns
    return exp.Not(this=listed) if negated else listed


def _detach(chain: exp.Connector) -> None:
    """Break the parent links between the connectors of a chain whose operands moved to a
    balanced tree, so that reference counting frees them (not the cycle collector, which
    would walk every node of the statement to find them)."""
    stack = [chain]
    while stack:
        node = stack.pop()
        node.parent = None
        stack.extend(c for c in (node.this, node.expression) if type(c) is type(chain))


def balanced(kind: type[exp.Connector], operands: list[exp.Expr]) -> exp.Expr:
    """``operands`` (in order) joined by ``kind`` in a tree of depth log2(n).

    An operand that is a connector of another kind must come wrapped in ``exp.Paren``.
    """
    if len(operands) == 1:
        return operands[0]
    middle = len(operands) // 2
    return kind(
        this=balanced(kind, operands[:middle]), expression=balanced(kind, operands[middle:])
    )


def depth(tree: exp.Expr) -> int:
    """The number of levels of ``tree``, computed without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        if level > deepest:
            deepest = level
        level += 1
        for value in node.args.values():
            if isinstance(value, list):
                stack.extend((v, level) for v in value if isinstance(v, exp.Expr))
            elif isinstance(value, exp.Expr):
                stack.append((value, level))
    return deepest
