"""A keyed pseudo-random stream: the only source of randomness behind sqlsdc's DP noise.

"Same question, same answer" (ARCHITECTURE.md §3) needs noise that is a *function* of the cell:
the stream for a cell is fixed by a server-side secret and a context such as
``(policy version, mechanism, table, cell identity)``. Repeating or rephrasing a query reproduces
the same bits, so noise cannot be averaged away; anyone without the secret sees bits that are
indistinguishable from uniform.

Construction (counter mode, the shape of NIST SP 800-108's KDF in counter mode)::

    block_i = HMAC-SHA256(secret, LABEL || enc(context) || 0x00 || uint64_be(i)),  i = 0, 1, ...

where ``LABEL = b"sqlsdc.prf.v1"`` and ``enc`` writes each context item as
``tag || uint64_be(len) || payload`` with tag 1 = bytes, 2 = str (UTF-8), 3 = int (two's
complement, big-endian). Tags are non-zero and every item carries its length, so the 0x00 after
the last item ends the context and the encoding is injective: ``("ab", "c")``, ``("a", "bc")``,
``("1",)``, ``(1,)`` and ``(b"1",)`` are all different streams.

Why HMAC-SHA256 rather than SHAKE-256: HMAC is a PRF whenever the SHA-256 compression function
is one (Bellare, CRYPTO 2006), it is the standard keyed construction for counter-mode key
derivation, and the standard library runs it in C through OpenSSL. SHAKE-256 over
``key || message`` would also be a sound PRF, but the keyed form with proper domain separation
is KMAC, which the standard library lacks, and ``shake_256().digest(n)`` needs the output length
in advance, whereas counter mode extends the stream one block at a time.

The stream is read as one long bit string, most significant bit of each block first; every draw
takes the next bits. The secret itself is not stored: only OpenSSL's keyed HMAC state is kept, and
``repr``, ``str``, error messages and pickling never show it.

Example:
    >>> stream = KeyedStream(b"a server secret of 16+ bytes", "policy-v3", "dp_count", 42)
    >>> stream.uniform_int(6), stream.bernoulli(Fraction(1, 3)), stream.bits(8)
    (4, False, 227)
    >>> KeyedStream(b"a server secret of 16+ bytes", "policy-v3", "dp_count", 42).uniform_int(6)
    4
"""

from __future__ import annotations

import hmac
import numbers
from collections.abc import Iterable
from fractions import Fraction

__all__ = ["KeyedStream", "MIN_SECRET_BYTES"]

LABEL = b"sqlsdc.prf.v1"
"""Domain-separation label; changing it changes every stream (and every released DP value)."""

MIN_SECRET_BYTES = 16
"""Shortest accepted secret: 128 bits, so the secret cannot be found by search."""

_BLOCK_BITS = 256
_TAG_BYTES, _TAG_STR, _TAG_INT = b"\x01", b"\x02", b"\x03"
_END = b"\x00"


def _encode_item(item: object, position: int) -> bytes:
    """``tag || uint64_be(len) || payload`` for one context item (see the module docstring)."""
    if isinstance(item, bytes | bytearray | memoryview):
        tag, payload = _TAG_BYTES, bytes(item)
    elif isinstance(item, str):
        # surrogatepass keeps every Python str encodable and the map injective.
        tag, payload = _TAG_STR, item.encode("utf-8", "surrogatepass")
    elif isinstance(item, int) and not isinstance(item, bool):
        tag, payload = _TAG_INT, item.to_bytes((item.bit_length() + 8) // 8, "big", signed=True)
    else:
        raise TypeError(
            f"context item {position} must be str, int or bytes, got {type(item).__name__}; "
            "encode other values (dates, floats, booleans) as str first so the encoding is "
            "explicit"
        )
    return tag + len(payload).to_bytes(8, "big") + payload


class KeyedStream:
    """A deterministic stream of pseudo-random bits keyed by a secret and a context.

    Args:
        secret: the server-side key, at least :data:`MIN_SECRET_BYTES` bytes. Never derived
            from user input.
        *context: str, int or bytes items naming what the randomness is for, e.g. policy
            version, mechanism, table and cell identity. Same secret and context, same stream.

    Raises:
        TypeError: the secret is not bytes, or a context item is not str, int or bytes.
        ValueError: the secret is shorter than :data:`MIN_SECRET_BYTES`.

    Example:
        >>> a = KeyedStream(b"a server secret of 16+ bytes", "v1", "region=North")
        >>> b = KeyedStream(b"a server secret of 16+ bytes", "v1", "region=South")
        >>> a.bits(32) != b.bits(32)
        True
    """

    __slots__ = ("_context", "_prefix", "_counter", "_pool", "_nbits")

    def __init__(self, secret: bytes, *context: str | int | bytes):
        if not isinstance(secret, bytes | bytearray | memoryview):
            raise TypeError(
                f"secret must be bytes, got {type(secret).__name__}; store the secret as random "
                f"bytes (e.g. secrets.token_bytes(32)), not as text"
            )
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(
                f"secret must be at least {MIN_SECRET_BYTES} bytes, got {len(secret)}; "
                "generate one with secrets.token_bytes(32)"
            )
        self._start(hmac.new(bytes(secret), LABEL, "sha256"), (), tuple(context))

    def _start(self, prefix: hmac.HMAC, known: tuple, more: tuple) -> None:
        """Absorb the items ``more`` into ``prefix`` (which has absorbed ``known``) and reset."""
        for position, item in enumerate(more, start=len(known)):
            prefix.update(_encode_item(item, position))
        self._context = known + more
        self._prefix = prefix  # keyed state before the 0x00 terminator; copied per block
        self._counter = 0
        self._pool = 0
        self._nbits = 0

    def derive(self, *more: str | int | bytes) -> KeyedStream:
        """A fresh stream for ``context + more`` under the same secret.

        ``KeyedStream(s, *a).derive(*b)`` equals ``KeyedStream(s, *a, *b)`` bit for bit, so code
        that holds a policy-level stream can hand each cell its own without seeing the secret.
        It does not depend on how much of this stream was read.
        """
        child = KeyedStream.__new__(KeyedStream)
        child._start(self._prefix.copy(), self._context, more)
        return child

    def derive_many(self, items: Iterable[str]) -> list[KeyedStream]:
        """``[self.derive(item) for item in items]``: the same streams, for the many cells of
        one result; a ``str`` item is absorbed as :func:`_encode_item` encodes it, without
        the per-item type dispatch (a third less time on thousands of cells)."""
        streams = []
        context, prefix, new = self._context, self._prefix, KeyedStream.__new__
        for item in items:
            if type(item) is not str:
                streams.append(self.derive(item))
                continue
            payload = item.encode("utf-8", "surrogatepass")
            mac = prefix.copy()
            mac.update(_TAG_STR + len(payload).to_bytes(8, "big") + payload)
            child = new(KeyedStream)
            child._context, child._prefix = context + (item,), mac
            child._counter = child._pool = child._nbits = 0
            streams.append(child)
        return streams

    @property
    def context(self) -> tuple:
        """The context items this stream is keyed by (never the secret)."""
        return self._context

    def _block(self) -> int:
        value = int.from_bytes(self.block(self._counter), "big")
        self._counter += 1
        return value

    def block(self, index: int) -> bytes:
        """Block ``index`` of the stream (32 bytes), whatever has been read so far.

        The stream is these blocks end to end, most significant bit first, so a reader that
        takes bits from ``block(0)``, ``block(1)``, ... sees exactly what :meth:`bits` and
        :meth:`uniform_int` see (:mod:`sqlsdc.mechanisms.batch_samplers` reads many streams
        at once this way).
        """
        mac = self._prefix.copy()
        mac.update(_END + index.to_bytes(8, "big"))
        return mac.digest()

    def bits(self, k: int) -> int:
        """The next ``k`` bits of the stream as an integer in ``[0, 2**k)``.

        Bits come in stream order; the first one drawn is the most significant.
        """
        if k < 0:
            raise ValueError(f"number of bits must be >= 0, got {k}")
        while self._nbits < k:
            self._pool = (self._pool << _BLOCK_BITS) | self._block()
            self._nbits += _BLOCK_BITS
        self._nbits -= k
        value = self._pool >> self._nbits
        self._pool &= (1 << self._nbits) - 1
        return value

    def read_bytes(self, size: int) -> bytes:
        """The next ``8 * size`` bits of the stream as ``size`` bytes: what
        ``bits(8 * size).to_bytes(size, "big")`` gives, in time linear in ``size`` (for the
        many draws of :mod:`sqlsdc.mechanisms.permute_flip`)."""
        if size < 0:
            raise ValueError(f"number of bytes must be >= 0, got {size}")
        want = 8 * size
        if want <= self._nbits:
            return self.bits(want).to_bytes(size, "big")
        count = -(-(want - self._nbits) // _BLOCK_BITS)
        fresh = b"".join(self.block(i) for i in range(self._counter, self._counter + count))
        self._counter += count
        pool = (self._pool << (count * _BLOCK_BITS)) | int.from_bytes(fresh, "big")
        self._nbits += count * _BLOCK_BITS - want
        self._pool = pool & ((1 << self._nbits) - 1)
        return (pool >> self._nbits).to_bytes(size, "big")

    def uniform_int(self, n: int) -> int:
        """An exactly uniform integer in ``[0, n)``.

        Rejection sampling: draw ``(n - 1).bit_length()`` bits and retry while the value is
        ``>= n``. No modulo reduction, so no bias; on average fewer than two draws.
        """
        if type(n) is not int:  # the samplers' hot path passes plain ints: no ABC check
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise ValueError(f"uniform_int needs an integer n >= 1, got {n!r}")
            n = int(n)
        if n < 1:
            raise ValueError(f"uniform_int needs an integer n >= 1, got {n!r}")
        k = (n - 1).bit_length()
        while True:
            while self._nbits < k:  # self.bits(k), inlined: most draws of a sampler land here
                self._pool = (self._pool << _BLOCK_BITS) | self._block()
                self._nbits += _BLOCK_BITS
            self._nbits -= k
            value = self._pool >> self._nbits
            self._pool &= (1 << self._nbits) - 1
            if value < n:
                return value

    def bernoulli(self, p: Fraction | int) -> bool:
        """True with probability exactly ``p`` (a rational in [0, 1]).

        ``p = a/b`` in lowest terms is decided by ``uniform_int(b) < a``. Floats are refused:
        write ``Fraction(1, 3)`` or ``Fraction("0.1")`` so the probability is the one you mean.
        """
        if isinstance(p, bool) or not isinstance(p, numbers.Rational):
            raise TypeError(
                f"bernoulli needs an int or fractions.Fraction, got {type(p).__name__} {p!r}; "
                "write Fraction('0.1') rather than 0.1 so the probability is exact"
            )
        p = Fraction(p)
        if not 0 <= p <= 1:
            raise ValueError(f"probability must be in [0, 1], got {p}")
        return self.uniform_int(p.denominator) < p.numerator

    def __repr__(self) -> str:
        return f"KeyedStream(context={self._context!r}, blocks_used={self._counter})"

    def __reduce__(self):
        raise TypeError(
            "KeyedStream cannot be pickled or copied: its state is derived from the secret; "
            "pass the context and rebuild it where the secret is available"
        )
