"""Permanent multiplicative noise per unit for magnitudes (EZS noise).

Evans, Zayatz & Slanta, "Using noise for disclosure limitation of establishment tabular data",
J. Official Statistics 14(4), 1998; Massell, Zayatz & Funk, PSD 2006 (digest
``seed_2006_microdata.md`` §17): every unit's contributions are multiplied by one factor m,
drawn once and kept, BEFORE any cell is aggregated. m has the split-triangular density
symmetric about 1, with 1 < a < b < 2 and k = 1/(b − a)²::

    f(x) = k·(x − (2 − b))   on (2 − b, 2 − a)
           0                 on [2 − a, a]
           −k·(x − b)        on (a, b)

so |m − 1| lies in [a − 1, b − 1] and E|m − 1| = (a − 1) + (b − a)/3. Why here: under the cell
key method a cell's noise is keyed by its set of contributors and scaled by its largest
contribution, so the cells ``pad_k ∪ {target}`` for many small paddings pad_k each draw new
noise of the target's scale around the exact sum, and their average less the paddings' own
sums converges on the target's value (red team s44j). With the factor, every such cell adds
x·m, and the average converges on x·m: never closer to x than (a − 1)·x, whatever the number
of queries (if a ≥ 1 + p/100 a one-unit cell is protected at p %, EZS).

The uniform behind m is a function of the unit's record key and the database's secret only:
the keyed mix of the statistic keys (:func:`sqlsdc.mechanisms.ckm.keyed_mix`) salted by
``unit:<table>.<column>``, a stream apart from every cell key's (one factor per unit and
measure, see :func:`salt_name`). :func:`factor` is the inverse of the distribution function,
which the rewrite (:mod:`sqlsdc.rewrite.unit_noise`) computes in SQL.
"""

from __future__ import annotations

import math

from sqlsdc.mechanisms.ckm import MIX_PRIME, MixKeys, keyed_mix
from sqlsdc.mechanisms.parameters import UnitNoise


def salt_name(measure: str) -> str:
    """The mix's salt of the factors of ``measure`` (``persons.income``).

    One factor per unit AND measure, where EZS draw one per company for all its variables: a
    measure the analyst knows exactly for some unit (employees from a public register) would
    otherwise give away that unit's factor, by the padded average x·m of that measure, and
    with it the exact value of every other measure of the unit. Nothing sqlsdc publishes needs
    the measures of one unit to share a factor (a sum of two columns is refused)."""
    return f"unit:{measure}"


def uniform(y: int) -> float:
    """The mix's output y in [0, p) as a uniform in (0, 1): (y + ½)/p."""
    return (y + 0.5) / MIX_PRIME


def factor(u: float, noise: UnitNoise) -> float:
    """The inverse distribution function of the split triangular at u in (0, 1).

    With s = sign(2u − 1): m = 1 + s·((b − 1) − (b − a)·√(1 − |2u − 1|)); for u ≥ ½ this is
    b − (b − a)·√(2 − 2u) (the right half, EZS's m = b − (b − a)·√U), for u < ½ its mirror
    2 − m, (2 − b) + (b − a)·√(2u)."""
    a, b = noise.a, noise.b
    t = 2 * u - 1
    return 1 + math.copysign(1.0, t) * ((b - 1) - (b - a) * math.sqrt(1 - abs(t)))


def cdf(x: float, noise: UnitNoise) -> float:
    """P(m ≤ x) of the split triangular."""
    a, b = noise.a, noise.b
    width = (b - a) ** 2
    if x <= 2 - b:
        return 0.0
    if x < 2 - a:
        return (x - (2 - b)) ** 2 / (2 * width)
    if x <= a:
        return 0.5
    if x < b:
        return 1 - (b - x) ** 2 / (2 * width)
    return 1.0


def unit_factor(record_key: int, measure: str, noise: UnitNoise, keys: MixKeys) -> float:
    """The factor m of the unit whose record key is ``record_key`` for ``measure``: what the
    rewrite computes in SQL (a reference for tests and for the back-end jobs)."""
    return factor(uniform(keyed_mix(record_key, salt_name(measure), keys)), noise)
