"""Compiled loops (numba) of :mod:`sqlsdc.microdata.microaggregation`: MDAV and the local search.

Both work on a standardised float64 matrix ``X`` (n × d, C order) and return or update a label
vector (group number per row). Ties are broken by the first record in the working order, so the
result is a deterministic function of the input.

MDAV keeps the records not yet grouped in the first ``m`` columns of a variable-major copy
(d × n, so that the distance loop runs over records and vectorises); a grouped record is swapped
with column ``m - 1`` and ``m`` shrinks, so every pass reads a block that halves on average. The
k nearest records are found by a bounded insertion list (k is small); the centroid of the
remaining records is a running sum. A pair of groups costs three distance passes
(centroid → r, r → s, s), about ``3n²/(4k)`` record visits in all: 2.5·10⁹ for 10^5 records
and k = 3.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _dist2(Y, i, c):
    s = 0.0
    for j in range(Y.shape[1]):
        t = Y[i, j] - c[j]
        s += t * t
    return s


@njit(cache=True)
def _distances(Yt, m, centre, out):
    """``out[:m]`` = squared distances of the columns of ``Yt[:, :m]`` to ``centre``.

    Variable-major layout, one variable at a time: the inner loop runs over records and
    vectorises."""
    for i in range(m):
        out[i] = 0.0
    for j in range(Yt.shape[0]):
        c = centre[j]
        row = Yt[j]
        for i in range(m):
            t = row[i] - c
            out[i] += t * t


@njit(cache=True)
def _argmax(dist, m):
    far, far_d = 0, -1.0
    for i in range(m):
        if dist[i] > far_d:
            far, far_d = i, dist[i]
    return far


@njit(cache=True)
def _nearest(dist, m, k, near, best):
    """Fill ``near`` with the positions of the ``k`` smallest of ``dist[:m]`` (ascending, first
    position first among ties)."""
    filled = 0
    for i in range(m):
        dd = dist[i]
        if filled < k or dd < best[filled - 1]:
            p = filled if filled < k else k - 1
            while p > 0 and best[p - 1] > dd:
                if p < k:
                    best[p] = best[p - 1]
                    near[p] = near[p - 1]
                p -= 1
            best[p] = dd
            near[p] = i
            if filled < k:
                filled += 1


@njit(cache=True)
def _take(Yt, idx, m, positions, labels, group, total):
    """Label the records at ``positions`` with ``group``, move them behind ``m``; return new m."""
    order = np.sort(positions)[::-1]
    for p in order:
        labels[idx[p]] = group
        last = m - 1
        for j in range(Yt.shape[0]):
            total[j] -= Yt[j, p]
            t = Yt[j, p]
            Yt[j, p] = Yt[j, last]
            Yt[j, last] = t
        t2 = idx[p]
        idx[p] = idx[last]
        idx[last] = t2
        m -= 1
    return m


WORK = 1 << 24
"""Record visits of one call of :func:`_mdav_pairs` (about 0.05 s): between calls the
interpreter runs, so that Ctrl-C and SIGTERM stop a long MDAV. One call over a million
records took hours and could not be interrupted (``sqlsdc anonymize --step microaggregate``
kept running minutes after SIGINT: new user s47f)."""


def mdav(X, k, work=WORK):
    """MDAV labels of the rows of ``X`` (see :func:`sqlsdc.microdata.microaggregation.mdav`),
    computed by calls of :func:`_mdav_pairs` of about ``work`` record visits each: the labels
    do not depend on ``work``."""
    n = X.shape[0]
    Yt = _variable_major(X)
    idx = np.arange(n)
    labels = np.full(n, -1, dtype=np.int64)
    total = _column_totals(Yt)
    m, group = n, 0
    while m >= 2 * k:
        m, group = _mdav_pairs(Yt, idx, labels, total, m, group, k, work)
    if m > 0:
        labels[idx[:m]] = group
    return labels


@njit(cache=True)
def _variable_major(X):
    """A variable-major copy of ``X`` (d × n, C order), which MDAV permutes as it groups.

    Always a copy, also when :func:`mdav` runs in the interpreter: there NumPy's
    ``ascontiguousarray(X.T)`` of one variable is ``X`` itself (n × 1 and 1 × n share their
    layout), so MDAV would reorder the caller's records (numba's copies by type)."""
    d = X.shape[1]
    Yt = np.empty((d, X.shape[0]))
    for j in range(d):
        Yt[j] = X[:, j]
    return Yt


@njit(cache=True)
def _column_totals(Yt):
    """Per variable, the sum over records in index order (as the single loop summed it)."""
    d, n = Yt.shape
    total = np.zeros(d)
    for j in range(d):
        for i in range(n):
            total[j] += Yt[j, i]
    return total


@njit(cache=True)
def _mdav_pairs(Yt, idx, labels, total, m, group, k, work):
    """MDAV's pairs of groups from state ``(m, group)`` (the records not yet grouped are the
    first ``m`` columns of ``Yt``), until fewer than 2k records remain or about ``work``
    record visits are done; return the new ``(m, group)``."""
    d = Yt.shape[0]
    near = np.empty(k, dtype=np.int64)
    best = np.empty(k)
    dist = np.empty(m)
    centre = np.empty(d)
    xs = np.empty(d)
    done = 0
    while m >= 2 * k and done < work:
        done += 3 * m
        for j in range(d):
            centre[j] = total[j] / m
        _distances(Yt, m, centre, dist)
        r = _argmax(dist, m)
        for j in range(d):
            centre[j] = Yt[j, r]
        _distances(Yt, m, centre, dist)
        s = _argmax(dist, m)
        for j in range(d):
            xs[j] = Yt[j, s]
        _nearest(dist, m, k, near, best)
        m = _take(Yt, idx, m, near, labels, group, total)
        group += 1
        if m < 2 * k:  # 2k..3k-1 were left: one group around r, the rest form the last
            break
        _distances(Yt, m, xs, dist)
        _nearest(dist, m, k, near, best)
        m = _take(Yt, idx, m, near, labels, group, total)
        group += 1
    return m, group


@njit(cache=True)
def local_search(X, labels, k, candidates, max_sweeps, stamp, seen, clock):
    """Improve ``labels`` in place by moves and swaps; return (sweeps, improving steps, clock).

    For each record a in group A and each candidate group B ≠ A (``candidates[a]``), evaluate:

    * the move of a to B, allowed when |A| > k and |B| < 2k − 1, with
      ΔSSE = −|A|/(|A|−1)·‖a − c_A‖² + |B|/(|B|+1)·‖a − c_B‖²;
    * the swap of a with every b in B (sizes unchanged), with the replacement delta of Castro,
      Gentile & Spagnolo-Arrizabalaga 2022 (two-swap, digest §1.1) applied to both groups:
      ΔSSE = ‖b − c_A‖² − ‖a − c_A‖² − ‖a − b‖²/|A| + ‖a − c_B‖² − ‖b − c_B‖² − ‖a − b‖²/|B|;

    and apply the best one if it lowers the SSE. Sweeps repeat until one changes nothing.

    Evaluations that would again find nothing are skipped: ``seen[a]`` is the ``clock`` at
    which a was last evaluated without finding an improving step (-1: never), ``stamp[g]`` the
    clock of the last change of group g (both updated in place; each step advances the clock).
    If a's group is stamped at or before ``seen[a]``, the deltas of a candidate group also
    stamped at or before it read the counts, sums and members they read then, so none of them
    lies below the threshold (whatever the order of candidates and members): only the candidate
    groups changed since are evaluated, in their order, and none if there is none. The best
    step is the first strictly best among them, as it is among all candidates, so the steps
    are the same as without skipping.
    """
    n, d = X.shape
    G = labels.max() + 1
    cap = 2 * k - 1
    counts = np.zeros(G, dtype=np.int64)
    sums = np.zeros((G, d))
    for i in range(n):
        g = labels[i]
        counts[g] += 1
        for j in range(d):
            sums[g, j] += X[i, j]
    width = max(cap, counts.max()) + 1  # a swap first moves a into B, then b out of it
    members = np.full((G, width), -1, dtype=np.int64)
    fill = np.zeros(G, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)
    for i in range(n):
        g = labels[i]
        members[g, fill[g]] = i
        slot[i] = fill[g]
        fill[g] += 1
    ca = np.empty(d)
    cb = np.empty(d)
    steps = 0
    sweeps = 0
    tol = 1e-12
    while sweeps < max_sweeps:
        sweeps += 1
        changed = 0
        for a in range(n):
            A = labels[a]
            seen_a = seen[a]
            partial = seen_a >= 0 and stamp[A] <= seen_a
            if partial and _unchanged(a, candidates, stamp, seen_a):
                continue
            na = counts[A]
            for j in range(d):
                ca[j] = sums[A, j] / na
            daA = _dist2(X, a, ca)
            best, best_b, best_B = -tol * (1.0 + daA), -2, -1
            for t in range(candidates.shape[1]):
                B = candidates[a, t]
                if B == A or B < 0 or (partial and stamp[B] <= seen_a):
                    continue
                nb = counts[B]
                for j in range(d):
                    cb[j] = sums[B, j] / nb
                daB = _dist2(X, a, cb)
                if na > k and nb < cap:
                    delta = -na / (na - 1.0) * daA + nb / (nb + 1.0) * daB
                    if delta < best:
                        best, best_b, best_B = delta, -1, B
                for q in range(nb):
                    b = members[B, q]
                    dbA = _dist2(X, b, ca)
                    dbB = _dist2(X, b, cb)
                    dab = 0.0
                    for j in range(d):
                        u = X[a, j] - X[b, j]
                        dab += u * u
                    delta = dbA - daA - dab / na + daB - dbB - dab / nb
                    if delta < best:
                        best, best_b, best_B = delta, b, B
            if best_b == -2:
                seen[a] = clock
                continue
            B = best_B
            clock += 1
            stamp[A] = clock
            stamp[B] = clock
            # a leaves A for B
            _move(X, a, A, B, labels, counts, sums, members, slot)
            if best_b >= 0:
                _move(X, best_b, B, A, labels, counts, sums, members, slot)
            changed += 1
        steps += changed
        if changed == 0:
            break
    return sweeps, steps, clock


@njit(cache=True, inline="always")
def _unchanged(a, candidates, stamp, seen):
    """Whether record a's candidate groups are all stamped at or before ``seen``."""
    for t in range(candidates.shape[1]):
        B = candidates[a, t]
        if B >= 0 and stamp[B] > seen:
            return False
    return True


@njit(cache=True)
def same_groups(old, new, n_old, n_new):
    """For each group of ``old`` (labels 0..n_old-1), the group of ``new`` with exactly the same
    records, or -1."""
    size_old = np.zeros(n_old, dtype=np.int64)
    size_new = np.zeros(n_new, dtype=np.int64)
    image = np.full(n_old, -1, dtype=np.int64)
    split = np.zeros(n_old, dtype=np.bool_)
    for i in range(len(old)):
        h, g = old[i], new[i]
        size_old[h] += 1
        size_new[g] += 1
        if image[h] < 0:
            image[h] = g
        elif image[h] != g:
            split[h] = True
    for h in range(n_old):
        if image[h] < 0 or split[h] or size_old[h] != size_new[image[h]]:
            image[h] = -1
    return image


@njit(cache=True)
def translate(groups, image):
    """Replace every group number g in ``groups`` by ``image[g]``, in place; return whether each
    row held a group without image (-1)."""
    lost = np.zeros(len(groups), dtype=np.bool_)
    for i in range(groups.shape[0]):
        for t in range(groups.shape[1]):
            g = image[groups[i, t]]
            groups[i, t] = g
            if g < 0:
                lost[i] = True
    return lost


@njit(cache=True)
def forget(seen, old, new, image):
    """Set ``seen[i]`` to -1 where row i of ``old`` translated by ``image`` differs from ``new``."""
    for i in range(old.shape[0]):
        for t in range(old.shape[1]):
            if image[old[i, t]] != new[i, t]:
                seen[i] = -1
                break


@njit(cache=True)
def within(X, centres, bound):
    """Whether some row of ``centres`` lies within squared distance ``bound[i]`` of ``X[i]``."""
    out = np.zeros(len(X), dtype=np.bool_)
    for i in range(len(X)):
        for c in range(len(centres)):
            if _dist2(X, i, centres[c]) <= bound[i]:
                out[i] = True
                break
    return out


@njit(cache=True)
def _move(X, a, A, B, labels, counts, sums, members, slot):
    last = members[A, counts[A] - 1]
    members[A, slot[a]] = last
    slot[last] = slot[a]
    members[A, counts[A] - 1] = -1
    counts[A] -= 1
    members[B, counts[B]] = a
    slot[a] = counts[B]
    counts[B] += 1
    labels[a] = B
    for j in range(X.shape[1]):
        sums[A, j] -= X[a, j]
        sums[B, j] += X[a, j]


@njit(cache=True)
def vmdav(X, k, gamma):
    """V-MDAV labels (see :func:`sqlsdc.microdata.microaggregation.vmdav`)."""
    n, d = X.shape
    Yt = _variable_major(X)
    idx = np.arange(n)
    labels = np.full(n, -1, dtype=np.int64)
    total = np.zeros(d)
    for j in range(d):
        for i in range(n):
            total[j] += Yt[j, i]
    near = np.empty(k, dtype=np.int64)
    best = np.empty(k)
    dist = np.empty(n)
    din = np.empty(n)  # distance of each ungrouped record to the group being built
    tmp = np.empty(n)
    centre = np.empty(d)
    m, group = n, 0
    cap = 2 * k - 1
    while m >= k:
        for j in range(d):
            centre[j] = total[j] / m
        _distances(Yt, m, centre, dist)
        e = _argmax(dist, m)
        for j in range(d):
            centre[j] = Yt[j, e]
        _distances(Yt, m, centre, dist)
        _nearest(dist, m, k, near, best)
        members = np.empty(k, dtype=np.int64)
        for q in range(k):
            members[q] = near[q]
        # nearest member distance of every record (members are swapped out below)
        for i in range(m):
            din[i] = np.inf
        for q in range(k):
            for j in range(d):
                centre[j] = Yt[j, members[q]]
            _distances(Yt, m, centre, tmp)
            for i in range(m):
                if tmp[i] < din[i]:
                    din[i] = tmp[i]
        # move the group behind m, keeping din aligned with the swaps
        order = np.sort(members)[::-1]
        for p in order:
            last = m - 1
            labels[idx[p]] = group
            for j in range(d):
                total[j] -= Yt[j, p]
                t = Yt[j, p]
                Yt[j, p] = Yt[j, last]
                Yt[j, last] = t
            t2 = idx[p]
            idx[p] = idx[last]
            idx[last] = t2
            din[p] = din[last]
            m -= 1
        size = k
        while size < cap and m > 0:
            u, du = 0, np.inf
            for i in range(m):
                if din[i] < du:
                    u, du = i, din[i]
            for j in range(d):
                centre[j] = Yt[j, u]
            _distances(Yt, m, centre, tmp)
            dout = np.inf
            for i in range(m):
                if i != u and tmp[i] < dout:
                    dout = tmp[i]
            if not (np.sqrt(du) < gamma * np.sqrt(dout)):
                break
            for i in range(m):
                if tmp[i] < din[i]:
                    din[i] = tmp[i]
            last = m - 1
            labels[idx[u]] = group
            for j in range(d):
                total[j] -= Yt[j, u]
                t = Yt[j, u]
                Yt[j, u] = Yt[j, last]
                Yt[j, last] = t
            t2 = idx[u]
            idx[u] = idx[last]
            idx[last] = t2
            din[u] = din[last]
            m -= 1
            size += 1
        group += 1
    return labels, idx[:m].copy()
