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

__all__ = ["refuse_coarse_keys"]


def refuse_coarse_keys(
    policy: Policy, source: str | None, columns: Sequence[str], keys: Sequence[str]
) -> None:
    """Refuse ``keys`` that hold a level of a hierarchy of the policy but not the finest level
    of it among the file's ``columns`` (by name; ``source``'s hierarchies, or every table's for
    a query).

    Raises:
        MicrodataError: naming the hierarchy, the key and the finer column, and what to write.
    """
    held = {str(c).lower() for c in columns}
    named = {str(k).lower() for k in keys}
    table = policy.table(source) if source else None
    tables = [table] if table is not None else list(policy.tables.values())
    for t in tables:
        for hierarchy, levels in t.hierarchies.items():
            present = [level for level in levels if level in held]
            if not present or not named & set(levels) or present[-1] in named:
                continue
            coarse = next(level for level in levels if level in named)
            raise MicrodataError(
                f"the risk would be measured on {coarse} while the file shows {present[-1]}, "
                f"a finer level of it (hierarchy {hierarchy} of {t.name}), and whoever knows "
                f"a person's {coarse} may know their {present[-1]} as well (a neighbour knows "
                f"both): add {present[-1]} to --keys (and to the suppress step), or leave it "
                f"out of the file (--sql SELECT without it)"
            )
