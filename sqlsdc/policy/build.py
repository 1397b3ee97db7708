"""Building the typed policy model (:mod:`sqlsdc.policy.model`) from a validated document.

Runs only on a document that :mod:`sqlsdc.policy.validate` found without problems, so it reads
keys without checking them. Exact amounts (epsilon, rho, delta, granularity) become fractions
as written (:func:`exact`: 0.1 is one tenth, never a float's binary value); names are lower
case, as the engines see them; protection rules inherit the policy-wide ones.
"""

from __future__ import annotations

import copy
import dataclasses
from fractions import Fraction
from types import MappingProxyType

from sqlsdc.mechanisms.accountant import PrivacyCost, parse_exact
from sqlsdc.mechanisms.ckm import mean_below
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.policy.model import (
    DEFAULT_DOMINANCE,
    DEFAULT_MAX_STATEMENT_CHARACTERS,
    DEFAULT_MIN_FREQUENCY,
    DEFAULT_STATEMENT_TIMEOUT,
    AggregateKind,
    Budget,
    CellLimit,
    ClassesOf,
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


def uses_method(doc: dict, spec: dict, method: str) -> bool:
    """Whether a table's counts or magnitudes use ``method`` (own rule or inherited)."""
    own, top = spec.get("protection", {}), doc.get("protection", {})
    return any(
        (own.get(kind) or top.get(kind) or {}).get("method") == method
        for kind in ("counts", "magnitudes")
    )


def exact(value, name: str = "value") -> Fraction:
    """A policy number as an exact fraction: 0.1 means one tenth, as written (a float's
    shortest text; strings through the bounded parser, never evaluated)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"expected a number, got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    return parse_exact(str(value), name)


def dp_settings(spec: dict | None) -> DpSettings:
    spec = spec or {}
    selection = spec.get("selection", {})
    return DpSettings(
        max_groups=int(spec.get("max_groups", 1)),
        max_rows=int(spec.get("max_rows", 1)),
        max_rows_per_unit=spec.get("max_rows_per_unit"),
        granularity=exact(spec.get("granularity", 1)),
        groups=GroupKeys(spec.get("groups", "public")),
        selection_epsilon=exact(selection["epsilon"]) if selection else None,
        selection_delta=exact(selection["delta"]) if selection else None,
        min_frequency=spec.get("min_frequency"),
        bounding_report=_spend(spec["bounding_report"]) if spec.get("bounding_report") else None,
    )


def _spend(spec: dict) -> PrivacyCost:
    return PrivacyCost(**{kind: exact(v) for kind, v in spec.items()})


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
            small_cells=ptable_spec(rule["small_cells"]) if "small_cells" in rule else None,
            unit_noise=_unit_noise(rule.get("unit_noise")),
        )
    return ProtectionRule(method, k, ptable_spec(rule["ptable"]), magnitude)


def _classes_of(spec: dict | None) -> ClassesOf | None:
    if spec is None:
        return None
    return ClassesOf(
        measure=spec["measure"].lower(),
        breaks=tuple(spec["breaks"]),
        labels=tuple(spec["labels"]),
    )


def _unit_noise(spec: dict | None) -> UnitNoise | None:
    return None if spec is None else UnitNoise(a=float(spec["a"]), b=float(spec["b"]))


def _suppression(spec: dict | None) -> Suppression | None:
    if spec is None:
        return None
    return Suppression(
        dimensions=tuple(d.lower() for d in spec["dimensions"]),
        secondary=SecondaryMethod(spec.get("secondary", "gauss")),
        cost=spec.get("cost", "value"),
        time_limit=float(spec.get("time_limit", 60.0)),
        singleton=spec.get("singleton", "anySumAudit"),
    )


def ptable_spec(spec: dict) -> PTableSpec:
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


def build_policy(doc: dict, label: str, marks: dict | None = None) -> Policy:
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
                classes_of=_classes_of(col.get("classes_of")),
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
            dp=dp_settings(spec.get("dp")) if uses_method(doc, spec, "dp") else None,
        )
    users = {n: User(n, UserRole(u["role"])) for n, u in doc["users"].items()}
    budgets = tuple(
        Budget(
            user=b.get("user", "*"),
            table=b.get("table", "*").lower(),
            epsilon=exact(b["epsilon"]) if "epsilon" in b else None,
            rho=exact(b["rho"]) if "rho" in b else None,
            delta=exact(b["delta"]) if "delta" in b else None,
        )
        for b in doc.get("budgets", [])
    )
    cell_limits = tuple(
        CellLimit(
            user=c.get("user", "*"),
            table=c.get("table", "*").lower(),
            cells=int(c["cells"]),
            per=c.get("per", "day"),
        )  # fmt: skip
        for c in doc.get("cell_limits", [])
    )
    return Policy(
        tables=MappingProxyType(tables),
        users=MappingProxyType(users),
        document=MappingProxyType(copy.deepcopy(doc)),
        source=label,
        marks=MappingProxyType(_marks(marks or {})),
        budgets=budgets,
        cell_limits=cell_limits,
        releases=tuple(dict.fromkeys(r.lower() for r in doc.get("releases", []))),
        statement_timeout=float(
            doc.get("limits", {}).get("statement_timeout_seconds", DEFAULT_STATEMENT_TIMEOUT)
        ),
        max_statement_characters=int(
            doc.get("limits", {}).get("max_statement_characters", DEFAULT_MAX_STATEMENT_CHARACTERS)
        ),
    )


def _marks(marks: dict) -> dict:
    """The marks of the source text, also under the lower-case path (the model's names, which
    the problems found in the database name; names never differ only in case)."""
    return {**{tuple(str(p).lower() for p in path): at for path, at in marks.items()}, **marks}
