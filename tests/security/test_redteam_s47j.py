"""Red team s47j: cell suppression in the query path (and what a suppression job releases).

Found and fixed: a suppression job of a sum stores, beside each suppressed cell, the interval
an attacker derives (``lower_bound``/``upper_bound``, released by ``sqlsdc publish`` and under
``releases:``). Since the job's audit learnt the policy's measure bounds (s44i), that interval
was computed with each hidden cell's box ``[0, hi x n]`` of its *true* unit count ``n``, which
the table hides: wherever the cap bound, ``upper_bound / hi`` was the hidden count. Turnover
in [0, 1000], the s45g table: 8 of its 8 hidden inner cells showed ``upper_bound = 1000 n``,
among them (B, R1), 2 firms that ``freq:3`` hides, and (B, R2), one firm; lower bounds came
from the same caps ((A, R1) >= 820 where the reader's LP gives 0). Now the stored interval is
the reader's own LP (published ``n`` and sums, ``sum <= hi x n``, listed cells of one unit at
least): equal to an independent LP on every cell.

Held (query path, demo with enterprises nace x region and persons geography x sex under
suppression; one line each):
- ROLLUP, CUBE, GROUPING SETS, a coarser hierarchy level and WHERE-selected cells all read the
  one audited pattern: an ILP attacker over every published count (listed inner cells >= 1,
  unlisted 0) leaves every primary within its 30 % (enterprises: 23 hidden counts; persons:
  98 hidden of 557 cells, municipality level included);
- insider (a singleton's respondent fixing its own sum) against every other primary: no sum
  determined (turnover 6 singletons x 77 primaries, employees 6 x 58, income 12 x 78);
- HAVING / ORDER BY / LIMIT / window functions / CAST errors on hidden cells: hidden values are
  NULL in the frame, errors only on published values (``CAST(COUNT(*) - 4 AS UTINYINT)``);
- joins with the public ``regions`` (COUNT, SUM(population), COUNT(DISTINCT)), a UNION with a
  public table, IN / EXISTS / correlated subqueries, CTEs and QUALIFY: refused;
- reading ``sqlsdc.suppressed__*`` or the ``__sup`` alias, parameters of other types (list,
  bytes, numbers for a text code): refused;
- a pattern that cannot be made (a municipality under two regions after new data): the generic
  refusal, no code named;
- dominance at holding level on the demo: no published turnover cell where one holding has
  over 60 % (holdings are documented as not modelled);
- AVG beside SUM and COUNT: published only where both are and every unit has a value; the
  contributors ``__n`` are read by nothing else;
- a measure bound ``lo > 0`` (``sum >= lo x n``, not in the joint audit): 0 of 105 random
  3 x 3 to 4 x 5 tables (employees in [1, 50] and [10, 50]) with a primary short under it.
"""

from __future__ import annotations

import numpy as np

from tests.security.test_redteam_s45g import JOB, _joint_interval, _values, job_table

HI = 1000.0  # firms_db's bounds: turnover in [0, 1000]


def test_a_sum_jobs_intervals_do_not_tell_its_hidden_unit_counts(tmp_path):
    """Every hidden cell's stored interval is the reader's own joint LP interval (published
    n and sums, inner counts >= 1, 0 <= sum <= 1000 n), holds the hidden sum, and no hidden
    inner cell's upper bound is 1000 times its unit count where that LP allows more. On main
    8 of 8 hidden inner cells had upper_bound = 1000 n ((B, R1): 2000 for 2 firms, (B, R2):
    1000 for one), where the reader's LP gives 5,820 and 7,400 (fails on main)."""
    frame = job_table(tmp_path)
    codes = frame[["nace", "region"]]
    hidden = frame[frame["status"] != "published"]
    assert len(hidden) >= 8
    told = []
    for row in hidden.itertuples():
        cell = (row.nace, row.region)
        low, high = _joint_interval(codes, frame["n"], frame["value"], cell, "sum", hi=HI)
        assert np.isclose(row.lower_bound, low, atol=1e-6), (cell, row.lower_bound, low)
        assert np.isclose(row.upper_bound, high, rtol=1e-9), (cell, row.upper_bound, high)
        values = _values(JOB, cell)
        assert row.lower_bound - 1e-6 <= sum(values) <= row.upper_bound + 1e-6, cell
        if "Total" not in cell and np.isclose(row.upper_bound, HI * len(values)):
            told.append(cell)
    assert not told
    b_r1 = hidden[(hidden.nace == "B") & (hidden.region == "R1")]
    assert b_r1.upper_bound.item() > 5000  # 2 firms, 1,940: not [0, 2,000]
