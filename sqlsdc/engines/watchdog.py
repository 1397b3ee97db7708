"""One thread per process that runs delayed actions: statement interrupts and idle releases.

Two ``threading.Timer`` threads per guarded query (the statement timeout and the idle release
of the database file) would cost 0.2-2 ms to start and wait for, most of the guard's fixed
cost beyond the catalog writes (``benchmarks/README.md``). Here one daemon thread sleeps until
the earliest alarm is due, so setting an alarm is a heap push under a lock, and cancelling it a
flag (cancelled alarms are dropped when they come due, or all at once when they outnumber the
live ones).

Actions run on the watchdog thread one after the other, so they must be short and must never
wait for a lock a statement may hold (an interrupt is one call; an idle release only tries its
connection's lock). An action that raises is reported through :func:`threading.excepthook`,
as a timer thread's would be, and the watchdog goes on.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["Alarm", "after"]


class Alarm:
    """An action due at ``when`` (monotonic clock) unless cancelled first."""

    __slots__ = ("action", "cancelled", "when")

    def __init__(self, when: float, action: Callable[[], object]):
        self.when, self.action, self.cancelled = when, action, False

    def cancel(self) -> None:
        """Do not run the action (no effect once it has started). The action is let go at
        once: an alarm waiting in the heap keeps nothing alive (an engine connection)."""
        with _due:
            if not self.cancelled:
                self.cancelled = True
                self.action = None
                _state.cancelled += 1


class _State:
    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Alarm]] = []
        self.cancelled = 0  # cancelled alarms still in the heap
        self.thread: threading.Thread | None = None


_due = threading.Condition()
_state = _State()
_order = itertools.count()  # ties keep the order alarms were set in


def after(seconds: float, action: Callable[[], object]) -> Alarm:
    """Run ``action()`` on the watchdog thread ``seconds`` from now, unless cancelled."""
    alarm = Alarm(time.monotonic() + seconds, action)
    with _due:
        if _state.thread is None:
            _state.thread = threading.Thread(target=_watch, name="sqlsdc-watchdog", daemon=True)
            _state.thread.start()
        heap = _state.heap
        if _state.cancelled > 64 and _state.cancelled * 2 > len(heap):
            heap[:] = [entry for entry in heap if not entry[2].cancelled]
            heapq.heapify(heap)
            _state.cancelled = 0
        earlier = not heap or alarm.when < heap[0][0]
        heapq.heappush(heap, (alarm.when, next(_order), alarm))
        if earlier:  # the watchdog sleeps until a later time: wake it to sleep less
            _due.notify()
    return alarm


_running = threading.Lock()  # held while an action runs; taken for good at interpreter exit


def _watch() -> None:
    while True:
        action = _next_due()
        with _running:
            try:
                action()
            except Exception:
                failure = (*sys.exc_info(), threading.current_thread())
                threading.excepthook(threading.ExceptHookArgs(failure))
            del action  # keep nothing alive while waiting


@atexit.register
def _finish_at_exit() -> None:
    """Let a running action end before the interpreter stops, and start no other: Python
    ends a daemon thread at exit wherever it is, and one inside DuckDB (an idle release
    closing its connection, about 0.1 s after a second of idleness) aborted the process
    ("terminate called after throwing an instance of ''", SIGABRT, exit 134): any script that
    left a connection open and ended in that window (red team s50g). The lock is never given
    back: the watchdog waits on it, outside the engine."""
    _running.acquire()


def _next_due() -> Callable[[], object]:
    """Wait for the earliest alarm not cancelled, take it off the heap, return its action."""
    heap = _state.heap
    with _due:
        while True:
            while heap and heap[0][2].cancelled:
                heapq.heappop(heap)
                _state.cancelled -= 1
            if not heap:
                _due.wait()
                continue
            delay = heap[0][0] - time.monotonic()
            if delay <= 0:
                alarm = heapq.heappop(heap)[2]
                action, alarm.action = alarm.action, None
                alarm.cancelled = True  # taken: a later cancel() changes nothing
                return action
            _due.wait(delay)


def _forget_after_fork() -> None:
    """A forked child has no watchdog thread (nor its parent's alarms): it starts its own."""
    global _due, _state, _running
    _due, _state, _running = threading.Condition(), _State(), threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
