"""The house's standing rules, read off the code: the store's dialects stay behind its seam, the
Kafka door uses none of the HTTP door's bodies, and no product file grows past one sitting."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("coordinator", "sdk", "jobs")
MAX_LINES = 600


def _files(*packages: str) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py"))


def test_no_module_outside_the_store_branches_on_its_dialect() -> None:
    """A domain asks the store (`coordinator.store.Store`); only the store's engines know which
    database they speak to."""
    dialect = re.compile(r"is_sqlite|dialect\.name|postgresql\.insert|sqlite\.insert")
    store = ROOT / "coordinator" / "store"
    branching = [
        str(path.relative_to(ROOT))
        for path in _files("coordinator")
        if store not in path.parents and dialect.search(path.read_text())
    ]
    assert branching == []


def test_the_kafka_door_imports_none_of_the_http_doors_bodies() -> None:
    """The doors translate to and from the domains' plain inputs; the HTTP door's pydantic
    models (`*.schemas`) are its own."""
    imported = []
    for path in _files("coordinator/kafka"):
        for node in ast.walk(ast.parse(path.read_text())):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            if module and (module.endswith(".schemas") or module == "pydantic"):
                imported.append(f"{path.relative_to(ROOT)}: {module}")
    assert imported == []


def test_no_product_file_is_over_600_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for path in _files(*PRODUCT)
        if (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
