"""Parameters of the cell key method, owned by the mechanism that uses them.

The policy model (:mod:`sqlsdc.policy`) reads them from YAML and re-exports them; the math in
:mod:`sqlsdc.mechanisms` depends on them only, never on the policy (imports point down:
policy → mechanisms).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PTableSpec:
    """Parameters of a maximum-entropy perturbation table (R package ``ptable``, τ-ARGUS).

    D: maximum deviation; V: noise variance; js: no positive count <= js is published;
    pstay: minimum probability of no change; step: steps per unit of a magnitude table;
    parity: separate tables for cells with an even and an odd number of contributors.
    """

    D: int
    V: float
    js: int = 0
    pstay: float | None = None
    optim: int = 1
    mono: bool = True
    step: int = 1
    parity: bool = False

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class UnitNoise:
    """Permanent multiplicative noise per unit (Evans, Zayatz & Slanta, J. Official Statistics
    14(4), 1998): every contribution x of a unit enters its magnitudes as x·m, m drawn once per
    unit and measure from the split-triangular density on (2−b, 2−a) ∪ (a, b), 1 < a < b < 2
    (:mod:`sqlsdc.mechanisms.unit_noise`)."""

    a: float
    b: float

    def noised_bounds(self, lo: float, hi: float) -> tuple[float, float]:
        """The bounds of x·m for x in [lo, hi]: what a reader of the policy knows of one
        noised contribution (m in [2 − b, b])."""
        factors = (2 - self.b, self.b)
        return min(lo * f for f in factors), max(hi * f for f in factors)


@dataclass(frozen=True)
class MagnitudeCkm:
    """Magnitude cell-key parameters (cellKey ``ck_params_nums`` with ``ck_flexparams``).

    The noise of a cell is built from its ``top_k`` largest contributions x_j: amplitude
    x_j·m(|x_j|) from the flex function (fp, p_small, p_large, q), weighted by epsilon_j when a
    cell is smaller than that amplitude; sensitive cells (fewer than ``sensitive_below``
    contributors) get the extra amount ``mu_c``; ``small_cells`` is the separate ptable for
    contributions below the separation point z_s.

    ``mean_below`` (sqlsdc's addition, set by the policy from the count ptable, 0: none): a
    cell of 2 or more contributors whose protected count is under ``mean_below`` is perturbed
    as n times a cell of one contribution, its mean (:func:`sqlsdc.mechanisms.ckm.mean_below`
    says why).

    ``unit_noise`` (None: none): each contribution is multiplied by its unit's permanent factor
    before the cell is aggregated and perturbed (:class:`UnitNoise`).
    """

    top_k: int
    fp: float
    p_small: float
    p_large: float
    q: float = 3.0
    epsilon: tuple[float, ...] = (1.0,)
    mu_c: float = 0.0
    sensitive_below: int = 0
    same_key: bool = True
    small_cells: PTableSpec | None = None
    mean_below: int = 0
    unit_noise: UnitNoise | None = None
