r"""Release files: a privatised release as a values file plus a TOML manifest.

An analyst meets a release as files: the released values (CSV, or Parquet where pyarrow is
installed) and a manifest that states how they were made, so that the release's exact
likelihood can be rebuilt without retyping anything::

    release = dp.read_release("models/midwest_american_indian/release.toml")
    with pm.Model(coords=release.coords) as model:
        ...
        count = pm.Poisson("count", rate, dims="county")
        release.observe(count)          # p(release | count), invariants included

A curator writes the same files from the mechanism object that made the release (the
manifest can also be written by hand; :func:`write_release` is a convenience)::

    write_release("release.toml", mechanism, noisy, index=counties, name="counts",
                  description="...", units="people", provenance="...")

Manifest (format ``dpinfer-release/1``; JSON Schema ``release-schema.json`` in this package)
--------------------------------------------------------------------------------------------

.. code-block:: toml

    format = "dpinfer-release/1"

    [release]
    name = "delinquent_children"          # also the default PyMC variable name
    description = "..."                    # optional
    units = "children"                     # optional
    provenance = "..."                     # optional: who released it, how, with which seed
    created = 2026-11-25                   # optional: TOML date/datetime or a string
    values_file = "release.csv"            # relative to the manifest; .csv or .parquet
    value_columns = ["Low", "Medium"]      # one column: values (n,); k columns: (n, k)
    index_columns = ["county"]             # optional: labels of the rows
    dims = ["county", "education"]         # optional: PyMC dims of the values' axes
    exposure_column = "population"         # optional: each row's public exposure (> 0, finite)

    [mechanism]
    family = "Conditioned"                 # a dpinfer mechanism class
    nonnegative = false                    # its constructor parameters, by name

    [mechanism.base]                       # Conditioned's base mechanism
    family = "DoubleGeometric"
    epsilon = 0.25
    sensitivity = 1
    neighbour = "add-remove"

    [invariants]                           # Conditioned, GeneralizedLaplace, GeneralizedGaussian
    kind = "margins"                       # total | group_totals | margins | matrix
    shape = [4, 4]
    margins = [[0], [1]]
    values = [20, 55, 25, 35, 50, 35, 30, 20]   # optional: the published A x, checked

    [query]                                # optional: what the released cells are
    kind = "matrix"                        # cells | totals | matrix
    matrix = [[1, 1, 0], [0, 0, 1]]        # released value i = sum_j Q[i, j] x_j

``[mechanism]`` takes ``family``, optionally ``constructor`` (a documented classmethod such as
``Gaussian.from_sigma``; absent = the class itself), the constructor's parameters by name
(``neighbour`` is always stated) and optionally a ``[mechanism.privacy]`` table (epsilon,
delta, sensitivity, neighbour, norm) that is checked against the rebuilt mechanism's
``privacy``. :data:`FAMILIES` lists every family's parameters. Unknown keys anywhere are
errors (typo protection).

Reading checks everything it can before an analysis starts: the manifest against the schema
(field by field; ``jsonschema`` is not a dependency), the mechanism by constructing it, the
values file (columns present, numeric, finite, whole numbers for a discrete mechanism, one
value per cell of the invariants; a declared ``exposure_column`` present, not a value or
index column, numeric, positive and finite), the mechanism's own ``check_release`` (bounds, table
sizes), declared invariant values against the released ones, and for a conditioned release
that its invariants admit non-negative counts (``Conditioned.check_invariants``). Every
problem raises :class:`ReleaseFileError` (a ``ValueError``) whose message starts with the
manifest's path and the field.

Round trip (:func:`mechanism_to_manifest`, :func:`mechanism_from_manifest`): every mechanism
class of :mod:`dpinfer.mechanisms` is written from its public attributes and rebuilt by its
constructor; the writer rebuilds it at once and refuses (naming what is missing) unless the
rebuilt object has the same public state and the same ``privacy``. Limits, from what the
classes expose: ``Logistic.per_coordinate`` / ``Subbotin.per_coordinate`` and
``Subbotin(..., dimension=d > 1)`` do not keep d publicly (pass ``cells=d``; ``write_release``
passes the number of released values); ``RandomizedResponse`` keeps an exact rational ``p``
privately (a float ``p`` is exposed): a rational p is recovered as the simplest fraction with
denominator <= 10^6 that reproduces the float and the privacy exactly;
``GeneralizedGaussian``'s epsilon is public only through ``privacy`` (refused where its
lattice cannot be enumerated).

Modules, one part of the format each: :mod:`~dpinfer.io.release.fields` (a manifest key: its
kind, checked in Python and stated in the JSON Schema; :class:`ReleaseFileError`),
:mod:`~dpinfer.io.release.codecs` (each mechanism family's codec: its parameters and how it is
rebuilt) and :mod:`~dpinfer.io.release.mechanism` (the ``[mechanism]`` table read and written),
:mod:`~dpinfer.io.release.invariants` and :mod:`~dpinfer.io.release.query` (the
``[invariants]`` and ``[query]`` tables), :mod:`~dpinfer.io.release.schema` (the format as a
JSON Schema), :mod:`~dpinfer.io.release.values` (the values file),
:mod:`~dpinfer.io.release.reading` (:func:`read_release`, :class:`Release`),
:mod:`~dpinfer.io.release.toml` and :mod:`~dpinfer.io.release.writing` (:func:`write_release`).
"""

from dpinfer.io.release.codecs import FAMILIES
from dpinfer.io.release.fields import ReleaseFileError
from dpinfer.io.release.mechanism import mechanism_from_manifest, mechanism_to_manifest
from dpinfer.io.release.reading import Release, read_release
from dpinfer.io.release.schema import FORMAT, SCHEMA_PATH, release_schema, write_schema
from dpinfer.io.release.toml import toml_dumps
from dpinfer.io.release.writing import write_release

__all__ = [
    "FAMILIES",
    "FORMAT",
    "Release",
    "ReleaseFileError",
    "SCHEMA_PATH",
    "mechanism_from_manifest",
    "mechanism_to_manifest",
    "read_release",
    "release_schema",
    "toml_dumps",
    "write_release",
    "write_schema",
]
