"""Limits of a server session: what one client may keep, and what runs on the event loop.

Each bound keeps one session (or the sessions of one user) from taking the server's memory or
its event loop, which every session shares (red teams s30, s32c, s35b):
:mod:`sqlsdc.server.session` and the protocol handlers of :mod:`sqlsdc.server.extended` read
them.
"""

from __future__ import annotations

MAX_PARAMETERS = 65_535  # PostgreSQL's limit: ParameterDescription counts them in 16 bits
MAX_PREPARED = 1_000  # named statements (and portals) one session may keep
MAX_PREPARED_BYTES = 32 * 1024 * 1024  # their text, together: one analyst cannot fill memory
MAX_HELD_BYTES = 64 * 1024 * 1024  # answers kept for portals and described statements by all
# sessions of one user; beyond, none of them runs a further statement to keep until some are
# closed (so a user keeps less than this plus one answer per statement running at once)
ROWS_PER_WRITE = 1000  # DataRows encoded and written at a time
INLINE_ROWS = 100  # DataRows encoded on the event loop (tens of microseconds), not in the pool
INLINE_TEXT = 65_536  # characters of a Parse (bytes of a Bind's values) read on the event loop
MAX_NAME = 1_024  # characters of a prepared statement's, portal's or cursor's name: a session
# keeps a thousand of each, and 200 Parse messages named with 3 MB each (an empty statement)
# took 600 MB of the server in 9 s (red team s43f); clients name them in tens of characters
MAX_SETTINGS = 1_000  # names a session's SET statements may keep (PostgreSQL has ~350)
MAX_SETTINGS_CHARACTERS = 65_536  # their names and values together: kept per session, echoed
# by SHOW and pg_settings; unbounded, one analyst's SETs of 2 MB values took 590 MB of the
# server in 250 statements (red team s43f)
AUTH_TIMEOUT = 15.0  # seconds from the first byte to the end of authentication
