"""Release files (values + manifest) and adapters from other DP libraries (OpenDP,
diffprivlib): how a release reaches dpinfer as a file or as another library's object."""

from dpinfer.io.adapters import UnsupportedMechanismError, from_diffprivlib, from_opendp

__all__ = ["UnsupportedMechanismError", "from_diffprivlib", "from_opendp"]
