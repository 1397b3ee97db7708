"""Compiled GaussSuppression walk (numba): the elimination of :mod:`sqlsdc.tabular.gauss` in int64.

This is :class:`sqlsdc.tabular.gauss._Elimination` (Langsrud 2024; SSBtools
``GaussSuppression1``) step for step: the same pivot rule, the same reduction order and the same
tests, so it takes the same decisions. The Python version spends its time in dict and set
operations, one per nonzero touched (about 6·10^9 on a 10^6-cell 3-D table); here everything
lives in flat arrays owned by :func:`walk`, which also does every reallocation, between the
calls that need room. (numba counts references to the arrays a function is given, at every
call, inlined or not: so the helpers take many arrays once, and the loops over nonzeros are
written out in them.)

* Vectors (basis vectors under their pivot row ``p``, reduced primaries under ``n_rows + i``,
  two scratch slots) are runs of a *vector pool*: sorted rows, int32 coefficients and, per
  entry, the vector's slot in the index list of that row; a run follows a header (owner,
  length) at ``vstart[v] - 1``. Eliminating a pivot from a long basis vector whose rows include
  all of the (usually short) new vector's changes it in place, leaving its new zeros as *dead*
  entries that readers skip; any other change writes the vector anew at the top of the pool,
  without dead entries, and its old run becomes garbage. When the pool is full the live runs
  slide down, or move to a pool four times their size when they fill more than a third of it.
* The inverted indexes (which basis vectors hold row ``r``: list ``r``; which primaries: list
  ``n_rows + r``) are chains of fixed-size chunks in an *index pool* with a free list. A vector
  that loses a row frees its slot in that list, found through the slot stored with the entry;
  freed slots are chained per list and reused first. So the lists are exact, and ``count``
  (their live size, which the pivot rule uses) is kept alongside.
* A candidate is reduced in a dense scratch row and gathered into a scratch slot.

Exactness: every stored coefficient is kept within ``±limit`` (``COEF_LIMIT = 2**31 - 1``), so
that it fits the int32 pool and every product and difference the walk forms fits in int64
(``|a*b - c*d| < 2**63``). Coefficients stay tiny on tables (at most 4 on the benchmark tables);
a step that would leave one beyond the limit (or an index pool beyond int32 slots) stops the
walk with ``OVERFLOW``, and the caller redoes the whole walk with Python integers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

COEF_LIMIT = 2**31 - 1
POOL_SIZES = (0, 0)  # walk()'s starting pool sizes (entries, chunks); 0: from the table's size

OK, OVERFLOW, LOST = 0, 1, 2  # walk() status: done, beyond int32, forced cells disclose

_CHUNK = 16  # index slots per chunk (one cache line of int32)
_MAX_CHUNKS = 2**31 // _CHUNK  # slots are int32
_CTOP, _NFREE = 0, 1  # fields of the index pool's ``meta`` array: chunks used, chunks free


@njit(cache=True, inline="always")
def _gcd(a, b):
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


# --- vector pool: runs after a header (owner, length) ------------------------------------------


@njit(cache=True)
def _slide(rows, vals, slots, vstart, vlen, top):
    """Move the live runs down to the front of the pool, in place; return the new top.

    A run is live when its owner still points at it; runs only move down, so copying forwards
    never overwrites what is still to be read.
    """
    pos = w = 0
    while pos < top:
        owner, n = rows[pos], vals[pos]
        if vlen[owner] and vstart[owner] == pos + 1:
            for j in range(n + 1):
                rows[w + j] = rows[pos + j]
                vals[w + j] = vals[pos + j]
                slots[w + j] = slots[pos + j]
            vstart[owner] = w + 1
            w += n + 1
        pos += n + 1
    return w


@njit(cache=True)
def _make_room(rows, vals, slots, vstart, vlen, top, need):
    """Room for ``need`` entries at the top: (rows, vals, slots, top).

    The live runs slide down; when they fill more than a third of the pool, they move to a new
    pool four times their size, so that copying costs less than half an entry per entry written.
    """
    top = _slide(rows, vals, slots, vstart, vlen, top)
    if 3 * (top + need) > rows.size:
        cap = 4 * (top + need)
        new_rows, new_vals = np.empty(cap, np.int32), np.empty(cap, np.int32)
        new_slots = np.empty(cap, np.int32)
        for j in range(top):  # loops, not slices: slices compile shape checks (seconds)
            new_rows[j], new_vals[j], new_slots[j] = rows[j], vals[j], slots[j]
        rows, vals, slots = new_rows, new_vals, new_slots
    return rows, vals, slots, top


# --- index pool: per list a chain of chunks, freed slots chained for reuse ---------------------


@njit(cache=True)
def _grow_index(pool, nxt, free, need):
    """The index pool with room for ``need`` more chunks, at least doubled: (pool, nxt, free)."""
    n = nxt.size
    cap = min(max(2 * n, n + need), _MAX_CHUNKS)
    new_pool, new_nxt, new_free = (
        np.empty(cap * _CHUNK, np.int32),
        np.empty(cap, np.int32),
        np.empty(cap, np.int32),
    )
    for j in range(pool.size):  # loops, not slices (see _make_room)
        new_pool[j] = pool[j]
    for j in range(n):
        new_nxt[j], new_free[j] = nxt[j], free[j]
    return new_pool, new_nxt, new_free


@njit(cache=True)
def _room_for_chunks(pool, nxt, free, meta, need):
    """The index pool with at least ``need`` chunks available: (pool, nxt, free, ok)."""
    if nxt.size - meta[_CTOP] + meta[_NFREE] >= need:
        return pool, nxt, free, True
    pool, nxt, free = _grow_index(pool, nxt, free, need)
    return pool, nxt, free, nxt.size - meta[_CTOP] + meta[_NFREE] >= need


@njit(cache=True)
def _index_vector(
    v, base, rows, slots, vstart, vlen, pool, nxt, free, meta, head, tail, used, hole, count
):
    """Add vector ``v`` to the lists ``base + r`` of its rows (at most one chunk each)."""
    for j in range(vstart[v], vstart[v] + vlen[v]):
        li = base + rows[j]
        # the slot: a freed one, else the next (as in _eliminate)
        s = hole[li]
        if s >= 0:
            hole[li] = -2 - pool[s]
        else:
            o = used[li] % _CHUNK
            if o == 0:
                if meta[_NFREE]:
                    meta[_NFREE] -= 1
                    c = free[meta[_NFREE]]
                else:
                    c = meta[_CTOP]
                    meta[_CTOP] += 1
                nxt[c] = -1
                if used[li] == 0:
                    head[li] = c
                else:
                    nxt[tail[li]] = c
                tail[li] = c
            s = tail[li] * _CHUNK + o
            used[li] += 1
        pool[s] = v
        slots[j] = s
        count[li] += 1


@njit(cache=True)
def _entries(li, out, nxt, head, used, pool):
    """Write the vectors in list ``li`` to ``out``; return how many."""
    c, k, n = head[li], 0, 0
    for _ in range(used[li]):
        if k == _CHUNK:
            c, k = nxt[c], 0
        v = pool[c * _CHUNK + k]
        k += 1
        if v >= 0:
            out[n] = v
            n += 1
    return n


@njit(cache=True)
def _clear(li, nxt, free, meta, head, tail, used, hole):
    """Empty list ``li`` (no vector holds its row any more) and free its chunks."""
    c = head[li]
    while c >= 0:
        d = nxt[c]
        free[meta[_NFREE]] = c
        meta[_NFREE] += 1
        c = d
    head[li] = tail[li] = hole[li] = -1
    used[li] = 0


# --- vector operations (the caller has made room) ----------------------------------------------


@njit(cache=True)
def _eliminate(
    found, first, n_found, v, q, nq, base, limit, rows, vals, slots, vstart, vlen, vdead, top,
    pool, nxt, free, meta, head, tail, used, hole, count, where,
):  # fmt: skip
    """Eliminate row ``q`` from the vectors ``found[first:n_found]`` with vector ``v``.

    Each ``u -= (u[q] / nq) * v`` in exact integers, ``u`` scaled by ``nq / gcd`` when needed;
    ``base`` is 0 for basis vectors and ``n_rows`` for primaries (which index lists ``u`` is in).
    ``v`` is usually much shorter than ``u``, so the rows of ``v`` are looked up in ``u``
    (galloping search). When they are all there, a basis vector is changed in place and its new
    zeros are left as *dead* entries (``vdead[u]`` of them, skipped by readers). Otherwise ``u``
    is copied to the top of the pool in blocks between the rows of ``v``, without dead entries.
    Stops before a ``u`` when the pools lack room (``len(u) + len(v) + 1`` entries, ``len(v)``
    chunks). Returns ``(next, top, ok)``: where to go on, the new top, and False if a
    coefficient went beyond ``limit``.

    Searches and list updates are written out here rather than in helpers: numba counts
    references to the arrays a function is given, each call, inlined or not.
    """
    va, vn = vstart[v], vlen[v]
    for t in range(first, n_found):
        u = found[t]
        ua, un = vstart[u], vlen[u]
        ue = ua + un
        if top + un + vn + 1 > rows.size or nxt.size - meta[_CTOP] + meta[_NFREE] < vn:
            return t, top, True
        lo, hi = ua, ue  # binary search for q in u
        while lo < hi:
            mid = (lo + hi) >> 1
            if rows[mid] < q:
                lo = mid + 1
            else:
                hi = mid
        uq = np.int64(vals[lo])
        m = 1
        if uq % nq:
            m = nq // _gcd(uq, nq)
            uq *= m
        f = uq // nq

        # where[j]: the position of row j of v in u, or where it would go
        all_live, lo = True, ua
        for j in range(vn):
            r, step = rows[va + j], 1
            while lo + step < ue and rows[lo + step] < r:
                step *= 2
            lo, hi = lo + step // 2, min(lo + step + 1, ue)
            while lo < hi:
                mid = (lo + hi) >> 1
                if rows[mid] < r:
                    lo = mid + 1
                else:
                    hi = mid
            where[j] = lo
            if lo < ue and rows[lo] == r:
                all_live &= vals[lo] != 0
                lo += 1
            else:
                all_live = False

        ok = True
        if base == 0 and m == 1 and all_live and 2 * vdead[u] < un:  # in place
            for j in range(vn):
                at = where[j]
                x = vals[at] - f * vals[va + j]
                if x == 0:  # u leaves list r: free its slot
                    r = rows[at]
                    pool[slots[at]] = -2 - hole[r]  # freed slots hold -2 - (the next freed one)
                    hole[r] = slots[at]
                    count[r] -= 1
                    vdead[u] += 1
                elif abs(x) > limit:
                    ok = False
                vals[at] = x
            if not ok:
                return n_found, top, False
            continue

        k, i = top + 1, ua  # copy u to the top: the block before each row of v, then the row
        for j in range(vn + 1):
            at = where[j] if j < vn else ue
            for e in range(i, at):  # the block, without dead entries
                if vals[e]:
                    x = vals[e] * m
                    ok &= abs(x) <= limit
                    rows[k], vals[k], slots[k] = rows[e], x, slots[e]
                    k += 1
            i = at
            if j == vn:
                break
            r, s, old = rows[va + j], np.int32(-1), 0
            if at < ue and rows[at] == r:
                s, old = slots[at], vals[at] * m
                i = at + 1
            x = old - f * vals[va + j]
            li = base + r
            if old and not x:  # u leaves list li: free its slot
                pool[s] = -2 - hole[li]
                hole[li] = s
                count[li] -= 1
            elif x and not old:  # u joins list li: a freed slot, else the next one
                count[li] += 1
                s = hole[li]
                if s >= 0:
                    hole[li] = -2 - pool[s]
                else:
                    o = used[li] % _CHUNK
                    if o == 0:  # a new chunk: from the free list, else from the top
                        if meta[_NFREE]:
                            meta[_NFREE] -= 1
                            c = free[meta[_NFREE]]
                        else:
                            c = meta[_CTOP]
                            meta[_CTOP] += 1
                        nxt[c] = -1
                        if used[li] == 0:
                            head[li] = c
                        else:
                            nxt[tail[li]] = c
                        tail[li] = c
                    s = tail[li] * _CHUNK + o
                    used[li] += 1
                pool[s] = u
            if x:
                ok &= abs(x) <= limit
                rows[k], vals[k], slots[k] = r, x, s
                k += 1
        rows[top], vals[top] = u, k - top - 1
        vstart[u], vlen[u], vdead[u] = top + 1, k - top - 1, 0
        top = k
        if not ok:
            return n_found, top, False
    return n_found, top, True


@njit(cache=True)
def _reduce(col_r, col_v, out, is_pivot, work, flag, touched, limit, rows, vals, vstart, vlen, top):
    """Reduce a column against the basis into vector ``out`` (``_Elimination.reduce``).

    The pivot rows of the column are taken in increasing order, as the Python version does; a
    basis vector is zero on every other pivot row, so each is met once. Returns the new top and
    False if a coefficient went beyond ``limit``.
    """
    nt = 0
    ok = True
    for k in range(col_r.size):
        r = col_r[k]
        work[r] = col_v[k]
        ok &= abs(col_v[k]) <= limit
        flag[r] = True
        touched[nt] = r
        nt += 1
    for k in range(col_r.size):
        p = col_r[k]
        if not is_pivot[p]:
            continue
        a, n = vstart[p], vlen[p]
        lo, hi = a, a + n  # binary search for p in the basis vector (by hand: see _eliminate)
        while lo < hi:
            mid = (lo + hi) >> 1
            if rows[mid] < p:
                lo = mid + 1
            else:
                hi = mid
        bp = np.int64(vals[lo])
        f = work[p]
        if f % bp:
            m = bp // _gcd(f, bp)
            for t in range(nt):
                x = work[touched[t]] * m
                work[touched[t]] = x
                if abs(x) > limit:
                    ok = False
            f *= m
        g = f // bp
        for j in range(a, a + n):
            if vals[j] == 0:
                continue  # a dead entry
            r = rows[j]
            if not flag[r]:
                flag[r] = True
                touched[nt] = r
                nt += 1
            x = work[r] - g * vals[j]
            work[r] = x
            if abs(x) > limit:
                ok = False
        if not ok:
            break
    order = touched[:nt] if nt == col_r.size else np.sort(touched[:nt])  # no fill-in: sorted
    k = top + 1
    for t in range(nt):
        r = order[t]
        if work[r]:
            rows[k] = r
            vals[k] = work[r]
            k += 1
        work[r] = 0
        flag[r] = False
    rows[top], vals[top] = out, k - top - 1
    vstart[out], vlen[out] = top + 1, k - top - 1
    return k, ok


@njit(cache=True)
def _copy_without_singletons(v, out, single, rows, vals, vstart, vlen, top):
    """Vector ``out`` = vector ``v`` without its singleton rows; returns the new top."""
    k = top + 1
    for j in range(vstart[v], vstart[v] + vlen[v]):
        if not single[rows[j]]:
            rows[k] = rows[j]
            vals[k] = vals[j]
            k += 1
    rows[top], vals[top] = out, k - top - 1
    vstart[out], vlen[out] = top + 1, k - top - 1
    return k


@njit(cache=True)
def _proportional(v, found, n_found, rows, vals, vstart, vlen):
    """Is one of the vectors ``found[:n_found]`` proportional to vector ``v``?"""
    a, n = vstart[v], vlen[v]
    v0 = np.int64(vals[a])
    for t in range(n_found):
        i = found[t]
        b = vstart[i]
        if vlen[i] != n:
            continue
        b0 = np.int64(vals[b])
        same = True
        for k in range(n):
            if rows[b + k] != rows[a + k] or vals[b + k] * v0 != vals[a + k] * b0:
                same = False
                break
        if same:
            return True
    return False


@njit(cache=True)
def _pivot(v, single, has_single, n_rows, rows, vals, vstart, vlen, count):
    """``_Elimination._pivot``: a ±1 entry in the least-held row, singleton rows last.

    Returns the entry's position in the pool.
    """
    a, n = vstart[v], vlen[v]
    best_any, key_any = -1, 0
    best_unit, key_unit = -1, 0
    for j in range(a, a + n):
        r = rows[j]
        if has_single and single[r]:
            continue
        key = (count[r] + count[n_rows + r]) * n_rows + r
        if best_any < 0 or key < key_any:
            best_any, key_any = j, key
        if abs(vals[j]) == 1 and (best_unit < 0 or key < key_unit):
            best_unit, key_unit = j, key
    if best_any < 0:
        return a  # only singleton rows: the first one
    return best_unit if best_unit >= 0 else best_any


# --- the walk ----------------------------------------------------------------------------------


@njit(cache=True)
def walk(
    indptr,
    indices,
    data,
    n_rows,
    prim_ptr,
    prim_rows,
    prim_vals,
    single,
    has_single,
    space,
    forced,
    cand,
    limit,
    sizes,
):
    """GaussSuppression's walk: the forced cells, then the candidates in order.

    Args:
        indptr, indices, data: the model matrix X in CSC form (sorted rows; int64 arrays).
        n_rows: rows of X (inner cells).
        prim_ptr, prim_rows, prim_vals: the primary vectors (CSC-like, sorted rows, int64),
            singleton rows already dropped in the "Space" methods.
        single: bool[n_rows]; has_single: apply the singleton rules; space: the "Space" methods.
        forced: int64, the forced cells; cand: int64, the candidates in candidate order.
        limit: the largest coefficient allowed (at most ``COEF_LIMIT``).
        sizes: (vector pool entries, index pool chunks) to start with; 0 for the defaults.
            The pools grow as needed.

    Returns:
        ``(status, secondary, lost)``: ``status`` is ``OK``, ``OVERFLOW`` (redo the walk with
        Python integers) or ``LOST``; ``secondary`` is bool[len(cand)], the candidates
        suppressed; ``lost`` lists the primaries that the forced cells make computable.
    """
    n_prim = prim_ptr.size - 1
    secondary = np.zeros(cand.size, np.bool_)
    lost = np.empty(0, np.int64)
    for x in prim_vals:
        if abs(x) > limit:
            return OVERFLOW, secondary, lost
    # vectors: basis p < n_rows, primary n_rows + i, then the scratch slots CAND and PART
    n_ids = n_rows + n_prim + 2
    CAND, PART = n_ids - 2, n_ids - 1
    cap = max(sizes[0] or 4 * (n_rows + prim_rows.size), prim_rows.size + n_prim + 1)
    rows, vals = np.empty(cap, np.int32), np.empty(cap, np.int32)
    slots = np.empty(cap, np.int32)
    vstart, vlen = np.zeros(n_ids, np.int64), np.zeros(n_ids, np.int64)
    vdead = np.zeros(n_ids, np.int64)  # zero entries left in a basis vector (see _eliminate)
    top = np.int64(0)  # (typed zeros here and below: a literal 0 would compile a second copy)
    for i in range(n_prim):
        a, n = prim_ptr[i], prim_ptr[i + 1] - prim_ptr[i]
        rows[top], vals[top] = n_rows + i, n
        for j in range(n):
            rows[top + 1 + j], vals[top + 1 + j] = prim_rows[a + j], prim_vals[a + j]
        vstart[n_rows + i], vlen[n_rows + i] = top + 1, n
        top += n + 1
    # index lists: basis vectors holding row r (list r), primaries holding it (n_rows + r)
    n_chunks = min(sizes[1] or (prim_rows.size + n_rows) // 4 + 1024, _MAX_CHUNKS)
    pool, nxt = np.empty(n_chunks * _CHUNK, np.int32), np.full(n_chunks, -1, np.int32)
    free, meta = np.empty(n_chunks, np.int32), np.zeros(2, np.int64)
    head, tail = np.full(2 * n_rows, -1, np.int64), np.full(2 * n_rows, -1, np.int64)
    used, hole = np.zeros(2 * n_rows, np.int64), np.full(2 * n_rows, -1, np.int64)
    count = np.zeros(2 * n_rows, np.int64)
    found = np.empty(n_ids, np.int64)  # the vectors in a list
    for i in range(n_prim):
        pool, nxt, free, ok = _room_for_chunks(pool, nxt, free, meta, vlen[n_rows + i])
        if not ok:
            return OVERFLOW, secondary, lost
        _index_vector(
            n_rows + i, n_rows, rows, slots, vstart, vlen, pool, nxt, free, meta, head, tail,
            used, hole, count,
        )  # fmt: skip
    is_pivot = np.zeros(n_rows, np.bool_)
    work, flag = np.zeros(n_rows, np.int64), np.zeros(n_rows, np.bool_)
    touched, where = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    sub_used = np.zeros(n_rows, np.bool_)  # singleton rows of earlier subSum exceptions
    space = space and has_single
    before = vlen[n_rows : n_rows + n_prim].copy()  # primary lengths before the forced cells
    n_basis = 0
    for t in range(forced.size + cand.size + 1):
        candidate = t >= forced.size
        if t == forced.size:  # forced cells done: did they disclose a primary?
            gone, n_gone = np.empty(n_prim, np.int64), 0
            for i in range(n_prim):
                if before[i] and vlen[n_rows + i] == 0:
                    gone[n_gone] = i
                    n_gone += 1
            if n_gone:
                return LOST, secondary, gone[:n_gone]
        if t == forced.size + cand.size or (candidate and n_basis == n_rows):
            break  # done, or every inner cell is determined (R stops here too: ii > m)
        c = cand[t - forced.size] if candidate else forced[t]
        col_r, col_v = indices[indptr[c] : indptr[c + 1]], data[indptr[c] : indptr[c + 1]]

        # reduce the column against the basis
        need = col_r.size
        for r in col_r:
            if is_pivot[r]:
                need += vlen[r]
        need = min(need, n_rows) + 1
        vlen[CAND] = 0
        if top + need > rows.size:
            rows, vals, slots, top = _make_room(rows, vals, slots, vstart, vlen, top, need)
        top, ok = _reduce(
            col_r, col_v, CAND, is_pivot, work, flag, touched, limit, rows, vals, vstart, vlen,
            top,
        )  # fmt: skip
        if not ok:
            return OVERFLOW, secondary, lost
        if vlen[CAND] == 0:
            continue

        if candidate:  # GaussSuppression1's test for a reduced, non-empty candidate column
            a, n = vstart[CAND], vlen[CAND]
            tested = CAND  # what is compared with the primaries
            sec = False
            if has_single:
                all_single, differ, overlap = True, False, False
                for j in range(a, a + n):
                    all_single &= single[rows[j]]
                    differ |= vals[j] != vals[a]
                    overlap |= sub_used[rows[j]]
                if all_single:  # only a combination of singletons ("subSubSec")
                    sec = True
                    if not space and differ and not overlap:
                        # not a plain sum of singletons, no overlap with an earlier exception
                        for j in range(a, a + n):
                            sub_used[rows[j]] = True
                        sec = False
                elif space:
                    vlen[PART] = 0
                    if top + n + 1 > rows.size:
                        rows, vals, slots, top = _make_room(
                            rows, vals, slots, vstart, vlen, top, n + 1
                        )
                    top = _copy_without_singletons(
                        CAND, PART, single, rows, vals, vstart, vlen, top
                    )
                    tested = PART
            if not sec:
                # would publishing it eliminate a primary (a reduced primary ∝ it)?
                a, n = vstart[tested], vlen[tested]
                best, best_n = -1, 0
                for j in range(a, a + n):
                    k = count[n_rows + rows[j]]
                    if best < 0 or k < best_n:
                        best, best_n = rows[j], k
                if best_n:
                    n_found = _entries(n_rows + best, found, nxt, head, used, pool)
                    sec = _proportional(tested, found, n_found, rows, vals, vstart, vlen)
            if sec:
                secondary[t - forced.size] = True
                continue

        # publish: add the reduced column to the span and eliminate its pivot everywhere
        a, n = vstart[CAND], vlen[CAND]
        g = 0
        for j in range(a, a + n):
            g = _gcd(g, vals[j])
        if g > 1:
            for j in range(a, a + n):
                vals[j] //= g
        at = _pivot(CAND, single, has_single, n_rows, rows, vals, vstart, vlen, count)
        q, nq = np.int64(rows[at]), np.int64(vals[at])
        for base in (0, n_rows):  # the basis vectors holding row q, then the primaries
            by = CAND
            if base:
                if count[n_rows + q] == 0:
                    _clear(n_rows + q, nxt, free, meta, head, tail, used, hole)
                    break
                by = q
                if space:  # the primaries have no singleton rows
                    vlen[PART] = 0
                    if top + vlen[q] + 1 > rows.size:
                        rows, vals, slots, top = _make_room(
                            rows, vals, slots, vstart, vlen, top, vlen[q] + 1
                        )
                    top = _copy_without_singletons(q, PART, single, rows, vals, vstart, vlen, top)
                    by = PART
            n_found = _entries(base + q, found, nxt, head, used, pool)
            done = np.int64(0)
            while done < n_found:
                done, top, ok = _eliminate(
                    found, done, n_found, by, q, nq, base, limit, rows, vals, slots, vstart,
                    vlen, vdead, top, pool, nxt, free, meta, head, tail, used, hole, count, where,
                )  # fmt: skip
                if not ok:
                    return OVERFLOW, secondary, lost
                if done < n_found:  # out of room: make some, then go on
                    need = vlen[found[done]] + vlen[by] + 1
                    if top + need > rows.size:
                        rows, vals, slots, top = _make_room(
                            rows, vals, slots, vstart, vlen, top, need
                        )
                    pool, nxt, free, ok = _room_for_chunks(pool, nxt, free, meta, vlen[by])
                    if not ok:
                        return OVERFLOW, secondary, lost
            _clear(base + q, nxt, free, meta, head, tail, used, hole)  # nothing holds row q now
            if base == 0:
                vstart[q], vlen[q], vlen[CAND] = vstart[CAND], vlen[CAND], 0
                rows[vstart[q] - 1] = q  # the run's owner
                is_pivot[q] = True
                n_basis += 1
                pool, nxt, free, ok = _room_for_chunks(pool, nxt, free, meta, vlen[q])
                if not ok:
                    return OVERFLOW, secondary, lost
                _index_vector(
                    q, np.int64(0), rows, slots, vstart, vlen, pool, nxt, free, meta, head, tail,
                    used, hole, count,
                )  # fmt: skip
    return OK, secondary, lost
