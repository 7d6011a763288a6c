"""What ``dpinfer.sample`` reports about each latent (``idata.posterior.attrs["dpinfer"]``):
the entry of a latent whose counts were drawn on a window, filled in by the engine that ran."""

from __future__ import annotations


def window_entry(plan, method: str, bound: float, tol: float) -> dict:
    """A count plan's report: its release and mechanism, the method that ran, the window's
    half-width, the largest bound reached on the neglected likelihood mass and ``tol``."""
    return {
        "release": plan.record.name,
        "mechanism": repr(plan.record.mechanism),
        "method": method,
        "window_half_width": plan.window.half_width,
        "max_relative_error_bound": bound,
        "tol": tol,
    }
