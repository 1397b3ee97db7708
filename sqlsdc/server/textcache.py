"""A bounded cache for decisions the server takes on a statement's text alone.

Clients repeat their statements (a dashboard refreshes the same queries), so the server keeps
what it decided about a text instead of parsing it again. Only short texts are kept: a message
may be megabytes long, and 256 of those kept as keys would hold the server's memory.
"""

from __future__ import annotations

import functools

CACHED_TEXT = 4096  # characters; longer statements are decided again each time
CACHED_ENTRIES = 256


def text_cache(function):
    """``function(text, *args)`` cached (LRU) for texts of at most :data:`CACHED_TEXT`
    characters; the function must depend on its arguments alone."""
    cached = functools.lru_cache(maxsize=CACHED_ENTRIES)(function)

    @functools.wraps(function)
    def call(text: str, *args):
        return cached(text, *args) if len(text) <= CACHED_TEXT else function(text, *args)

    call.cache_info = cached.cache_info
    return call
