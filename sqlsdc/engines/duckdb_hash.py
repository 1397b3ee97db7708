"""DuckDB's ``hash(a, b, ...)`` in numpy, bit for bit, for the Spark engine.

The keyed choices of differential privacy (:class:`sqlsdc.rewrite.dp_bounding.Hashed`) rank
each unit's groups and rows by ``hash(record key, keys, measures)``. Spark's ``hash`` is a
32-bit Murmur3, so the Spark engine (:mod:`sqlsdc.engines.spark`) calls this function
instead, as a vectorised Arrow UDF, and its cells equal DuckDB's. DuckDB's definition
(DuckDB 2.0; source files of github.com/duckdb/duckdb):

- ``src/include/duckdb/common/types/hash.hpp``: ``MurmurHash64(x)`` is
  ``x ^= x >> 32; x *= C; x ^= x >> 32; x *= C; x ^= x >> 32`` with ``C = 0xd6e8feb86659fd93``
  (mod 2^64); a value of at most 32 bits (BOOLEAN, TINYINT … INTEGER, their unsigned kinds,
  DATE) hashes as ``MurmurHash64(uint32(v))``, BIGINT, UBIGINT and TIMESTAMP as
  ``MurmurHash64(uint64(v))``.
- ``src/common/types/hash.cpp``: HUGEINT as ``MurmurHash64(lower) ^ MurmurHash64(upper)``;
  FLOAT and DOUBLE as ``MurmurHash64`` of their bits, -0.0 as 0.0 and every NaN as the quiet
  NaN; a string by ``HashBytes``: ``h = 0xe17a1465 ^ (len * 0xc6a4a7935bd1e995)``, then per 8
  bytes (the last block padded with zeros, read little-endian) ``h ^= block; h *= C``, then
  ``MurmurHash64(h)``.
- ``src/common/vector_operations/vector_hash.cpp``: NULL hashes as ``0xbf58476d1ce4e5b9``, and
  the arguments are combined left to right by ``CombineHashScalar(a, b) =
  ((a ^ (a >> 32)) * C) ^ b`` (``DataChunk::Hash`` in ``src/common/types/data_chunk.cpp``).
- A DECIMAL is its unscaled integer, stored in 16, 32, 64 or 128 bits for precisions up to 4,
  9, 18 and 38; a HUGEINT and a DECIMAL(38, 0) of one value hash alike.

Each argument is an Arrow array typed as Spark sends it; :data:`HASHED_DUCKDB_TYPES` are the
DuckDB types whose copy on Spark (:meth:`SparkEngine.load_duckdb`) hashes as in DuckDB.
``tests/test_duckdb_hash.py`` compares this function with DuckDB's on random values.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

C = np.uint64(0xD6E8FEB86659FD93)
NULL_HASH = np.uint64(0xBF58476D1CE4E5B9)
STRING_SEED = np.uint64(0xE17A1465)
STRING_LENGTH_FACTOR = np.uint64(0xC6A4A7935BD1E995)
_32 = np.uint64(32)

HASHED_DUCKDB_TYPES = re.compile(
    r"(BOOLEAN|U?(TINYINT|SMALLINT|INTEGER|BIGINT)|HUGEINT|DECIMAL\(\d+,\s*\d+\)|FLOAT|DOUBLE"
    r"|VARCHAR|DATE|TIMESTAMP|TIMESTAMP WITH TIME ZONE)"
)
"""DuckDB column types (as DuckDB names them) that Spark's copy hashes as DuckDB does: the
Parquet copy keeps their values (unsigned integers widen, which changes no non-negative value's
hash; UBIGINT and HUGEINT become DECIMAL(20 or 38, 0)). Others (ENUM, UUID, TIMESTAMP_S, BLOB,
nested types, ...) are stored or copied differently and are refused."""


def murmur64(x: np.ndarray) -> np.ndarray:
    """DuckDB's ``MurmurHash64`` of each uint64 (a new array)."""
    x = x ^ (x >> _32)
    x *= C
    x ^= x >> _32
    x *= C
    x ^= x >> _32
    return x


def combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """DuckDB's ``CombineHashScalar``: the hash of ``(..., b)`` from the hash ``a`` of ``(...)``."""
    a = a ^ (a >> _32)
    a *= C
    return a ^ b


def duckdb_hash(columns: Sequence[pa.Array]) -> np.ndarray:
    """``hash(c1, c2, ...)`` row by row, as DuckDB computes it: a uint64 array.

    Raises:
        TypeError: a column's Arrow type has no DuckDB hash here.
    """
    if not columns:
        raise TypeError("hash() needs at least one argument")
    hashed = hash_values(columns[0])
    for column in columns[1:]:
        hashed = combine(hashed, hash_values(column))
    return hashed


def hash_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """DuckDB's hash of each value of one column (NULL: :data:`NULL_HASH`)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_null(kind):
        return np.full(len(column), NULL_HASH, dtype=np.uint64)
    if pa.types.is_dictionary(kind):
        column = column.dictionary_decode()
        kind = column.type
    if pa.types.is_boolean(kind):
        hashed = murmur64(_filled(column.cast(pa.uint8()), 0).astype(np.uint64))
    elif pa.types.is_integer(kind) or pa.types.is_date32(kind):
        values = _filled(column.cast(pa.int32()) if pa.types.is_date32(kind) else column, 0)
        if kind.bit_width <= 32:  # static_cast<uint32_t>: two's complement, 32 bits
            values = values.astype(np.int64) & 0xFFFFFFFF
        hashed = murmur64(values.astype(np.uint64))  # int64 -> uint64 keeps the bits
    elif pa.types.is_timestamp(kind):
        if kind.unit != "us":
            raise TypeError(f"hash of {kind}: DuckDB's TIMESTAMP counts microseconds")
        hashed = murmur64(_filled(column.cast(pa.int64()), 0).view(np.uint64))
    elif pa.types.is_float64(kind) or pa.types.is_float32(kind):
        hashed = _hash_floats(_filled(column, 0.0), kind)
    elif pa.types.is_decimal(kind):
        hashed = _hash_decimals(column)
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        hashed = _hash_strings(column)
    else:
        raise TypeError(f"hash of {kind} is not reproduced")
    if column.null_count:
        hashed[np.asarray(column.is_null())] = NULL_HASH
    return hashed


def _filled(column: pa.Array, fill) -> np.ndarray:
    """The values as numpy, NULLs replaced by ``fill`` (their hash is set afterwards)."""
    if column.null_count:
        column = column.fill_null(fill)
    return column.to_numpy(zero_copy_only=False)


def _hash_floats(values: np.ndarray, kind: pa.DataType) -> np.ndarray:
    values = values.copy()
    values[values == 0] = 0.0  # -0.0 hashes as 0.0
    if pa.types.is_float32(kind):
        bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits[np.isnan(values)] = 0x7FC00000  # the quiet NaN
    else:
        bits = values.astype(np.float64).view(np.uint64).copy()
        bits[np.isnan(values)] = 0x7FF8000000000000
    return murmur64(bits)


def _hash_decimals(column: pa.Array) -> np.ndarray:
    """A DECIMAL(p, s) is its unscaled integer, of 16, 32, 64 or 128 bits by ``p``."""
    precision = column.type.precision
    if not pa.types.is_decimal128(column.type):
        raise TypeError(f"hash of {column.type} is not reproduced")
    data = np.frombuffer(column.buffers()[1], dtype="<u8")
    words = data[2 * column.offset : 2 * (column.offset + len(column))].reshape(-1, 2)
    lower, upper = words[:, 0].astype(np.uint64), words[:, 1].astype(np.uint64)
    if precision <= 9:  # int16 or int32: the low 32 bits (two's complement)
        return murmur64(lower & np.uint64(0xFFFFFFFF))
    if precision <= 18:
        return murmur64(lower)
    return murmur64(lower) ^ murmur64(upper)


def _hash_strings(column: pa.Array) -> np.ndarray:
    """DuckDB's ``HashBytes`` of each string's UTF-8 bytes, 8 bytes (one block) at a time
    for all strings at once, each block read as one little-endian word."""
    offsets_type = np.int64 if pa.types.is_large_string(column.type) else np.int32
    offsets = np.frombuffer(column.buffers()[1], dtype=offsets_type)
    offsets = offsets[column.offset : column.offset + len(column) + 1].astype(np.int64)
    data = column.buffers()[2]
    data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(8, dtype=np.uint8)])  # reads past the end are zeros
    # words[i]: the 8 bytes from byte i, little-endian (an overlapping view, no copy)
    words = np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, strides=(1,))
    starts, lengths = offsets[:-1], np.diff(offsets)
    valid = np.asarray(column.is_valid()) if column.null_count else np.ones(len(column), bool)
    lengths = np.where(valid, lengths, 0)
    hashed = STRING_SEED ^ (lengths.astype(np.uint64) * STRING_LENGTH_FACTOR)
    blocks = (lengths + 7) // 8
    kept = np.array([(1 << (8 * n)) - 1 for n in range(8)] + [2**64 - 1], dtype=np.uint64)
    for block in range(int(blocks.max(initial=0))):
        rows = np.flatnonzero(blocks > block)
        left = np.minimum(lengths[rows] - 8 * block, 8)  # the block's bytes of the string
        word = words[starts[rows] + 8 * block] & kept[left]  # zeros beyond the string
        hashed[rows] = (hashed[rows] ^ word) * C
    return murmur64(hashed)


def hash_struct(arguments: pa.Array) -> pa.Array:
    """The Spark engine's UDF: DuckDB's ``hash`` of the fields of each struct, in order, as
    DECIMAL(20, 0) (DuckDB's UBIGINT, exact and ordered as DuckDB orders it)."""
    hashed = duckdb_hash(arguments.flatten())
    return pa.array(hashed, pa.uint64()).cast(pa.decimal128(20, 0))
