"""Build the perturbation tables a policy's CKM parameters name, and refuse unsafe ones.

Policy validation builds every table a policy uses (a table that cannot be built is a policy
problem, not a failure of every query), and the catalog stores the same tables when the policy is
applied; built tables are cached per process, as building one can take a second.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache

from sqlsdc.errors import PolicyError
from sqlsdc.mechanisms import ptable as pt
from sqlsdc.mechanisms.ckm import KEY_BITS, PUBLISHED_BITS, REMAINDER_FLOOR
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


def narrowest_window(
    spec: PTableSpec, p_small: float, mu_c: float, kind: str = "magnitudes"
) -> float:
    """The fewest integer keys a published sum's rounding leaves a candidate count (0: none).

    A published CKM sum has :data:`~sqlsdc.mechanisms.ckm.PUBLISHED_BITS` significant bits, a
    window of 2^-bits·|x̂| (at least) around the noise the analyst can infer for each candidate
    contributor count of a sum whose value the query pins; in the spread v + (u − ½)/step of
    an entry [lo, hi) that is ``step·(hi − lo)·2^-bits·|x̂|/|x_delta|`` keys. For a sum of
    either sign, |x̂|/|x_delta| is at least ``1 + v`` for a positive v (the running value is
    at least |x_delta|, or is x_delta itself once cellKey rescales it) and, for a negative v,
    ``1 − μ_c − |v|`` or :data:`~sqlsdc.mechanisms.ckm.REMAINDER_FLOOR`, whichever is larger
    (a value the noise would leave under that share of |x_delta| is published as 0, whose
    window holds every key of the crossing). Under one key, a window may hold no integer key:
    the wrong candidates are told apart from the true one, as with all 53 bits (red team
    s40a). Every row from i = 1 up is read: the lookup position is the running value's
    ``|x̂/x_delta|`` (τ-ARGUS, cellKey), 1 for a rescaled amplitude and at least 1 otherwise.
    A row under the last is read interpolated towards the next, whose entry may move v to
    either sign: the bound there is the floor's, |x̂|/|x_delta| >= REMAINDER_FLOOR (the demo's
    row 1: 53 keys at the least). The position is not the contribution's (never under
    ``1/p_small``), so the rows under ``1/p_small`` are read too (the demo's narrowest window,
    1.10 keys in its last row, is the same either way). ``p_small`` and ``mu_c`` are the
    rule's flex parameters.

    The bound covers sums of both signs, not only of one (x̂/|x_delta| ≥ 1/p_small − μ_c − |v|,
    0.46 for the demo: 1.01 keys): a sum of both signs below |x_delta| (x̂ = x·(1 − μ − |v|)
    once rescaled) would leave about 2^18 keys past each crossing of |v| = 1 − μ a window
    under one key: a sum of 28 from +1,000, −990 and 18 ones gave 40 published values for 40
    consecutive keys (red team s42h, ``tests/security/test_ckm_mixed_signs.py``). The floor
    makes the demo's narrowest window 1.10 keys (its entry v = −4 of row 4, 48,232 keys). Not
    bounded here: a top_k >= 2 sum of pinned contributions, whose second noise comes from the
    rotated key (the demo's enterprises held: the exact key sets of 134 pinned cells ruled out
    no candidate, red team s41a).

    ``kind`` "small_cells": a rule's small-cells ptable (a count table whose v is spread over
    1/step, looked up with x_delta 1 at a = |x̂| for contributions under the separation
    point), every row from 0 (small contributions reach them all): unchecked,
    ``small_cells: {D: 5, V: 1}`` beside the demo's own ptable would leave 0.0122 keys
    (entry v = -5 of row 5, 6,400 keys), ``{D: 3, V: 0.5}`` 0.580 (red team s43a). The
    bound of a positive v, 1 + v, is of a running value of at least x_delta (1 here): a sum
    of at least one unit; a sum under one unit is not bounded here."""
    first_row = 0 if kind == "small_cells" else 1
    half = 0.5 / spec.step
    narrowest = math.inf
    for table in generated(kind, spec):
        lo, hi = table.key_bounds(KEY_BITS)
        for entry, low, high in zip(table.rows, lo, hi, strict=True):
            if entry.i < first_row or high <= low:
                continue
            v = float(entry.v) - half  # the entry's lowest spread noise
            if entry.i < table.max_i:  # interpolated: only the floor bounds |x̂|
                ratio = REMAINDER_FLOOR
            else:
                ratio = 1 + v if v > 0 else max(REMAINDER_FLOOR, 1 - mu_c + v)
            keys = spec.step * int(high - low) * 2.0**-PUBLISHED_BITS * ratio
            narrowest = min(narrowest, keys)
    return narrowest


def check_published_bits(
    spec: PTableSpec, p_small: float, mu_c: float, kind: str = "magnitudes"
) -> None:
    """Refuse magnitude parameters under which a published sum's last bits tell a pinned
    sum's count: a rounding window (:func:`narrowest_window`) of less than one key. The demo's
    ptable (D 4, V 1, step 12, p_small 0.2, mu_c 0.5) leaves 1.10; D 4, V 0.5 left 0.0009,
    and one query told 11 municipality x age counts exactly beyond what the noise's scale
    tells, and ruled a candidate out for 366 of 3,985 cells (red team s41a). ``kind``
    "small_cells" checks a rule's small-cells ptable likewise (red team s43a)."""
    keys = narrowest_window(spec, p_small, mu_c, kind)
    if keys < 1:
        what = "small-cells ptable" if kind == "small_cells" else "magnitude ptable"
        raise PolicyError(
            [
                f"{what} {_params(spec)} with p_small {p_small:g} and mu_c {mu_c:g}: "
                f"a published sum's {PUBLISHED_BITS} significant bits leave some candidate "
                f"counts a window of {keys:.3g} keys (fewer than one), so that a sum of values "
                "a query pins would tell its count; use a larger V or a smaller D (no entries of "
                "so low a probability), e.g. ptable {D: 4, V: 1, step: 12} with p_small 0.2 and "
                "mu_c 0.5"
            ]
        )


def _params(spec: PTableSpec) -> str:
    return json.dumps(spec.as_dict(), sort_keys=True)
