r"""Baselines: what an analyst *without* a likelihood does with a release.

Census-style post-processing (Abowd et al. 2022, "The 2020 Census Disclosure Avoidance System
TopDown Algorithm", Harvard Data Science Review, Special Issue 2; inference notes §5 use it as the
baseline) turns a noisy release into tables that look like counts:

1. **Least-squares projection** onto the invariants,
   ``x_hat = argmin ||x - s||_2^2  s.t.  A x = a, x >= 0``  (:func:`nonnegative_least_squares`),
   generalised to several linear-query releases ``s_r = Q_r x + e_r`` with ``Var(e_r) = v_r``,
   ``x_hat = argmin sum_r ||Q_r x - s_r||^2 / v_r  s.t.  A x = a, x >= 0``
   (:func:`generalized_least_squares`, the generalised least-squares estimate);
2. **Integer rounding** that keeps the invariants exactly: a non-negative integer ``x_int`` with
   ``A x_int = a`` minimising ``||x_int - x_hat||_1`` (:func:`round_to_invariants`);
3. **Noise-only intervals** ``[x_point + lo, x_point + hi]`` with ``(lo, hi)`` the central interval
   of the noise law (:func:`noise_only_intervals`).

These are point estimates and intervals with no model for the confidential data: compare them
with dpinfer's posteriors, never treat them as calibrated. In particular the noise-only interval
has its nominal coverage only around the raw release; around a projected or rounded estimate the
error is no longer the mechanism's noise (invariants shrink it; where non-negativity binds, small
counts are pushed up and the others down to keep the totals) and coverage is not guaranteed.

Modules, one step each (all exact, no penalty or iteration-to-tolerance approximations):
:mod:`~dpinfer.utility.baselines.least_squares` (step 1: closed-form simplex projection, else
the quadratic programme of :mod:`~dpinfer.utility.baselines.qp`),
:mod:`~dpinfer.utility.baselines.rounding` (step 2), :mod:`~dpinfer.utility.baselines.intervals`
(step 3); :mod:`~dpinfer.utility.baselines.inputs` checks the arguments they share (cells,
constraint matrices, group labels and totals). The subpackage
:mod:`~dpinfer.utility.baselines.nested` holds the baselines of nested measurements (census noisy
measurement files), one module each: GLS/BLUE, per-cell posteriors, NNLS, and their scoring
beside dpinfer's posterior.
"""

from dpinfer.utility.baselines.intervals import noise_only_intervals
from dpinfer.utility.baselines.least_squares import generalized_least_squares, nonnegative_least_squares
from dpinfer.utility.baselines.qp import KKT_TOLERANCE
from dpinfer.utility.baselines.rounding import round_to_invariants

__all__ = [
    "KKT_TOLERANCE",
    "generalized_least_squares",
    "noise_only_intervals",
    "nonnegative_least_squares",
    "round_to_invariants",
]
