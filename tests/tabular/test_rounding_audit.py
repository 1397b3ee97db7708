"""The attacker's audit of a controlled rounding (:mod:`sqlsdc.tabular.rounding_audit`): windows
of the published multiples, additivity and public bounds, read by an LP per bound (s42h)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sqlsdc.tabular.attacker import audit_intervals
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rounding import controlled_round
from sqlsdc.tabular.rounding_audit import audit_rounding, rounding_windows
from sqlsdc.tabular.rules import FrequencyRule, apply_rules
from tests.tabular.test_rounding import hier_table, parity_table


def row(values, negative: bool = False, n=1) -> Table:
    """One dimension ``c`` with codes a, b, ... and its total (first cell)."""
    frame = pd.DataFrame({"c": list("abcdefgh"[: len(values)]), "value": values, "n": n})
    table = Table.from_cells(frame, ["c"], top=[])
    if negative:
        object.__setattr__(table, "negative", True)
    return table


def per_cell_ok(table, rounded, base, sensitive, upl, lpl) -> bool:
    """The check the job made before s42: each sensitive cell alone within ``R ± base``."""
    x = table.values
    return bool(np.all(((rounded + base - x >= upl) & (x - (rounded - base) >= lpl))[sensitive]))


def test_additivity_narrows_a_cell_whose_neighbour_is_known():
    """A row of 4 and 8 (total 12) to base 5 as 5 and 10 (total 15): each cell alone lies in
    [1, 9] and [6, 14], far enough from the sensitive 4 (levels 2). A reader who knows the 8
    (a public figure) reads the first as the total less 8, at least 11 - 8 = 3: 1 below its
    value. The per-cell check passes; the audit refuses, and without the known cell it passes."""
    table = row([4.0, 8.0])
    values = table.values
    at = {c: i for i, c in enumerate(table.cells["c"])}
    rounded = np.zeros(3)
    rounded[[at["Total"], at["a"], at["b"]]] = [15, 5, 10]
    sensitive = np.zeros(3, dtype=bool)
    sensitive[at["a"]] = True
    levels = np.where(sensitive, 2.0, 0.0)
    assert values[at["a"]] == 4 and per_cell_ok(table, rounded, 5, sensitive, levels, levels)
    assert audit_rounding(table, rounded, 5, sensitive, levels, levels).protected.all()
    known = np.zeros(3, dtype=bool)
    known[at["b"]] = True
    audit = audit_rounding(table, rounded, 5, sensitive, levels, levels, known=known)
    assert audit.exposed.tolist() == [at["a"]] and not audit.timed_out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dims", [2, 3])
def test_a_fully_published_rounding_leaves_every_cell_its_whole_window(dims, seed):
    """What the module docstring proves: with every cell published, additivity narrows no
    window, so the LP interval of each cell is ``[max(R - b + 1, 0), R + b - 1]`` for whole
    numbers (hierarchical 2-D and 3-D tables, controlled roundings; a margin a near-feasible
    rounding relaxed has a wider window, which its cells' windows may narrow)."""
    table = hier_table(dims, 2, 2 if dims == 3 else 3, seed, mean=4.0)
    base = 3
    result = controlled_round(table, base, time_limit=20, partition=None, seed=seed)
    rounded = result.cells["rounded"].to_numpy(np.float64)
    relaxed = _relaxed(table, result)
    assert relaxed.any() == (result.status == "near_feasible")
    lower, upper, integer = rounding_windows(table, rounded, base, relaxed=relaxed,
                                             max_excess=result.max_excess)  # fmt: skip
    assert integer
    assert np.all((upper == rounded + base - 1)[~relaxed])
    assert np.all((lower == np.maximum(rounded - base + 1, 0))[~relaxed])
    everything = np.ones(len(rounded), dtype=bool)
    res = audit_intervals(table.A, table.values, everything, lower=lower, upper=upper,
                          integer=True, time_limit=30)  # fmt: skip
    assert res.exact.all()
    assert np.array_equal(res.lo[~relaxed], lower[~relaxed])
    assert np.array_equal(res.hi[~relaxed], upper[~relaxed])


def _relaxed(table: Table, result) -> np.ndarray:
    """The cells ``result`` reports beyond their adjacent multiples, in table order."""
    dims = list(table.dims)
    merged = (
        table.cells[dims]
        .reset_index(drop=True)
        .merge(result.violations[dims], on=dims, how="left", indicator=True)
    )
    return merged["_merge"].eq("both").to_numpy()


def test_a_sum_rounded_to_zero_is_bounded_by_zero_unless_it_has_negative_contributions():
    """A sensitive sum of 0.6 (one contributor: the frequency rule's level is its minimum, 1)
    rounded to 0 with base 5: ``R - base`` is -5, 5.6 below, and the per-cell check passed it;
    a reader who knows the sum cannot be negative has it within 0.6 of 0. With contributions
    of both signs the sum may be negative, the window is all the reader has, and it holds."""
    for negative, protected in [(False, False), (True, True)]:
        table = row([0.6, 9.4], negative=negative, n=[1, 5])
        found = apply_rules(table, [FrequencyRule(2)])
        at = {c: i for i, c in enumerate(table.cells["c"])}
        assert found.primary.tolist() == [c == "a" for c in table.cells["c"]]
        assert found.lpl[at["a"]] == 1.0
        rounded = np.zeros(3)
        rounded[[at["Total"], at["b"]]] = 10
        args = (table, rounded, 5, found.primary, found.upl, found.lpl)
        assert per_cell_ok(*args)
        audit = audit_rounding(*args)
        assert audit.protected.all() == protected, negative
        if not protected:
            assert audit.exposed.tolist() == [at["a"]]


def test_relaxed_margins_get_wider_windows():
    """A margin a near-feasible rounding moved beyond its adjacent multiples lies within
    ``base + max_excess`` of its published value (the parity table: no zero-restricted
    rounding exists), the other cells within the base; the originals lie in their windows."""
    frame = parity_table()
    frame["n"] = 1
    table = Table.from_cells(frame, ["i", "j", "k"], top=[])
    result = controlled_round(table, 10, time_limit=10, partition=None)
    assert result.status == "near_feasible" and result.max_excess > 0
    relaxed = _relaxed(table, result)
    assert relaxed.any()
    rounded = result.cells["rounded"].to_numpy(np.float64)
    lower, upper, _ = rounding_windows(table, rounded, 10, relaxed=relaxed,
                                       max_excess=result.max_excess)  # fmt: skip
    width = np.where(relaxed, 10 + result.max_excess - 1, 9)
    assert np.array_equal(upper, rounded + width)
    assert np.all((table.values >= lower) & (table.values <= upper))


def test_a_rounding_to_a_base_well_beyond_the_levels_passes_and_costs_little():
    """Sensitive cells of a 3-D table (frequency rule, 30 % levels) rounded to a base of three
    times the largest level: every cell protected, decided within a CPU second."""
    table = hier_table(3, 2, 2, seed=7, mean=30.0)
    found = apply_rules(table, [FrequencyRule(2)])
    assert found.primary.sum() > 5
    base = 3 * int(np.ceil(max(found.upl.max(), found.lpl.max())))
    result = controlled_round(table, base, time_limit=20, partition=None)
    rounded = result.cells["rounded"].to_numpy(np.float64)
    audit = audit_rounding(table, rounded, base, found.primary, found.upl, found.lpl)
    assert audit.protected.all() and not audit.timed_out
    assert audit.cpu_seconds < 1.0


def test_an_audit_out_of_time_protects_nothing():
    """Fail closed: a cell the time limit left undecided is not protected."""
    table = row([4.0, 8.0])
    rounded = np.array([15.0, 5.0, 10.0])
    sensitive = np.array([False, True, False])
    levels = np.where(sensitive, 2.0, 0.0)
    audit = audit_rounding(table, rounded, 5, sensitive, levels, levels, time_limit=0)
    assert audit.exposed.tolist() == [1] and audit.timed_out
