"""Load a policy from YAML, JSON or a dict, validate it, and build the typed model.

Validation runs in two layers: the JSON Schema (``schemas/policy.schema.json``) for shape, then
the cross-field rules the schema cannot express (bounds order, privacy unit declared, references
and hierarchies pointing at real columns). Every problem is reported as
``<file>: <path.inside.document>: <problem>``, all problems at once.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import yaml

from sqlsdc.errors import PolicyError
from sqlsdc.policy.model import (
    DEFAULT_MIN_FREQUENCY,
    AggregateKind,
    Column,
    ColumnRole,
    Method,
    Policy,
    ProtectionRule,
    Table,
    TableKind,
    User,
    UserRole,
)


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
        PolicyError: naming the file, the path inside it and each problem.

    Example:
        >>> doc = {"tables": {"t": {"kind": "public"}}, "users": {"a": {"role": "admin"}}}
        >>> p = load_policy(doc)
        >>> p.table("t").is_public
        True
    """
    document, label = _read(source, name)
    problems = [f"{label}: {p}" for p in validate_document(document)]
    if problems:
        raise PolicyError(problems)
    return _build(document, label)


def validate_document(document: Any) -> list[str]:
    """Return every problem of a parsed policy document as ``path: problem`` strings."""
    validator = jsonschema.Draft202012Validator(policy_schema())
    errors = sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.absolute_path)))
    problems = [f"{_path(e.absolute_path)}: {_describe(e)}" for e in errors]
    if problems:
        return problems
    return _semantic_problems(document)


def _read(source: str | Path | dict, name: str | None) -> tuple[Any, str]:
    if isinstance(source, dict):
        return source, name or "<policy>"
    text_is_document = isinstance(source, str) and ("\n" in source or source.lstrip()[:1] in "{")
    if text_is_document:
        label, text = name or "<policy>", source
    else:
        path = Path(source)
        label = name or path.name
        try:
            text = path.read_text("utf-8")
        except OSError as e:
            raise PolicyError([f"{label}: cannot read the policy file: {e.strerror}"]) from None
        except UnicodeDecodeError as e:
            raise PolicyError([f"{label}: not UTF-8 text (byte {e.start})"]) from None
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise PolicyError([f"{label}: {where}not valid YAML: {problem}"]) from None
    if document is None:
        raise PolicyError([f"{label}: the policy is empty"])
    return document, label


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing duplicate keys (YAML forbids them; PyYAML keeps the last)."""

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


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "(top level)"


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
        return f"expected {kind}, got {type(error.instance).__name__} {error.instance!r}"
    if v == "pattern":
        return f"{error.instance!r} is not a valid name (letters, digits, _; a letter first)"
    if v in ("minItems", "maxItems"):
        return f"expected {'at least' if v == 'minItems' else 'at most'} {kind} items"
    if v == "minProperties":
        return "must not be empty"
    if v == "minimum":
        return f"{error.instance!r} is below the minimum {kind}"
    if v == "uniqueItems":
        return "items must be unique"
    return error.message


def _semantic_problems(doc: dict) -> list[str]:
    problems: list[str] = []
    tables = {name.lower(): spec for name, spec in doc["tables"].items()}
    if dupes := _case_dupes(doc["tables"]):
        problems.append(f"tables: names differ only in case: {dupes}")
    for tname, spec in doc["tables"].items():
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
                    problems.append(
                        f"{cwhere}.references: {ref} is not a declared identifier column"
                    )
        if cname_dupes := _case_dupes(columns):
            problems.append(f"{where}.columns: names differ only in case: {cname_dupes}")
        roles = {c.lower(): v["role"] for c, v in columns.items()}
        if kind == "confidential":
            unit = spec.get("privacy_unit")
            if unit is None:
                problems.append(f"{where}: a confidential table needs a privacy_unit")
            elif roles.get(unit.lower()) != "identifier":
                problems.append(
                    f"{where}.privacy_unit: {unit!r} must be a declared column with role identifier"
                )
        else:
            for key in ("privacy_unit", "hierarchies", "protection"):
                if key in spec:
                    problems.append(f"{where}.{key}: not used for a public table")
        for hname, levels in spec.get("hierarchies", {}).items():
            for level in levels:
                if roles.get(level.lower()) != "dimension":
                    problems.append(
                        f"{where}.hierarchies.{hname}: {level!r} is not a declared dimension"
                    )
    if not any(u["role"] == "admin" for u in doc["users"].values()):
        problems.append("users: declare at least one user with role admin")
    return problems


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
            k = rule.get("min_frequency", default_k or base.min_frequency)
            rules[kind] = ProtectionRule(Method(rule["method"]), int(k))
        elif default_k is not None:
            rules[kind] = ProtectionRule(base.method, int(default_k))
        else:
            rules[kind] = base
    return rules


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
            hierarchies=MappingProxyType(hierarchies),
            protection=MappingProxyType(
                {} if kind is TableKind.PUBLIC else _rules(spec.get("protection"), top_rules)
            ),
            description=spec.get("description", ""),
        )
    users = {n: User(n, UserRole(u["role"])) for n, u in doc["users"].items()}
    return Policy(
        tables=MappingProxyType(tables),
        users=MappingProxyType(users),
        document=MappingProxyType(copy.deepcopy(doc)),
        source=label,
    )
