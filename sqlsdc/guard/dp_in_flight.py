"""DP statistics a statement of this process has charged and whose cells are not yet settled.

A statistic counts as paid for a later asking only once its cells are cached
(:mod:`sqlsdc.guard.dp_charge`): a statement stopped between its charge and that caching leaves
it unpaid, so that no asking computes the same exact cells again for free (red team s41b).
Statements of one process asking the same new statistic at once (a dashboard's panels, threads
of one user) would each pay it then; instead, one that finds the statistic charged by another
statement still running waits for that one to settle (:func:`claim`'s ``settle``: its cells
cached, or it stopped), and prices again: the cells are then free from the cache, or, nothing
released, it pays. The wait computes nothing and is bounded by the statement's own timeout.
Statements of other processes are not seen: they pay each (fail closed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

Key = tuple[str, str, int, str]  # (database path, user, policy version, statistic digest)

_guard = threading.Lock()
_running: dict[Key, threading.Event] = {}


def busy(keys: Iterable[Key]) -> list[threading.Event]:
    """The events of other statements that charged any of ``keys`` and have not settled."""
    with _guard:
        return list({id(e): e for k in keys if (e := _running.get(k)) is not None}.values())


def claim(keys: Iterable[Key]) -> Callable[[], None]:
    """Mark ``keys`` charged by the calling statement (under the database's charging lock,
    after :func:`busy` found none of them); the returned ``settle`` (idempotent) lets waiters
    go once its cells are cached or it stopped."""
    keys = list(keys)
    event = threading.Event()
    with _guard:
        for key in keys:
            _running[key] = event

    def settle() -> None:
        with _guard:
            for key in keys:
                if _running.get(key) is event:
                    del _running[key]
        event.set()

    return settle


def wait(events: list[threading.Event], time_left: Callable[[], float]) -> None:
    """Wait until every event is set; ``time_left`` raises once the statement's timeout has
    passed or it was cancelled (checked at least every 50 ms)."""
    for event in events:
        while not event.wait(min(time_left(), 0.05)):
            pass
