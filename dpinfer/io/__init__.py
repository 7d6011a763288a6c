"""Release files (values + manifest) and adapters from other DP libraries (OpenDP,
diffprivlib): how a release reaches dpinfer as a file or as another library's object."""

from dpinfer.io.adapters import UnsupportedMechanismError, from_diffprivlib, from_opendp
from dpinfer.io.noisy_measurements import NoisyMeasurements, read_noisy_measurements
from dpinfer.io.release import (
    Release,
    ReleaseFileError,
    mechanism_from_manifest,
    mechanism_to_manifest,
    read_release,
    write_release,
)

__all__ = [
    "NoisyMeasurements",
    "Release",
    "ReleaseFileError",
    "UnsupportedMechanismError",
    "from_diffprivlib",
    "from_opendp",
    "mechanism_from_manifest",
    "mechanism_to_manifest",
    "read_noisy_measurements",
    "read_release",
    "write_release",
]
