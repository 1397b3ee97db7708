"""sqlsdc.engines.duckdb_hash equals DuckDB's ``hash(...)`` bit for bit.

Random values of every supported type (fixed seed), with the edge cases written out (empty,
8-, 12- and long strings, unicode, NULL, -0.0 and NaN, minimum and maximum integers, dates and
times before 1970), hashed one column at a time and several at once, in the Arrow types Spark
sends its copies in (:meth:`sqlsdc.engines.spark.SparkEngine.load_duckdb`: unsigned integers
widened, UBIGINT as DECIMAL(20, 0), HUGEINT as DECIMAL(38, 0)) and in DuckDB's own.
"""

from __future__ import annotations

import random
from decimal import Decimal

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from sqlsdc.engines.duckdb_hash import (
    HASHED_DUCKDB_TYPES,
    NULL_HASH,
    duckdb_hash,
    hash_struct,
    hash_values,
)

ROWS = 3000
RNG_SEED = 20261127

INTEGERS = {  # DuckDB type: (min, max)
    "TINYINT": (-(2**7), 2**7 - 1),
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
    "UTINYINT": (0, 2**8 - 1),
    "USMALLINT": (0, 2**16 - 1),
    "UINTEGER": (0, 2**32 - 1),
    "UBIGINT": (0, 2**64 - 1),
    "HUGEINT": (-(10**38) + 1, 10**38 - 1),  # what DECIMAL(38, 0) holds on Spark
}
DECIMALS = ["DECIMAL(4,1)", "DECIMAL(9,3)", "DECIMAL(18,2)", "DECIMAL(38,5)", "DECIMAL(20,0)"]
STRINGS = ["", "a", "abcdefg", "abcdefgh", "abcdefghi", "abcdefghijkl", "abcdefghijklm",
           "0123456789abcdef", "ünïcödé ✓ 😀", "\x00", "a\x00b", "x" * 1000]  # fmt: skip
ALPHABET = list("abcXYZ019 _-éü✓😀\x00")


def _integers(rng, low: int, high: int) -> list:
    edges = [low, high, 0, 1, -1, low + 1, high - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, -(2**31)]
    edges = [e for e in edges if low <= e <= high]
    draw = random.Random(int(rng.integers(2**32)))  # exact integers of any size
    return [*edges, None, *(draw.randint(low, high) for _ in range(ROWS - len(edges) - 1))]


def _decimal(rng, precision: int, scale: int) -> list:
    top = 10**precision - 1
    return [None if u is None else Decimal(f"{u}e-{scale}") for u in _integers(rng, -top, top)]


def _strings(rng) -> list:
    lengths = rng.integers(0, 40, ROWS - len(STRINGS) - 1)
    made = ["".join(rng.choice(ALPHABET, n)) for n in lengths]
    return [*STRINGS, None, *made]


def _columns(rng) -> dict[str, tuple[str, list]]:
    """Column name -> (DuckDB type, SQL literals or Python values)."""
    columns: dict[str, tuple[str, list]] = {}
    for kind, (low, high) in INTEGERS.items():
        columns[f"c_{kind.lower()}"] = (kind, _integers(rng, low, high))
    for i, kind in enumerate(DECIMALS):
        precision, scale = (int(x) for x in kind[8:-1].split(","))
        columns[f"c_decimal{i}"] = (kind, _decimal(rng, precision, scale))
    spread = rng.standard_normal(ROWS - 8) * 10.0 ** rng.integers(-30, 30, ROWS - 8)
    doubles = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 5e-324,
               1.7976931348623157e308, None, *spread]  # fmt: skip
    columns["c_double"] = ("DOUBLE", doubles)
    floats = [None if v is None or abs(v) > 3e38 else v for v in doubles]  # FLOAT's range
    columns["c_float"] = ("FLOAT", floats)  # rounded to 32 bits by DuckDB
    columns["c_varchar"] = ("VARCHAR", _strings(rng))
    columns["c_boolean"] = ("BOOLEAN", [True, False, None, *(rng.random(ROWS - 3) < 0.5)])
    days = rng.integers(-200_000, 200_000, ROWS - 1)
    columns["c_date"] = ("DATE", [None, *(int(d) for d in days)])
    micros = rng.integers(-(2**55), 2**55, ROWS - 2)
    columns["c_timestamp"] = ("TIMESTAMP", [None, 0, *(int(m) for m in micros)])
    columns["c_timestamptz"] = ("TIMESTAMP WITH TIME ZONE", [None, -1, *(int(m) for m in micros)])
    return columns


def make_table(con, name: str = "t") -> dict[str, str]:
    """Table ``name`` of every supported type (and a row number ``i``) in DuckDB connection
    ``con``; returns its columns' DuckDB types by name."""
    rng = np.random.default_rng(RNG_SEED)
    columns = _columns(rng)
    frame = {"i": pa.array(range(ROWS), pa.int64())}
    for column, (kind, values) in columns.items():
        if kind.startswith("DECIMAL"):  # exact (DuckDB reads long decimal strings as doubles)
            precision, scale = (int(x) for x in kind[8:-1].split(","))
            frame[column] = pa.array(values, pa.decimal128(precision, scale))
        elif kind in INTEGERS:
            frame[column] = pa.array([None if v is None else str(v) for v in values], pa.string())
        elif kind == "DATE":
            frame[column] = pa.array(values, pa.int32()).cast(pa.date32())
        elif kind.startswith("TIMESTAMP"):
            frame[column] = pa.array(values, pa.int64()).cast(pa.timestamp("us"))
        elif kind in ("DOUBLE", "FLOAT"):
            frame[column] = pa.array([None if v is None else float(v) for v in values])
        elif kind == "BOOLEAN":
            frame[column] = pa.array([None if v is None else bool(v) for v in values], pa.bool_())
        else:
            frame[column] = pa.array(values, pa.string())
    source = pa.table(frame)  # noqa: F841 (read by DuckDB's replacement scan)
    casts = ", ".join(f"CAST({c} AS {kind}) AS {c}" for c, (kind, _v) in columns.items())
    con.execute(f"CREATE TABLE {name} AS SELECT i, {casts} FROM source ORDER BY i")
    return {column: kind for column, (kind, _v) in columns.items()}


@pytest.fixture(scope="module")
def table():
    """A DuckDB connection with table ``t`` (:func:`make_table`) and its columns' types."""
    con = duckdb.connect()
    yield con, make_table(con)
    con.close()


def as_spark_sends(column: pa.Array, kind: str) -> pa.Array:
    """The Arrow array of a DuckDB column as Spark's copy sends it to an Arrow UDF."""
    if kind == "UBIGINT":
        return column.cast(pa.decimal128(20, 0))
    if kind == "HUGEINT":
        return column.cast(pa.decimal128(38, 0))
    if pa.types.is_unsigned_integer(column.type):
        return column.cast({8: pa.int16(), 16: pa.int32(), 32: pa.int64()}[column.type.bit_width])
    if pa.types.is_string_view(column.type) or pa.types.is_large_string(column.type):
        return column.cast(pa.string())
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.timestamp("us", tz=column.type.tz))
    return column


def arrow_of(con, names: list[str], kinds: dict[str, str]) -> list[pa.Array]:
    read = con.execute(f"SELECT {', '.join(names)} FROM t ORDER BY i").to_arrow_table()
    return [as_spark_sends(read.column(j).combine_chunks(), kinds[n]) for j, n in enumerate(names)]


def duckdb_hashes(con, names: list[str]) -> np.ndarray:
    read = con.execute(f"SELECT hash({', '.join(names)}) AS h FROM t ORDER BY i")
    return np.asarray(read.to_arrow_table()["h"].to_numpy(), dtype=np.uint64)


def test_every_supported_type_is_tested(table):
    _con, kinds = table
    assert all(HASHED_DUCKDB_TYPES.fullmatch(k) for k in kinds.values())
    assert {k for k in kinds.values() if not k.startswith("DECIMAL")} | {"DECIMAL"} == {
        *INTEGERS, "DECIMAL", "DOUBLE", "FLOAT", "VARCHAR", "BOOLEAN", "DATE", "TIMESTAMP",
        "TIMESTAMP WITH TIME ZONE",
    }  # fmt: skip


def test_each_type_hashes_as_in_duckdb(table):
    con, kinds = table
    for name in kinds:
        want = duckdb_hashes(con, [name])
        (column,) = arrow_of(con, [name], kinds)
        got = duckdb_hash([column])
        bad = np.flatnonzero(got != want)
        assert not bad.size, f"{kinds[name]}: {bad.size} rows differ, first {column[bad[0]]}"
        assert (got[np.asarray(column.is_null())] == NULL_HASH).all()


def test_duckdbs_own_arrow_types_hash_alike(table):
    """Unsigned integers, HUGEINT and dictionary strings as DuckDB exports them."""
    con, kinds = table
    for name in ("c_utinyint", "c_usmallint", "c_uinteger", "c_ubigint", "c_varchar"):
        read = con.execute(f"SELECT {name} FROM t ORDER BY i").to_arrow_table()[name]
        column = read.combine_chunks()
        if not pa.types.is_integer(column.type):
            column = column.cast(pa.string())
        assert (duckdb_hash([column]) == duckdb_hashes(con, [name])).all()
        assert (duckdb_hash([column.dictionary_encode()]) == duckdb_hashes(con, [name])).all()


def test_several_arguments_combine_as_in_duckdb(table):
    con, kinds = table
    rng = np.random.default_rng(RNG_SEED + 1)
    names = list(kinds)
    for size in (2, 2, 3, 3, 4, 5, 8, len(names)):
        chosen = [str(n) for n in rng.choice(names, size, replace=size > len(names) // 2)]
        got = duckdb_hash(arrow_of(con, chosen, kinds))
        assert (got == duckdb_hashes(con, chosen)).all(), chosen


def test_slices_and_nulls_of_strings():
    """Arrow slices (offsets into shared buffers) and NULL strings, as Spark's batches give."""
    con = duckdb.connect()
    values = ["", None, "abcdefgh", "ü" * 9, None, "z" * 33]
    whole = pa.array(values, pa.string())
    source = pa.table({"i": range(len(values)), "v": whole})  # noqa: F841 (read by DuckDB)
    want = con.execute("SELECT hash(v) FROM source ORDER BY i").fetchall()
    for start in range(len(values)):
        assert hash_values(whole.slice(start)).tolist() == [w for (w,) in want[start:]]
    con.close()


def test_the_udf_takes_a_struct_and_returns_duckdbs_ubigint(table):
    con, kinds = table
    names = ["c_bigint", "c_varchar", "c_date"]
    struct = pa.StructArray.from_arrays(arrow_of(con, names, kinds), names=["a0", "a1", "a2"])
    result = hash_struct(struct.slice(7))
    assert result.type == pa.decimal128(20, 0)
    want = duckdb_hashes(con, names)[7:]
    assert [int(v) for v in result.to_pylist()] == [int(w) for w in want]


@pytest.mark.parametrize("kind", ["BLOB", "INTERVAL", "UUID", "TIMESTAMP_S", "ENUM('a', 'b')",
                                  "TIME", "INTEGER[]", "VARCHAR COLLATE NOCASE"])  # fmt: skip
def test_other_duckdb_types_are_not_hashed_on_spark(kind):
    assert not HASHED_DUCKDB_TYPES.fullmatch(kind)


def test_arrow_types_without_a_duckdb_hash_raise():
    with pytest.raises(TypeError, match="binary"):
        hash_values(pa.array([b"x"], pa.binary()))
    with pytest.raises(TypeError, match="microseconds"):
        hash_values(pa.array([1], pa.timestamp("ns")))
