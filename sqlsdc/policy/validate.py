"""Validating a parsed policy document: every problem at once, as ``path: problem`` strings.

One pass (:func:`validate_document`): the JSON Schema (``schemas/policy.schema.json``) for
shape and ranges, with messages that say what to write instead; every number finite; exact
amounts (epsilon, rho, delta, granularity) parsed by a bounded parser (never evaluated) and
inside :data:`AMOUNT_RANGES`; the cross-field rules (:mod:`sqlsdc.policy.semantics`). Checks of
a part whose shape is wrong are skipped, its shape problem reported instead. Every
perturbation table of a CKM rule is built and checked against differencing
(:func:`ptable_problems`), since one that cannot be built would fail every query of its table.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from sqlsdc.errors import PolicyError
from sqlsdc.mechanisms.ptable_build import check_differencing, check_published_bits, generate
from sqlsdc.policy.build import exact, ptable_spec
from sqlsdc.policy.model import AggregateKind, Method
from sqlsdc.policy.read import MAX_DEPTH, MAX_NODES
from sqlsdc.policy.semantics import semantic_checks

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
    problems = [f"{_path(_located_path(e))}: {_describe(e)}" for e in errors]
    problems += _finite_problems(document)
    if not isinstance(document, dict):
        return problems
    problems += _amount_problems(document, {_path(e.absolute_path) for e in errors})
    found_before = bool(problems)
    malformed = {str(e.absolute_path[1]) for e in errors
                 if len(e.absolute_path) > 1 and e.absolute_path[0] == "tables"}  # fmt: skip
    for check in semantic_checks(document, malformed):
        try:
            problems += check()
        except (KeyError, TypeError, AttributeError, ValueError, IndexError):
            if not found_before:
                raise  # a valid shape must never crash a check: this is a bug
    return problems


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
            amount = exact(value, where)
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


def ptable_problems(document: Any, found: list[str]) -> list[str]:
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
                    ptable = ptable_spec(spec)
                    flex = _flex(rule) if kind is AggregateKind.MAGNITUDES else None
                except (KeyError, TypeError, ValueError):
                    continue  # its shape problem is in ``found``
                if (table_kind, ptable, flex) in seen:
                    continue
                seen.add((table_kind, ptable, flex))
                try:
                    generate(table_kind, ptable)
                    check_differencing(table_kind, ptable)
                    if flex is not None:  # its small-cells ptable too (red team s43a)
                        check_published_bits(ptable, *flex, table_kind)
                except PolicyError as e:
                    problems += [f"{path}: {p}" for p in e.problems]
                except ValueError as e:
                    problems.append(f"{path}: the ptable cannot be built: {e}")
    return problems


def _flex(rule: dict) -> tuple[float, float] | None:
    """``(p_small, mu_c)`` of a magnitude CKM rule, which the published sum's rounding window
    depends on beside its ptable (mu_c 0 when no cell is sensitive, ``sensitive_below`` 0);
    None without a usable flex function or with a value that is not a finite number (a problem
    of its own, reported by the schema or :func:`_finite_problems`)."""
    flex = rule.get("flex")
    if not isinstance(flex, dict) or "p_small" not in flex:
        return None
    try:  # ``sensitive_below: .inf`` was an internal error (OverflowError) here, not a problem
        p_small = float(flex["p_small"])
        mu_c = float(rule.get("mu_c", 0.0)) if float(rule.get("sensitive_below", 0)) > 0 else 0.0
    except (TypeError, ValueError):
        return None  # a shape problem of its own
    if not (math.isfinite(p_small) and math.isfinite(mu_c)):
        return None  # reported as not finite
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


def _located_path(error: jsonschema.ValidationError) -> list:
    """The path of a schema violation, down to the key for a bad key name (``propertyNames``:
    jsonschema gives the mapping's path, so every bad user name was placed on ``users:``)."""
    parts = list(error.absolute_path)
    if "propertyNames" in error.absolute_schema_path and isinstance(error.instance, str):
        parts.append(error.instance)
    return parts


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
        if error.instance is None:  # `key:` with nothing after it ("got NoneType None")
            found = f"expected {kind}, got no value (null)"
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
    if v == "oneOf" and error.schema is policy_schema()["$defs"]["amount"]:
        # jsonschema's "... is not valid under any of the given schemas" said nothing usable
        return (
            f"{_yaml_value(error.instance)} is not a positive number: write e.g. 0.5, 1e-6 or 1/3"
        )
    if v == "anyOf" and all(list(branch) == ["required"] for branch in kind):
        keys = [branch["required"][0] for branch in kind]
        return f"names none of {', '.join(keys)}: give at least one"
    return error.message


def _yaml_value(value: Any) -> str:
    """A value as the policy's YAML writes it (true, null, a date), not as Python's repr."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float, str)):
        return repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return str(value)


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
