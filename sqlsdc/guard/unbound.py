"""A parameter a client has not sent yet, for describing a statement before it is bound.

asyncpg, pg8000 and pgjdbc describe a prepared statement before they bind it, to learn the
types of its parameters and columns; the server then checks and types the statement with no
value for its parameters. Bound as NULL, a condition on a measure (``employees > $1``) was
refused as a comparison with NULL, not one of the measure's class breaks, so those clients
could not run the statement whatever value they would have bound (s50j's leftover).

:data:`UNBOUND` stands for such a value while a statement is described
(:func:`describing`): it is bound as a NULL marked :data:`META`, which the class-break check
(:func:`sqlsdc.planner.breaks.check_classed_comparisons`) takes for a break, since the value
is not known yet. Nothing is read when a statement is described, and its Execute is checked
again with the values the client binds then; outside :func:`describing` an UNBOUND parameter
is refused, so no statement runs with one. The mark counts only while describing (an analyst
can write it: ``NULL /* sqlglot.meta sqlsdc_unbound */``), and no check made while describing
is kept in the check cache, so an Execute never reuses one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlglot import exp

from sqlsdc.errors import ProgrammingError
from sqlsdc.planner.breaks import DESCRIBING as _describing
from sqlsdc.planner.breaks import UNBOUND_META as META


class Unbound:
    """The type of :data:`UNBOUND` (one instance)."""

    def __repr__(self) -> str:
        return "UNBOUND"


UNBOUND = Unbound()


def is_describing() -> bool:
    """Whether a statement is being described (:func:`describing`)."""
    return _describing.get()


@contextmanager
def describing() -> Iterator[None]:
    """Within it, an :data:`UNBOUND` parameter binds (as :func:`unbound_null`)."""
    token = _describing.set(True)
    try:
        yield
    finally:
        _describing.reset(token)


def unbound_null() -> exp.Expr:
    """The literal of an :data:`UNBOUND` parameter: a NULL marked :data:`META`; refused
    outside :func:`describing`."""
    if not _describing.get():
        raise ProgrammingError("a parameter has no value; bind a value for every parameter")
    node = exp.Null()
    node.meta[META] = True
    return node


def is_unbound(node: exp.Expr) -> bool:
    """Whether ``node`` is an :data:`UNBOUND` parameter's literal."""
    return isinstance(node, exp.Null) and bool(node.meta.get(META))
