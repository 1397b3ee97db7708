"""The cell key method on single cells, in plain Python: the reference the SQL rewrite must match.

``perturb_count`` and ``perturb_magnitude`` restate, cell by cell, what
:mod:`sqlsdc.rewrite.ckm` computes in SQL for whole tables; tests compare the two on real data.
Definitions: Geyer, Tent, Reiffert, Giessing (PSD 2022) §2 and the sdcTools ``cellKey`` package
(``.perturb_cell_flex``, ``.para_m``, ``.lookup_v_flex``, ``.scramble_ckeys``), with the integer
keys of sqlsdc: a cell key is an integer in [0, 2^32) and a ptable row's entries carry integer
intervals [lo, hi).
"""

from __future__ import annotations

import hashlib
import hmac
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sqlsdc.mechanisms.parameters import MagnitudeCkm, PTableSpec

KEY_BITS = 32


@dataclass(frozen=True)
class Lookup:
    """A stored ptable as arrays: rows by (type, i) with the entries' [lo, hi) and noise v.

    ``step`` is the table's number of noise steps per unit (``PTableSpec.step``); when given,
    magnitude lookups spread v uniformly over its grid cell (see :meth:`interpolated`).
    """

    type: np.ndarray
    i: np.ndarray
    v: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    step: int = 0

    @classmethod
    def from_table(cls, table, step: int = 0) -> Lookup:
        """From an Arrow table or DataFrame with columns type, i, v, lo, hi."""
        get = (lambda c: table.column(c).to_numpy()) if hasattr(table, "column") else table.get
        return cls(*(np.asarray(get(c)) for c in ("type", "i", "v", "lo", "hi")), step=step)

    @property
    def classes(self) -> list[float]:
        return sorted(set(self.i.tolist()))

    def value(self, kind: str, i: float, key: int) -> float:
        return self.entry(kind, i, key)[0]

    def entry(self, kind: str, i: float, key: int) -> tuple[float, float]:
        """(v, u): the noise of the entry whose [lo, hi) holds ``key``, and where in it the key
        lies, u = (key − lo) / (hi − lo) in [0, 1)."""
        hit = (self.type == kind) & (self.i == i) & (self.lo <= key) & (key < self.hi)
        if hit.sum() != 1:
            raise LookupError(f"no unique ptable entry for type={kind} i={i} key={key}")
        lo, hi = float(self.lo[hit][0]), float(self.hi[hit][0])
        return float(self.v[hit][0]), (key - lo) / (hi - lo)

    def interpolated(self, kind: str, a: float, key: int) -> float:
        """v at ``a``, linear between the ptable rows around it (cellKey ``.lookup_v_flex``),
        then spread over its grid cell: v + (u − ½)/step, u the key's place in the lower row's
        entry.

        The spread is sqlsdc's addition to the flex method. A magnitude ptable has a small
        public set of noise values, so x̂ = x·(1 ± m(x)·(μ + |v|)) can be inverted for the few
        candidate factors, and a value recorded in cents comes out exact (one person's income
        from one AVG). u is uniform and secret (it comes from the record keys), and
        independent of v since every entry's interval is cut at random places of the key
        space, so v + (u − ½)/step is continuous: the noise keeps its mean, its variance grows
        by 1/(12·step²), and no finite set of factors remains to try.
        """
        classes = self.classes
        below = max((c for c in classes if c <= a), default=classes[0])
        above = min((c for c in classes if c >= a), default=classes[-1])
        weight = (a - below) / (above - below) if above > below else 0.0
        (low, u), high = self.entry(kind, below, key), self.value(kind, above, key)
        spread = (u - 0.5) / self.step if self.step else 0.0
        return (1 - weight) * low + weight * high + spread


def statistic_salt(statistic: str) -> int:
    """The key offset of one statistic: the first 32 bits of BLAKE2b(``statistic``).

    The cell key ``Σ rkey mod 2^32`` belongs to a set of records; every statistic of that set
    would share its noise. A count and a sum, or the sums of two columns, then move together,
    and their difference or ratio cancels the noise (``SUM(income * weight) / SUM(income)`` of a
    one-person cell is exactly the weight when both contributions sit below the flex function's
    threshold; ``COUNT(*) − COUNT(DISTINCT municipality)`` is exact when both counts use the
    last ptable row). So a magnitude looks its noise up with a key of its own,
    :func:`statistic_key`, and a distinct count of a dimension likewise, from this hash of what
    is measured
    (``sum:persons.income``, ``distinct:persons.municipality``), not of how the query wrote it:
    the same statistic of the same records always gets the same noise. Counts of rows and of
    units are one statistic of their records and keep the cell key (``COUNT(income)`` equals
    ``COUNT(*)`` when income is never NULL).
    """
    return int.from_bytes(hashlib.blake2b(statistic.encode()).digest()[:4], "big")


MIX_PRIME = 2**31 - 1  # the keyed mix works modulo this prime: every product fits in 62 bits


@dataclass(frozen=True)
class MixKeys:
    """The secret constants of :func:`statistic_key`, derived from the database's PRF secret."""

    square: int
    scale: int
    shift: int
    final: int

    @classmethod
    def from_secret(cls, secret: bytes) -> MixKeys:
        digest = hmac.new(secret, b"sqlsdc: cell key method statistic keys", "sha256").digest()
        words = [int.from_bytes(digest[i : i + 4], "big") % MIX_PRIME for i in range(0, 16, 4)]
        return cls(words[0], max(words[1], 1), words[2], words[3])


def statistic_key(cell_key: int, statistic: str, keys: MixKeys) -> int:
    """The key a statistic other than a count of units looks its noise up with.

    y = (ckey + salt) mod p, y ← y² + a, y ← b·y + c, y ← y² + d (all mod p = 2³¹ − 1, a..d
    secret), key = 2y + (ckey mod 2). The salt (:func:`statistic_salt`) keeps the statistics of
    one set of records apart; the secret mix keeps them *unlinkable*. With a public salt alone
    the key of every statistic was the cell key plus a known constant, so one statistic whose
    true value the analyst knows (the AVG(age) of a cell whose ages the WHERE fixes) gave away
    its noise, hence its key, hence the cell key and the noise of every other statistic of the
    same records: a one-person cell's income to the cent from one query. Knowing one
    statistic's key now says nothing of another's without the 124 secret bits (two squarings
    mod p stand between them). The map is integer arithmetic that every engine computes
    exactly; it is a keyed mix, not a cryptographic PRF, and its outputs fall on about a
    quarter of the key space, spread evenly, which keeps every ptable entry's probability.
    """
    return 2 * keyed_mix(cell_key, statistic, keys) + cell_key % 2


def keyed_mix(value: int, name: str, keys: MixKeys) -> int:
    """y of :func:`statistic_key`: the secret mix of ``value`` salted by ``name``, in [0, p)."""
    p = MIX_PRIME
    y = (value + statistic_salt(name)) % p
    y = (y * y + keys.square) % p
    y = (y * keys.scale + keys.shift) % p
    return (y * y + keys.final) % p


def perturb_count(n: int, key: int, counts: Lookup, max_i: float) -> int:
    """n + v with v from row min(n, max_i) at the cell key (Geyer et al. §2; τ-ARGUS)."""
    return n + int(counts.value("all", min(n, max_i), key))


def flex(x: float, m: MagnitudeCkm) -> float:
    """The flex function m(x) of cellKey ``.para_m`` (``ck_flexparams``) and τ-ARGUS
    ``flexfunction``: p_small at fp, tending to p_large. Not always decreasing, whatever Geyer
    et al. (PSD 2022, §3.4) say: its slope at fp is proportional to 2·p_small − q·(p_small −
    p_large), so with q < 2·p_small/(p_small − p_large) it first rises a little above p_small
    (0.2054 at 1.25·fp for p_small 0.2, p_large 0.1, q 3), in both peers too: more noise there,
    never less (``tests/reference/test_ckm_geyer_utility.py``)."""
    f1 = (m.p_small * x - m.p_large * m.fp) / (m.p_large * m.fp)
    f2 = 2 * m.fp / (m.fp + x)
    return m.p_large * (1 + f1 * f2**m.q)


def amplitude(x: float, j: int, m: MagnitudeCkm) -> float:
    """x_delta_j = x_j·ε_j·m(|x_j|), m = p_small below the flex point (τ-ARGUS
    ``SetCellKeyValuesCont`` and ``flexfunction``; ESSnet D4.2's x_δ,j = ε_j·m(x_j)·x_j).

    cellKey's ``.perturb_cell_flex`` leaves ε_j out below the flex point (x_j·p_small), while
    its rescaling of a small running value, x_j = x̂/(p_small·ε_j), and τ-ARGUS keep it; sqlsdc
    follows τ-ARGUS. Leaving ε_j out on both sides of the flex point would give the demo's
    second-largest turnover twice the amplitude its ε_2 = 0.5 states."""
    weight = m.epsilon[j - 1]
    if abs(x) < m.fp:
        return x * (weight * m.p_small)
    return x * flex(abs(x), m) * weight  # in the order the SQL frame multiplies


def scrambled(key: int, rotations: int) -> int:
    """The key rotated left by 4·r bits (integer analogue of cellKey ``.scramble_ckeys``)."""
    bits = (4 * rotations) % KEY_BITS
    return ((key << bits) | (key >> (KEY_BITS - bits))) & (2**KEY_BITS - 1) if bits else key


def separation_point(m: MagnitudeCkm, m1sq: float | None) -> float:
    """z_s = sqrt(m1²)/(sqrt(Σε²)·p_small) (cellKey ``ck_params_nums``); 0 without small cells."""
    if not m1sq:
        return 0.0
    return math.sqrt(m1sq) / (math.sqrt(sum(e * e for e in m.epsilon)) * m.p_small)


def perturb_magnitude(
    total: float,
    top: Sequence[float],
    key: int,
    contributors: int,
    m: MagnitudeCkm,
    main: Lookup,
    small: Lookup | None = None,
    m1sq: float | None = None,
    protected: int | None = None,
) -> float:
    """The perturbed cell value x̂ of cellKey ``.perturb_cell_flex``.

    ``top`` holds the largest contributions by absolute value (at most ``m.top_k``). For each
    contributor j in turn: x_delta = x_j·ε_j·m(|x_j|) (:func:`amplitude`; or rescaled to
    the running value x̂ when that is smaller, with x_j = x̂/(p_small·ε_j)), v looked up at
    a = |x̂/x_delta| with the j-th scrambled key (the running value's position, as τ-ARGUS's
    ``LookUpVinptable(ptable, fabs(x/xdelta), ...)`` and cellKey's ``abs(xo / x_delta)``: a
    value under D·|x_delta| reads a row whose targets stop at 0), and
    x̂ += sign(x̂)·|x_delta|·sign(v)·(μ + |v|) without changing sign;
    μ = mu_c for the first contributor of a sensitive cell (:func:`is_sensitive`).
    A negative v that would leave the running value under ``REMAINDER_FLOOR·|x_delta|`` in
    absolute value takes it to 0 (cellKey stops at 0 only; see :data:`REMAINDER_FLOOR`). A
    contribution j >= 2 below the separation point z_s adds nothing, rescaled or not (τ-ARGUS;
    cellKey's ``.lookup_v_flex`` means to, but compares a one-element lookup with index 1 and
    perturbs it from the small-cells table, which sqlsdc does not copy).

    A cell of 2 or more contributors whose protected count ``protected`` (n̂, the count the
    published sum is multiplied by) is under ``m.mean_below`` is perturbed as n times a cell
    whose one contribution is its mean (sqlsdc's addition, see :func:`mean_below`):
    x̂ = n·x̂₁(x/n).
    """
    if m.mean_below and 1 < contributors:
        if protected is None:
            raise ValueError("a magnitude under a mean floor needs its protected count")
        floored = protected < m.mean_below
    else:
        floored = False
    if floored:
        mean = float(total) / contributors
        return contributors * perturb_magnitude(mean, [mean], key, 1, m, main, small, m1sq)
    zs = separation_point(m, m1sq)
    sensitive = is_sensitive(contributors, protected, m)
    kind = "all"
    if main.type.size and "even" in set(main.type.tolist()):
        kind = "odd" if contributors % 2 else "even"
    xo = float(total)
    for j, x in enumerate(top[: m.top_k], start=1):
        lookup, table = kind, main
        ax = abs(x)
        if ax < zs:
            if j > 1:  # below the separation point only the largest is perturbed (τ-ARGUS)
                continue
            delta, table, lookup = 1.0, small, "all"
        else:
            delta = amplitude(x, j, m)
        zero = False
        xj = x
        if abs(xo) < abs(delta):
            xj = xo / (m.p_small * m.epsilon[j - 1])
            delta, table, lookup = xo, main, kind
            if abs(xj) < zs:
                delta, table, lookup = 1.0, small, "all"
                zero = j > 1
        if zero:
            continue
        a = 0.0 if delta == 0 else abs(xo / delta)  # the running value's (τ-ARGUS, cellKey)
        a = min(a, max(table.classes))
        ckey = scrambled(key, j - 1 + (0 if m.same_key else 1))
        v = table.interpolated(lookup, a, ckey)
        mu = m.mu_c if (j == 1 and sensitive) else 0.0
        size = abs(delta) * (mu + abs(v))
        if v < 0 and abs(xo) - size < REMAINDER_FLOOR * abs(delta):
            size = abs(xo)  # to 0, never past it nor into (0, |x_delta|/2): REMAINDER_FLOOR
        xo += _sign(xo) * _sign(v) * size
    return xo


def is_sensitive(contributors: int, protected: int | None, m: MagnitudeCkm) -> bool:
    """Whether a cell's first contributor gets μ_c: cellKey's ``contributors <
    sensitive_below``, or under a mean floor its protected count n̂ under
    max(``sensitive_below``, ``mean_below``) (sqlsdc's addition).

    Under the floor every cell shown under ``mean_below`` is one contribution (or n times
    one), sensitive by cellKey's own rule, whatever n; a cell shown at or above it holds
    2·D + js + 1 or more, and was sensitive where its true count was under
    ``sensitive_below``. With ``sensitive_below`` above that guarantee (20 beside the demo's
    13), μ_c, half of p_small of the value over n at least, told beside a count shown as 18
    to 24 which side of 20 the true count is: certain for 183 of 360 region x sex x age
    cells, the count alone 120 (red team s42a), the bit ``n < 13`` of the floor's first
    version again (red team s41i). Decided by n̂, μ_c follows what the count shows; on the
    demo (``sensitive_below`` 3) no cell changes. A cell of one, never floored, has n̂ <= 1 +
    D, under the floor: sensitive as every floored cell is (``sensitive_below`` >= 2)."""
    if not m.mean_below or protected is None:
        return contributors < m.sensitive_below
    return m.sensitive_below > 1 and protected < max(m.sensitive_below, m.mean_below)


def mean_below(counts: PTableSpec) -> int:
    """The protected count n̂ under which a magnitude cell of 2 or more contributors is
    perturbed as n times a cell of one contribution, its mean: 3·D + js + 1 of the count
    ptable (18 for the demo's D 5, js 2).

    Published mean before sum, ``(x̂/n)·n̂``, a sum of values the query pins (``SUM(age)`` by
    municipality x age) shows its mean ``a + d/n``; cellKey's noise d is scaled by the largest
    contribution a, the same for every n, so the mean's noise shrinks as 1/n, and μ_c marks the
    cells under ``sensitive_below``: one query and the public ptables proved a count shown as 3
    to 6 to be 1 or 2 for 366 of 1,646 such cells (red team s40a). As n times a one-contributor
    cell of its mean, a cell's published mean is ``x̂₁(x/n)``: noise of one distribution for
    every n (μ_c included, a singleton being sensitive).

    The floor is decided by the protected count, not the true one. Decided by n < 13, whether a
    cell was floored (its mean off by at least p_small·μ_c of the value, or by at most
    p_small·D/13 of it) was a bit ``n < 13`` of any record set the analyst writes: padding a
    cell with persons of other cells, one query per step, found 13 one-person cells, hence
    sets of every known size, and from there the exact count of any cell under 13 (hidden
    counts of one or two included) in four queries (red team s41i). n̂ is the cell's own
    noisy count, drawn once per record set, which the published sum and count show anyway.
    The bound keeps every cell that could be under ``2·D + js + 1`` floored: its n̂ is at most
    n + D, under 3·D + js + 1; a cell not floored has n̂ >= 3·D + js + 1, so n >= 2·D + js + 1,
    whose count is published as at least D + js + 1, never as a true count of at most js: its
    mean's 1/n scale tells nothing of a count under 3 (nor of one under 13).
    """
    return 3 * counts.D + counts.js + 1


PUBLISHED_BITS = 18
"""The significant bits of a published CKM magnitude (a relative precision of 2^-18, about
4·10^-6: five significant digits and a half).

The noise of a magnitude is ``|x_delta|·(μ + |v|)`` with v = v_entry + (u − ½)/step and u =
(key − lo)/(hi − lo): one value per integer key, a lattice about 10^-9 apart in v, which a
double's 53 bits resolve. Where the analyst knows the exact sum, the noise's value follows
from the published one, and only the true contributor count n makes it a lattice point: the
mean of a constant (``SUM(age)`` by municipality x age) told the exact count of 3,880 of 3,979
published cells from one query (red team s40a), where the spread was meant to leave no
finite set to try. Rounded to 18 bits, a published sum leaves a window of keys
``12·(hi − lo)·2^-18·x̂/|x_delta|`` wide for every candidate n; it holds an integer key for
every entry of the demo's ptables (the narrowest holds 48,232 keys, and |x̂|/|x_delta| >= 1/2
for every published non-zero sum, of either sign, :data:`REMAINDER_FLOOR`: a window of 1.10
keys), so the bits tell nothing the noise's scale does not. Policy validation refuses a
magnitude ptable and flex function that leave a window under one key
(:func:`sqlsdc.mechanisms.ptable_build.check_published_bits`; red team s41a). The rounding
is far below the noise it hides: 2^-18·x̂ against x_delta·|v|, which it reaches only in sums
of some 10^4 to 10^5 contributions of one size."""
REMAINDER_FLOOR = 0.5
"""The least share of its noise amplitude |x_delta| a perturbed magnitude keeps: a negative v
that would leave |x̂| under ``REMAINDER_FLOOR·|x_delta|`` takes x̂ to 0 (cellKey takes it to 0
only where it would change sign).

The published bits resolve the noise to 2^-bits·|x̂|, and a key moves x̂ by
``|x_delta|/(step·(hi − lo))``, so a published sum leaves a window of
``step·(hi − lo)·2^-bits·|x̂|/|x_delta|`` keys: under one key where |x̂| is small beside
|x_delta|. A sum of one sign never gets there (x ≥ x_1 ≥ |x_delta|/p_small), but one of both
signs does: below |x_delta| cellKey rescales x_delta to the running value itself, x̂ = x·(1 − μ
− |v|) for a negative v, and near |v| = 1 − μ the 18 bits told a pinned sum's key apart from
its neighbours (40 consecutive keys, 40 published values; s42h,
``tests/security/test_ckm_mixed_signs.py``). With the floor every published non-zero sum has
|x̂| ≥ |x_delta|/2 of its last step (top_k 1: its only one; a top_k >= 2 sum's earlier steps
are as unbounded as before, ``ptable_build.narrowest_window``), a window of
``step·(hi − lo)·2^-(bits+1)`` keys or more (1.10 for the demo's
narrowest entry, 48,232 keys; policy validation refuses less,
:func:`sqlsdc.mechanisms.ptable_build.check_published_bits`), and 0 holds every key of the
crossing. Publishing such a sum on a coarser grid instead (``|x_delta|·2^-bits``) would have
left the value's bits telling |x_delta|'s binary order, the largest contribution's (or, once
rescaled, the true sum's) within a factor of 2, in a value that is now 0 or keeps its 18 bits
relative to itself. What a non-zero value newly tells: |x_delta| ≤ 2·|x̂|, which a positive v
already gave (|x̂| ≥ |x_delta| there). A sum of one sign keeps x̂/|x_delta| ≥ 1/p_small − μ_c
− |v|, which under the demo's policy falls below 0.5 only for a sensitive cell whose v is
beyond −4 (half the entry v = −4, about 6·10^-6 of the keys: x̂ ≥ 0.46·|x_delta| became 0)."""
_SPLIT = 2.0 ** (53 - PUBLISHED_BITS) + 1  # Veltkamp's splitter for PUBLISHED_BITS bits


def published_value(x: float) -> float:
    """``x`` rounded to :data:`PUBLISHED_BITS` significant bits, by Veltkamp's split
    (``t = x·(2^35 + 1)``, ``t − (t − x)``): three IEEE operations that DuckDB, Spark and
    Python compute to the same bits (the frame's SQL is the same expression)."""
    t = x * _SPLIT
    return t - (t - x)


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def utility_risk(
    counts: Sequence[float],
    perturbed_counts: Sequence[float],
    values: Sequence[float] | None = None,
    perturbed_values: Sequence[float] | None = None,
) -> dict[str, float]:
    """Utility and risk of a released table (Geyer et al., PSD 2022, §3 and Appendix A.1).

    U: Σ|x̂ − x| / Σ|x| over the cells (of ``values`` if given, else of the counts);
    U_single: the same over cells that are singletons before and after perturbation;
    R_pert: the share of published singletons (count 1) that are true singletons;
    R: (1 − min(1, U_single))·R_pert, the combined risk of the R–U map;
    hellinger: √(½ Σ (√(n_i/N) − √(n̂_i/N̂))²) of the count tables, in [0, 1].
    Undefined measures (no singletons, empty tables) are NaN.
    """
    n, n_hat = np.asarray(counts, float), np.asarray(perturbed_counts, float)
    x = n if values is None else np.asarray(values, float)
    x_hat = n_hat if perturbed_values is None else np.asarray(perturbed_values, float)
    if not (len(n) == len(n_hat) == len(x) == len(x_hat)):
        raise ValueError("counts, perturbed counts and values need one entry per cell")
    singles = (n == 1) & (n_hat == 1)
    u_single = _relative_deviation(x[singles], x_hat[singles])
    published_singles = n_hat == 1
    r_pert = float(np.mean(n[published_singles] == 1)) if published_singles.any() else math.nan
    total, total_hat = n.sum(), n_hat.sum()
    if total > 0 and total_hat > 0:
        hellinger = math.sqrt(0.5 * np.sum((np.sqrt(n / total) - np.sqrt(n_hat / total_hat)) ** 2))
    else:
        hellinger = math.nan
    return {
        "cells": len(n),
        "U": _relative_deviation(x, x_hat),
        "U_single": u_single,
        "R_pert": r_pert,
        "R": math.nan if math.isnan(u_single) else (1 - min(1.0, u_single)) * r_pert,
        "hellinger": hellinger,
    }


def _relative_deviation(x: np.ndarray, x_hat: np.ndarray) -> float:
    scale = np.abs(x).sum()
    return float(np.abs(x_hat - x).sum() / scale) if scale > 0 else math.nan
