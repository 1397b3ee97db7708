"""The registry of protection mechanisms: one frame builder per policy method.

The planner decides which method protects an aggregation (:func:`sqlsdc.planner.plan.
choose_mechanism`); this registry is the only place that maps that decision to the module that
rewrites the aggregation's cells. Adding a mechanism means one module with a frame builder and
one entry here. Each builder is a pure function ``(Cells, twin) -> Frame`` (see
:mod:`sqlsdc.rewrite.cells`): it refuses the aggregates it cannot protect, and DP's records its
exact-cells stage as data for the release step that noises them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sqlsdc.planner.identity import Population
from sqlsdc.policy import Method, Policy
from sqlsdc.rewrite.cells import FrameBuilder
from sqlsdc.rewrite.ckm import PTableKey, PTableRef, ckm_frame
from sqlsdc.rewrite.dp import DpStage, dp_frame
from sqlsdc.rewrite.noised_conditions import refuse_noised_conditions
from sqlsdc.rewrite.round import round_frame
from sqlsdc.rewrite.suppress import suppress_frame
from sqlsdc.rewrite.threshold import threshold_frame


@dataclass(frozen=True)
class RewriteContext:
    """What frame builders may read: the policy, the CKM ptables, where DP records its stages
    (by id of the aggregation), how the engine renders SQL, and the populations the check has
    already described (by id of their scope; :func:`sqlsdc.planner.identity.
    aggregation_identity`)."""

    policy: Policy
    ptables: Mapping[PTableKey, PTableRef]
    stages: dict[int, DpStage]
    to_sql: Callable
    populations: Mapping[int, Population] = field(default_factory=dict)


MECHANISMS: dict[Method, Callable[[RewriteContext], FrameBuilder]] = {
    Method.THRESHOLD: lambda c: threshold_frame,
    Method.CKM: lambda c: ckm_frame(c.policy, c.ptables),
    Method.SUPPRESS: lambda c: suppress_frame(c.policy),
    Method.DP: lambda c: dp_frame(c.policy, c.stages, c.to_sql, c.populations),
    Method.ROUND: lambda c: round_frame(c.policy),
}


def frame_builders(context: RewriteContext) -> dict[Method, FrameBuilder]:
    """The frame builder of every registered method, bound to ``context``."""
    builders = {method: make(context) for method, make in MECHANISMS.items()}
    return {
        method: build if method is Method.CKM else _plain_values(build, context.policy)
        for method, build in builders.items()
    }


def _plain_values(build: FrameBuilder, policy: Policy) -> FrameBuilder:
    """``build`` after refusing a condition on a unit-noised measure, which only the cell key
    method's frame compares as x·m (:mod:`sqlsdc.rewrite.noised_conditions`)."""

    def checked(cells, twin):
        refuse_noised_conditions(cells.select, cells.lent.get("where"), policy)
        return build(cells, twin)

    return checked
