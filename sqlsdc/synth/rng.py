"""Keyed randomness of synthesis: the same seed and database secret give the same data.

Synthesis draws from two sources, both keyed by the database's PRF secret
(:class:`sqlsdc.mechanisms.prf.KeyedStream`), never by the seed alone, so that knowing the seed
written in an output's report does not let anyone repeat (or invert) the draws:

* :func:`synth_rng`: a numpy ``Generator`` (PCG64) for the sampling steps of every method
  (multinomial cell counts, copula draws, CART leaves), seeded from 256 bits of the stream
  ``(secret, "synth", seed, label)``;
* :func:`noise_stream`: the stream of one noisy cell of a DP margin, read by the exact
  discrete samplers of :mod:`sqlsdc.mechanisms.samplers` (no floating point in the noise).
  Its context must name everything that sets the noise's distribution (the scale): the
  samplers turn one stream into dependent draws at two scales (X and X // 5 at scales 12 and
  12/5), and two releases of one seed at two privacy levels then gave a count exactly, for
  the sum of their ε (red team s37c); the same context at the same scale is the same
  release made again.

Example:
    >>> a = synth_rng(b"a server secret of 16+ bytes", 7, "parametric").integers(1000, size=3)
    >>> b = synth_rng(b"a server secret of 16+ bytes", 7, "parametric").integers(1000, size=3)
    >>> bool((a == b).all())
    True
"""

from __future__ import annotations

import numpy as np

from sqlsdc.mechanisms.prf import KeyedStream

__all__ = ["noise_stream", "synth_rng"]

_DOMAIN = "sqlsdc.synth"


def synth_rng(secret: bytes, seed: int, label: str) -> np.random.Generator:
    """A numpy Generator keyed by ``secret``, ``seed`` and ``label`` (one per use)."""
    entropy = KeyedStream(secret, _DOMAIN, "rng", int(seed), str(label)).bits(256)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def noise_stream(secret: bytes, seed: int, *context: str | int) -> KeyedStream:
    """The keyed stream of one noisy cell; ``context`` names the source data version, the
    margin and the cell, so every cell draws its own noise."""
    return KeyedStream(secret, _DOMAIN, "noise", int(seed), *context)
