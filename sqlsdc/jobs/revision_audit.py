"""The joint audit of two versions of a suppression job: the difference table read through both
patterns at once.

:mod:`sqlsdc.jobs.revisions` makes a cell whose difference from an earlier version fails the
job's rules a primary of the new version, protected with the difference's levels as if the
earlier value were a constant its readers hold. A cell hidden in both versions has no such
constant, and its difference is then given by the two patterns together: the difference table
``D = x_new − x_old`` is additive, its cells published in both versions are known exactly, and
a reader who follows the business register knows which cells only gained units (``D ≥ 0``),
only lost some (``D ≤ 0``) or did not change (``D = 0``). Red team s42k: one firm (1,234,567)
entered a hidden cell of row A, three firms another cell of that row; the row total and that
cell changed by four and three units (both published), the hidden cells beside the firm's did
not change, and the two versions gave the firm's turnover exactly, with every cell of either
version protected on its own. This is the linked-tables case of Hundepool et al. (2012,
*Statistical Disclosure Control*, 4.5: cells derivable by subtraction are cells of the
difference table), audited as :mod:`sqlsdc.tabular.attacker` audits one table: the variables
are the hidden cells of the old version, of the new one and of ``D``, the equations
``A x_old = 0``, ``A x_new = 0`` and ``x_new − x_old − D = 0``, and the bounds the reader
holds. Every primary of the new version (the job's own, at its levels on ``x_new``; a
revision, at the difference's levels on ``D``) must reach its levels; the job is refused
otherwise (fail closed: the pattern does not aim at the joint table).

The attacker is given the signs of every cell's change, the most a reader of the register can
know; the earlier versions audited are the stored outputs of the job's cells and dimensions
whose kept units (``sqlsdc.job_units``) give their originals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import sparse

from sqlsdc.errors import TabularError
from sqlsdc.jobs.revisions import S, Units, version_changes
from sqlsdc.tabular.attacker import ProtectionCheck
from sqlsdc.tabular.model import Table

if TYPE_CHECKING:
    from sqlsdc.jobs.job import Job


def audit_revisions(
    job: Job,
    table: Table,
    hidden: np.ndarray,
    found,
    revised,
    units: Units,
    earlier: list[tuple[str, pd.Series]],
    time_limit: float,
    replaced: Sequence = (),
) -> None:
    """Refuse the new pattern (``hidden``: bool per cell of ``table``) when a primary of it is
    not protected in the joint table of it and an ``earlier`` version (``(output name, its
    status per cell of table)``; its published values are its originals, which its kept units
    give): ``found`` the job's own primaries and levels, ``revised`` the revision rule (or
    None). ``replaced``: the versions no output holds now
    (:class:`~sqlsdc.jobs.replaced_suppressions.Replaced`), audited alike."""
    versions = [(name, status, _query_id(job, name)) for name, status in earlier]
    versions += [(v.label, v.status, v.query_id) for v in replaced]
    for name, status, query_id in versions:
        if query_id is None:
            continue
        changes = version_changes(job, table, query_id, units)
        if changes is None:  # no units kept of it: revisions.unknown_revisions hid its changes
            continue
        if _disjoint(job, query_id, units):
            continue  # other people under the name (R02's table replacing R01's): no revision
        shown_before = (status == "published").to_numpy()
        _audit_pair(table, hidden, found, revised, shown_before, changes, name, time_limit)


def _query_id(job: Job, name: str) -> int | None:
    """The query id of the job that stored the output ``name`` now, or None."""
    found = job.con.execute(
        f"SELECT query_id FROM {S}.outputs WHERE lower(name) = lower(?)", [name]
    ).fetchall()
    return found[0][0] if found else None


def _disjoint(job: Job, query_id: int, units: Units) -> bool:
    """Whether the version stored by ``query_id`` kept units and none of them is a unit of
    the job now: the two tables count other people, whose cells share only their codes, and
    no cell of one is a revision of the other's (red team s42c's R01 table replaced by R02's
    was refused here as "its units do not add up in this table")."""
    kept = job.con.execute(
        f"SELECT DISTINCT unit FROM {S}.job_units WHERE query_id = ?", [query_id]
    ).fetchall()
    return bool(kept) and not {unit for (unit,) in kept} & set(units.frame["unit"])


def _audit_pair(table, hidden, found, revised, shown_before, changes, name, time_limit):
    """One earlier version: the joint LP of the module docstring, each primary checked."""
    c = len(table.cells)
    delta, gained, lost = changes
    old = table.values - delta
    if not np.allclose(table.A @ old, 0.0, atol=1e-6 * max(1.0, float(np.abs(old).max()))):
        raise TabularError(  # its originals do not add up in this table: not the same cells
            f"{name} and this job tabulate the same cells, but its units do not add up in this "
            "table: the joint audit of the two versions cannot be built. Tabulate another "
            "population (a WHERE of its own), or drop the earlier output first"
        )
    A = table.A.tocsr()
    eye = sparse.identity(c, format="csr")
    zero = sparse.csr_matrix((A.shape[0], c))
    joint = sparse.vstack([
        sparse.hstack([A, zero, zero]),
        sparse.hstack([zero, A, zero]),
        sparse.hstack([-eye, eye, -eye]),
    ]).tocsr()  # fmt: skip
    values = np.concatenate([old, table.values, delta])
    floor = -np.inf if table.negative else 0.0
    lower = np.concatenate([np.full(2 * c, floor), np.where(gained & ~lost, 0.0, -np.inf)])
    upper = np.concatenate([np.full(2 * c, np.inf), np.where(lost & ~gained, 0.0, np.inf)])
    unchanged = ~gained & ~lost
    suppressed = np.concatenate([~shown_before, hidden, ~unchanged])
    upl, lpl = np.zeros(3 * c), np.zeros(3 * c)
    targets = []
    own = np.flatnonzero(found.primary & hidden)
    upl[c + own], lpl[c + own] = found.upl[own], found.lpl[own]
    targets.extend((c + own).tolist())
    if revised is not None:
        cells = np.flatnonzero(revised.cells & hidden & ~unchanged)
        upl[2 * c + cells], lpl[2 * c + cells] = revised.upl[cells], revised.lpl[cells]
        targets.extend((2 * c + cells).tolist())
    if not targets:
        return
    check = ProtectionCheck(joint, values, upl, lpl, lower=lower, upper=upper)
    met = check.met(suppressed, np.asarray(targets), time_limit=time_limit)
    if met.all():
        return
    at = targets[int(np.flatnonzero(~met)[0])] % c
    codes = {d: str(table.cells[d].iloc[at]) for d in table.dims}
    raise TabularError(
        f"this version and {name} together give cell {codes} (or its change) closer than its "
        "protection level: a cell hidden in both versions is still the difference of cells "
        "published in both (a reader who knows which cells only gained units reads it off). "
        "Tabulate the new data as a population of its own (a WHERE on its period), or hide "
        "more with a stricter rule"
    )
