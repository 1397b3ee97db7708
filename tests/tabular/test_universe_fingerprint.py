"""The live pattern's fingerprint and carry-over read sums up to the engine's order of addition.

Before: the fingerprint hashed ``income__sum`` to its last bit, which DuckDB's parallel SUM
changes from one computation to the next (165 of the demo's persons cells), so openings
protected the persons universe anew; and a cell published before counted as known only when
its new sum equalled the old one bit for bit.
"""

from __future__ import annotations

import pandas as pd

from sqlsdc.policy import load_policy
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.universe import _carried_over, fingerprint, universe_of


def _cells(total: float, top: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"region": ["A", "B"], "__units": [4, 5], "__spread": [1, 1],
                         "income__sum": [total, 10.5], "income__n": [4, 5],
                         "income__top": [top, [3.0, 2.0]]})  # fmt: skip


def test_the_last_bits_of_a_sum_leave_the_fingerprint_as_it_was(make_suppress_document):
    universe = universe_of(load_policy(make_suppress_document()), "persons")
    one = fingerprint(universe, _cells(2672853.6600000006, [1000798.0399999999]))
    assert one == fingerprint(universe, _cells(2672853.66, [1000798.0399999998]))
    assert one != fingerprint(universe, _cells(2672853.67, [1000798.0399999999]))  # a cent
    assert one != fingerprint(universe, _cells(2672853.66, [1000798.05]))


def test_a_cell_published_before_is_known_up_to_the_last_bits_of_its_sum():
    inner = pd.DataFrame({"region": ["A", "B"], "value": [2672853.6600000006, 0.1], "n": [4, 5]})
    table = Table.from_cells(inner, ["region"])  # cells Total, A, B
    before = pd.DataFrame({"value": [2672853.76, 2672853.66, 0.1], "status": ["published"] * 3})
    _kept, _held, known = _carried_over(table, before)
    assert known.tolist() == [True, True, True]
    before["value"] = [2672853.77, 2672853.67, 0.1]  # a cent more: not the cell published
    assert _carried_over(table, before)[2].tolist() == [False, False, True]
