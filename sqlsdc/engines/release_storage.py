"""The release database's storage format: which DuckDB releases can open the file.

DuckDB 2.0 writes its own storage format by default, which no DuckDB 1.x opens ("Trying to read
a database file with version number 999"), yet many readers bundle a 1.x (Metabase's driver,
older notebooks, R packages). ``ATTACH ... (STORAGE_VERSION 'v1.0.0')`` makes DuckDB 2.0 write a
format that every release from the given one on reads (DuckDB, "Storage Versions and Format";
the file header then says 64 for v1.0.0 and v1.1.x, 65 for v1.2, 66 v1.3, 67 v1.4, 68 v1.5).

The storage version does not stop DuckDB 2.0 from storing its new types, and one column of a
type a reader does not know makes the whole file unreadable for it ("Enum value: '33' not
implemented" in DuckDB 1.0). :data:`NEWER_TYPES` lists them with the type a release for older
readers stores instead (:func:`readable_types`); every other type is stored as it is.
"""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pyarrow as pa
from sqlglot import exp

from sqlsdc.errors import Error

OLDEST_READER = "v1.0.0"
"""The oldest DuckDB release a release database is written for by default (tested)."""

# The DuckDB releases whose storage format a release can be written in: the oldest DuckDB
# release that must open the file. A patch release (v1.1.3) names its minor release's format.
STORAGE_VERSIONS = ("v1.0.0", "v1.1.0", "v1.2.0", "v1.3.0", "v1.4.0", "v1.5.0", "v2.0.0")
LATEST = "latest"  # the running DuckDB's own format: only readers of its version or newer

# DuckDB 2.0 types no 1.x release reads -> what a release for 1.x readers stores instead
# (checked with DuckDB 1.0.0: TIMESTAMPTZ_NS, TIME_NS and BIGNUM make the file unreadable,
# GEOMETRY reads as internal bytes, VARIANT cannot be stored before v1.5.0).
NEWER_TYPES = {
    "TIMESTAMPTZ_NS": "TIMESTAMP WITH TIME ZONE",  # microseconds, as DuckDB 1.x computes anyway
    "TIME_NS": "TIME",  # microseconds
    "BIGNUM": "VARCHAR",  # exact digits
    "GEOMETRY": "VARCHAR",  # well-known text
    "VARIANT": "VARCHAR",  # its text
}
_NEWER = re.compile(r"\b(" + "|".join(NEWER_TYPES) + r")\b")
_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def storage_version(text: str) -> str:
    """The storage version for ``text`` (``v1.1.3``, ``1.1.3`` or ``latest``), or a clear error.

    >>> storage_version("1.1.3"), storage_version("latest")
    ('v1.1.3', 'latest')
    """
    if text.strip().lower() == LATEST:
        return LATEST
    match = _VERSION.fullmatch(text.strip())
    if match is None or f"v{match[1]}.{match[2]}.0" not in STORAGE_VERSIONS:
        raise Error(
            f"unknown storage version {text!r}: give the oldest DuckDB release that must open "
            f"the release, one of {', '.join(STORAGE_VERSIONS)} (or a patch release of one, "
            f"e.g. v1.1.3), or {LATEST} (DuckDB {duckdb.__version__} and newer only); "
            f"the default {OLDEST_READER} is read by every DuckDB from {OLDEST_READER} on"
        )
    return "v{}.{}.{}".format(*match.groups())


def readable_types(types: list[str], version: str) -> list[str | None]:
    """Per column of DuckDB ``types``, the type to store instead for readers of ``version``, or
    None to store the column as it is (nested types are rewritten inside: ``TIME_NS[]`` ->
    ``TIME[]``)."""
    if version in (LATEST, STORAGE_VERSIONS[-1]) or version.startswith("v2."):
        return [None] * len(types)
    return [_NEWER.sub(lambda m: NEWER_TYPES[m[1]], t) if _NEWER.search(t) else None for t in types]


class ReleaseFile:
    """A new DuckDB file in the given storage ``version``, written table by table.

    Example:
        >>> with ReleaseFile(path, "v1.0.0") as release:  # doctest: +SKIP
        ...     release.write("persons_by_region", arrow_table)
    """

    def __init__(self, path: Path, version: str):
        self.version = version
        self._con = duckdb.connect()
        attach = exp.Literal.string(str(path)).sql("duckdb")
        option = exp.Literal.string(version).sql("duckdb")
        try:
            self._con.execute(f"ATTACH {attach} AS release (STORAGE_VERSION {option})")
        except duckdb.Error:
            self._con.close()
            raise
        self._con.execute("USE release")

    def write(self, name: str, data: pa.Table) -> None:
        """Store ``data`` as table ``name``, with the types readers of the version know."""
        self._con.register("__release_input", data)
        try:
            source = self._con.sql("SELECT * FROM __release_input")
            types = readable_types([str(t) for t in source.types], self.version)
            columns = [
                exp.column(column, quoted=True)
                if new is None
                else exp.alias_(
                    exp.cast(exp.column(column, quoted=True), exp.DataType.build(new, "duckdb")),
                    column,
                    quoted=True,
                )
                for column, new in zip(source.columns, types, strict=True)
            ]
            select = exp.select(*columns).from_("__release_input")
            create = exp.Create(
                this=exp.to_table(exp.to_identifier(name, quoted=True)),
                kind="TABLE",
                expression=select,
            )
            self._con.execute(create.sql("duckdb"))
        finally:
            self._con.unregister("__release_input")

    def close(self) -> None:
        """Checkpoint and close the file (nothing is left in a write-ahead log)."""
        try:
            self._con.execute("CHECKPOINT release")
            self._con.execute("USE memory")
            self._con.execute("DETACH release")
        finally:
            self._con.close()

    def __enter__(self) -> ReleaseFile:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._con.close()
