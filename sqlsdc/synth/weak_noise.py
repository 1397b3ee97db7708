"""A note for a DP synthesis whose noise leaves its margins' counts exact more often than not.

A DP synthesis of a table the policy protects by another method (suppression, the cell key
method, a threshold, rounding) spends whatever ε the admin grants: such a table has no budget
unless the admin sets one, and the job is not refused. But its margins are the table's counts
plus discrete Laplace noise of scale ``t = K·M/ε`` (``K`` rows per privacy unit, ``M``
margins), and ``P(noise = 0) = tanh(1/(2t))``: from ``t <= 1/ln 3`` (about 0.91) on, each
noisy count equals the true one with probability 1/2 or more, so a reader of the synthesis is
more often right than wrong about the small counts the live path hides or perturbs — the
cells of 1-4 persons a suppression pattern hides among them. That is the line
:mod:`sqlsdc.microdata.negligible` draws for PRAM (a cell left as it was with probability 1/2
reads as exact), so the same line is used here.

:func:`weak_noise_note` words the note the job prints, keeps in its report (``details.notes``)
and writes into its audit entry; it refuses nothing (the ε is the admin's choice).
"""

from __future__ import annotations

import math
from fractions import Fraction

from sqlsdc.policy import Policy

EXACT_SCALE = 1 / math.log(3)
"""The noise scale at and below which a noisy count is exact with probability 1/2 or more."""


def weak_noise_note(policy: Policy, table: str, scale: Fraction, epsilon: Fraction,
                    margins: int, bound: int) -> str | None:  # fmt: skip
    """The note for a DP synthesis of ``table`` whose margins (``margins`` of them, ``bound``
    rows per unit) get noise of ``scale`` for ``epsilon``; None when the table is protected by
    DP (its budget is the policy's guard) or the noise is wider than :data:`EXACT_SCALE`."""
    declared = policy.table(table)
    if declared is None or declared.differentially_private or float(scale) > EXACT_SCALE:
        return None
    live = sorted({rule.method.value for rule in declared.protection.values()})
    exact = math.tanh(1 / (2 * float(scale)))
    largest = bound * margins * math.log(3)
    return (
        f"note: ε = {epsilon} over {margins} margin(s) leaves discrete Laplace noise of scale "
        f"{scale} on each count, which is then exact with probability {exact:.2f} (1/2 or "
        f"more at a scale of 1/ln 3 = 0.91 or less): the synthesis may repeat the small "
        f"counts of {table} that its policy's {', '.join(live)} protection hides or perturbs "
        f"live (not DP). ε below {largest:.2f} keeps each count more often wrong than right; "
        f"`sqlsdc budget` can cap ε on {table}"
    )
