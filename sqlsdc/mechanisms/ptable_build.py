"""Build the perturbation tables a policy's CKM parameters name, and refuse unsafe ones.

Policy validation builds every table a policy uses (a table that cannot be built is a policy
problem, not a failure of every query), and the catalog stores the same tables when the policy is
applied; built tables are cached per process, as building one can take a second.
"""

from __future__ import annotations

import json
from functools import lru_cache

from sqlsdc.errors import PolicyError
from sqlsdc.mechanisms import ptable as pt
from sqlsdc.mechanisms.parameters import PTableSpec

MAX_EXACT_DIFFERENCE = 0.05  # largest Σ p(v)² of a magnitude ptable row (differencing)


@lru_cache(maxsize=64)
def generate(kind: str, spec: PTableSpec) -> pt.PTable:
    """Build the ptable of ``spec``: counts and small cells as count tables, magnitudes as
    magnitude tables (even and odd rows when ``parity``)."""
    common = dict(
        D=spec.D, V=spec.V, js=spec.js, pstay=spec.pstay, optim=spec.optim, mono=spec.mono
    )
    if kind in ("counts", "small_cells"):
        return pt.count_ptable(**common)
    return pt.magnitude_ptable(**common, step=spec.step, type="even" if spec.parity else "all")


def generated(kind: str, spec: PTableSpec) -> list[pt.PTable]:
    """The tables of ``spec``: one, or the even and the odd table of a parity magnitude table."""
    tables = [generate(kind, spec)]
    if kind == "magnitudes" and spec.parity:
        common = dict(D=spec.D, V=spec.V, js=spec.js, pstay=spec.pstay, optim=spec.optim)
        tables.append(pt.magnitude_ptable(**common, mono=spec.mono, step=spec.step, type="odd"))
    return tables


@lru_cache(maxsize=64)
def check_differencing(kind: str, spec: PTableSpec) -> None:
    """Refuse a magnitude ptable under which differencing gives exact values too often.

    Two cells that differ by one unit and share their largest contributor publish that unit's
    exact value when both draw the same noise, with probability
    :func:`~sqlsdc.mechanisms.ptable.exact_difference_probability` (Σ p(v)² of a row). It
    must not exceed :data:`MAX_EXACT_DIFFERENCE`; a finer noise grid (``step``) lowers it.
    """
    if kind != "magnitudes":
        return
    chance = max(pt.exact_difference_probability(t) for t in generated(kind, spec))
    if chance > MAX_EXACT_DIFFERENCE:
        raise PolicyError(
            [
                f"magnitude ptable {_params(spec)}: two cells differing by one unit draw the same "
                f"noise with probability {chance:.3f} (above {MAX_EXACT_DIFFERENCE}), so their "
                "difference would reveal that unit's exact value; use a finer noise grid, "
                "e.g. ptable {D: 4, V: 1, step: 12} (probability 0.038)"
            ]
        )


def _params(spec: PTableSpec) -> str:
    return json.dumps(spec.as_dict(), sort_keys=True)
