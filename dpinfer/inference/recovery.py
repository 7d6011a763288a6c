"""Every recovery a fit makes is on the record: announced as it happens with a
:class:`RecoveryWarning` (whatever ``progressbar`` is), and kept in the result's
``sample_stats.attrs["dpinfer_recoveries"]`` (a JSON list, one entry per recovery, in order;
``posterior.attrs`` where a result has no ``sample_stats``).

A recovery is anything a fit did to go on after something went wrong, so that its draws are
not those of an uneventful run of the same call, or took another path to them:

* ``"windows widened"``: latent counts whose windows missed ``tol`` (or whose cells were held
  too often) got wider windows and the model was fitted again (``dp.sample``,
  ``dp.sample_sharded``); on a resume, the widenings the checkpointed fit had made are replayed
  and recorded again with ``"replayed": true``;
* ``"resumed"``: the fit continued from a checkpoint (``dp.sample(resume=...)``), with the
  iterations each chain had done there;
* ``"lost workers"``: Dask workers of a sharded fit were lost; the shards were rebuilt on
  the workers alive from the last whole checkpoint and the sweeps since it run again.

Each entry has ``kind``, ``message`` (the warning's text) and the details of its kind. A
user who must know that a result came from an uneventful run checks that the list is empty
(:func:`recoveries_of`), or turns the warnings into errors
(``warnings.simplefilter("error", dp.RecoveryWarning)``).
"""

from __future__ import annotations

import json
import warnings

ATTRIBUTE = "dpinfer_recoveries"


class RecoveryWarning(UserWarning):
    """A fit recovered from a failure and went on (module docstring): its result records how
    in ``sample_stats.attrs["dpinfer_recoveries"]``."""


def announce(recoveries: list, kind: str, message: str, *, warn: bool = True, **details) -> None:
    """Append the recovery ``kind`` to ``recoveries`` and, with ``warn``, announce it with a
    :class:`RecoveryWarning` saying ``message``. ``details``: JSON-serialisable facts."""
    recoveries.append({"kind": kind, "message": message, **details})
    if warn:
        warnings.warn(message, RecoveryWarning, stacklevel=3)


def bounds_of(failed: dict) -> dict:
    """A widening's failed latents (name -> the bound they reached) as JSON numbers."""
    return {str(name): float(bound) for name, bound in failed.items()}


def record(idata, recoveries: list) -> None:
    """Keep ``recoveries`` in ``idata.sample_stats.attrs`` (module docstring); in
    ``posterior.attrs`` for a result without sampler statistics (counts summed out by
    convolution, drawn exactly: no sampler of their own)."""
    group = idata.sample_stats if "sample_stats" in idata.children else idata.posterior
    group.attrs[ATTRIBUTE] = json.dumps(recoveries)


def recoveries_of(idata) -> list:
    """The recoveries a fit recorded (module docstring); empty for an uneventful fit."""
    for group in ("sample_stats", "posterior"):
        if group in idata.children and ATTRIBUTE in idata[group].attrs:
            return json.loads(idata[group].attrs[ATTRIBUTE])
    return []
