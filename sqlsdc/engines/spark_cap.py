"""The byte cap of a Spark answer, held where its rows are made, before the driver has them.

The DuckDB path abandons an answer's stream past ``MAX_ANSWER_BYTES`` batch by batch; Spark's
``toArrow`` collects every batch into the driver (the process a server shares) first, so a cap
checked after it held nothing: 1,001 rows of 64 KiB strings were 64 MiB in the driver before
they were refused. :func:`capped` is the function of a ``mapInArrow`` stage over the answer
after Spark's ``limit`` (one partition, in the answer's order): it passes the Arrow batches on
and raises as soon as their bytes pass the cap, so the driver receives at most the cap.

Shipped to Spark's Python workers by value (as :mod:`sqlsdc.engines.duckdb_hash`): they need
pyarrow, not sqlsdc.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

MARKER = "sqlsdc: the answer passes its byte cap"
"""The start of the error :func:`capped` raises in the worker, known again in the driver."""


def capped(max_bytes: int) -> Callable[[Iterator], Iterator]:
    """A ``mapInArrow`` function that yields its batches unchanged and raises once their Arrow
    bytes pass ``max_bytes`` (the batch that passes it is not yielded)."""

    def cap(batches: Iterator) -> Iterator:
        total = 0
        for batch in batches:
            total += batch.nbytes
            if total > max_bytes:
                raise RuntimeError(f"{MARKER} of {max_bytes} bytes")
            yield batch

    return cap
