"""The per-output limit of new verification queries (``verification.max_queries``), counted
with the queries of this process still running.

A new query counts once its answer is stored (:mod:`sqlsdc.synth.verify`), seconds after the
limit was checked: threads of one process (connections of one server) that checked at once all
passed. Red team s43b: 8 threads, each a new query on an output whose limit is 3, were all
answered (8 stored). So a query reserves its place when it passes the check, under one lock,
and the check counts the stored queries and the reserved ones. Other processes cannot run
meanwhile: a guarded connection holds the database file for the whole verification.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager

__all__ = ["reserved"]

_guard = threading.Lock()
_running: Counter = Counter()


@contextmanager
def reserved(key: Hashable, limit: int, stored: Callable[[], int],
             refuse: Callable[[int], Exception]) -> Iterator[None]:  # fmt: skip
    """Run the body as one of at most ``limit`` queries under ``key`` (the database, user,
    output and its version): ``stored()`` (the count of stored answers) plus those running,
    or raise ``refuse(count)``. The place is given back when the body ends; an answer it
    stored counts from then on through ``stored``."""
    with _guard:
        count = stored() + _running[key]
        if count >= limit:
            raise refuse(count)
        _running[key] += 1
    try:
        yield
    finally:
        with _guard:
            _running[key] -= 1
            if not _running[key]:
                del _running[key]
