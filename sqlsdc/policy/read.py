"""Reading a policy's text, bounded: the document and where each of its parts is written.

At most :data:`MAX_POLICY_BYTES` of text (a file's size is checked before it is read, and a
DuckDB database named where the policy belongs is told apart), YAML's safe loader (no Python
objects, duplicate keys refused), at most :data:`MAX_ALIASES` aliases, :data:`MAX_DEPTH` levels
of nesting and :data:`MAX_NODES` values after expanding aliases (an alias bomb is refused
before it expands, on the shared node graph). The (line, column) of every key and item
(:data:`Marks`) lets :mod:`sqlsdc.policy.load` point each problem at its place in the text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sqlsdc.errors import PolicyError

MAX_POLICY_BYTES = 1_000_000


MAX_DEPTH = 32


MAX_ALIASES = 100


MAX_NODES = 100_000


def read_text(source: str | Path, name: str | None) -> tuple[str, str]:
    text_is_document = isinstance(source, str) and ("\n" in source or source.lstrip()[:1] in "{")
    if text_is_document:
        label, text = name or "<policy>", source
    else:
        path = Path(source)
        label = name or path.name
        try:
            size = path.stat().st_size
            with open(path, "rb") as file:  # a database named as the policy: arguments swapped
                database = file.read(12)[8:] == b"DUCK"  # DuckDB's magic bytes
            if database:
                raise PolicyError([f"{label}: a DuckDB database, not a policy file (YAML or "
                                   "JSON); the database comes first: `sqlsdc policy apply DB "
                                   "FILE`, `sqlsdc init DB --policy FILE`"])  # fmt: skip
            if path.is_file() and size > MAX_POLICY_BYTES:
                raise PolicyError(
                    [f"{label}: the policy file has {size} bytes, more than {MAX_POLICY_BYTES}"]
                )
            text = path.read_text("utf-8")
        except OSError as e:
            raise PolicyError([f"{label}: cannot read the policy file: {e.strerror}"]) from None
        except UnicodeDecodeError as e:
            raise PolicyError([f"{label}: not UTF-8 text (byte {e.start})"]) from None
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyError([f"{label}: the policy has {len(text)} characters, more than "
                           f"{MAX_POLICY_BYTES}"])  # fmt: skip
    return text, label


Marks = dict[tuple[str, ...], tuple[int, int]]


def parse_document(text: str, label: str) -> tuple[Any, Marks]:
    """The document in ``text`` and the (line, column) of every key and item in it."""
    try:
        loader = _PolicyLoader(text)
    except yaml.reader.ReaderError as e:  # a character YAML refuses (a NUL: a binary file)
        line, column = (
            text.count("\n", 0, e.position) + 1,
            e.position - text.rfind("\n", 0, e.position),
        )
        problem = str(e).split("\n")[0]  # the rest names PyYAML's "<unicode string>"
        raise PolicyError(
            [f"{label}: line {line}, column {column}: not valid YAML: {problem}"]
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise PolicyError([f"{label}: the policy is empty"])
        _check_expansion(node)
        marks: Marks = {}
        _collect_marks(node, (), marks)
        document = loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise PolicyError([f"{label}: {where}not valid YAML: {problem}"]) from None
    finally:
        loader.dispose()
    if document is None:
        raise PolicyError([f"{label}: the policy is empty"])
    return document, marks


class _PolicyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing duplicate keys (YAML forbids them; PyYAML keeps the last),
    more than :data:`MAX_ALIASES` aliases and nesting deeper than :data:`MAX_DEPTH`."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} aliases (*name); write values out",
                    self.peek_event().start_mark,
                )  # fmt: skip
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels",
                    self.peek_event().start_mark,
                )  # fmt: skip
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:  # ``? [a, b]``: a list key, which the set below failed on (TypeError, exit 70)
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a key that is a list or mapping (? [...]); keys are names",
                    key_node.start_mark,
                ) from None  # fmt: skip
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document that expands (aliases repeated) to more than :data:`MAX_NODES` values
    or :data:`MAX_DEPTH` levels; computed on the shared node graph, never expanded. An alias
    inside the value its anchor names (``&a [*a]``: PyYAML registers the anchor before the
    value's items) is an endless value: this walk pushed that node for ever, taking every
    byte of memory (13 GB in a minute: new user s44g), and is refused when found."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()  # nodes whose items are being walked: their ancestors' line
    stack = [(root, False)]
    while stack:  # post-order over distinct nodes
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        if not children_done and id(node) in open_:
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name) inside the value its anchor (&name) names: the "
                "value would contain itself without end; write it out", node.start_mark,
            )  # fmt: skip
        kids = _children(node)
        if not children_done:  # a node after all of its children, however they are shared
            open_.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in size)
            continue
        size[id(node)] = min(MAX_NODES + 1, 1 + sum(size[id(k)] for k in kids))
        depth[id(node)] = 1 + max((depth[id(k)] for k in kids), default=0)
    if size[id(root)] > MAX_NODES or depth[id(root)] > MAX_DEPTH + 1:
        raise yaml.composer.ComposerError(
            None, None, f"the document expands to more than {MAX_NODES} values or "
            f"{MAX_DEPTH} levels (through aliases)", root.start_mark,
        )  # fmt: skip


def _collect_marks(node: yaml.Node, path: tuple[str, ...], marks: Marks) -> None:
    marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, str(key.value))
            marks.setdefault(child, (key.start_mark.line + 1, key.start_mark.column + 1))
            _collect_marks(value, child, marks)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_marks(item, (*path, str(i)), marks)


def position_of(problem: str, marks: Marks) -> tuple[int, int] | None:
    """(line, column) of the deepest part of the problem's path found in the text."""
    path = problem.split(": ", 1)[0]
    parts = () if path == "(top level)" else tuple(path.split("."))
    for n in range(len(parts), 0, -1):
        if parts[:n] in marks:
            return marks[parts[:n]]
    return None


def located(label: str, problem: str, marks: Marks) -> str:
    """``problem`` prefixed with the line and column its path points at, when known."""
    mark = position_of(problem, marks)
    return (
        f"{label}: line {mark[0]}, column {mark[1]}: {problem}" if mark else f"{label}: {problem}"
    )
