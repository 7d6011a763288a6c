"""The documentation site (issue 14, part 5): every ```python block of docs/site/**/*.md runs,
the site builds with ``mkdocs build --strict``, every mechanism dpinfer exports has a section,
and every number a page quotes in its prose appears in that page's sources (NUMBER_SOURCES).

Blocks of one page run in order in one namespace (later blocks use earlier names), in a
temporary working directory. A block is skipped only when the line before its fence is
exactly ``<!-- no-run -->``; such markers must stay few (MAX_NO_RUN).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "site"
PAGES = sorted(p for p in DOCS.rglob("*.md"))
NO_RUN = "<!-- no-run -->"
MAX_NO_RUN = 5
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")


def code_blocks(page: Path) -> list[dict]:
    """Every fenced block of ``page``: its language, first line number, source (dedented) and
    whether it carries the no-run marker."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, ticks, info = opening["indent"], opening["ticks"], opening["info"].lower()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: unclosed code fence")
        previous = lines[i - 1].strip() if i > 0 else ""
        blocks.append({"language": info, "line": i + 1, "source": "\n".join(body) + "\n",
                       "no_run": previous == NO_RUN})
        i = j + 1
    return blocks


def python_blocks(page: Path) -> list[dict]:
    return [b for b in code_blocks(page) if b["language"] in ("python", "py", "python3")]


def page_id(page: Path) -> str:
    return str(page.relative_to(DOCS))


RUN_PAGES = [p for p in PAGES if any(not b["no_run"] for b in python_blocks(p))]


def test_the_site_has_its_pages():
    names = {page_id(p) for p in PAGES}
    for required in ("index.md", "mechanisms/index.md", "inference.md", "gallery.md", "cli.md",
                     "release-files.md", "validation.md"):
        assert required in names, required
    examples = sum(len(python_blocks(p)) for p in PAGES)
    assert examples >= 20, f"only {examples} python examples"


def test_no_run_markers_are_few_and_each_precedes_a_python_block():
    markers, marked = 0, 0
    for page in PAGES:
        text = page.read_text()
        markers += text.count(NO_RUN)
        marked += sum(b["no_run"] for b in python_blocks(page))
    assert markers == marked, "a <!-- no-run --> marker must sit on the line just before a ```python fence"
    assert markers < MAX_NO_RUN, f"{markers} examples are not run; keep them under {MAX_NO_RUN}"


@pytest.mark.parametrize("page", RUN_PAGES, ids=[page_id(p) for p in RUN_PAGES])
def test_examples_run(page, tmp_path, monkeypatch):
    """The page's python blocks, in order, in one namespace, in a temporary directory."""
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__docs__"}
    start = time.perf_counter()
    for block in python_blocks(page):
        if block["no_run"]:
            continue
        where = f"{page.relative_to(ROOT)}:{block['line']}"
        code = compile(block["source"], where, "exec")
        try:
            exec(code, namespace)
        except Exception as err:
            raise AssertionError(f"the example at {where} failed: {type(err).__name__}: {err}") from err
    print(f"{page_id(page)}: {time.perf_counter() - start:.1f} s")


def test_every_exported_mechanism_has_a_section():
    """A heading naming (in backticks) each Mechanism class that dpinfer exports, and Invariants."""
    import dpinfer as dp

    exported = [name for name in dp.__all__
                if inspect.isclass(getattr(dp, name)) and issubclass(getattr(dp, name), dp.Mechanism)
                and getattr(dp, name) is not dp.Mechanism]
    headings = "\n".join(line for p in (DOCS / "mechanisms").glob("*.md")
                         for line in p.read_text().splitlines() if line.startswith("#"))
    missing = [name for name in exported + ["Invariants"] if f"`{name}`" not in headings]
    assert not missing, f"no section for {missing}"


def test_every_page_is_in_the_nav():
    """mkdocs.yml's nav lists every page (and only pages that exist)."""
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:"):]
    listed = set(re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w/.-]+\.md)\s*$", nav, flags=re.M))
    assert listed == {page_id(p) for p in PAGES}


def _numbers(text: str) -> set[str]:
    """Numbers with a decimal point, a thousands separator or at least 3 digits, outside code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    found = re.findall(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?:\.\d+)?|(?<![\w.])\d+\.\d+|(?<![\w.,])\d{3,}(?![\d,])", text)
    return set(found)


# Where each page's quoted numbers must come from; other pages (but references.md, whose
# identifiers come from the seed papers) against DEFAULT_SOURCES. The reference moved from the
# README into this site, so a published value the site quotes (an analytic sigma, a seed
# paper's figure that dpinfer reproduces) is found in the test that asserts it: tests/*.py.
DEFAULT_SOURCES = ["README.md", "benchmarks/README.md", "models/*/README.md", "dpinfer/**/*.py",
                   "tests/*.py"]
NUMBER_SOURCES = {
    "validation.md": ["README.md", "benchmarks/README.md", "validation/results/*.md", "tests/*.py"],
    "gallery.md": ["README.md", "models/*/README.md", "benchmarks/README.md"],
    # dpinfer fit's rules and dpinfer compare's presets are stated in their modules
    "cli.md": ["README.md", "benchmarks/README.md", "dpinfer/io/*.py", "dpinfer/utility/*.py"],
    # the exact posterior of B1 (examples/privatised_mean.py) and the curator's question's
    # zCDP target (examples/curator_question.py) are stated in the examples' docstrings; the
    # law of the sum against data augmentation is validation/results/record_sums_vs_augmentation*.md,
    # against importance sampling validation/results/record_sums_importance*.md, its calibration
    # validation/results/sbc_record_sums.md
    "continuous.md": DEFAULT_SOURCES + ["examples/*.py", "validation/results/record_sums_vs_augmentation*.md",
                                        "validation/results/record_sums_importance*.md",
                                        "validation/results/sbc_record_sums.md"],
    "compare.md": DEFAULT_SOURCES + ["examples/*.py"],
    # the side by side of the census files is validation/results/census_nmf.md
    "census-nmf.md": DEFAULT_SOURCES + ["validation/results/*.md"],
}
NUMBER_PAGES = [p for p in PAGES if page_id(p) != "references.md"]


@pytest.mark.parametrize("page", NUMBER_PAGES, ids=[page_id(p) for p in NUMBER_PAGES])
def test_quoted_numbers_come_from_their_sources(page):
    """Every number quoted in a page's prose appears in one of its source files (no invented or
    stale figures)."""
    sources = NUMBER_SOURCES.get(page_id(page), DEFAULT_SOURCES)
    text = "\n".join(f.read_text() for pattern in sources for f in sorted(ROOT.glob(pattern)))
    missing = sorted(n for n in _numbers(page.read_text()) if n not in text)
    assert not missing, f"{page_id(page)} quotes numbers not found in {sources}: {missing}"


def test_mkdocs_build_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # material's end-of-life banner
    assert result.returncode == 0, result.stderr[-4000:]
    for page in PAGES:
        built = page_id(page).removesuffix(".md")
        built = built.removesuffix("index") if built.endswith("index") else built + "/"
        assert (tmp_path / "site" / built / "index.html").is_file(), built
    assert (tmp_path / "site" / "img" / "demo-intervals.png").is_file()
