"""Ctrl-C during a statement interrupts the statement.

DuckDB 2.0 does not stop a running statement on SIGINT: Python's default handler only notes the
signal, and the engine checks for it so rarely that a long aggregation runs to its end (a
``GROUP BY`` over 3e9 rows: 25 s of CPU and ~50 s under load, in 8 of 12 tries signalled from
0 to 3 s in) before ``KeyboardInterrupt`` is raised. The engine's own ``interrupt()`` stops it
within milliseconds, and Python handlers do run while a statement does. So while a statement
runs in the main thread under Python's default handler, SIGINT interrupts the connection, and
the caller raises ``KeyboardInterrupt`` once the statement has stopped (or ended): a Ctrl-C is
never lost, and never mistaken for the statement timeout's interrupt.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def interrupting(interrupt: Callable[[], object]) -> Iterator[list[int]]:
    """While the block runs, SIGINT calls ``interrupt()`` and is noted in the list yielded
    (empty: no Ctrl-C). Only in the main thread (the one Python delivers signals to) under
    Python's default handler: a handler of the application's own is left alone, as are other
    threads (the server's workers)."""
    pressed: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield pressed
        return

    def handler(number, frame):
        pressed.append(number)
        interrupt()

    signal.signal(signal.SIGINT, handler)
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
