"""The 2020 Census PL94 person noisy measurement files (NMF): their published layout as data
(:mod:`~dpinfer.io.nmf.layout`), a faithful synthetic instance with a known truth
(:mod:`~dpinfer.io.nmf.synthetic`), the reader (:mod:`~dpinfer.io.nmf.reading`), and any
union of blocks summarised from a stored fit (:mod:`~dpinfer.io.nmf.areas`).

Names are loaded on first use, so that ``python -m dpinfer.io.nmf.synthetic`` runs the module
once."""

from dpinfer._lazy import lazy_exports

_EXPORTS = {
    "dpinfer.io.nmf.areas": (
        "read_plan", "summarise_areas"
    ),
    "dpinfer.io.nmf.reading": (
        "GeoLevel", "LevelConstraints", "NMFFileError", "NMFPrivacy", "NMFRelease",
        "NoisyMeasurementFiles", "QueryRows", "read_nmf"
    ),
    "dpinfer.io.nmf.synthetic": (
        "write_synthetic_nmf",
    ),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, ("areas", "layout", "reading", "store", "synthetic"))
