"""Turns of a database file between this process and the others, for the whole process.

A guarded connection that has held the file for a while lets it go after its statement when
another process waits (``Connection._schedule_release``), but the file's lock belongs to the
process: while another connection of the same process runs a statement, the process keeps it,
and the connection that let go joins it again at once. A process whose connections run
statements that overlap (``sqlsdc serve`` with several busy sessions) then kept the file for
as long as they overlapped: an admin command waited 47 s behind three 25 s statements started
25 s apart (red team s32c). So an opening waits while this process has held the file longer
than ``hold`` seconds and another process waits for it, until the process's connections have
let it go (each after its statement) and a turn has passed; never longer than ``bound``
seconds, so a connection left open and idle elsewhere delays it but never stops it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable


class ProcessTurns:
    """The engine connections of this process's guarded connections that hold each database
    file (weakly: one dropped without being closed stops counting when it is collected)."""

    def __init__(self, hold: float, turn: float):
        self.hold, self.turn = hold, turn
        self._changed = threading.Condition()
        self._holders: dict[str, weakref.WeakSet] = {}
        self._since: dict[str, float] = {}  # when the process's current hold began
        self._until: dict[str, float] = {}  # openings wait until then: another's turn
        self._yielding: set[str] = set()  # a turn is due when the last holder lets go

    def wait(self, key: str, others_waiting: Callable[[], bool], bound: float) -> None:
        """Wait, at most ``bound`` seconds, while this process has held the file ``key``
        longer than ``hold`` seconds and another process waits for it (until the process's
        connections let it go and a turn has passed), or while another's turn lasts."""
        deadline = time.monotonic() + bound
        with self._changed:
            while (now := time.monotonic()) < deadline:
                if now < self._until.get(key, 0.0):
                    self._changed.wait(min(self._until[key], deadline) - now)
                elif (
                    self._holders.get(key)
                    and now - self._since[key] > self.hold
                    and others_waiting()
                ):
                    self._yielding.add(key)
                    self._changed.wait(min(0.05, deadline - now))  # the waiter may leave
                else:
                    return

    def held(self, key: str, con) -> None:
        """``con`` (an engine connection) now holds the file ``key``."""
        with self._changed:
            holders = self._holders.setdefault(key, weakref.WeakSet())
            if not holders:
                self._since[key] = time.monotonic()
            holders.add(con)

    def closed(self, key: str, con) -> None:
        """``con`` let the file go; the last holder after a yield starts another's turn."""
        with self._changed:
            holders = self._holders.get(key)
            if holders is not None:
                holders.discard(con)
                if not holders and key in self._yielding:
                    self._yielding.discard(key)
                    self._until[key] = time.monotonic() + self.turn
            self._changed.notify_all()
