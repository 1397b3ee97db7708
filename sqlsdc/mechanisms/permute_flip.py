"""Permute-and-flip (McKenna and Sheldon, NeurIPS 2020), drawn at a cost the scores do not set.

Permute-and-flip visits the candidates in a uniformly random order and stops at the first
candidate r accepted by a coin of probability exp(-gamma_r), gamma_r = rate (s_r - s_min). Drawn
that way, its running time is the number of visits, which the scores set: over [0, 3000] at
epsilon = 1/5, one visit for a median cell of up to 120 rows, 121 at 12,000 rows (0.3 against
4.6 ms of CPU), so a timed quantile told its cell's size (red team s40c).

The same distribution, drawn at a cost fixed by the number of candidates: flip *every*
candidate's coin and return a uniformly random accepted one. The order of a random permutation
is independent of the coins, so its first accepted candidate is a uniform draw among the
accepted ones; the best candidate (gamma = 0) is always accepted. Each coin is Bernoulli(exp(
-gamma)) exactly (CKS20 Algorithm 1), split so that every random draw is made whatever gamma is:

* gamma = w + f with w = floor(gamma), f = gamma - w in [0, 1): exp(-gamma) = exp(-w) exp(-f).
  Every candidate draws V = #{v >= 1 : U < e^-v} for U uniform in [0, 1) (P(V >= v) = e^-v,
  the run of heads of exp(-1) coins) and passes the first part iff V >= w. U is read 16 bits
  at a time: its first 16 bits u decide V unless u is one of the 12 words at a threshold (u =
  floor(2^16 e^-v), v <= 11, or 0), one time in 5,461; then 64 bits more, and so on, each
  threshold compared exactly with series bounds of e^v (no floating point).
* Bernoulli(exp(-f)) (CKS20's first branch): with A_k ~ Bernoulli(f/k) and K the first k with
  A_k = 0, P(K odd) = exp(-f). Write A_k = B_k and C_k with B_k ~ Bernoulli(1/k) and C_k ~
  Bernoulli(f): every candidate draws L, the first k with B_k = 0, as L = 1 + #{k >= 1 : U' <
  1/k!} for U' uniform in [0, 1) (P(L > k) = 1/k!), read like U (its first 16 bits decide
  unless they are one of 7 words, one time in 9,362), and C_1 .. C_{L-1}; K is the first
  k < L with C_k = 0, else L.

How many draws are made, of which sizes, in which order, depends only on the random words and
on the number of candidates and the rate's denominator (policy constants), never on the scores;
the scores enter as comparisons over whole arrays, and the final choice is one uniform draw
among the accepted candidates (fewer than two 8- to 64-bit words on average). The words are
the cell's keyed stream read in order (:meth:`KeyedStream.read_bytes`), each draw taking the
next 8, 16, 32 or 64 bits (the fewest that hold its range), big-endian, redrawn at or above
the largest multiple of its range.

Exactness: the integer part w is held at most 2^62, which V reaches only when U < e^-(2^62).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np

from sqlsdc.mechanisms.prf import KeyedStream

__all__ = ["permute_and_flip"]

_CAP = 1 << 62  # integers held in int64 lanes stay below this
_CHUNK = 1 << 16  # candidates drawn at once (memory), ``check`` called before each chunk
_FACTORIALS = np.array([math.factorial(k) for k in range(1, 10)], dtype=np.int64)  # 1! .. 9!


def _words(stream: KeyedStream, count: int, width: int) -> np.ndarray:
    """The stream's next ``count`` words of ``width`` bits (8, 16, 32 or 64), as uint64."""
    data = stream.read_bytes(count * width // 8)
    return np.frombuffer(data, dtype=f">u{width // 8}").astype(np.uint64)


def _uniform(stream: KeyedStream, n: int, count: int) -> np.ndarray:
    """``count`` exactly uniform integers in ``[0, n)``: words of the smallest width that holds
    ``n - 1``, redrawn at or above the largest multiple of ``n`` below 2^width (int64; an object
    array of Python ints when ``n > 2^62``)."""
    if n > _CAP:
        return np.array([_big_uniform(stream, n) for _ in range(count)], dtype=object)
    width = next(w for w in (8, 16, 32, 64) if n <= 1 << w)
    limit = np.uint64(((1 << width) // n) * n - 1)  # largest kept word
    out = np.empty(count, dtype=np.int64)
    todo = np.arange(count)
    while todo.size:
        w = _words(stream, todo.size, width)
        kept = w <= limit
        out[todo[kept]] = (w[kept] % np.uint64(n)).astype(np.int64)
        todo = todo[~kept]
    return out


def _big_uniform(stream: KeyedStream, n: int) -> int:
    """One uniform integer in ``[0, n)`` for ``n`` beyond int64, from whole 64-bit words."""
    k = -(-(n - 1).bit_length() // 64)
    limit = ((1 << (64 * k)) // n) * n
    while True:
        value = 0
        for w in _words(stream, k, 64).tolist():
            value = (value << 64) | w
        if value < limit:
            return value % n


def _first_zero(stream: KeyedStream, count: int) -> np.ndarray:
    """L per lane, L = 1 + #{k >= 1 : U < 1/k!} for U uniform in [0, 1), so P(L > k) = 1/k!:
    the first k with B_k = 0 for independent B_k ~ Bernoulli(1/k) (module docstring)."""
    u = _words(stream, count, 16).astype(np.int64)[:, None]
    first = 1 + ((u + 1) * _FACTORIALS <= 1 << 16).sum(axis=1)
    unsure = ((u * _FACTORIALS < 1 << 16) & ((u + 1) * _FACTORIALS > 1 << 16)).any(axis=1)
    for lane in np.flatnonzero(unsure).tolist():
        first[lane] = _first_zero_of(stream, int(u[lane, 0]))
    return first


def _first_zero_of(stream: KeyedStream, u: int) -> int:
    """L for U in [u/2^16, (u + 1)/2^16), an interval holding a threshold 1/k!: 64 bits of U
    more until none lies inside U's interval."""
    bits = 16
    while True:
        u, bits = (u << 64) | int(_words(stream, 1, 64)[0]), bits + 64
        k = 1
        while (u + 1) * math.factorial(k) <= 1 << bits:  # U < (u + 1)/2^bits <= 1/k!
            k += 1
        if u * math.factorial(k) >= 1 << bits:  # 1/k! <= u/2^bits <= U
            return k


def _exp_above(v: int, x: Fraction) -> bool:
    """Whether e^-v > x, exactly, for an integer v >= 1 (e^-v is irrational: never equal).

    With x = p/q, e^-v > x iff e^v < q/p, decided in integers by e^v's partial sum S_k =
    N/k! below it and S_k + v^(k+1) (k+2) / ((k+1)! (k+2-v)) above it (k + 2 > v), k
    doubled until one of them decides."""
    if x <= 0:
        return True
    p, q = x.numerator, x.denominator
    k = 2 * v + 16
    while True:
        fact = math.factorial(k)
        n = sum(v**j * (fact // math.factorial(j)) for j in range(k + 1))
        if n * p >= q * fact:  # S_k >= q/p: e^v > q/p
            return False
        room = (k + 1) * (k + 2 - v)
        if (n * room + v ** (k + 1) * (k + 2)) * p <= q * fact * room:
            return True
        k *= 2


def _thresholds() -> np.ndarray:
    """floor(2^16 e^-v) for v = 1 .. 11 (the last v with one >= 1), exactly."""
    out = []
    for v in range(1, 12):
        t = int(65536 * math.exp(-v)) + 2
        while not _exp_above(v, Fraction(t, 65536)):
            t -= 1
        out.append(t)
    return np.array(out, dtype=np.int64)


_RUN_BELOW = _thresholds()  # V >= v for certain when u < _RUN_BELOW[v - 1]
_RUN_UNSURE = np.append(_RUN_BELOW, 0)  # u at a threshold: more bits decide


def _heads_run(stream: KeyedStream, count: int) -> np.ndarray:
    """V per lane, #{v >= 1 : U < e^-v} for U uniform in [0, 1) (module docstring)."""
    u = _words(stream, count, 16).astype(np.int64)
    run = (u[:, None] < _RUN_BELOW[None, :]).sum(axis=1)
    for lane in np.flatnonzero(np.isin(u, _RUN_UNSURE)).tolist():
        run[lane] = _run_of(stream, int(u[lane]))
    return run


def _run_of(stream: KeyedStream, u: int) -> int:
    """V for U in [u/2^16, (u + 1)/2^16), an interval holding a threshold e^-v: 64 bits of
    U more until none lies inside U's interval."""
    bits = 16
    while True:  # (the first interval holds a threshold: that is why u is here)
        u, bits = (u << 64) | int(_words(stream, 1, 64)[0]), bits + 64
        low, high = Fraction(u, 1 << bits), Fraction(u + 1, 1 << bits)
        run = 0
        while _exp_above(run + 1, high):  # U < high < e^-(run + 1)
            run += 1
        if not _exp_above(run + 1, low):  # e^-(run + 1) <= low <= U
            return run


def _fraction_coins(stream: KeyedStream, rest: np.ndarray, d: int) -> np.ndarray:
    """Bernoulli(exp(-rest/d)) per lane, 0 <= rest < d (module docstring: K from L and
    C_1 .. C_{L-1}, each C_k = [uniform in [0, d) < rest])."""
    first = _first_zero(stream, rest.size)  # L >= 2: B_1 = 1
    draws = first - 1
    owner = np.repeat(np.arange(rest.size), draws)
    starts = np.concatenate(([0], np.cumsum(draws)[:-1]))
    k = np.arange(owner.size) - starts[owner] + 1  # the k of each C_k
    zero = _uniform(stream, d, owner.size) >= rest[owner]
    first_zero_c = np.minimum.reduceat(np.where(zero, k, _CAP), starts)
    return np.minimum(first, first_zero_c) % 2 == 1


def _split(scores: Sequence[int], rate: Fraction) -> tuple[np.ndarray, np.ndarray]:
    """(w, rest) per candidate with rate (s - s_min) = w + rest/d, d the rate's denominator
    and w held at most 2^62 (int64); rest is int64, or Python ints when d > 2^62."""
    p, d = rate.numerator, rate.denominator
    if p < 1 << 31 and d < 1 << 31:
        try:
            s = np.asarray(scores, dtype=np.int64)
        except OverflowError:
            s = None
        if s is not None and int(s.max()) - int(s.min()) < _CAP:
            a, b = divmod(s - s.min(), d)  # rate (s - s_min) = a p + b p / d, b p < 2^62
            whole = np.where(a > _CAP // max(p, 1), _CAP, a * p) + b * p // d
            return np.minimum(whole, _CAP), b * p % d
    ints = [int(x) for x in scores]
    best = min(ints)
    gamma = [(x - best) * p for x in ints]
    whole = np.array([min(g // d, _CAP) for g in gamma], dtype=np.int64)
    return whole, np.array([g % d for g in gamma], dtype=object if d > _CAP else np.int64)


def permute_and_flip(
    scores: Sequence[int],
    rate: Fraction,
    stream: KeyedStream,
    check: Callable[[], object] | None = None,
) -> int:
    """Index chosen by permute-and-flip (McKenna and Sheldon, NeurIPS 2020), exactly, at a
    cost set by ``len(scores)`` and the rate's denominator, not by the scores (module
    docstring).

    Lower scores are better; candidate r is accepted with probability exp(-rate (s_r -
    s_min)) (a Bernoulli(exp(-gamma)) of CKS20 Algorithm 1: no floating point). With rate =
    epsilon/(2 Delta) this is epsilon-DP for scores of sensitivity Delta and its expected
    error is never worse than the exponential mechanism's.

    ``check`` is called before each 65,536 candidates are drawn and raises to stop (the
    statement timeout, a cancel): over a million candidates the draw takes about a second.
    """
    n = len(scores)
    if not n:
        raise ValueError("permute-and-flip needs at least one candidate")
    r = Fraction(rate)
    if r < 0:
        raise ValueError(f"rate must be >= 0, got {r}")
    whole, rest = _split(scores, r)
    coins = np.empty(n, dtype=bool)
    for start in range(0, n, _CHUNK):
        if check is not None:
            check()
        part = slice(start, min(start + _CHUNK, n))
        run = _heads_run(stream, part.stop - start)
        coins[part] = (run >= whole[part]) & _fraction_coins(stream, rest[part], r.denominator)
    accepted = np.flatnonzero(coins)
    return int(accepted[int(_uniform(stream, accepted.size, 1)[0])])
