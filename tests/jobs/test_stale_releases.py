"""The signed sums that give a stale release's change (``sqlsdc.jobs.stale_releases``)."""

from __future__ import annotations

import numpy as np

from sqlsdc.jobs.stale_releases import _newly_given


def test_a_sum_with_the_new_release_that_cancels_every_region_gives_the_change():
    """Regions R02, R03 of a total cell; rows: the new R03 (0), R02+R03 (1), the stale R02
    (2). T1 - T0 - T2 cancels both regions: the stale R02's change (red team s46b)."""
    matrix = np.array([[0, 1], [1, 1], [1, 0]], dtype=float)
    assert _newly_given(matrix, [2]) == [2]
    # without the R02+R03 table no sum takes the stale one
    assert _newly_given(matrix[[0, 2]], [1]) == []


def test_the_same_units_as_the_stale_release_are_a_revision_and_no_unit_is_nothing():
    """A new release over the stale one's units is a revision of its cell (the revision
    rules'); a stale release or a new one with no unit in the cell takes part in no sum."""
    assert _newly_given(np.array([[1, 0], [1, 0]], dtype=float), [1]) == []
    assert _newly_given(np.array([[0, 1], [0, 1], [0, 0]], dtype=float), [2]) == []
    assert _newly_given(np.array([[0, 0], [1, 0], [1, 0]], dtype=float), [2]) == []
