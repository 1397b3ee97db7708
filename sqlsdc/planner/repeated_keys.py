"""A group key written as an output's alias or position, typed once (ISSUE18 must-have 6).

``SELECT CASE WHEN age = 0 THEN 'a0' ... END AS g, COUNT(*) FROM persons GROUP BY g`` names
the key once, but sqlglot's ``qualify`` expands ``GROUP BY g`` (and ``GROUP BY 1``) into a copy
of the projection, so ``annotate_types`` then types a key of thousands of nodes twice: a fifth
of the check of a 100 KB CASE key.

:class:`RepeatedKeys` notes, before ``qualify``, each element of a GROUP BY that is a bare
column named as an output alias of its SELECT or a position in its outputs. After ``qualify``
(:meth:`detach`, right before ``annotate_types``) such an element that is node for node the
output's expression (:func:`_twins`: the same classes, arguments, comments, meta and types so
far; no subquery, star, dot, table or placeholder, whose typing reads more than the scope's
sources) and of more than :data:`KEY_FROM` nodes is taken out of the GROUP BY while
``annotate_types`` runs; after it (:meth:`attach`), each of its nodes gets the type and meta
of its twin in the output, which sqlglot gave the twin from the twin's own subtree and the
scope's sources, the same for both. The element keeps its nodes (nothing that holds them is
changed); every check of the analysis reads it as before. ``tests/test_guard_size.py`` pins
node-for-node equality of the types and meta with ``annotate_types`` on the whole tree.
"""

from __future__ import annotations

from enum import Enum

from sqlglot import exp

from sqlsdc.engines.trees import of_kind
from sqlsdc.errors import InternalError

KEY_FROM = 64  # keys of more nodes are typed once (a key of a few nodes costs nothing)
_ATOMS = (str, int, float, bool, type(None))
_NOT_TWINS = (exp.Query, exp.Subquery, exp.Dot, exp.Star, exp.Table, exp.Placeholder)


class RepeatedKeys:
    """The GROUP BY elements of a tree that name an output of their SELECT."""

    def __init__(self, walked: list[exp.Expr]):
        """``walked``: ``nodes()`` of the parsed tree, before ``qualify``."""
        self._named: list[tuple[exp.Select, int, str | int]] = []  # (select, index, name)
        self._aside: list[tuple[exp.Group, list[exp.Expr], list[exp.Expr]]] = []
        self._twins: list[tuple[exp.Expr, exp.Expr]] = []  # (output's node, key's node)
        self.taken = 0  # keys the last :meth:`detach` set aside
        for select in of_kind(walked, exp.Select):
            group = select.args.get("group")
            if group is None:
                continue
            aliases = {p.alias for p in select.expressions if type(p) is exp.Alias}
            for index, key in enumerate(group.expressions):
                if type(key) is exp.Column and not key.table and key.name in aliases:
                    self._named.append((select, index, key.name))
                elif type(key) is exp.Literal and not key.is_string and _position(key.this):
                    self._named.append((select, index, int(key.this)))

    def detach(self) -> None:
        """Take the keys that are node for node their outputs' expressions out of their GROUP
        BY (call it after ``qualify``, right before ``annotate_types``)."""
        taken: dict[int, tuple[exp.Group, list[exp.Expr], set[int]]] = {}
        self.taken = 0
        for select, index, name in self._named:
            group = select.args.get("group")
            keys = group.args.get("expressions") if group is not None else None
            if not keys or index >= len(keys):
                continue
            output = _output(select, name)
            twins = None if output is None else _twins(output, keys[index])
            if twins is None or len(twins) <= KEY_FROM:
                continue
            self._twins += twins
            self.taken += 1
            taken.setdefault(id(group), (group, keys, set()))[2].add(id(keys[index]))
        for group, keys, aside in taken.values():
            kept = [key for key in keys if id(key) not in aside]
            group.args["expressions"] = kept
            self._aside.append((group, keys, kept))

    def attach(self) -> None:
        """Put the keys back, each node typed as its twin in the output."""
        for group, keys, kept in self._aside:
            if group.args.get("expressions") is not kept:
                raise InternalError("a GROUP BY changed while its keys were set aside")
            group.args["expressions"] = keys
        for output, key in self._twins:
            key._type = output._type
            key._meta = None if output._meta is None else dict(output._meta)
        self._aside.clear()
        self._twins.clear()


def _position(text: str) -> bool:
    """Whether ``text`` is written as a position (ASCII digits only: ``int`` reads others)."""
    return text.isascii() and text.isdigit()


def _output(select: exp.Select, name: str | int) -> exp.Expr | None:
    """The expression of the output of ``select`` that ``name`` (an alias, or a position from
    1) names, if exactly one does."""
    outputs = select.expressions
    if isinstance(name, int):
        return outputs[name - 1].unalias() if 1 <= name <= len(outputs) else None
    named = [p for p in outputs if type(p) is exp.Alias and p.alias == name]
    return named[0].this if len(named) == 1 else None


def _plain(value: object) -> bool:
    """Whether ``value`` (an argument that is no node) is compared by ``==``: a string, number,
    boolean, None or enumeration member (a type's ``DType``)."""
    return type(value) in _ATOMS or isinstance(value, Enum)


def _twins(output: exp.Expr, key: exp.Expr) -> list[tuple[exp.Expr, exp.Expr]] | None:
    """The pairs of nodes of ``output`` and ``key`` at the same place, when the two trees are
    node for node the same (classes, arguments, comments, meta of plain values, types) and
    hold nothing of :data:`_NOT_TWINS`; else None. ``key`` must not be ``output``."""
    if key is output:
        return None
    Expr = exp.Expr
    pairs = []
    stack = [(output, key)]
    push, pop = stack.append, stack.pop
    while stack:
        a, b = pop()
        if a.__class__ is not b.__class__ or isinstance(a, _NOT_TWINS):
            return None
        if a.comments != b.comments:
            return None
        if a._type is not b._type and (
            a._type is None or b._type is None or _twins(a._type, b._type) is None
        ):  # a CAST is typed at parse, its copy with a copy of that type
            return None
        if a._meta != b._meta or (a._meta and any(type(v) not in _ATOMS for v in a._meta.values())):
            return None
        if a.args.keys() != b.args.keys():
            return None
        for arg, value in a.args.items():
            other = b.args[arg]
            if isinstance(value, Expr):
                if not isinstance(other, Expr):
                    return None
                push((value, other))
            elif type(value) is list:
                if type(other) is not list or len(other) != len(value):
                    return None
                for x, y in zip(value, other, strict=True):
                    if isinstance(x, Expr) and isinstance(y, Expr):
                        push((x, y))
                    elif isinstance(x, Expr) or isinstance(y, Expr):
                        return None
                    elif type(x) is not type(y) or not _plain(x) or x != y:
                        return None
            elif type(value) is not type(other) or not _plain(value) or value != other:
                return None
        pairs.append((a, b))
    return pairs
