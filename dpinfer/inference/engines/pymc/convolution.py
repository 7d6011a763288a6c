"""The log-likelihood ``sum_g log V_g`` of releases whose noise was conditioned on group totals
(inference notes §2) as a PyTensor Op, with the conditional cell marginals as its gradient;
the numbers come from :func:`dpinfer.lattice.convolution.log_convolution_at`."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.gradient import DisconnectedType, disconnected_type, grad_not_implemented
from pytensor.graph.basic import Apply
from pytensor.graph.op import Op

from dpinfer.lattice.convolution import log_convolution_at

__all__ = ["ConvolutionLogLikelihood"]


class ConvolutionLogLikelihood(Op):
    """``sum_g log V_g`` as a PyTensor Op, with gradient ``d/d log_g = marginals``.

    ``ConvolutionLogLikelihood(groups)(log_g, targets)`` takes ``log_g`` a float64 (d, W)
    tensor and ``targets`` an int64 (G,) tensor and returns the scalar ``sum_g log V_g``
    (``-inf`` if any target is unreachable). The gradient with respect to ``log_g`` is
    ``output_grad * marginals`` (0 for the cells of unreachable groups); ``targets`` are
    integers and disconnected from the gradient. A NaN or +inf in ``log_g`` gives a NaN value
    (and zero gradient) instead of the ValueError :func:`log_convolution_at` raises, so that a
    bad proposal during sampling is rejected rather than aborting the run.

    ``groups`` is fixed at construction and stored as a tuple (the Op's only prop, so equal
    groupings give equal, mergeable Ops). Internally the Op has a second output, the (d, W)
    marginals, which the gradient reuses, so value and gradient cost one evaluation; calling
    the Op returns only the scalar (``default_output = 0``). Second derivatives are not
    implemented.

    Use inside PyMC as ``pm.Potential("lik", op(log_g, targets))``, or as the ``logp`` of a
    ``pm.CustomDist`` whose observed value is the released total(s) (tested with a scalar
    total: ``logp=lambda value, *params: op(log_g(*params), value[None])``).
    """

    __props__ = ("groups",)
    default_output = 0

    def __init__(self, groups):
        arr = np.asarray(groups)
        if arr.ndim != 1:
            raise ValueError(f"groups must be a 1-D sequence of integer codes; got shape {arr.shape}")
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            if not np.all(arr == np.round(arr)):
                raise ValueError("groups must be integer codes 0..G-1")
        if arr.size and arr.min() < 0:
            raise ValueError("groups must be integer codes 0..G-1 (got a negative code)")
        self.groups = tuple(int(x) for x in arr)
        self._groups_arr = np.asarray(self.groups, dtype=np.int64)
        super().__init__()

    def make_node(self, log_g, targets):
        log_g = pt.as_tensor_variable(log_g)
        if log_g.dtype != "float64":
            log_g = pt.cast(log_g, "float64")
        targets = pt.as_tensor_variable(targets)
        if not targets.dtype.startswith(("int", "uint")):
            raise ValueError(f"targets must be an integer tensor; got dtype {targets.dtype}")
        if targets.dtype != "int64":
            targets = pt.cast(targets, "int64")
        if log_g.ndim != 2:
            raise ValueError(f"log_g must be a (d, W) tensor; got ndim {log_g.ndim}")
        if targets.ndim != 1:
            raise ValueError(f"targets must be a (G,) tensor; got ndim {targets.ndim}")
        d = len(self.groups)
        if log_g.type.shape[0] is not None and log_g.type.shape[0] != d:
            raise ValueError(f"log_g has {log_g.type.shape[0]} rows but groups has d = {d} cells")
        outputs = [pt.dscalar(), pt.tensor(dtype="float64", shape=(d, log_g.type.shape[1]))]
        return Apply(self, [log_g, targets], outputs)

    def perform(self, node, inputs, output_storage):
        log_g, targets = inputs
        if log_g.shape[0] != len(self.groups):
            raise ValueError(f"log_g has {log_g.shape[0]} rows but groups has d = {len(self.groups)} cells")
        if np.isnan(log_g).any() or np.isposinf(log_g).any():
            # propagate like an elementwise op would (NUTS then treats the point as divergent)
            output_storage[0][0] = np.asarray(np.nan)
            output_storage[1][0] = np.zeros(log_g.shape)
            return
        logV, marg = log_convolution_at(log_g, self._groups_arr, targets)
        total = logV.sum() if np.all(np.isfinite(logV)) else -np.inf
        output_storage[0][0] = np.asarray(total, dtype=np.float64)
        output_storage[1][0] = np.nan_to_num(marg, nan=0.0)

    def infer_shape(self, node, input_shapes):
        return [(), input_shapes[0]]

    def connection_pattern(self, node):
        return [[True, True], [False, False]]

    def pullback(self, inputs, outputs, cotangents):
        g_val, g_marg = cotangents
        if not isinstance(g_marg.type, DisconnectedType):
            return [grad_not_implemented(self, 0, inputs[0], "second derivatives of log V"), disconnected_type()]
        if isinstance(g_val.type, DisconnectedType):
            return [disconnected_type(), disconnected_type()]
        return [g_val * outputs[1], disconnected_type()]
