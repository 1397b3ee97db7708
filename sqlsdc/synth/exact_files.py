"""Syntheses that may hold their source's counts exactly, checked as anonymised files are.

A synthesis drawn with replacement (``cart``'s default ``draw="random"`` and ``"bayes"``,
``parametric``'s model draws, the DP methods' noisy margins) reproduces no marginal or cell of
its source by construction: its counts carry the sampling noise of the draws, and a cell that
equals the original's does so by chance, unknown to its reader. ``cart`` with ``draw="balanced"``
(opt-in, :data:`EXACT_DRAWS`) takes each donor once per pass: with as many
records as originals its first variable's marginal is the original's, and so is a leaf's table
whenever its synthetic size equals its donors (red team s39c: ``SELECT sex, municipality, income
FROM persons`` gave all 350 municipality x sex cells, the 74 the live suppression pattern hides
among them). Which of its tables are exact depends on the trees, so such a file counts as
holding every column exactly (fail closed), as an anonymised file with no perturbative step:
it is refused when its cells give a cell of the suppression pattern
(:func:`sqlsdc.jobs.live_cells.refuse_live_file_cells`) or differ from an exact table of its
table by a few units (:func:`sqlsdc.jobs.differencing.refuse_file_differences`), and, when its
population is no WHERE on one table, next to any exact table of a table it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlsdc.errors import SynthesisError
from sqlsdc.jobs.differencing import refuse_file_differences
from sqlsdc.jobs.live_cells import refuse_live_file_cells
from sqlsdc.jobs.record_files import file_release, opaque_refusal, opaque_tables
from sqlsdc.jobs.session import OUTPUT_SCHEMA
from sqlsdc.jobs.stored_tables import exact_tables
from sqlsdc.policy import Policy

__all__ = ["EXACT_DRAWS", "exact_synthesis", "refuse_exact_synthesis"]

EXACT_DRAWS = ("balanced",)
"""``cart`` draws that may reproduce the source's counts exactly (:mod:`sqlsdc.synth.cart`)."""


def exact_synthesis(method: str, options: Mapping[str, object] | None) -> bool:
    """True when a synthesis by ``method`` with ``options`` may hold its source's counts
    exactly: ``cart`` with a draw of :data:`EXACT_DRAWS`."""
    return method == "cart" and (options or {}).get("draw") in EXACT_DRAWS


def refuse_exact_synthesis(
    con, policy: Policy, into: str, source: str, columns: Sequence[str]
) -> None:
    """Refuse the synthesis of ``source`` (a table name or a SELECT) into ``columns``, to be
    stored as ``protected.<into>``, taken as exact in each of them (module docstring), when it
    gives a cell of the live suppression pattern or differs from an exact table of its table
    by a few units in a cell."""
    label = f"the synthesis {OUTPUT_SCHEMA}.{into} (cart, draw=balanced: exact counts)"
    found = file_release(con, policy, label, source, [], list(columns))
    if found is not None:  # no step, nothing blanked: its cells are counted on the source
        table, release = found
        refuse_file_differences(con, policy, release, exact_tables(con, policy, table))
        refuse_live_file_cells(con, policy, table, release, SynthesisError)
    for table in opaque_tables(policy, source):
        if others := exact_tables(con, policy, table):
            raise SynthesisError(opaque_refusal(label, table, others[0][0]))
