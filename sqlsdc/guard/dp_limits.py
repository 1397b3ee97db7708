"""Limits of a DP release, decided before the charge from public facts and read again when
cells are drawn (one place, so that a test that lowers one lowers it everywhere)."""

from __future__ import annotations

MAX_QUANTILE_SCORES = 50_000_000  # cells x candidates of one quantile (memory: 8 bytes each)
MAX_PRIVATE_GROUPS = 1_000_000
"""The most groups one stage releases by private selection, as many as a connection returns
(:data:`sqlsdc.guard.connection.MAX_ANSWER_ROWS`) and as public domains may have
(:data:`sqlsdc.rewrite.dp.MAX_DOMAIN_CELLS`): the bound of its cells known before the charge
(:func:`stage_cells`). Beyond it, the groups kept are those of the smallest cell digests
(:func:`_selected`), a choice by the released keys alone."""


PREFETCHED_CELLS = 256
"""At most this many cells over public domains are looked up with a query's statistics."""
