"""The linked audit of suppression jobs (:func:`sqlsdc.jobs.linked_audit.audit_linked`) reads
the job's cells with the policy's measure bounds, as the job's own check does (s44o's
``verify_suppression(upper=)``; s44q).

The case: s44i's 3 x 3 table of three firms per cell (employees bounded by [0, 50], so a cell
of n firms holds at most 50 n), the pattern the SUM job chose before s44o (hidden (A, R1), its
primary, and (A, R3), (B, R1), (B, R3), (C, R1), (C, R3)), and an earlier output of the same
rows by region x size class, all published. nk(1, 60) asks (A, R1)'s interval (52: firms of
50, 1 and 1) to reach 50 * 100 / 60 = 83.3. Read over [0, inf) the two tables leave it that
(the linked audit on the branch's start passed the pattern); with the bounds the attacker's LP
stops at 69. In the jobs, the job's own audit with the bounds now avoids this pattern first:
no run of two jobs was found where the linked LP with the bounds refuses (274 random tables:
s44i's firms or 3 or 4 random firms per cell, two size classes at random, an earlier SUM job by
nace or region x size class then the nace x region one; 146 ran both, the differencing check
refused the others), so this test calls the linked audit directly: [0, 88] over [0, inf),
[0, 69] with the bounds.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from sqlsdc.errors import TabularError
from sqlsdc.jobs.linked_audit import audit_linked
from sqlsdc.jobs.tabulation import JobSpec
from tests.security.test_redteam_s44i import FIRMS, HI

TOTAL = "Total"
HIDDEN = {("A", "R1"), ("A", "R3"), ("B", "R1"), ("B", "R3"), ("C", "R1"), ("C", "R3")}


@pytest.fixture
def linked():
    """The firms (size class alternating), the job's cells with margins (values, unit counts)
    and the earlier region x size class output, all published."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE firms (id INTEGER, nace VARCHAR, region VARCHAR, size_class VARCHAR, "
        "employees DOUBLE)"
    )
    firm = 0
    for (nace, region), employees in FIRMS.items():
        for value in employees:
            size = "small" if firm % 2 else "large"
            con.execute(
                "INSERT INTO firms VALUES (?, ?, ?, ?, ?)", [firm, nace, region, size, value]
            )
            firm += 1
    keys = [(a, r) for a in ("A", "B", "C", TOTAL) for r in ("R1", "R2", "R3", TOTAL)]
    held = [
        [v for (x, y), vs in FIRMS.items() for v in vs if a in (x, TOTAL) and r in (y, TOTAL)]
        for a, r in keys
    ]
    earlier = con.sql(
        "SELECT region, size_class, SUM(employees) AS value FROM firms GROUP BY ALL"
    ).df()
    earlier["status"] = "published"
    yield con, keys, held, earlier
    con.close()


def _audit(linked, upper: bool) -> None:
    con, keys, held, earlier = linked
    values = np.array([sum(v) for v in held], dtype=float)
    primary = np.array([key == ("A", "R1") for key in keys])
    audit_linked(
        con,
        JobSpec("firms", ("nace", "region"), "employees", "id", None),
        {c: (c,) for c in ("nace", "region", "size_class")},
        pd.DataFrame(keys, columns=["nace", "region"]),
        [("protected.by_size", earlier)],
        values=values,
        suppressed=np.array([key in HIDDEN for key in keys]),
        primary=primary,
        upl=np.where(primary, HI * 100 / 60 - values, 0.0),
        lpl=np.zeros_like(values),
        lower=np.zeros_like(values),
        upper=HI * np.array([len(v) for v in held], dtype=float) if upper else None,
        time_limit=10,
    )


def test_the_linked_audit_proves_a_primary_short_with_the_measure_bounds(linked):
    """Fails on the branch's start (audit_linked took no upper bounds: the pattern passed)."""
    _audit(linked, upper=False)  # [0, inf): (A, R1) reaches 83.3
    with pytest.raises(TabularError, match=r"read together with protected.by_size.*'A'"):
        _audit(linked, upper=True)
