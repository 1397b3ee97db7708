"""Synthetic data (issue 19): synthesis jobs stored back as ``protected.<name>``.

* :mod:`sqlsdc.synth.job` — the job (:func:`synthesize`, ``sqlsdc synthesize``) and the method
  registry :data:`~sqlsdc.synth.job.METHODS`;
* :mod:`sqlsdc.synth.ipf` — ``dp-ipf`` and ``dp-catall`` (Raab), on noisy margins;
* :mod:`sqlsdc.synth.parametric` — ``parametric``, a Gaussian copula;
* :mod:`sqlsdc.synth.rng` — randomness keyed by the database secret and the seed.
"""

from sqlsdc.synth.job import METHODS, SynthReport, synthesize

__all__ = ["METHODS", "SynthReport", "synthesize"]
