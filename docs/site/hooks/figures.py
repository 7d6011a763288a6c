"""MkDocs hook: serve the README's figures (docs/*.png, outside docs_dir) as img/<name>.png,
so the site and the README share one copy of each."""

from pathlib import Path

from mkdocs.structure.files import File

FIGURES = Path(__file__).resolve().parents[2]  # docs/


def on_files(files, config):
    for png in sorted(FIGURES.glob("*.png")):
        files.append(File.generated(config, f"img/{png.name}", abs_src_path=str(png)))
    return files
