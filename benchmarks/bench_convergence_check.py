"""What judging latent counts costs after a fit: R-hat, bulk and tail ESS and the latents'
family bound, as ``dpinfer.inference.convergence.check`` computes them for every latent count,
on K synthetic counts (Poisson with gamma-spread means, so most are small whole numbers with
ties) x 2 chains x 1,000 draws; median of 3 timings after a small warm-up call. The draws are
independent, or with ``--phi`` an AR(1) series of that autocorrelation about each count's mean
(rounded, at least 0), as a chain's draws are. With ``--continuous`` the values are not rounded
(latent records, continuous parameters: ranked by sorting, no ties).

With ``--baseline DIR`` (a checkout of an earlier dpinfer, e.g. ``git worktree add /tmp/base
596eef4``) the same is timed there in a separate process and the ratio printed: there the
latents were judged by ``diagnostics`` and ``latent_rhat_excess`` (two rankings each of the
draws and of their folds) where now ``latent_diagnostics`` ranks each once, and ranks of whole
and half numbers are counted rather than sorted.

Run:  .venv/bin/python benchmarks/bench_convergence_check.py [--latents 20000] [--phi 0] [--continuous]
          [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def judge_seconds(k: int, phi: float = 0.0, continuous: bool = False) -> float:
    """Median of 3 timings of judging k latent counts (module docstring), in this process."""
    from dpinfer.inference import convergence as cv

    rng = np.random.default_rng(0)
    means = rng.gamma(0.5, 4.0, size=k)
    if continuous:
        values = means + np.sqrt(means + 0.25) * rng.standard_normal((2, 1000, k))
        for t in range(1, 1000):
            values[:, t] = means + phi * (values[:, t - 1] - means) + np.sqrt(1 - phi**2) * (values[:, t] - means)
    elif phi == 0.0:
        values = rng.poisson(means, size=(2, 1000, k)).astype(float)
    else:
        series = np.empty((2, 1000, k))
        series[:, 0] = rng.standard_normal((2, k))
        for t in range(1, 1000):
            series[:, t] = phi * series[:, t - 1] + np.sqrt(1 - phi**2) * rng.standard_normal((2, k))
        values = np.maximum(np.round(means + np.sqrt(means + 0.25) * series), 0.0)

    def judge(v):
        if hasattr(cv, "latent_diagnostics"):
            cv.latent_diagnostics(v, k)
        else:  # before latent_diagnostics: both functions, each ranking the draws
            cv.diagnostics(v)
            cv.latent_rhat_excess(v, k)
        cv.tail_ess(v)

    judge(values[:, :, :64])
    times = []
    for _ in range(3):
        start = time.perf_counter()
        judge(values)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _in_process(path: Path, k: int, phi: float, continuous: bool) -> float:
    env = dict(os.environ, PYTHONPATH=str(path))
    out = subprocess.run([sys.executable, __file__, "--latents", str(k), "--phi", str(phi), "--only",
                          *(["--continuous"] if continuous else [])], env=env, cwd=path,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latents", type=int, default=20000)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--phi", type=float, default=0.0, help="the draws' autocorrelation (AR(1); default 0)")
    parser.add_argument("--continuous", action="store_true", help="real-valued draws, not counts")
    parser.add_argument("--only", action="store_true", help=argparse.SUPPRESS)  # one timing, for a subprocess
    args = parser.parse_args(argv)
    if args.latents < 64:
        parser.error(f"--latents must be at least 64, got {args.latents}")
    if not 0.0 <= args.phi < 1.0:
        parser.error(f"--phi must be in [0, 1), got {args.phi}")
    if args.only:
        print(judge_seconds(args.latents, args.phi, args.continuous))
        return
    if args.baseline is not None and not (args.baseline / "dpinfer" / "__init__.py").is_file():
        parser.error(f"--baseline {args.baseline} is not a dpinfer checkout (no dpinfer/__init__.py)")
    now = _in_process(ROOT, args.latents, args.phi, args.continuous)
    per = now / (args.latents * 2000) * 1e9
    kind = "real-valued latents" if args.continuous else "latent counts"
    print(f"judging {args.latents:,} {kind} x 2 chains x 1,000 draws (autocorrelation {args.phi}): "
          f"{now:.2f} s ({per:.0f} ns a value)")
    if args.baseline is not None:
        base = _in_process(args.baseline, args.latents, args.phi, args.continuous)
        print(f"baseline {args.baseline}: {base:.2f} s; now / baseline {now / base:.2f}")


if __name__ == "__main__":
    main()
