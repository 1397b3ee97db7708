"""Red team s42k: revisions of suppression jobs and the rounding audit (session 42).

The attacker reads every version of every stored output (readers keep what ``--replace``
overwrote) and runs guarded queries only; the admin runs routine jobs after each change of the
data. Findings (F fixed, H held):

- F  two spellings of one population, ``WHERE turnover > 0`` and none (the same enterprises:
     both jobs allowed), each compared with its own canonical population's versions only:
     five firms enter (C, R01), the first job is stored again (five units: published), one
     more firm enters, the second is stored again (six units against its own version:
     published); the grand totals of the two latest versions differ by that firm's exact
     turnover (1 cell, 4 jobs). Fixed: a job is compared with the kept versions of every
     population of its table and aggregate that shares cells with it now.
- H  one name alternating between R01's enterprises and all of them (``--replace``), with
     five firms and then one between versions: the replacement by the other population is
     refused (forced cells of the earlier version make primaries computable), both orders.
- H  a rounding of turnover by nace x region replaced after one new firm: the smallest base
     the audit accepts is 375,353,060 (above every inner cell), and a firm of 20 bases makes
     its own cell a primary needing base 732,652,283, so the replacement is refused; versions
     tell a change within 2 bases only.
- H  the ``primary`` status of a cell published before tells that fewer units than the rules
     allow changed in it, not which or by how much: what a primary tells of any cell.
- H  coalitions: an analyst who changed two firms of a cell beside one victim's change meets
     freq:3 and p% by the rules' own definition (they protect against one other contributor).
"""

from __future__ import annotations

import numpy as np

from sqlsdc.jobs.protect import protect_query
from tests.jobs.test_revisions import NEW_FIRM, RULES, change, changed_in_both, published

BY = "SELECT nace, region, SUM(turnover) FROM enterprises {where}GROUP BY nace, region"


def test_two_spellings_of_one_population_are_differenced_across_their_versions(jobs_demo_db):
    """Red team s42k (fails before the fix: the grand totals differed by 1,234,567)."""
    db = jobs_demo_db
    plain, spelled = BY.format(where=""), BY.format(where="WHERE turnover > 0 ")
    protect_query(db, "admin", plain, into="monthly", rules=RULES)
    protect_query(db, "admin", spelled, into="monthly_b", rules=RULES)
    change(db, *(NEW_FIRM.format(nace="C", region="R01", turnover=x)
                 for x in (410_000, 420_000, 430_000, 440_000, 450_000)))  # fmt: skip
    protect_query(db, "admin", plain, into="monthly", rules=RULES, replace=True)
    first = published(db, "monthly")
    change(db, NEW_FIRM.format(nace="C", region="R01", turnover=1_234_567))
    protect_query(db, "admin", spelled, into="monthly_b", rules=RULES, replace=True)
    moved = changed_in_both(first, published(db, "monthly_b"))
    assert moved.empty, moved
    assert not np.isclose(moved.value_2 - moved.value_1, 1_234_567).any()
