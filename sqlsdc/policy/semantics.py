"""The cross-field rules of a policy that its JSON Schema cannot express.

Bounds in order, a privacy unit declared where a table is confidential, references and
hierarchies pointing at real columns, names unique without regard to case, DP settings that
fit their method, suppression universes and rules that parse, dominance and primary rules in
range. Each table is checked on its own and the rest once (:func:`semantic_checks`), so a part
with a wrong shape does not hide the problems of the others. Problems are ``path: problem``
strings, as :func:`sqlsdc.policy.validate.validate_document` reports them.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlsdc.mechanisms.accountant import Bounding
from sqlsdc.policy.build import dp_settings, exact, uses_method
from sqlsdc.policy.model import MAX_DOMINANCE_TOP, GroupKeys
from sqlsdc.policy.rule_syntax import rule_arguments


def semantic_checks(doc: dict, malformed: set[str]) -> list[Callable[[], list[str]]]:
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
        if "classes_of" in col:
            problems += _classes_problems(cwhere, col, columns)
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
    elif "key" in spec and spec["key"].lower() not in roles:  # validated, then refused by apply
        problems.append(f"{where}.key: {spec['key']!r} is not a declared column of this table")
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
        problems += _dp_problems(where, spec, uses_method(doc, spec, "dp"))
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


def _classes_problems(where: str, col: dict, columns: dict) -> list[str]:
    """A dimension declared the class of a measure (``classes_of``): the measure a measure or
    weight of the same table, the breaks ascending, one label more than breaks, the domain
    (when declared) the labels."""
    spec, where = col["classes_of"], f"{where}.classes_of"
    problems = []
    if col["role"] != "dimension":
        problems.append(f"{where}: only a dimension may be the class of a measure")
    roles = {c.lower(): v.get("role") for c, v in columns.items()}
    measure = spec["measure"]
    if roles.get(measure.lower()) not in ("measure", "weight"):
        problems.append(
            f"{where}.measure: {measure!r} is not a declared measure or weight of this table"
        )
    breaks, labels = spec["breaks"], spec["labels"]
    if any(a >= b for a, b in zip(breaks, breaks[1:], strict=False)):
        problems.append(f"{where}.breaks: must be ascending, got {breaks}")
    if len(labels) != len(breaks) + 1:
        problems.append(
            f"{where}.labels: {len(breaks)} breaks make {len(breaks) + 1} classes, "
            f"got {len(labels)} labels"
        )
    if "domain" in col and set(col["domain"]) != set(labels):
        problems.append(f"{where}.labels: must be the dimension's domain {col['domain']}")
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
    problems += _per_user_and_table(doc, tables, "budgets", "a budget", "budget")
    problems += _per_user_and_table(doc, tables, "cell_limits", "a cell limit", "cell limit")
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
    return uses_method(doc, spec, "suppress")


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


def _dp_problems(where: str, spec: dict, uses_dp: bool) -> list[str]:
    """Bounding settings that :class:`Bounding` accepts, on a table that uses DP."""
    settings = spec.get("dp")
    if settings is None:
        return []
    if not uses_dp:
        return [f"{where}.dp: only used when counts or magnitudes use method dp"]
    problems = []
    dp = dp_settings(settings)
    if dp.groups is GroupKeys.PRIVATE and dp.selection_epsilon is None:
        problems.append(
            f"{where}.dp.selection: private groups need `selection: {{epsilon: .., delta: ..}}`"
        )
    if dp.groups is GroupKeys.PUBLIC and dp.selection_epsilon is not None:
        problems.append(f"{where}.dp.selection: only used with `groups: private`")
    for cname, col in spec.get("columns", {}).items():
        if col.get("bounds") and col["role"] == "measure":
            try:
                Bounding(lower=exact(col["bounds"][0]), upper=exact(col["bounds"][1]),
                         granularity=dp.granularity)  # fmt: skip
            except ValueError as e:
                problems.append(f"{where}.columns.{cname}.bounds: {e}")
    return problems


def _case_dupes(mapping: dict) -> str:
    seen: dict[str, str] = {}
    dupes = []
    for key in mapping:
        if key.lower() in seen:
            dupes.append(f"{seen[key.lower()]}/{key}")
        seen[key.lower()] = key
    return ", ".join(dupes)


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
        "unit_noise",
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
    noise = rule.get("unit_noise")
    if isinstance(noise, dict) and not noise.get("a", 0) < noise.get("b", 0):
        problems.append(
            f"{where}.unit_noise: needs a < b (the factors lie in (2 - b, 2 - a) and (a, b)), "
            f"got a = {noise.get('a')}, b = {noise.get('b')}"
        )
    if rule.get("ptable", {}).get("parity") and top_k > 1:
        problems.append(f"{where}.ptable.parity: even/odd tables need top_k = 1")
    return problems


def _per_user_and_table(doc: dict, tables, section: str, one: str, each: str) -> list[str]:
    """Problems of the entries of ``section`` (budgets, cell limits): a user or table the
    policy does not declare, and two entries for one user and table (and period, for cell
    limits), the later of which replaced the earlier silently."""
    problems, seen = [], {}
    for i, entry in enumerate(doc.get(section, [])):
        where = f"{section}.{i}"
        if entry.get("table", "*") != "*" and entry["table"].lower() not in tables:
            problems.append(f"{where}.table: table {entry['table']!r} is not declared")
        if entry.get("user", "*") not in ("*", *doc["users"]):
            problems.append(f"{where}.user: user {entry['user']!r} is not declared")
        period = entry.get("per", "day" if section == "cell_limits" else "")
        key = (entry.get("user", "*"), entry.get("table", "*").lower(), period)
        if key in seen:
            per = f" per {key[2]}" if key[2] else ""
            problems.append(
                f"{where}: user {key[0]!r} on table {key[1]!r} has {one}{per} already "
                f"({section}.{seen[key]}); give each user and table one {each}{per}"
            )
        seen.setdefault(key, i)
    return problems
