"""PostgreSQL as the session catalog reads it: sqlglot's dialect, with arrays of
object-identifier types.

sqlglot reads ``x::oid`` (and ``regtype``, ``regclass`` …) as an object-identifier type, but
fails on ``x::oid[]`` ("Required keyword: 'expressions' missing for Bracket"), which
asyncpg's type introspection sends (``ti.oid = any($1::oid[])``, PostgreSQL's
``pg_catalog`` queries; asyncpg ``introspection.INTRO_LOOKUP_TYPES``). Here such a type
followed by ``[]`` is an array of that type, named as written (the catalog casts ``oid[]``
to ``BIGINT[]``, :func:`sqlsdc.server.catalog._cast`). Nothing else differs.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.tokens import TokenType


class CatalogPostgres(Postgres):
    """sqlglot's PostgreSQL, reading ``oid[]``-style arrays of object-identifier types."""

    class Parser(Postgres.Parser):
        def _parse_types(self, *args, **kwargs) -> exp.Expr | None:
            this = super()._parse_types(*args, **kwargs)
            if not isinstance(this, exp.ObjectIdentifier):
                return this
            while self._match_pair(TokenType.L_BRACKET, TokenType.R_BRACKET):
                element = this if isinstance(this, exp.DataType) else exp.DataType(
                    this=exp.DataType.Type.USERDEFINED, kind=this.name.lower()
                )  # fmt: skip
                this = exp.DataType(this=exp.DataType.Type.ARRAY, expressions=[element],
                                    nested=True)  # fmt: skip
            return this
