"""The docs a user reads: the site builds strict (a broken link, a missing anchor or a page left
out of the nav fails it), the README's links all land in the repository, and nothing links
outside it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_docs_build_strict(tmp_path: Path) -> None:
    config, site = str(DOCS / "mkdocs.yml"), str(tmp_path / "site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", site],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "http-api" / "index.html").exists()


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return [link for link in LINK.findall(text) if not link.startswith(("http://", "https://"))]


def test_the_readme_links_land_in_the_repository() -> None:
    broken = [
        link
        for link in _links(ROOT / "README.md")
        if not (ROOT / link.split("#")[0]).resolve().is_relative_to(ROOT)
        or not (ROOT / link.split("#")[0]).exists()
    ]
    assert broken == []


def test_nothing_links_outside_the_repository() -> None:
    outside = [
        f"{page.relative_to(ROOT)}: {link}"
        for page in [ROOT / "README.md", *sorted((DOCS / "pages").glob("*.md"))]
        for link in _links(page)
        if not (page.parent / link.split("#")[0]).resolve().is_relative_to(ROOT)
    ]
    mentions = [
        str(page.relative_to(ROOT))
        for page in [ROOT / "README.md", *sorted((DOCS / "pages").glob("*.md"))]
        if "../shared" in page.read_text()
    ]
    assert (outside, mentions) == ([], [])


def _api_names() -> dict[int, str]:
    """Every API key Kafka's schemas (kio's) define, with its name."""
    import importlib
    import pkgutil

    import kio.schema

    names: dict[int, str] = {}
    for found in pkgutil.iter_modules(kio.schema.__path__):
        if not found.ispkg:
            continue
        package = importlib.import_module(f"kio.schema.{found.name}")
        for version in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
            try:
                module = importlib.import_module(f"kio.schema.{found.name}.{version.name}.request")
            except ImportError:
                continue
            for name, entity in vars(module).items():
                kind = getattr(getattr(entity, "__type__", None), "name", None)
                if name.endswith("Request") and kind == "request":
                    names[int(entity.__api_key__)] = name.removesuffix("Request")
            break
    return names


@pytest.mark.parametrize(
    ("page", "heading", "door"),
    [
        (DOCS / "pages" / "kafka.md", "## The API keys not served", "the listener"),
        (ROOT / "README.md", "## Kafka's API keys not served", "the Kafka door"),
    ],
    ids=["kafka.md", "README"],
)
def test_the_docs_name_every_api_key_not_served(page: Path, heading: str, door: str) -> None:
    from coordinator.kafka.wire import SUPPORTED

    text = page.read_text()
    section = text[text.index(heading) :]
    section = section[: section.index("\n## ", 1)]
    names = _api_names()
    assert f"define {len(names)} API keys; {door} serves {len(SUPPORTED)}" in section
    missing = [n for key, n in sorted(names.items()) if key not in SUPPORTED and n not in section]
    assert missing == []
