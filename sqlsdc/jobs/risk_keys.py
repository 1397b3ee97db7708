"""The key variables of an anonymisation job's risk report against the policy's hierarchies.

The report measures k-anonymity and the individual risk on the key variables the admin names
(``--keys``): an intruder who knows a person's values of them finds the records showing them.
A neighbour who knows a person's region knows the municipality too, and a file that shows the
municipality is read by it: with ``region`` as a key and ``municipality`` in the file, the
report's "records with fk < 3: 0" says nothing of the records unique by municipality (red team
s47i: ``anonymize --help``'s own example, keys region, sex, age, education at k = 3, left
1,466 of the demo's 20,000 persons unique on municipality, sex, age band and education).
So keys that name a level of a declared hierarchy must name the finest level the file holds
(Hundepool et al., *Statistical Disclosure Control*, 2012, §3.3: the key variables are those
an intruder can know, at the detail the file gives them).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlsdc.errors import MicrodataError
from sqlsdc.policy import Policy

__all__ = ["refuse_coarse_keys", "source_columns"]


def source_columns(roots: dict, columns: Sequence[str]) -> dict[str, tuple[set[str], str | None]]:
    """Each of ``columns`` of a ``--sql`` query with the names of the policy tables' columns it
    is computed from, and the one column it is a plain copy of (a rename, through CTEs and
    subqueries) or None, from the query's sqlglot column lineage ``roots`` (the identifier
    check's trace, :func:`sqlsdc.jobs.anonymize.read_records`). So ``municipality AS place`` is
    known for the municipality it shows (red team s47o: keys region, sex, age, education passed
    beside ``place`` with "records with fk < 3: 0", and 1,460 of the 20,000 persons were unique
    by place, sex, age band, education). A column that cannot be traced keeps its own name only
    (the identifier check has refused such a query before this runs)."""
    from sqlglot import exp
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

    def plain(node) -> bool:
        expression = node.expression
        if isinstance(expression, exp.Alias):
            expression = expression.this
        return isinstance(expression, exp.Column | exp.Table)

    out = {}
    for column in columns:
        root = roots.get(normalize_identifiers(exp.to_identifier(column), dialect="duckdb").name)
        if root is None:
            out[str(column)] = (set(), None)
            continue
        nodes = list(root.walk())
        leaves = {node.name.split(".")[-1].lower() for node in nodes
                  if isinstance(node.source, exp.Table)
                  and isinstance(node.expression, exp.Table)}  # fmt: skip
        copy = next(iter(leaves)) if len(leaves) == 1 and all(map(plain, nodes)) else None
        out[str(column)] = (leaves, copy)
    return out


def refuse_coarse_keys(
    policy: Policy,
    source: str | None,
    columns: Sequence[str],
    keys: Sequence[str],
    sources: dict[str, tuple[set[str], str | None]] | None = None,
) -> None:
    """Refuse ``keys`` that hold a level of a hierarchy of the policy but not the finest level
    of it among the file's ``columns`` (``source``'s hierarchies, or every table's for a
    query). ``sources`` (:func:`source_columns`) gives each column the source columns it
    shows and the one it copies: the file shows a level wherever a column is computed from it
    (``substr(municipality, 1, 3)`` too: fail closed), a key names a level only as a copy of
    it (``municipality AS place``), not as a coarsening of it; the keys hold the finest level
    when one is a copy of it or every column computed from it is a key.

    Raises:
        MicrodataError: naming the hierarchy, the key and the finer column, and what to write.
    """
    sources = sources or {}
    held: dict[str, list[str]] = {}  # a source column the file shows -> the columns showing it
    for column in columns:
        shows, _copy = sources.get(str(column), (set(), None))
        for level in sorted(shows | {str(column).lower()}):
            held.setdefault(level, []).append(str(column))
    named: dict[str, str] = {}  # a level a key is (itself or a plain copy of it) -> the key
    for key in keys:
        _shows, copy = sources.get(str(key), (set(), None))
        for level in {str(key).lower(), copy} - {None}:
            named.setdefault(level, str(key))
    table = policy.table(source) if source else None
    tables = [table] if table is not None else list(policy.tables.values())
    for t in tables:
        for hierarchy, levels in t.hierarchies.items():
            present = [level for level in levels if level in held]
            if not present or not set(named) & set(levels) or present[-1] in named:
                continue
            showing = [c for c in held[present[-1]] if c not in {str(k) for k in keys}]
            if not showing:  # every column computed from the finest level is a key itself
                continue
            coarse = named[next(level for level in levels if level in named)]
            finer = showing[0]
            raise MicrodataError(
                f"the risk would be measured on {coarse} while the file shows {finer}, "
                f"a finer level of it (hierarchy {hierarchy} of {t.name}), and whoever knows "
                f"a person's {coarse} may know their {finer} as well (a neighbour knows "
                f"both): add {finer} to --keys (and to the suppress step), or leave it "
                f"out of the file (--sql SELECT without it)"
            )
