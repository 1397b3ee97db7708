"""Revised counts (:mod:`sqlsdc.tabular.universe_revisions`): no attacker LP over two
publications proves the change of a hidden count below the frequency threshold.

s48d made a hidden count's upper level reach ``min_freq`` (no suppressed count provably below
it); a revised count keeps the levels of its change (30 % of ``|d|``), so s48m asked whether
an attacker with both publications proves ``|new - old| < min_freq`` for a cell published
before (the earlier value is a constant, so the LP of the new publication gives the change's
interval). Audited on random count tables under ``freq:5`` (two-way 3 x 3 to 5 x 5 and
three-way 3 x 3 x 2, cells of 0 to 9, one to four persons moved, half within their row,
removed or added; about 3,000 seeds): none is proved. Of 691 revisions counted (800 seeds),
the narrowest interval of a change reaches exactly -5 or 5 in 13, and is wider in the others.

Why it holds here (an argument, not a proof): a count published as 0 before now holds
``d < min_freq`` persons and is a frequency primary whose upper level reaches ``min_freq``
(s48d), so its change can reach ``min_freq``; a count published with another value held 0 or
at least ``min_freq`` persons, and its change reaches ``-min_freq`` whenever the attacker's
lower bound of the new count falls to 0, which its own lines allow (the cells that changed
with it there are hidden: its margins, at least as large, or the cells that gained what it
lost, which only rise when it falls; the revision itself is a feasible
direction of the LP: the difference of two additive tables is additive and non-zero on the
revised, hidden cells only). A pattern whose every lowering direction is stopped by small cells
was not found; if one is, the fix is s48d's threshold-reaching level, on the change
(``universe_revisions._counts``, and ``jobs/revisions.py`` for jobs). Until then the safety-range
levels stand, and this test keeps them honest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.tabular.api import protect
from sqlsdc.tabular.model import build_table
from sqlsdc.tabular.rules import FrequencyRule
from sqlsdc.tabular.universe_revisions import revision_rule, seen_values

MIN_FREQ = 5
RULES = [FrequencyRule(min_freq=MIN_FREQ)]


def _tables(seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Persons in a 3 x 3 (or 4 x 4) table of small counts, and the same after one to four of
    them moved (half within their row), left or came."""
    rng = np.random.default_rng(seed)
    rows = []
    size = int(rng.integers(3, 5))
    for g in "abcd"[:size]:
        for h in "wxyz"[:size]:
            rows += [(g, h)] * int(rng.choice([1, 2, 3, 4, 5, 5, 6, 7, 9]))
    before = pd.DataFrame(rows, columns=["g", "h"])
    after, cells = before.copy(), sorted(set(rows))
    for _ in range(int(rng.integers(1, 5))):
        i, how = int(rng.integers(len(after))), rng.random()
        to = cells[int(rng.integers(len(cells)))]
        if rng.random() < 0.5:
            to = (after.loc[i, "g"], to[1])
        if how < 0.8:
            after.loc[i, ["g", "h"]] = list(to)
        elif how < 0.9:
            after = after.drop(index=i).reset_index(drop=True)
        else:
            after = pd.concat([after, pd.DataFrame([to], columns=["g", "h"])], ignore_index=True)
    return before, after


def _changes_audited(before: pd.DataFrame, after: pd.DataFrame):
    """The attacker's interval of each revised published count's change, [lo - old, hi - old],
    from the revised publication (the query path's pattern: revision rule, unchanged published
    cells forced, hidden ones held)."""
    first = protect(build_table(before, ["g", "h"]), rules=RULES)
    table = build_table(after, ["g", "h"])
    if len(table.cells) != len(first):  # a code left or came: another table
        return None
    old = first["value"].to_numpy(float)
    published = (first["status"] == "published").to_numpy()
    earlier = pd.DataFrame({"value": old, "status": first["status"].to_numpy(object),
                            "seen": [None] * len(first)})  # fmt: skip
    revised = revision_rule(True, RULES, table.values, earlier, seen_values(earlier, len(old)))
    if revised is None:
        return None
    second = protect(table, rules=[*RULES, revised], held=~published, forced_known=True,
                     forced=published & np.isclose(old, table.values))  # fmt: skip
    cells = revised.cells & published
    assert (second["status"].to_numpy()[cells] != "published").all()
    return second["lo"].to_numpy()[cells] - old[cells], second["hi"].to_numpy()[cells] - old[cells]


@pytest.mark.parametrize("seeds", [range(2000, 2012), range(2012, 2024)])
def test_no_change_of_a_revised_count_is_provably_below_the_frequency_threshold(seeds):
    audited = 0
    for seed in seeds:
        before, after = _tables(seed)
        try:
            found = _changes_audited(before, after)
        except TabularError:  # a table the rules cannot protect: refused, nothing published
            continue
        if found is None:
            continue
        low, high = found
        audited += len(low)
        proved = (high < MIN_FREQ) & (low > -MIN_FREQ)
        assert not proved.any(), (seed, low[proved], high[proved])
    assert audited >= 20  # the seeds revise published cells
