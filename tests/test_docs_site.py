"""The docs site (mkdocs.yml, docs/) builds in strict mode, as `make docs` builds it, with every page in the nav.

Strict mode is what makes the site unable to drift: a broken link or anchor, a page missing from docs/ or left out
of the nav, and a docstring's cross-reference to a renamed function each fail the build. The last test proves that
our settings make each of those a failure, on a tiny site of its own, so loosening them cannot pass unnoticed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mkdocs.config import load_config

pytestmark = pytest.mark.xdist_group("docs_site")  # one worker builds the module fixtures once, not each worker
ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "mkdocs.yml"
DOCS = ROOT / "docs"
# Subpackages of gptlab that are not a public API: the CLI only parses and dispatches.
NOT_API = {"cli"}


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` in a fresh process, as `make docs` runs it (mkdocs keeps state per process)."""
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # an advert Material prints, not a warning of ours
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)]
    return subprocess.run(command, cwd=site.parent, env=environment, capture_output=True, text=True, timeout=300)


def problems(result: subprocess.CompletedProcess) -> str:
    """The build's warnings and errors with their continuation lines (mkdocs lists omitted pages on lines below)."""
    lines = (result.stdout + result.stderr).splitlines()
    return "\n".join(line for line in lines if not line.startswith("INFO"))


def nav_pages(items: list) -> list[str]:
    """The page paths of a nav, at any depth (entries are "page.md", {"Title": "page.md"} or {"Section": [...]})."""
    pages = []
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    result = build(CONFIG, site)
    assert result.returncode == 0 and "WARNING" not in result.stdout + result.stderr, (
        f"mkdocs build --strict failed (rc {result.returncode}):\n{problems(result)}")
    return site


def test_docs_site_builds_strictly_without_warnings(site):
    assert (site / "index.html").is_file()
    assert (site / "reference" / "model.html").is_file()


def test_docs_site_api_reference_renders_the_docstrings_of_the_public_api(site):
    page = (site / "reference" / "model.html").read_text(encoding="utf-8")
    assert 'id="gptlab.model.GPT"' in page and 'id="gptlab.model.ModelConfig"' in page
    assert "Single device: no optimizer" in page  # gptlab.model's own docstring, as prose


def test_docs_site_works_offline(site):
    """No Google fonts or CDN styles, and search reads an index inlined as a script, so file:// needs no server."""
    for page in [site / "index.html", site / "reference" / "train.html"]:
        html = page.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html
        assert 'rel="stylesheet" href="http' not in html
    assert (site / "search" / "search_index.js").is_file()
    assert 'href="tokenizer.html"' in (site / "index.html").read_text(encoding="utf-8")  # links open as files


def test_every_docs_page_is_in_the_nav_and_every_nav_page_exists():
    nav = nav_pages(load_config(str(CONFIG))["nav"])
    pages = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    orphans = [page for page in pages if page not in nav]
    assert not orphans, f"pages not in mkdocs.yml's nav (add them where a reader would look): {orphans}"
    missing = [page for page in nav if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages docs/ lacks: {missing}"


def test_every_gptlab_package_has_an_api_reference_page_in_the_nav():
    nav = nav_pages(load_config(str(CONFIG))["nav"])
    packages = sorted(path.parent.name for path in (ROOT / "src" / "gptlab").glob("*/__init__.py"))
    lacking = [name for name in packages if name not in NOT_API and f"reference/{name}.md" not in nav]
    assert not lacking, f"packages without an API page docs/reference/NAME.md in the nav: {lacking}"
    for name in packages:
        if name not in NOT_API:
            assert f"::: gptlab.{name}" in (DOCS / "reference" / f"{name}.md").read_text(encoding="utf-8")


def test_strict_build_fails_on_broken_anchor_orphan_page_and_renamed_docstring_reference(tmp_path):
    """Our mkdocs.yml's settings on a site with one of each mistake: each must be reported and fail the build."""
    settings = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    (tmp_path / "src" / "toy").mkdir(parents=True)
    (tmp_path / "src" / "toy" / "__init__.py").write_text('"""Toy.\n\nUse [toy.renamed][] instead."""\n')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[the API](api.md#no-such-heading)\n")
    (tmp_path / "docs" / "api.md").write_text("# API\n\n::: toy\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Nobody links here\n")
    settings["docs_dir"] = str(tmp_path / "docs")
    settings["nav"] = [{"Home": "index.md"}, {"API": "api.md"}]
    mkdocstrings = next(plugin["mkdocstrings"] for plugin in settings["plugins"] if isinstance(plugin, dict) and "mkdocstrings" in plugin)
    mkdocstrings["handlers"]["python"]["paths"] = [str(tmp_path / "src")]
    config = tmp_path / "mkdocs.yml"
    config.write_text(yaml.safe_dump(settings))
    result = build(config, tmp_path / "site")
    output = problems(result)
    assert result.returncode != 0, output
    assert "no-such-heading" in output and "orphan.md" in output and "toy.renamed" in output, output
