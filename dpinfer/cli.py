"""The ``dpinfer`` command."""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

COMMANDS = {
    "demo": "privatise census counts and recover them with a Bayesian model",
    "compare": "compare mechanisms at equal privacy: a preset or a config file in, a table and a PNG out",
    "fit": "fit a model to a release file: the posterior, a summary table and an HTML report out",
    "nmf": "fit a state's 2020 Census noisy measurement files: posteriors per level, a report and a CSV out",
    "areas": "summarise any union of blocks (a district plan) from a stored dpinfer nmf fit: a CSV out",
    "cache": "where the compiled models are kept and what they hold; --clear deletes them",
    "compile": "compile dpinfer's numba kernels now (once per install and per source), not in the first fits",
}

CONFIG_KEYS = {"target", "families", "sensitivity", "true_values", "levels", "tails", "prob",
               "consumers", "consumer_range", "priors", "replications", "seed"}


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: dpinfer COMMAND [options]\n\ncommands:")
        for name, text in COMMANDS.items():
            print(f"  {name:8s} {text}")
        return
    command, rest = argv[0], argv[1:]
    if command == "demo":
        from dpinfer.demo import main as demo_main

        demo_main(rest)
    elif command == "compare":
        compare_main(rest)
    elif command == "fit":
        fit_main(rest)
    elif command == "nmf":
        nmf_main(rest)
    elif command == "areas":
        areas_main(rest)
    elif command == "cache":
        cache_main(rest)
    elif command == "compile":
        compile_main(rest)
    else:
        raise SystemExit(f"dpinfer: unknown command {command!r}; choose from {sorted(COMMANDS)}")


def nmf_main(argv) -> None:
    """``dpinfer nmf ROOT --state FIPS [--leaves LEVEL] [--cells NAME] [--out DIR] ...``
    (:mod:`dpinfer.io.nmf.fit`)."""
    from dpinfer.io.nmf.fit import INFERENCES
    from dpinfer.io.nmf.layout import LEVELS
    from dpinfer.io.nmf.model import LEAF_SIZES
    from dpinfer.io.nmf.table import COARSENINGS

    parser = argparse.ArgumentParser(
        prog="dpinfer nmf", description=COMMANDS["nmf"],
        epilog="phases: the files read, the table, the fit (inference 'auto': the hyperparameters' "
               "empirical-Bayes estimate, then full Bayes if it is predicted to converge within "
               "--max-minutes, else empirical Bayes; sampling on until R-hat <= 1.01 and bulk and tail "
               "ESS >= 400 or the time is up), the summaries and report. Writes report.html (the method "
               "and the convergence verdict first, then every level's intervals beside GLS), summary.csv "
               "(per level, geocode and quantity: mean, sd, median, 5%% and 95%% quantiles, R-hat, bulk "
               "and tail ESS, the GLS estimate and sd, the truth if given) and posterior.zarr (every draw, "
               "with every block under each leaf: summarise any plan later with dpinfer areas)")
    parser.add_argument("root", help="the directory holding US_Person_PL_PROD/ (a local path or URL)")
    parser.add_argument("--state", required=True, type=int, help="state FIPS code, e.g. 19")
    parser.add_argument("--leaves", default="Block_Group", choices=LEVELS[1:],
                        help="the level whose geographies carry the latent counts (default Block_Group)")
    parser.add_argument("--cells", default="pl94-28", choices=sorted(COARSENINGS),
                        help="the coarse cells (default pl94-28: votingage x hispanic x 7 race groups)")
    parser.add_argument("--out", default=None, help="output directory (default nmf-STATE-LEAVES)")
    parser.add_argument("--inference", default="auto", choices=INFERENCES,
                        help="full Bayes, empirical Bayes, or auto (default): full Bayes where it is predicted "
                             "to converge within --max-minutes")
    parser.add_argument("--max-minutes", type=float, default=20.0,
                        help="the whole run's time: sample on until converged or this is up (default 20)")
    parser.add_argument("--uncertainty", default="normal", choices=("normal", "none"),
                        help="empirical Bayes: the hyperparameters drawn from the normal approximation of their "
                             "posterior (default) or held at its mode")
    parser.add_argument("--leaf-sizes", default="auto", choices=("auto", *LEAF_SIZES),
                        help="each leaf's expected share of its parent: its published total or estimated (a "
                             "parameter per leaf); auto (default): estimated at Block leaves, where published "
                             "totals make the blocks' intervals undercover, published above")
    parser.add_argument("--draws", type=int, default=1000, help="draws per chain before sampling on (default 1000)")
    parser.add_argument("--tune", type=int, default=1000, help="full Bayes's tuning iterations (default 1000)")
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--truth", default=None, help="a synthetic file's truth.parquet: adds the truth to the outputs")
    parser.add_argument("--areas", default=None, metavar="PLAN.csv",
                        help="a block-assignment plan (GEOID20, area label): also write OUT/areas.csv "
                             "(see dpinfer areas)")
    parser.add_argument("--probability", action="append", default=[], metavar="EVENT",
                        help="with --areas: each area's probability of EVENT, e.g. 'share_vap_hisp > 0.5' "
                             "(repeatable)")
    parser.add_argument("--partial", action="store_true",
                        help="with --areas: the plan may leave blocks in no area (places)")
    parser.add_argument("--checkpoint-every", type=int, default=100, metavar="N",
                        help="save the chains every N iterations in OUT/checkpoint; after Ctrl-C or a "
                             "killed run, the same command continues from there (default 100; 0: off)")
    args = parser.parse_args(argv)
    from dpinfer.inference.checkpoint import Interrupted
    from dpinfer.io.nmf.fit import fit_nmf

    if args.checkpoint_every < 0:
        parser.error(f"--checkpoint-every must be >= 0 (0: no checkpoints), got {args.checkpoint_every}")
    try:
        out = fit_nmf(args.root, args.state, leaves=args.leaves, cells=args.cells, out=args.out,
                      draws=args.draws, tune=args.tune, chains=args.chains, seed=args.seed, truth=args.truth,
                      checkpoint_every=args.checkpoint_every or None, inference=args.inference,
                      max_minutes=args.max_minutes, uncertainty=args.uncertainty, leaf_sizes=args.leaf_sizes,
                      areas=args.areas, probabilities=args.probability, partial=args.partial)
    except Interrupted as err:
        again = ("; run the same command again to continue" if args.checkpoint_every else "")
        print(f"dpinfer nmf: {err}{again}", file=sys.stderr)
        raise SystemExit(130) from None
    except (ValueError, TypeError, OSError) as err:  # a bad root or file: one line naming it
        raise SystemExit(f"dpinfer nmf: {' '.join(str(err).splitlines())}") from None
    except RuntimeError as err:  # a fit that could not go on (no time left, a term that fails): what and why
        raise SystemExit(f"dpinfer nmf: {' '.join(str(err).splitlines())} (files: {args.root})") from None
    import json

    from dpinfer.io.nmf.report import verdict_text
    from dpinfer.io.nmf.store import open_posterior

    with open_posterior(out / "posterior.zarr") as tree:
        verdict = json.loads(tree.posterior.attrs["dpinfer_convergence"])
    print(f"dpinfer nmf: {verdict_text(verdict)}")
    print(f"dpinfer nmf: report {out / 'report.html'}")
    if args.areas:
        print(f"dpinfer nmf: areas {out / 'areas.csv'}")


def areas_main(argv) -> None:
    """``dpinfer areas STORE (PLAN.csv | --tabulation LEVEL) [--out CSV] [--probability EVENT] ...``
    (:mod:`dpinfer.io.nmf.areas`)."""
    from dpinfer.io.nmf.areas import TABULATION, summarise_areas, tabulation_plan, write_summary

    parser = argparse.ArgumentParser(
        prog="dpinfer areas", description=COMMANDS["areas"],
        epilog="quantities per area: every cell, pop and vap (voting-age population), each also _hisp and "
               "_nh_<race> (white, black, aian, asian, nhopi, sor, two_or_more_races), and each group's share "
               "share_pop_<group>, share_vap_<group>; events compare two quantities or a quantity and a number "
               "with >, >=, <, <=. The CSV's first lines (# comments) give the fit's convergence verdict: "
               "summaries of a fit that has not converged are not results.")
    parser.add_argument("store", help="a stored fit: OUT/posterior.zarr of dpinfer nmf")
    parser.add_argument("plan", nargs="?", default=None,
                        help="a CSV of blocks (15-digit GEOID20) and area labels, one row per block")
    parser.add_argument("--tabulation", default=None, choices=sorted(TABULATION),
                        help="instead of a plan: the tabulation counties, tracts or block groups rebuilt from the "
                             "fit's blocks")
    parser.add_argument("--out", default=None,
                        help="the CSV to write (default areas.csv beside the plan, or in the working directory)")
    parser.add_argument("--probability", action="append", default=[], metavar="EVENT",
                        help="each area's probability of EVENT, e.g. 'share_vap_hisp > 0.5' or "
                             "'vap_hisp > vap_nh_white' (repeatable): written to <out>-probabilities.csv")
    parser.add_argument("--interval", type=float, default=0.9, help="the central interval's probability (default 0.9)")
    parser.add_argument("--partial", action="store_true",
                        help="the plan may leave blocks of the fit in no area (places); otherwise each missing "
                             "block is an error")
    parser.add_argument("--geoid-column", default=None, help="the plan's block column (default GEOID20, or the first)")
    parser.add_argument("--area-column", default=None, help="the plan's area column (default: the other one)")
    args = parser.parse_args(argv)
    if (args.plan is None) == (args.tabulation is None):
        parser.error("give a PLAN.csv or --tabulation LEVEL (one of them)")
    out = Path(args.out) if args.out else (Path(args.plan).with_name("areas.csv") if args.plan else Path("areas.csv"))
    try:
        plan = args.plan if args.plan else tabulation_plan(args.store, args.tabulation)
        summary = summarise_areas(args.store, plan, probabilities=args.probability, interval=args.interval,
                                  partial=args.partial, geoid_column=args.geoid_column, area_column=args.area_column)
        written = write_summary(summary, out)
    except (ValueError, TypeError, OSError) as err:
        raise SystemExit(f"dpinfer areas: {' '.join(str(err).splitlines())}") from None
    for line in summary.lines():
        print(f"dpinfer areas: {line}")
    figure = out.with_suffix(".png")
    print(f"dpinfer areas: wrote {', '.join(str(p) for p in (*written, figure if figure.exists() else None) if p)}")


def cache_main(argv) -> None:
    """``dpinfer cache [--clear]``: the model cache's directory, entries and size (module
    :mod:`dpinfer.inference.engines.compiled.cache`); ``--clear`` deletes it."""
    parser = argparse.ArgumentParser(
        prog="dpinfer cache", description=COMMANDS["cache"],
        epilog="the directory is $DPINFER_CACHE_DIR/models, else $XDG_CACHE_HOME/dpinfer/models, "
               "else ~/.cache/dpinfer/models; each entry is one compiled model function, keyed by "
               "its graph and the versions of dpinfer, PyMC, PyTensor and numba; after each "
               "compilation the least recently used entries are deleted beyond "
               "$DPINFER_CACHE_MAX_MB megabytes (default 1024)")
    parser.add_argument("--clear", action="store_true", help="delete every compiled model function")
    args = parser.parse_args(argv)
    from dpinfer.inference.engines.compiled import cache

    root, entries, size = cache.contents()
    if args.clear:
        cache.clear()
        print(f"dpinfer cache: deleted {entries} compiled model functions ({size / 1e6:.1f} MB) "
              f"from {root}")
        return
    print(f"dpinfer cache: {root}: {entries} compiled model functions, {size / 1e6:.1f} MB "
          f"(bound {cache.size_limit() / 1e6:.0f} MB, least recently used deleted beyond it)")


def compile_main(argv) -> None:
    """``dpinfer compile [--force]`` (:mod:`dpinfer.warm_up`)."""
    parser = argparse.ArgumentParser(
        prog="dpinfer compile", description=COMMANDS["compile"],
        epilog="runs a few small fits that reach every engine's kernels (a few minutes on 2 cores) and "
               "leaves them in numba's cache beside dpinfer's source; returns at once when that cache is "
               "already warm for this source (tools/ensure-venv runs it after installing)")
    parser.add_argument("--force", action="store_true", help="run the fits even if the cache is warm")
    args = parser.parse_args(argv)
    from dpinfer.warm_up import warm_up

    warm_up(force=args.force)


def _target(spec):
    from dpinfer.utility import PrivacyTarget

    if not isinstance(spec, dict) or spec.get("kind") not in ("pure", "approximate", "zcdp"):
        raise SystemExit("config: target must be a table with kind = 'pure', 'approximate' or 'zcdp' "
                         "and its epsilon / delta / rho")
    kind = spec["kind"]
    try:
        if kind == "pure":
            return PrivacyTarget.pure(spec["epsilon"])
        if kind == "approximate":
            return PrivacyTarget.approximate(spec["epsilon"], spec["delta"])
        return PrivacyTarget.zcdp(spec["rho"])
    except KeyError as err:
        raise SystemExit(f"config: target of kind {kind!r} needs {err.args[0]!r}") from None


def _from_config(path: Path):
    """dp.compare from a TOML file (keys: CONFIG_KEYS; README "Comparing mechanisms")."""
    import numpy as np

    from dpinfer._validation import check_seed
    from dpinfer.utility import Consumer, compare

    try:
        config = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise SystemExit(f"config: cannot read {path}: {err}") from None
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise SystemExit(f"config: unknown keys {unknown}; allowed: {sorted(CONFIG_KEYS)}")
    if "target" not in config or "true_values" not in config:
        raise SystemExit("config: 'target' and 'true_values' are required")
    try:
        consumers = {label: Consumer(spec.get("loss", "absolute"), spec.get("side_information"))
                     for label, spec in _consumer_tables(config.get("consumers", {})).items()}
        levels = config.get("levels", ["release"] + (["consumer"] if consumers else []))
        return compare(target=_target(config["target"]), families=config.get("families"),
                       sensitivity=config.get("sensitivity", 1), true_values=config["true_values"],
                       levels=levels, tails=config.get("tails", (1.0, 5.0)), prob=config.get("prob", 0.9),
                       consumers=consumers or None, consumer_range=config.get("consumer_range"),
                       priors=config.get("priors"),
                       replications=config.get("replications", 2000),
                       rng=np.random.default_rng(check_seed(config.get("seed", 0), "seed")))
    except (ValueError, TypeError) as err:
        raise SystemExit(f"config {path}: {err}") from None


def _consumer_tables(consumers) -> dict:
    """The config's [consumers.LABEL] tables, each with ``loss`` and ``side_information`` only."""
    if not isinstance(consumers, dict) or not all(isinstance(spec, dict) for spec in consumers.values()):
        raise TypeError("consumers must be tables [consumers.LABEL] with loss = ... and side_information = [...]")
    for label, spec in consumers.items():
        unknown = sorted(set(spec) - {"loss", "side_information"})
        if unknown:
            raise ValueError(f"consumers.{label}: unknown keys {unknown}; allowed: ['loss', 'side_information']")
    return consumers


def fit_main(argv) -> None:
    """``dpinfer fit RELEASE [--model NAME|FILE.py] [--out DIR] [--draws N] [--exposure
    COLUMN|none] [--max-minutes M] ...`` (:mod:`dpinfer.io.fit`); prints whether the fit
    converged and where the report is."""
    from dpinfer.io.templates import TEMPLATES

    parser = argparse.ArgumentParser(
        prog="dpinfer fit", description=COMMANDS["fit"],
        epilog="models: " + "; ".join(f"{k}: {v}" for k, v in TEMPLATES.items())
        + "; or a Python file defining build_model(release) -> (pm.Model, latent name)")
    parser.add_argument("release", type=Path, help="the release's manifest (release.toml)")
    parser.add_argument("--model", default="auto",
                        help="a model template or a Python model file (default auto)")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the report (default: <release name>-fit beside the manifest)")
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--tune", type=int, default=1000)
    parser.add_argument("--chains", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--exposure", default=None, metavar="COLUMN|none",
                        help="a column of the values file giving each cell's exposure (e.g. "
                             "population); default: the manifest's exposure_column, if it "
                             "declares one; 'none': no exposure")
    parser.add_argument("--truth", default=None,
                        help="a column of the values file holding the true counts, where known")
    parser.add_argument("--max-minutes", type=float, default=10.0,
                        help="while the fit misses R-hat <= 1.01, bulk and tail ESS >= 400 or has "
                             "divergences, sample again with more draws until this many minutes "
                             "have passed (default 10; 0: one fit only)")
    parser.add_argument("--cores", type=int, default=None,
                        help="cores to run the chains on (default: one per chain, up to the "
                             "cores available)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    from dpinfer.io.fit import DECLARED, fit

    try:
        result = fit(args.release, model=args.model, out=args.out, draws=args.draws,
                     tune=args.tune, chains=args.chains, seed=args.seed,
                     exposure=DECLARED if args.exposure is None else args.exposure,
                     truth=args.truth, progressbar=not args.quiet, max_minutes=args.max_minutes,
                     cores=args.cores)
    except (ValueError, TypeError, FileNotFoundError) as err:
        raise SystemExit(f"dpinfer fit: {err}") from None
    except RuntimeError as err:  # a fit that could not go on (no time left, a term that fails): what and why
        raise SystemExit(f"dpinfer fit: {' '.join(str(err).splitlines())} (release: {args.release})") from None
    print(result.line())
    print(f"report: {result.index}")


def compare_main(argv) -> None:
    """``dpinfer compare (--preset NAME | --config FILE) [--out DIR] [--replications N]``."""
    import pandas as pd

    from dpinfer.utility import presets

    parser = argparse.ArgumentParser(prog="dpinfer compare", description=COMMANDS["compare"])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", choices=sorted(presets.PRESETS))
    source.add_argument("--config", type=Path, help="a TOML file (see README)")
    parser.add_argument("--out", type=Path, default=Path("compare-output"),
                        help="directory for the CSV tables and the PNG (default ./compare-output)")
    parser.add_argument("--replications", type=int, default=None,
                        help="simulated releases (midwest: 100; config: its own or 2000)")
    args = parser.parse_args(argv)
    if args.replications is not None and args.preset in ("seed002", "seed004"):
        parser.error(f"--replications: the {args.preset} preset is exact (no simulated releases); it takes "
                     "--replications with --preset midwest, and a config file takes replications = N")
    if args.replications is not None and args.replications < 2:
        parser.error(f"--replications must be a whole number >= 2, got {args.replications}")
    args.out.mkdir(parents=True, exist_ok=True)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_columns", 12)
    if args.preset == "seed002":
        tables = {"seed002": presets.seed002()}
        figure = presets.seed002_figure(tables["seed002"])
    elif args.preset == "seed004":
        tables = presets.seed004()
        figure = presets.seed004_figure(tables)
    else:
        if args.preset == "midwest":
            result = presets.midwest(replications=100 if args.replications is None else args.replications)
        else:
            result = _from_config(args.config)
            if args.replications is not None:
                raise SystemExit("--replications goes in the config file (replications = N)")
        tables = {"compare": result.table}
        figure = result.figure()
    for name, table in tables.items():
        path = args.out / f"{name}.csv"
        table.to_csv(path, index=False)
        print(f"\n{name} ({path}):")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.6g}"))
    png = args.out / "compare.png"
    figure.savefig(png, dpi=110)
    print(f"\nfigure: {png}")
