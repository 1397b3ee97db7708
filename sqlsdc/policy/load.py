"""Load a policy from YAML, JSON or a dict, validate it, and build the typed model.

Reading is bounded: at most :data:`MAX_POLICY_BYTES` of text, YAML's safe loader (no Python
objects), at most :data:`MAX_ALIASES` aliases, :data:`MAX_DEPTH` levels of nesting and
:data:`MAX_NODES` values after expanding aliases (an alias bomb is refused before it expands).

Validation is one pass and reports every problem at once, as
``<file>: line L, column C: <path.inside.document>: <problem>`` (line and column when the source
is YAML or JSON text): the JSON Schema (``schemas/policy.schema.json``) for shape and ranges,
every number finite, exact amounts (epsilon, rho, delta, granularity) parsed by a bounded
parser (never evaluated) and inside :data:`AMOUNT_RANGES`, the cross-field rules the schema
cannot express (bounds order, privacy unit declared, references and hierarchies pointing at
real columns, suppression rules that parse), and every perturbation table buildable. A document
that validated once is not validated again in the same process (:func:`load_policy` caches by
the document's text).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
from collections.abc import Callable
from fractions import Fraction
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import yaml

from sqlsdc.errors import PolicyError
from sqlsdc.mechanisms.accountant import Bounding, PrivacyCost, parse_exact
from sqlsdc.mechanisms.ckm import mean_below
from sqlsdc.mechanisms.ptable_build import check_differencing, check_published_bits, generate
from sqlsdc.policy.model import (
    DEFAULT_DOMINANCE,
    DEFAULT_MAX_STATEMENT_CHARACTERS,
    DEFAULT_MIN_FREQUENCY,
    DEFAULT_STATEMENT_TIMEOUT,
    MAX_DOMINANCE_TOP,
    AggregateKind,
    Budget,
    Column,
    ColumnRole,
    DpSettings,
    GroupKeys,
    MagnitudeCkm,
    Method,
    Policy,
    ProtectionRule,
    PTableSpec,
    Rounding,
    SecondaryMethod,
    Suppression,
    Table,
    TableKind,
    User,
    UserRole,
)
from sqlsdc.policy.rule_syntax import rule_arguments

MAX_POLICY_BYTES = 1_000_000
MAX_DEPTH = 32
MAX_ALIASES = 100
MAX_NODES = 100_000

AMOUNT_RANGES: dict[str, tuple[Fraction, Fraction, bool]] = {
    # name: (lowest, highest, whether the highest is allowed)
    "epsilon": (Fraction(1, 10**6), Fraction(1000), True),
    "rho": (Fraction(1, 10**9), Fraction(1000), True),
    "delta": (Fraction(1, 10**15), Fraction(1), False),
    "granularity": (Fraction(1, 10**6), Fraction(10**6), True),
    "budget epsilon": (Fraction(1, 10**6), Fraction(10**6), True),
    "budget rho": (Fraction(1, 10**9), Fraction(10**6), True),
    "budget delta": (Fraction(1, 10**15), Fraction(1), False),
}
"""Exact policy amounts outside these ranges are refused: a smaller epsilon or rho gives noise
that drowns every cell (and samplers that never finish), a larger one no protection at all; a
delta is a probability of failure and stays far below 1. Budgets (totals over many queries)
may reach 10^6."""


@cache
def policy_schema() -> dict:
    """The policy JSON Schema shipped with the package."""
    text = resources.files("sqlsdc.schemas").joinpath("policy.schema.json").read_text("utf-8")
    return json.loads(text)


def load_policy(source: str | Path | dict, *, name: str | None = None) -> Policy:
    """Read, validate and build a policy.

    Args:
        source: a path to a YAML/JSON file, a YAML/JSON string, or an already parsed dict.
        name: how to call the source in error messages (defaults to the file name).

    Raises:
        PolicyError: naming the file, the line and column, the path inside it and each problem.

    Example:
        >>> doc = {"tables": {"t": {"kind": "public"}}, "users": {"a": {"role": "admin"}}}
        >>> p = load_policy(doc)
        >>> p.table("t").is_public
        True
    """
    if isinstance(source, dict):
        try:
            text = json.dumps(source, allow_nan=True)  # order kept: it is the tables' order
        except (TypeError, ValueError, RecursionError):
            text = None  # not JSON-like: validation names the problem
        if text is None or len(text) > MAX_POLICY_BYTES:
            return _load_dict(copy.deepcopy(source), name or "<policy>")
        return _loaded(text, name or "<policy>", True)
    text, label = _text(source, name)
    return _loaded(text, label, False)


@lru_cache(maxsize=64)
def _loaded(text: str, label: str, is_json_dict: bool) -> Policy:
    """Validate and build a policy from its text, once per process and document (the guarded
    connection loads the stored policy each time it opens)."""
    if is_json_dict:
        return _load_dict(json.loads(text), label)
    document, marks = _parse(text, label)
    return _validated(document, label, marks)


def _load_dict(document: Any, label: str) -> Policy:
    return _validated(document, label, {})


def _validated(document: Any, label: str, marks: Marks) -> Policy:
    """The policy of a valid ``document``; PolicyError listing every problem otherwise."""
    problems = validate_document(document)
    problems += _ptable_problems(document, problems)
    if problems:
        raise PolicyError([_located(label, p, marks) for p in _by_position(problems, marks)])
    return _build(document, label)


def _by_position(problems: list[str], marks: Marks) -> list[str]:
    """Problems in the order of the text they point at (as found, for a dict)."""
    if not marks:
        return problems
    return sorted(problems, key=lambda p: _mark(p, marks) or (0, 0))


def validate_document(document: Any) -> list[str]:
    """Return every problem of a parsed policy document as ``path: problem`` strings.

    Checks of a part whose shape is wrong are skipped (the shape problem is reported instead),
    so one pass lists every problem that can be found.
    """
    too_deep = _depth_problem(document)
    if too_deep:
        return [too_deep]
    validator = jsonschema.Draft202012Validator(policy_schema())
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    problems = [f"{_path(e.absolute_path)}: {_describe(e)}" for e in errors]
    problems += _finite_problems(document)
    if not isinstance(document, dict):
        return problems
    problems += _amount_problems(document, {_path(e.absolute_path) for e in errors})
    found_before = bool(problems)
    malformed = {str(e.absolute_path[1]) for e in errors
                 if len(e.absolute_path) > 1 and e.absolute_path[0] == "tables"}  # fmt: skip
    for check in _semantic_checks(document, malformed):
        try:
            problems += check()
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            if not found_before:
                raise  # a valid shape must never crash a check: this is a bug
    return problems


def _text(source: str | Path, name: str | None) -> tuple[str, str]:
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


def _parse(text: str, label: str) -> tuple[Any, Marks]:
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
    or :data:`MAX_DEPTH` levels; computed on the shared node graph, never expanded."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack = [(root, False)]
    while stack:  # post-order over distinct nodes (the composer made the graph acyclic)
        node, children_done = stack.pop()
        if id(node) in size:
            continue
        kids = _children(node)
        if not children_done:  # a node after all of its children, however they are shared
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


def _mark(problem: str, marks: Marks) -> tuple[int, int] | None:
    """(line, column) of the deepest part of the problem's path found in the text."""
    path = problem.split(": ", 1)[0]
    parts = () if path == "(top level)" else tuple(path.split("."))
    for n in range(len(parts), 0, -1):
        if parts[:n] in marks:
            return marks[parts[:n]]
    return None


def _located(label: str, problem: str, marks: Marks) -> str:
    """``problem`` prefixed with the line and column its path points at, when known."""
    mark = _mark(problem, marks)
    return (
        f"{label}: line {mark[0]}, column {mark[1]}: {problem}" if mark else f"{label}: {problem}"
    )


def _depth_problem(document: Any) -> str | None:
    """A document (a dict from Python) nested deeper than :data:`MAX_DEPTH`, or None."""
    stack = [(document, 1)]
    count = 0
    while stack:
        value, level = stack.pop()
        count += 1
        if level > MAX_DEPTH + 1 or count > MAX_NODES:
            return (f"(top level): the document has more than {MAX_NODES} values or "
                    f"{MAX_DEPTH} levels")  # fmt: skip
        if isinstance(value, dict):
            stack.extend((v, level + 1) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, level + 1) for v in value)
    return None


def _finite_problems(document: Any) -> list[str]:
    """Every number in the document finite (YAML's .inf and .nan break every computation)."""
    problems, stack = [], [((), document)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{_path(path)}: must be a finite number, got {value}")
        elif isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))
    return sorted(problems)


def _amount_problems(doc: dict, shape_problems: set[str]) -> list[str]:
    """Exact amounts parse (bounded, no evaluation) and lie inside :data:`AMOUNT_RANGES`."""
    found: list[tuple[str, str, Any]] = []  # (path, kind, value)

    def rule_spends(where: str, protection: Any) -> None:
        if not isinstance(protection, dict):
            return
        for kind in ("counts", "magnitudes"):
            spend = (protection.get(kind) or {}) if isinstance(protection.get(kind), dict) else {}
            if isinstance(spend.get("spend"), dict):
                for key, value in spend["spend"].items():
                    found.append((f"{where}.{kind}.spend.{key}", key, value))

    rule_spends("protection", doc.get("protection"))
    tables = doc.get("tables")
    for tname, spec in tables.items() if isinstance(tables, dict) else ():
        if not isinstance(spec, dict):
            continue
        rule_spends(f"tables.{tname}.protection", spec.get("protection"))
        dp = spec.get("dp")
        if isinstance(dp, dict):
            if "granularity" in dp:
                found.append((f"tables.{tname}.dp.granularity", "granularity", dp["granularity"]))
            selection = dp.get("selection")
            for key, value in selection.items() if isinstance(selection, dict) else ():
                found.append((f"tables.{tname}.dp.selection.{key}", key, value))
    budgets = doc.get("budgets")
    for i, budget in enumerate(budgets if isinstance(budgets, list) else ()):
        for key in ("epsilon", "rho", "delta"):
            if isinstance(budget, dict) and key in budget:
                found.append((f"budgets.{i}.{key}", f"budget {key}", budget[key]))
    problems = []
    for where, kind, value in found:
        if kind not in AMOUNT_RANGES or isinstance(value, bool) or where in shape_problems:
            continue  # the schema names it
        if isinstance(value, float) and not math.isfinite(value):
            continue  # reported as not finite
        try:
            amount = _exact(value, where)
        except (ValueError, TypeError) as e:
            problems.append(str(e) if str(e).startswith(where) else f"{where}: {e}")
            continue
        low, high, high_allowed = AMOUNT_RANGES[kind]
        if amount < low or amount > high or (amount == high and not high_allowed):
            upper = f"at most {_show(high)}" if high_allowed else f"below {_show(high)}"
            problems.append(
                f"{where}: {value!r} is outside the allowed range: at least {_show(low)} and "
                f"{upper}"
            )
    return problems


def _show(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def _ptable_problems(document: Any, found: list[str]) -> list[str]:
    """Every perturbation table of a CKM rule can be built and is safe against differencing (one
    that cannot would otherwise fail every query of its table), and a magnitude table leaves a
    published sum's rounding a window of a key or more (:func:`check_published_bits`). Checked
    from the document, also when other parts have problems, so that one pass lists them all; a
    ptable inside a part that already has a problem (``found``) is skipped."""
    problems, seen = [], set()
    for where, protection in _protection_sections(document):
        for kind in AggregateKind:
            rule = protection.get(kind.value)
            if not isinstance(rule, dict) or rule.get("method") != Method.CKM.value:
                continue
            for table_kind, key in ((kind.value, "ptable"), ("small_cells", "small_cells")):
                path = f"{where}.{kind.value}.{key}"
                spec = rule.get(key)
                if not isinstance(spec, dict) or any(_overlaps(p, path) for p in found):
                    continue
                try:
                    ptable = _ptable(spec)
                    flex = _flex(rule) if table_kind == AggregateKind.MAGNITUDES.value else None
                except (KeyError, TypeError, ValueError):
                    continue  # its shape problem is in ``found``
                if (table_kind, ptable, flex) in seen:
                    continue
                seen.add((table_kind, ptable, flex))
                try:
                    generate(table_kind, ptable)
                    check_differencing(table_kind, ptable)
                    if flex is not None:
                        check_published_bits(ptable, *flex)
                except PolicyError as e:
                    problems += [f"{path}: {p}" for p in e.problems]
                except ValueError as e:
                    problems.append(f"{path}: the ptable cannot be built: {e}")
    return problems


def _flex(rule: dict) -> tuple[float, float] | None:
    """``(p_small, mu_c)`` of a magnitude CKM rule, which the published sum's rounding window
    depends on beside its ptable (mu_c 0 when no cell is sensitive, ``sensitive_below`` 0);
    None without a usable flex function (a problem of its own)."""
    flex = rule.get("flex")
    if not isinstance(flex, dict) or "p_small" not in flex:
        return None
    p_small = float(flex["p_small"])
    mu_c = float(rule.get("mu_c", 0.0)) if int(rule.get("sensitive_below", 0)) > 0 else 0.0
    return (p_small, mu_c) if p_small > 0 else None


def _protection_sections(document: Any):
    """``(path, protection mapping)`` of the policy's defaults and of every table."""
    if not isinstance(document, dict):
        return
    if isinstance(document.get("protection"), dict):
        yield "protection", document["protection"]
    tables = document.get("tables")
    for name, spec in tables.items() if isinstance(tables, dict) else ():
        if isinstance(spec, dict) and isinstance(spec.get("protection"), dict):
            yield f"tables.{name}.protection", spec["protection"]


def _overlaps(problem: str, path: str) -> bool:
    """Whether ``problem`` (``path: text``) is about ``path``, a part of it or a part holding it."""
    at = problem.split(": ", 1)[0]
    return at == path or path.startswith(f"{at}.") or at.startswith(f"{path}.")


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


_YAML_TEXT_NUMBER = re.compile(r"[-+]?\d+[eE][-+]?\d+")  # YAML 1.1: 1e-9 is a str, 1.0e-9 a float


def _describe(error: jsonschema.ValidationError) -> str:
    """A short human sentence for a schema violation (jsonschema's own are long)."""
    v, kind = error.validator, error.validator_value
    if v == "additionalProperties":
        allowed = ", ".join(sorted(error.schema.get("properties", {})))
        extra = ", ".join(sorted(set(error.instance) - set(error.schema.get("properties", {}))))
        return f"unknown key(s) {extra}; allowed here: {allowed}"
    if v == "required":
        missing = [k for k in kind if k not in error.instance]
        return f"missing required key(s): {', '.join(missing)}"
    if v == "enum":
        return f"{error.instance!r} is not one of: {', '.join(map(str, kind))}"
    if v == "const":
        return f"{error.instance!r} is not supported; use {kind!r}"
    if v == "type":
        found = f"expected {kind}, got {type(error.instance).__name__} {error.instance!r}"
        if isinstance(error.instance, str) and _YAML_TEXT_NUMBER.fullmatch(error.instance):
            found += " (YAML reads an exponent without a dot as text: write e.g. 1.0e-9)"
        return found
    if v == "pattern":
        name = "a valid name (letters, digits, _; a letter first)"
        expected = error.schema.get("description", name)
        return f"{error.instance!r} is not {expected}" + _rename_hint(error, expected == name)
    if v in ("minItems", "maxItems"):
        return f"expected {'at least' if v == 'minItems' else 'at most'} {kind} items"
    if v == "minProperties":
        return "must not be empty"
    if v == "minimum":
        return f"{error.instance!r} is below the minimum {kind}"
    if v == "exclusiveMinimum":
        return f"{error.instance!r} must be above {kind}"
    if v == "maximum":
        return f"{error.instance!r} is above the maximum {kind}"
    if v == "uniqueItems":
        return "items must be unique"
    return error.message


def _rename_hint(error: jsonschema.ValidationError, a_name: bool) -> str:
    """How to get a table or column name the policy takes, when the database's has spaces or
    other characters (a CSV header ``Firm ID``: the policy could not name the column at all,
    and nothing said what to do; new user s38)."""
    where = [str(p) for p in error.absolute_path]
    if not a_name or where[:1] != ["tables"] or not isinstance(error.instance, str):
        return ""
    plain = re.sub(r"\W+", "_", error.instance).strip("_").lower() or "x"
    plain = plain if plain[0].isalpha() else f"c_{plain}"
    if where == ["tables"]:
        return (f"; rename the table in the database (ALTER TABLE \"{error.instance}\" RENAME TO "
                f"{plain}) and here")  # fmt: skip
    table = where[1] if len(where) > 1 else "t"
    table = table if re.fullmatch(r"[A-Za-z_]\w*", table) else f'"{table}"'
    return (f"; rename the column in the database (ALTER TABLE {table} RENAME COLUMN "
            f"\"{error.instance}\" TO {plain}) and here, or load CSV files with read_csv(..., "
            "normalize_names = true)")  # fmt: skip


def _semantic_checks(doc: dict, malformed: set[str]) -> list[Callable[[], list[str]]]:
    """The cross-field checks, one per table and one for the rest: each runs on its own, so a
    part with a wrong shape does not hide the problems of the others; tables with a shape
    problem (``malformed``) are left to the schema's message."""
    tables = doc.get("tables")
    names = [n for n in tables if str(n) not in malformed] if isinstance(tables, dict) else []
    return [
        *(lambda name=name: _table_problems(doc, name) for name in names),
        lambda: _global_problems(doc),
    ]


def _table_problems(doc: dict, tname: str) -> list[str]:
    problems: list[str] = []
    tables = {name.lower(): spec for name, spec in doc["tables"].items()}
    spec = doc["tables"][tname]
    where = f"tables.{tname}"
    columns = spec.get("columns", {})
    kind = spec.get("kind", "confidential")
    for cname, col in columns.items():
        cwhere = f"{where}.columns.{cname}"
        bounds = col.get("bounds")
        if bounds and bounds[0] > bounds[1]:
            problems.append(
                f"{cwhere}.bounds: lower bound {bounds[0]} is above upper bound {bounds[1]}"
            )
        if bounds and col["role"] in ("identifier", "hidden"):
            problems.append(f"{cwhere}.bounds: a column with role {col['role']} has no bounds")
        if "domain" in col and col["role"] != "dimension":
            problems.append(f"{cwhere}.domain: only dimensions have a domain")
        if len({isinstance(v, bool) for v in col.get("domain", ())}) > 1:  # 1 == true in Python:
            problems.append(  # two cells, two noises, one exact value
                f"{cwhere}.domain: mixes true/false with other values; give one kind of value "
                "(YAML reads NO, yes, on and off as true or false: quote such codes, 'NO')"
            )
        if "breaks" in col and col["role"] not in ("measure", "weight"):
            problems.append(f"{cwhere}.breaks: only measures and weights have class breaks")
        ref = col.get("references")
        if ref:
            if col["role"] != "identifier":
                problems.append(f"{cwhere}.references: only identifiers may reference a table")
            rtable, rcol = ref.lower().split(".")
            target = tables.get(rtable, {}).get("columns", {})
            target = {k.lower(): v for k, v in target.items()}
            if rtable not in tables:
                problems.append(f"{cwhere}.references: table {rtable!r} is not declared")
            elif target.get(rcol, {}).get("role") != "identifier":
                problems.append(f"{cwhere}.references: {ref} is not a declared identifier column")
    if cname_dupes := _case_dupes(columns):
        problems.append(f"{where}.columns: names differ only in case: {cname_dupes}")
    roles = {c.lower(): v["role"] for c, v in columns.items()}
    if "key" in spec and kind != "public":
        problems.append(
            f"{where}.key: only public tables declare a key; a confidential table's key is "
            "its privacy_unit"
        )
    if kind == "confidential":
        unit = spec.get("privacy_unit")
        if unit is None:
            problems.append(f"{where}: a confidential table needs a privacy_unit")
        elif roles.get(unit.lower()) != "identifier":
            problems.append(
                f"{where}.privacy_unit: {unit!r} must be a declared column with role identifier"
            )
        protection = spec.get("protection", {})
        for kind_name in ("counts", "magnitudes"):
            if kind_name in protection:
                problems += _rule_problems(
                    f"{where}.protection.{kind_name}", kind_name, protection[kind_name]
                )
        problems += _suppression_problems(where, spec, _uses_suppress(doc, spec))
        problems += _suppressed_count_problems(where, doc, spec)
        problems += _dp_problems(where, spec, _uses(doc, spec, "dp"))
    else:
        for key in ("privacy_unit", "hierarchies", "protection", "suppression", "dp"):
            if key in spec:
                problems.append(f"{where}.{key}: not used for a public table")
    for hname, levels in spec.get("hierarchies", {}).items():
        for level in levels:
            if roles.get(level.lower()) != "dimension":
                problems.append(
                    f"{where}.hierarchies.{hname}: {level!r} is not a declared dimension"
                )
    return problems


def _global_problems(doc: dict) -> list[str]:
    problems: list[str] = []
    tables = {name.lower(): spec for name, spec in doc["tables"].items()}
    if dupes := _case_dupes(doc["tables"]):
        problems.append(f"tables: names differ only in case: {dupes}")
    for kind_name in ("counts", "magnitudes"):
        if kind_name in doc.get("protection", {}):
            problems += _rule_problems(
                f"protection.{kind_name}", kind_name, doc["protection"][kind_name]
            )
    if not any(u["role"] == "admin" for u in doc["users"].values()):
        problems.append("users: declare at least one user with role admin")
    if dupes := _case_dupes(doc["users"]):  # two principals a typo apart: budgets, audit, login
        problems.append(f"users: names differ only in case: {dupes}; give each user one name")
    seen_budgets: dict[tuple[str, str], int] = {}
    for i, budget in enumerate(doc.get("budgets", [])):
        where = f"budgets.{i}"
        if budget.get("table", "*") != "*" and budget["table"].lower() not in tables:
            problems.append(f"{where}.table: table {budget['table']!r} is not declared")
        if budget.get("user", "*") not in ("*", *doc["users"]):
            problems.append(f"{where}.user: user {budget['user']!r} is not declared")
        key = (budget.get("user", "*"), budget.get("table", "*").lower())
        if key in seen_budgets:  # the later one replaced the earlier, silently
            problems.append(
                f"{where}: user {key[0]!r} on table {key[1]!r} has a budget already "
                f"(budgets.{seen_budgets[key]}); give each user and table one budget"
            )
        seen_budgets.setdefault(key, i)
    releases = [r.lower() for r in doc.get("releases", [])]
    for i, name in enumerate(releases):
        if name in tables:
            problems.append(f"releases.{i}: {name!r} is the name of a declared table; a "
                            "released output is read under its own name")  # fmt: skip
        if name.startswith("__"):
            problems.append(f"releases.{i}: names starting with '__' are reserved for sqlsdc")
        if releases.index(name) != i:
            problems.append(f"releases.{i}: {name!r} is listed twice (names ignore case)")
    return problems


def _uses_suppress(doc: dict, spec: dict) -> bool:
    """Whether a table's counts or magnitudes are protected by suppression (own or inherited)."""
    return _uses(doc, spec, "suppress")


def _suppressed_count_problems(where: str, doc: dict, spec: dict) -> list[str]:
    """Counts protected by suppression need magnitudes protected by suppression (or DP).

    Any other magnitude method publishes a cell's SUM and AVG with an exact or small error, so
    SUM/AVG is its unit count, under filters of its own: ``SUM(m)/AVG(m) WHERE NOT (nace = 'G'
    AND region = 'R05')`` subtracted from the published total gave a suppressed count exactly
    under threshold, CKM (mean before sum) and rounded magnitudes (red team s37d)."""
    own, top = spec.get("protection", {}), doc.get("protection", {})
    counts, magnitudes = (
        (own.get(kind) or top.get(kind) or {}).get("method", "threshold")
        for kind in ("counts", "magnitudes")
    )
    measures = any(c.get("role") == "measure" for c in spec.get("columns", {}).values())
    if counts != "suppress" or magnitudes in ("suppress", "dp") or not measures:
        return []
    return [
        f"{where}.protection.magnitudes: method {magnitudes} publishes each cell's count as "
        "SUM(m)/AVG(m), under filters of its own; where counts use method suppress, protect "
        "magnitudes by suppress (or dp) too"
    ]


def _uses(doc: dict, spec: dict, method: str) -> bool:
    """Whether a table's counts or magnitudes use ``method`` (own rule or inherited)."""
    own, top = spec.get("protection", {}), doc.get("protection", {})
    return any(
        (own.get(kind) or top.get(kind) or {}).get("method") == method
        for kind in ("counts", "magnitudes")
    )


def _dp_problems(where: str, spec: dict, uses_dp: bool) -> list[str]:
    """Bounding settings that :class:`Bounding` accepts, on a table that uses DP."""
    settings = spec.get("dp")
    if settings is None:
        return []
    if not uses_dp:
        return [f"{where}.dp: only used when counts or magnitudes use method dp"]
    problems = []
    dp = _dp_settings(settings)
    if dp.groups is GroupKeys.PRIVATE and dp.selection_epsilon is None:
        problems.append(
            f"{where}.dp.selection: private groups need `selection: {{epsilon: .., delta: ..}}`"
        )
    if dp.groups is GroupKeys.PUBLIC and dp.selection_epsilon is not None:
        problems.append(f"{where}.dp.selection: only used with `groups: private`")
    for cname, col in spec.get("columns", {}).items():
        if col.get("bounds") and col["role"] == "measure":
            try:
                Bounding(lower=_exact(col["bounds"][0]), upper=_exact(col["bounds"][1]),
                         granularity=dp.granularity)  # fmt: skip
            except ValueError as e:
                problems.append(f"{where}.columns.{cname}.bounds: {e}")
    return problems


def _exact(value, name: str = "value") -> Fraction:
    """A policy number as an exact fraction: 0.1 means one tenth, as written (a float's
    shortest text; strings through the bounded parser, never evaluated)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    return parse_exact(str(value), name)


def _dp_settings(spec: dict | None) -> DpSettings:
    spec = spec or {}
    selection = spec.get("selection", {})
    return DpSettings(
        max_groups=int(spec.get("max_groups", 1)),
        max_rows=int(spec.get("max_rows", 1)),
        max_rows_per_unit=spec.get("max_rows_per_unit"),
        granularity=_exact(spec.get("granularity", 1)),
        groups=GroupKeys(spec.get("groups", "public")),
        selection_epsilon=_exact(selection["epsilon"]) if selection else None,
        selection_delta=_exact(selection["delta"]) if selection else None,
        min_frequency=spec.get("min_frequency"),
        bounding_report=_spend(spec["bounding_report"]) if spec.get("bounding_report") else None,
    )


def _spend(spec: dict) -> PrivacyCost:
    return PrivacyCost(**{kind: _exact(v) for kind, v in spec.items()})


def _case_dupes(mapping: dict) -> str:
    seen: dict[str, str] = {}
    dupes = []
    for key in mapping:
        if key.lower() in seen:
            dupes.append(f"{seen[key.lower()]}/{key}")
        seen[key.lower()] = key
    return ", ".join(dupes)


def _rules(spec: dict | None, inherited: dict[AggregateKind, ProtectionRule]):
    spec = spec or {}
    default_k = spec.get("min_frequency")
    rules = {}
    for kind in AggregateKind:
        base = inherited[kind]
        rule = spec.get(kind.value)
        if rule is not None:
            k = int(rule.get("min_frequency", default_k or base.min_frequency))
            rules[kind] = _rule(rule, k)
        elif default_k is not None:
            rules[kind] = dataclasses.replace(base, min_frequency=int(default_k))
        else:
            rules[kind] = base
    return rules


def _floored(rules: dict[AggregateKind, ProtectionRule]) -> dict[AggregateKind, ProtectionRule]:
    """A table's rules, its CKM magnitude given ``mean_below`` from its CKM count ptable
    (:func:`sqlsdc.mechanisms.ckm.mean_below`): the count that hides n is what the mean of a
    small cell must not tell. Without CKM counts a magnitude's n is published exactly or not
    at all, and its noise is cellKey's."""
    counts, magnitudes = rules[AggregateKind.COUNTS], rules[AggregateKind.MAGNITUDES]
    if counts.method is not Method.CKM or magnitudes.magnitude is None:
        return rules
    floor = mean_below(counts.ptable)
    magnitude = dataclasses.replace(magnitudes.magnitude, mean_below=floor)
    return {**rules, AggregateKind.MAGNITUDES: dataclasses.replace(magnitudes, magnitude=magnitude)}


def _rule(rule: dict, k: int) -> ProtectionRule:
    method = Method(rule["method"])
    dominance = tuple(rule.get("dominance", DEFAULT_DOMINANCE))
    if method is Method.THRESHOLD:
        return ProtectionRule(method, k, dominance=dominance)
    if method is Method.DP:
        return ProtectionRule(method, k, spend=_spend(rule["spend"]))
    if method is Method.SUPPRESS:
        return ProtectionRule(method, k, rules=tuple(rule.get("rules", ())))
    if method is Method.ROUND:
        rounding = Rounding(rule.get("rounding", Rounding.UNBIASED.value))
        return ProtectionRule(
            method, k, base=int(rule["base"]), rounding=rounding, dominance=dominance
        )
    magnitude = None
    if "flex" in rule:
        flex = rule["flex"]
        magnitude = MagnitudeCkm(
            top_k=rule.get("top_k", 1),
            fp=float(flex["fp"]),
            p_small=float(flex["p_small"]),
            p_large=float(flex["p_large"]),
            q=float(flex.get("q", 3.0)),
            epsilon=tuple(float(e) for e in rule.get("epsilon", [1.0])),
            mu_c=float(rule.get("mu_c", 0.0)),
            sensitive_below=int(rule.get("sensitive_below", 0)),
            same_key=bool(rule.get("same_key", True)),
            small_cells=_ptable(rule["small_cells"]) if "small_cells" in rule else None,
        )
    return ProtectionRule(method, k, _ptable(rule["ptable"]), magnitude)


def _suppression(spec: dict | None) -> Suppression | None:
    if spec is None:
        return None
    return Suppression(
        dimensions=tuple(d.lower() for d in spec["dimensions"]),
        secondary=SecondaryMethod(spec.get("secondary", "gauss")),
        cost=spec.get("cost", "value"),
        time_limit=float(spec.get("time_limit", 60.0)),
    )


def _suppression_problems(where: str, spec: dict, uses_suppress: bool) -> list[str]:
    """The suppression universe names dimensions (or hierarchies of them), each level once."""
    universe = spec.get("suppression")
    if universe is None:
        if uses_suppress:
            return [
                f"{where}: method suppress needs `suppression: {{dimensions: [...]}}`, the "
                "dimensions (or hierarchies) of the table every release is cut from"
            ]
        return []
    if not uses_suppress:
        return [f"{where}.suppression: only used when counts or magnitudes use method suppress"]
    roles = {c.lower(): v["role"] for c, v in spec.get("columns", {}).items()}
    hierarchies = {h.lower(): [lv.lower() for lv in levels]
                   for h, levels in spec.get("hierarchies", {}).items()}  # fmt: skip
    problems, seen = [], set()
    for name in universe["dimensions"]:
        levels = hierarchies.get(name.lower(), [name.lower()])
        if name.lower() not in hierarchies and roles.get(name.lower()) != "dimension":
            problems.append(
                f"{where}.suppression.dimensions: {name!r} is neither a dimension column nor a "
                "hierarchy of this table"
            )
        if twice := sorted(seen & set(levels)):
            problems.append(
                f"{where}.suppression.dimensions: {', '.join(twice)} appear(s) twice (directly "
                "and through a hierarchy); name each level once"
            )
        seen |= set(levels)
    return problems


def _ptable(spec: dict) -> PTableSpec:
    return PTableSpec(
        D=int(spec["D"]),
        V=float(spec["V"]),
        js=int(spec.get("js", 0)),
        pstay=float(spec["pstay"]) if "pstay" in spec else None,
        optim=int(spec.get("optim", 1)),
        mono=bool(spec.get("mono", True)),
        step=int(spec.get("step", 1)),
        parity=bool(spec.get("parity", False)),
    )


def _primary_rule_problems(where: str, rules) -> list[str]:
    """Primary suppression rules that parse and whose numbers are in range (``freq:0`` or a
    ``freq`` without its number would protect nothing)."""
    problems = []
    for i, text in enumerate(rules):
        try:
            rule_arguments(text)
        except ValueError as e:
            problems.append(f"{where}.{i}: {e}")
    return problems


def _dominance_problems(where: str, rules) -> list[str]:
    """Dominance rules of a threshold or round magnitude: ``p:P``, ``pq:P,Q`` or ``nk:N,K``
    with N at most :data:`MAX_DOMINANCE_TOP` (the SQL keeps that many largest contributions)."""
    problems = []
    for i, text in enumerate(rules):
        try:
            name, arguments = rule_arguments(text)
        except ValueError as e:
            problems.append(f"{where}.{i}: {e}")
            continue
        if name == "nk" and arguments["n"] > MAX_DOMINANCE_TOP:  # (the schema refuses freq)
            problems.append(
                f"{where}.{i}: {text!r}: N must be at most {MAX_DOMINANCE_TOP} (the largest "
                "contributions a cell's SQL keeps)"
            )
    return problems


def _rule_problems(where: str, kind: str, rule: dict) -> list[str]:
    """Cross-field rules of a protection rule (cellKey ``ck_params_nums``/``ck_flexparams``)."""
    if rule["method"] == "dp":
        problems = []
        if "spend" not in rule:
            problems.append(
                f"{where}.spend: method dp needs what each aggregate costs, e.g. "
                "{epsilon: 0.5} (discrete Laplace) or {rho: 0.05} (discrete Gaussian)"
            )
        if extra := sorted(set(rule) - {"method", "spend"}):
            problems.append(f"{where}: {', '.join(extra)} do not apply to method dp")
        return problems
    if "spend" in rule:
        return [f"{where}.spend: only method dp spends a privacy budget"]
    if rule["method"] == "suppress":
        extra = sorted(set(rule) - {"method", "min_frequency", "rules"})
        problems = [f"{where}: {', '.join(extra)} do not apply to method suppress"] if extra else []
        return problems + _primary_rule_problems(f"{where}.rules", rule.get("rules", ()))
    if "rules" in rule:
        return [f"{where}.rules: only method suppress has primary rules"]
    if "dominance" in rule:
        if rule["method"] not in ("threshold", "round") or kind != "magnitudes":
            return [f"{where}.dominance: only magnitudes under method threshold or round have "
                    "dominance rules (suppress: rules; ckm's noise scales with the largest "
                    "contributions)"]  # fmt: skip
        dominance_problems = _dominance_problems(f"{where}.dominance", rule["dominance"])
        rule = {key: value for key, value in rule.items() if key != "dominance"}
        return dominance_problems + _rule_problems(where, kind, rule)
    if rule["method"] == "round":
        problems = []
        if "base" not in rule:
            problems.append(
                f"{where}.base: method round needs the rounding base, an integer >= 2, e.g. "
                "{method: round, base: 5, rounding: unbiased}"
            )
        if extra := sorted(set(rule) - {"method", "min_frequency", "base", "rounding"}):
            problems.append(f"{where}: {', '.join(extra)} do not apply to method round")
        return problems
    if extra := sorted(set(rule) & {"base", "rounding"}):
        return [f"{where}: {', '.join(extra)} only apply to method round"]
    if rule["method"] != "ckm":
        extra = sorted(set(rule) - {"method", "min_frequency"})
        return [f"{where}: {', '.join(extra)} only apply to method ckm"] if extra else []
    problems = []
    if "ptable" not in rule:
        problems.append(
            f"{where}.ptable: method ckm needs a perturbation table, e.g. {{D: 5, V: 2}}"
        )
    magnitude_keys = {
        "top_k",
        "flex",
        "epsilon",
        "mu_c",
        "sensitive_below",
        "same_key",
        "mean_before_sum",
        "small_cells",
    }
    if kind == "counts":
        if extra := sorted(set(rule) & magnitude_keys):
            problems.append(f"{where}: {', '.join(extra)} only apply to magnitudes")
        return problems
    if rule.get("mean_before_sum") is False:
        problems.append(
            f"{where}.mean_before_sum: false is not offered: noise relative to the largest "
            "value made a sum of values a query pins (a dimension, a measure at a class break) "
            "an exact count; remove the key (true is the default)"
        )
    if "flex" not in rule:
        problems.append(
            f"{where}.flex: magnitude CKM needs the flex function, e.g. "
            "{fp: 10000, p_small: 0.2, p_large: 0.05}"
        )
        return problems
    flex, top_k = rule["flex"], rule.get("top_k", 1)
    epsilon = rule.get("epsilon", [1.0])
    if flex["p_small"] < flex["p_large"]:
        problems.append(f"{where}.flex: p_small must be at least p_large")
    if len(epsilon) != top_k:
        problems.append(f"{where}.epsilon: needs top_k = {top_k} values, got {len(epsilon)}")
    if epsilon[0] != 1 or any(b > a for a, b in zip(epsilon, epsilon[1:], strict=False)):
        problems.append(f"{where}.epsilon: must start with 1 and not increase")
    for key in ("js", "pstay"):
        if key in rule.get("ptable", {}):
            problems.append(
                f"{where}.ptable.{key}: only count tables have {key} (R ptable create_num_ptable)"
            )
    if rule.get("ptable", {}).get("parity") and top_k > 1:
        problems.append(f"{where}.ptable.parity: even/odd tables need top_k = 1")
    return problems


def _build(doc: dict, label: str) -> Policy:
    default = ProtectionRule(Method.THRESHOLD, DEFAULT_MIN_FREQUENCY)
    top_rules = _rules(doc.get("protection"), {k: default for k in AggregateKind})
    tables = {}
    for tname, spec in doc["tables"].items():
        columns = {}
        for cname, col in spec.get("columns", {}).items():
            ref = col.get("references")
            columns[cname.lower()] = Column(
                name=cname.lower(),
                role=ColumnRole(col["role"]),
                domain=tuple(col["domain"]) if "domain" in col else None,
                bounds=tuple(col["bounds"]) if "bounds" in col else None,
                breaks=tuple(sorted(col["breaks"])) if "breaks" in col else None,
                references=tuple(ref.lower().split(".")) if ref else None,
                description=col.get("description", ""),
            )
        kind = TableKind(spec.get("kind", "confidential"))
        hierarchies = {
            h: tuple(level.lower() for level in levels)
            for h, levels in spec.get("hierarchies", {}).items()
        }
        tables[tname.lower()] = Table(
            name=tname.lower(),
            kind=kind,
            columns=MappingProxyType(columns),
            privacy_unit=spec["privacy_unit"].lower() if spec.get("privacy_unit") else None,
            key=spec["key"].lower() if spec.get("key") else None,
            hierarchies=MappingProxyType(hierarchies),
            protection=MappingProxyType(
                {}
                if kind is TableKind.PUBLIC
                else _floored(_rules(spec.get("protection"), top_rules))
            ),
            description=spec.get("description", ""),
            suppression=_suppression(spec.get("suppression")),
            dp=_dp_settings(spec.get("dp")) if _uses(doc, spec, "dp") else None,
        )
    users = {n: User(n, UserRole(u["role"])) for n, u in doc["users"].items()}
    budgets = tuple(
        Budget(
            user=b.get("user", "*"),
            table=b.get("table", "*").lower(),
            epsilon=_exact(b["epsilon"]) if "epsilon" in b else None,
            rho=_exact(b["rho"]) if "rho" in b else None,
            delta=_exact(b["delta"]) if "delta" in b else None,
        )
        for b in doc.get("budgets", [])
    )
    return Policy(
        tables=MappingProxyType(tables),
        users=MappingProxyType(users),
        document=MappingProxyType(copy.deepcopy(doc)),
        source=label,
        budgets=budgets,
        releases=tuple(dict.fromkeys(r.lower() for r in doc.get("releases", []))),
        statement_timeout=float(
            doc.get("limits", {}).get("statement_timeout_seconds", DEFAULT_STATEMENT_TIMEOUT)
        ),
        max_statement_characters=int(
            doc.get("limits", {}).get("max_statement_characters", DEFAULT_MAX_STATEMENT_CHARACTERS)
        ),
    )
