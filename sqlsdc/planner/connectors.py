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

Likewise the rows of a filter on several columns, ``(x = 1 AND y = 'a') OR (x = 2 AND y = 'a')
OR ...``, that differ only in one column's literal become ``(y = 'a' AND x IN (1, 2, ...))``
(and dually for an AND chain of ORs of ``<>``). AND and OR distribute over each other in SQL's
three-valued logic (Kleene's logic is a distributive lattice), so the factored tree has the
chain's truth value on every row.

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


def balance_connectors(tree: exp.Expr, walked: list[exp.Expr] | None = None) -> exp.Expr:
    """``tree`` with every AND and OR chain of more than :data:`BALANCE_FROM` operands
    balanced (mutates ``tree``; returns the new root when the root itself is a chain).
    ``walked``: ``nodes(tree)``, when the caller has it."""
    chains = [
        node
        for node in (walked if walked is not None else nodes(tree))
        if isinstance(node, exp.Connector) and type(node.parent) is not type(node)
    ]
    for chain in chains:
        operands = list(chain.flatten(unnest=False))
        if len(operands) > BALANCE_FROM:
            operands = factor_conjunctions(type(chain), operands)
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


def factor_conjunctions(kind: type[exp.Connector], operands: list[exp.Expr]) -> list[exp.Expr]:
    """``operands`` of an OR (AND) chain with every group of more than :data:`BALANCE_FROM`
    parenthesised ANDs (ORs) of equalities (``<>``), ``(x = 1 AND y = 'a')``, that differ only
    in the literal of one column replaced, where its first member stood, by that AND with the
    column's equalities as one IN list: ``(y = 'a' AND x IN (1, ...))``.

    Only conjunctions of at most :data:`_FACTOR_TERMS` terms, each ``column = literal`` as
    :func:`fold_comparisons` folds them, are factored; one column is chosen per chain, the one
    that removes the most operands. The chain's other operands keep their order.
    """
    inner = exp.And if kind is exp.Or else exp.Or
    comparison = exp.EQ if kind is exp.Or else exp.NEQ
    terms = [_terms(operand, inner, comparison) for operand in operands]
    factor = _best_factor(terms)
    if factor is None:
        return operands
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(terms):
        rest = _rest(row, factor)
        if rest is not None:
            groups.setdefault(rest, []).append(index)
    firsts, dropped = {}, set()
    for members in groups.values():
        if len(members) > BALANCE_FROM:
            firsts[members[0]] = members
            dropped.update(members[1:])
    factored = []
    for index, operand in enumerate(operands):
        if index in firsts:
            factored.append(_factored(operand, [terms[i] for i in firsts[index]], factor, inner))
        elif index not in dropped:
            factored.append(operand)
    release(operands[i] for i in dropped)
    return factored


_FACTOR_TERMS = 8  # the columns of a multi-column filter's row; longer conjunctions stay


def _terms(operand: exp.Expr, inner: type[exp.Connector], comparison: type[exp.Binary]):
    """The terms of ``(a = 1 AND b = 2)``: (comparison node, its column's group, its literal's
    text) for each; None unless every term is a foldable comparison."""
    if type(operand) is not exp.Paren or operand.comments:
        return None
    conjunction = operand.this
    if type(conjunction) is not inner or conjunction.comments:
        return None
    parts = list(conjunction.flatten(unnest=False))
    if len(parts) > _FACTOR_TERMS:
        return None
    terms = []
    for part in parts:
        group = _foldable(part, comparison)
        if group is None:
            return None
        terms.append((part, group, _column_and_literal(part)[1].sql()))
    return terms


def _rest(terms, factor: tuple) -> tuple | None:
    """The key of a row's other terms, when exactly one of its terms is on ``factor``."""
    if terms is None or sum(group == factor for _node, group, _text in terms) != 1:
        return None
    return tuple((group, text) for _node, group, text in terms if group != factor)


def _best_factor(rows: list) -> tuple | None:
    """The column (with its literal kind) whose factoring removes the most operands.

    One pass over the rows, each row's other terms keyed once per column it has once (at most
    :data:`_FACTOR_TERMS` each): linear in the chain, where scanning every row for every
    candidate column was quadratic (red team s30c: 135 s for a 1 MB chain of 5,000 columns)."""
    sizes: dict[tuple, dict[tuple, int]] = {}
    for terms in rows:
        groups = [group for _node, group, _text in terms or ()]
        for factor in dict.fromkeys(groups):  # in the row's order: the choice is deterministic
            if groups.count(factor) == 1:
                rest = tuple((group, text) for _node, group, text in terms if group != factor)
                counted = sizes.setdefault(factor, {})
                counted[rest] = counted.get(rest, 0) + 1
    best, removed = None, 0
    for factor, counted in sizes.items():
        saving = sum(size - 1 for size in counted.values() if size > BALANCE_FROM)
        if saving > removed:
            best, removed = factor, saving
    return best


def _factored(first: exp.Paren, rows: list, factor: tuple, inner: type[exp.Connector]):
    """``first`` (a member of a group) with its term on ``factor`` replaced by the IN list of
    every member's term on it, and the other terms in their order."""
    members = [
        _column_and_literal(node) for terms in rows for node, group, _text in terms
        if group == factor
    ]  # fmt: skip
    listed = _in_list(members, negated=inner is exp.Or)
    kept = [
        listed if group == factor else node for node, group, _text in rows[0]
    ]  # the first member's other terms, moved
    conjunction = first.this
    first.set("this", balanced(inner, kept))
    release([conjunction])
    return first


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
    return _joined(kind, operands, 0, len(operands))


def _joined(kind: type[exp.Connector], operands: list[exp.Expr], start: int, end: int):
    """``operands[start:end]`` joined as :func:`balanced` joins them, without copying the
    list at every level; each connector linked to its two children as its constructor
    links them."""
    if end - start == 1:
        return operands[start]
    middle = start + (end - start) // 2
    left, right = _joined(kind, operands, start, middle), _joined(kind, operands, middle, end)
    node = kind()
    node.args["this"], node.args["expression"] = left, right
    left.parent, left.arg_key, left.index = node, "this", None
    right.parent, right.arg_key, right.index = node, "expression", None
    return node


def depth(tree: exp.Expr, walked: list[exp.Expr] | None = None) -> int:
    """The number of levels of ``tree``, computed without recursion, a level at a time.
    ``walked``, when given, receives every node of ``tree``: the levels one after the other,
    which is the order of :func:`~sqlsdc.engines.trees.nodes` (breadth first, children in
    argument order), so that a caller needs no walk of its own."""
    Expr = exp.Expr
    levels, level = 0, [tree]
    while level:
        levels += 1
        if walked is not None:
            walked += level
        below: list[exp.Expr] = []
        append, extend = below.append, below.extend
        for node in level:
            for value in node.args.values():
                if isinstance(value, Expr):
                    append(value)
                elif isinstance(value, list):
                    extend([v for v in value if isinstance(v, Expr)])
        level = below
    return levels
