"""A CKM sum of contributions of both signs leaves each published value a window of a key or
more (found open by s42h, closed by s42j: :data:`sqlsdc.mechanisms.ckm.REMAINDER_FLOOR`).

A sum below its largest contribution's amplitude ``|x_delta|`` is perturbed by cellKey's
rescaling with ``x_delta`` set to the sum itself (:func:`sqlsdc.mechanisms.ckm.perturb_magnitude`),
so ``x̂ = x·(1 − |v|)`` for a negative v of a non-sensitive cell: where ``1 − |v|`` nears 0, the
18 published bits resolved the noise finer than one key, and the key of a pinned sum (one whose
contributions an analyst knows) was read off. Measured on the demo's magnitude ptable (D 4, V 1,
step 12): 20 contributions +1,000, −990 and 18 of 1 (sum 28), keys of the entry v = −1 just
above the crossing: 40 consecutive keys gave 40 published values up to about 2^18 keys past it
(2^-14 of all keys, about 6·10^-5 of such cells), 19 of 40 at 400,000, 5 at 2·10^6. A sum of
both signs above |x_delta| gets there too (x̂ = x − |x_delta|·|v| near 0). Now a negative v
that would leave |x̂| under |x_delta|/2 publishes 0, and every other value keeps a window of at
least ``step·(hi − lo)·2^-19`` keys (1.10 for the demo's narrowest entry). Since session 43
the lookup position is the running value's, |x/x_delta| (τ-ARGUS, cellKey): a rescaled sum
reads row 1 (a = 1), whose targets stop at 0, no longer the last row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

import sqlsdc
from sqlsdc.catalog.ptables import entries, load_ptables, stored_entries
from sqlsdc.engines.duckdb import open_database
from sqlsdc.mechanisms.ckm import (
    PUBLISHED_BITS,
    REMAINDER_FLOOR,
    Lookup,
    perturb_magnitude,
    published_value,
)
from sqlsdc.policy import MagnitudeCkm, PTableSpec

sys.path.insert(0, str(Path(__file__).parents[1]))
from test_ckm import _expected_magnitudes  # noqa: E402

FLEX = MagnitudeCkm(top_k=1, fp=20000, p_small=0.2, p_large=0.05, q=3, mu_c=0.5, sensitive_below=3)
SPEC = PTableSpec(D=4, V=1, step=12)


@pytest.fixture(scope="module")
def lookup() -> Lookup:
    return Lookup.from_table(entries("magnitudes", SPEC), step=12)


def test_a_pinned_sum_of_both_signs_leaves_each_published_value_more_than_one_key(lookup):
    # 28 < |x_delta| = 200: rescaled, x_delta = 28 and a = 1, row 1 (before session 43 the
    # contribution's position 1/p_small = 5, the last row, 4)
    entry = (lookup.i == 1.0) & (lookup.v == -1.0)
    lo, hi = int(lookup.lo[entry][0]), int(lookup.hi[entry][0])
    crossing = lo + (hi - lo) // 2  # v + (u - 1/2)/12 = -1: x̂ = x·(1 - |v|) = 0
    keys = range(crossing + 2_000, crossing + 2_040)
    published = {published_value(perturb_magnitude(28.0, [1000.0], k, 20, FLEX, lookup))
                 for k in keys}  # fmt: skip
    assert len(published) < len(keys) / 2


def _rows(lookup: Lookup, total: float, top: float) -> tuple[float, float]:
    """The two ptable rows the sum's lookup reads: around a = |x/x_delta| (x_delta = x itself
    when |x| is under p_small·top, a = 1), capped at the last row."""
    delta = FLEX.p_small * top
    a = 1.0 if abs(total) < delta else min(abs(total) / delta, 4.0)
    classes = lookup.classes
    return max(c for c in classes if c <= a), min(c for c in classes if c >= a)


def _window(lookup: Lookup, total: float, top: float, key: int) -> float | None:
    """Keys per published value around ``key``: 2^-bits·|x̂| over x̂'s step from one key to
    the next (x̂ is linear in the key inside the entries of both rows read); None where x̂ is
    0 (every key of the crossing) or the next key is in another entry."""
    here = perturb_magnitude(total, [top], key, 20, FLEX, lookup)
    there = perturb_magnitude(total, [top], key + 1, 20, FLEX, lookup)
    low, high = _rows(lookup, total, top)
    same = lookup.entry("all", low, key)[1] < lookup.entry("all", low, key + 1)[1] and (
        lookup.entry("all", high, key)[0] == lookup.entry("all", high, key + 1)[0]
    )
    if here == 0 or there == 0 or not same or here == there:
        return None
    return 2.0**-PUBLISHED_BITS * abs(here) / abs(there - here)


def test_every_non_zero_sum_of_both_signs_keeps_a_window_of_a_key(lookup):
    """Random sums of both signs whose noise leaves them near 0: below |x_delta| (rescaled,
    a = 1, row 1: x̂ = x·(1 − |v|)) with keys within 2^20 of its crossing of |v| = 1, and above
    it (x̂ = x − |x_delta|·|v|, a = x/|x_delta| between 1 and 5, rows 1 and 4 interpolated)
    with keys in a negative entry of the lower row. Before the floor 45 of the 680 non-zero
    ones left under one key (down to 0.03). With the running value's lookup position
    (session 43): 409 publish 0 or cross an entry, none of the 391 others leaves under one
    key (the least 1.27)."""
    rng = np.random.default_rng(42)
    one = lookup.i == 1.0
    at = {
        float(v): (int(lo), int(hi))
        for v, lo, hi in zip(lookup.v[one], lookup.lo[one], lookup.hi[one], strict=True)
    }
    crossing = sum(at[-1.0]) // 2  # |v| = 1: x̂ = 0 once rescaled
    windows = []
    for k in range(400):
        top = float(rng.integers(100, 19_000))
        total = float(rng.uniform(-0.19, 0.19) * FLEX.p_small * top)  # below |x_delta|
        if k % 2:
            key = crossing + int(rng.integers(-(2**20), 2**20))
        else:  # |v| from 0.5 to 1: x̂ from x/2 down to 0
            key = int(rng.integers(at[-1.0][0], at[-0.5][1]))
        windows.append(_window(lookup, total, top, key))
    for _ in range(400):
        top = float(rng.integers(100, 19_000))
        a = rng.uniform(1.0, 5.0)
        total = float(rng.choice([-1.0, 1.0]) * a * FLEX.p_small * top)
        low, _high = _rows(lookup, total, top)
        negative = np.flatnonzero((lookup.i == low) & (lookup.v < 0))
        e = rng.choice(negative)
        key = int(rng.integers(lookup.lo[e], lookup.hi[e] - 1))
        windows.append(_window(lookup, total, top, key))
    zeros = sum(w is None for w in windows)
    found = [w for w in windows if w is not None]
    assert 100 < zeros < 700
    assert min(found) >= 1, sorted(found)[:5]


def build_ledger(path: Path) -> Path:
    """A table of signed amounts under the demo's CKM rules: 240 cells, each of a credit +B,
    a debit −(B − s) and 30 small units of 1 (tier 1 to 30), so that a query's WHERE on the
    tier pins every contribution (the analyst knows them all) and the sum s + m is below
    |x_delta| = 0.2·B: cellKey's rescaled regime, where the published bits told the key."""
    rng = np.random.default_rng(7)
    rows, unit = [], 0
    for cell in range(240):
        big = int(rng.integers(2_000, 19_000))
        small = int(rng.integers(-int(0.15 * big), int(0.15 * big)))
        for value, tier in ((big, 0), (-(big - small), 0), *((1, t) for t in range(1, 31))):
            unit += 1
            rows.append((unit, f"c{cell:03d}", tier, value))
    frame = pd.DataFrame(rows, columns=["unit", "cell", "tier", "amount"])  # noqa: F841
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE ledger AS SELECT unit::INTEGER AS unit, cell::VARCHAR AS cell, "
        "tier::INTEGER AS tier, amount::INTEGER AS amount FROM frame"
    )
    con.close()
    columns = {
        "unit": {"role": "identifier"},
        "cell": {"role": "dimension"},
        "tier": {"role": "dimension"},
        "amount": {"role": "measure"},
    }
    magnitudes = {
        "method": "ckm",
        "ptable": {"D": 4, "V": 1, "step": 12},
        "top_k": 1,
        "flex": {"fp": 20000, "p_small": 0.2, "p_large": 0.05, "q": 3},
        "mu_c": 0.5,
        "sensitive_below": 3,
        "mean_before_sum": True,
    }
    protection = {
        "min_frequency": 10,
        "counts": {"method": "ckm", "ptable": {"D": 5, "V": 3, "js": 2}},
        "magnitudes": magnitudes,
    }
    document = {
        "protection": protection,
        "tables": {"ledger": {"privacy_unit": "unit", "columns": columns}},
        "users": {"admin": {"role": "admin"}, "analyst": {"role": "analyst"}},
    }
    sqlsdc.init(path, document)
    return path


@pytest.fixture(scope="module")
def ledger(tmp_path_factory) -> Path:
    return build_ledger(tmp_path_factory.mktemp("ledger") / "ledger.duckdb")


@pytest.mark.parametrize("tiers", [24, 30])
def test_a_guarded_sum_of_both_signs_is_zero_or_keeps_half_its_amplitude(ledger, tiers):
    """Through the analyst's connection: every published SUM of a pinned cell of both signs
    below |x_delta| (x = s + m, rescaled: x_delta = x) is 0 or at least |x|/2 in absolute value
    (as mean·n̂: |P|·n/n̂ ≥ |x|/2), and equals the Python reference's published value to the
    bit (``mechanisms.ckm``, the frame's SQL being its restatement). Before the floor, 27 and
    33 of the 240 cells of each query published 0 < |x̂| < |x|/2 (windows under a key near the
    crossing) and 41, 45 published 0; now none, and 69, 68 publish 0 (record keys are drawn
    anew with each database: the counts vary, the property does not)."""
    path = ledger
    where = f"WHERE tier <= {tiers}"
    sql = f"SELECT cell, COUNT(*), SUM(amount) FROM ledger {where} GROUP BY cell"
    with sqlsdc.connect(path, user="analyst") as ana:
        got = {cell: (n_hat, total) for cell, n_hat, total in ana.execute(sql).fetchall()}
        policy = ana.policy
    raw = open_database(path)
    try:
        exact = dict(
            raw.execute(f"SELECT cell, SUM(amount) FROM ledger {where} GROUP BY cell").fetchall()
        )
        refs = load_ptables(raw, policy)
        tables = {
            k: Lookup.from_table(stored_entries(raw, r.ptable_id), step=k[1].step)
            for k, r in refs.items()
        }
        expected, _m, _present = _expected_magnitudes(
            (raw, policy, refs, tables), "ledger", "amount", "cell", where
        )
    finally:
        raw.close()
    n = 2 + tiers
    assert len(got) == 240
    small, zeros = [], 0
    for cell, (n_hat, published) in got.items():
        assert n_hat >= 18  # no mean floor: cellKey's flex noise with the rescaled x_delta
        assert published == expected[cell][0], cell  # the SQL frame is the reference
        x = exact[cell]
        if published == 0:
            zeros += 1
        elif abs(published) * n / n_hat < REMAINDER_FLOOR * abs(x) * (1 - 1e-5):
            small.append(cell)
    assert small == []
    assert 30 <= zeros <= 110  # v < -1/2: about 28 %, 17 % (v < -1) before
