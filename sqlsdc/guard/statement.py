"""A statement's text and parameters as the guard takes them: built-in values, cache keys.

The text is read as a built-in ``str`` (:func:`statement_text`): a subclass's own equality
and hash made the check cache answer one statement with another's check. Parameters key the
check cache only as built-in lists, tuples and dicts, each value with its type and spelling
(:func:`parameters_key`, :func:`freeze`): Python's equality takes ``1``, ``1.0`` and ``True``
for one value, and a subclass may iterate over other values than it binds (cache poisoning).
"""

from __future__ import annotations

from sqlsdc.errors import ProgrammingError
from sqlsdc.guard.list_parameters import LIST_TYPES
from sqlsdc.guard.unbound import Unbound


def statement_text(sql) -> str:
    """The statement as a built-in str (:func:`built_in_text`); anything else is the
    caller's mistake, said as such (PEP 249's ProgrammingError), not an internal error."""
    if not isinstance(sql, str):
        raise ProgrammingError(
            f"a statement must be a str, not {type(sql).__name__}: pass the SQL text "
            "(bytes: decode them first)"
        )
    return built_in_text(sql)


def built_in_text(sql):
    """A statement given as a str subclass, as a built-in str: the subclass's own ``__eq__``
    and ``__hash__`` made the check cache answer it with another statement's check, so the
    audit log recorded one text beside another statement's answer."""
    return str.__str__(sql) if isinstance(sql, str) else sql


UNCACHEABLE = object()  # parameters that cannot be a key of the check cache
_KEYED_PARAMETERS = (type(None), list, tuple, dict)


def parameters_key(params):
    """``params`` as a hashable key of the check cache (:func:`freeze`), or
    :data:`UNCACHEABLE` (the check then binds them, and refuses what it cannot bind: a value
    whose ``repr`` fails, an int of more digits than Python writes out). Only a built-in
    list, tuple or dict is a key: a subclass may iterate over other values than it binds
    (``__getitem__``), and its check, kept under the key of the values it iterates, answered
    other connections of the process that bound those (cache poisoning)."""
    if type(params) not in _KEYED_PARAMETERS:
        return UNCACHEABLE
    try:
        frozen = freeze(params)
        hash(frozen)
    except Exception:  # noqa: BLE001 - the analyst's objects: any error makes no cache key
        return UNCACHEABLE
    return frozen


def freeze(params):
    """The parameters as a key of the check cache: each value with its type and spelling, as
    Python's equality would take ``1``, ``1.0``, ``True`` and ``Decimal('1.00')`` for one value
    and the cache would then run the statement checked with another literal
    (``CAST(? AS VARCHAR)`` is ``'1'``, ``'1.0'`` or ``'true'``)."""
    if params is None:
        return None
    if isinstance(params, dict):
        return tuple(sorted((k, *_frozen_value(v)) for k, v in params.items()))
    return tuple(_frozen_value(v) for v in params)


def _frozen_value(value) -> tuple:
    """One parameter as a key: its type and spelling, and a list's (``= ANY(?)``) element by
    element, each with its type: ``repr`` of a list calls its elements' own ``__repr__``, and
    an int subclass spelled ``1`` and bound as 2 shared the key of ``[1]``."""
    if type(value) in LIST_TYPES:
        return (type(value), tuple(_frozen_value(v) for v in value))
    if type(value) is Unbound:  # a described statement's check is never kept: not a key
        raise TypeError("a parameter not sent yet is no key of the check cache")
    return (type(value), repr(value))
