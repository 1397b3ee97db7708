"""Balanced AND/OR trees, so that no pass needs one stack frame per operand of a long chain.

``a OR b OR c OR d`` parses as ``((a OR b) OR c) OR d``: n operands nest n deep, and every
recursive pass (ours, sqlglot's generator, copier and simplifier) would need n stack frames.
AND and OR are associative under SQL's three-valued logic, so a chain can be rebuilt as a tree
of depth log2(n) over the same operands in the same order. Operands are nested only in
connectors of their own kind, so the SQL generated from the tree says the same without
parentheses.

Example:
    >>> import sqlglot
    >>> tree = sqlglot.parse_one(" OR ".join(f"x = {i}" for i in range(100)))
    >>> balanced = balance_connectors(tree)
    >>> balanced.sql() == tree.sql(), depth(balanced) < 12
    (True, True)
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import nodes

BALANCE_FROM = 16  # chains with more operands are rebuilt; shorter ones keep the parser's shape


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
            joined = balanced(type(chain), operands)
            if chain is not tree:
                chain.replace(joined)
            _detach(chain)
            if chain is tree:
                return joined
    return tree


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
