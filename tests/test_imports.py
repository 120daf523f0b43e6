"""The house's dependencies: every module imports alone, and imports run one way.

Layers, lowest first: core, with the store's protocol (`coordinator.store`); producer ids; the
log (and side effects and client telemetry, beside it); groups; transactions; what spans the
domains, and the store's engines, which run the domains' rules and statements on each database;
the doors (the Kafka listener, the admin calls and pages); the app that composes them. A module
may import its own layer and those below it, never one above: what a lower domain needs from
above it declares as an interface, and the app gives it (`coordinator.app.wire_domains`). Each
domain's HTTP routes belong to its domain.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (module prefix, layer); the longest prefix that matches a module names its layer.
LAYERS: dict[str, int] = {
    "coordinator": 0,  # the package itself: its version only
    "coordinator.core": 0,
    "coordinator.store": 0,  # the protocol the domains hold, and SQL both engines share
    "coordinator.store.postgres": 5,
    "coordinator.store.sqlite": 5,
    "coordinator.store.engines": 5,
    "coordinator.producers": 1,
    "coordinator.log": 2,
    "coordinator.effects": 2,
    "coordinator.telemetry": 2,
    "coordinator.groups": 3,
    "coordinator.shares": 3,
    "coordinator.transactions": 4,
    "coordinator.deletion": 5,
    "coordinator.cluster": 5,  # brokers and leadership over the log, for the Kafka door
    "coordinator.models": 5,
    "coordinator.admin.service": 5,
    "coordinator.admin.schemas": 5,
    "coordinator.kafka": 6,
    "coordinator.admin": 6,
    "coordinator.app": 7,
    "coordinator.cli": 8,
    "coordinator.launcher": 8,
    "coordinator.__main__": 8,
}
NAMES = {
    0: "core",
    1: "producer ids",
    2: "the log",
    3: "groups",
    4: "transactions",
    5: "across the domains, the store's engines",
    6: "the doors",
    7: "the app",
    8: "the command line",
}


def _modules(package: str) -> list[str]:
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join(parts))
    return names


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def _imports(module: str) -> set[str]:
    """The coordinator modules `module` imports when it is imported (not those imported inside
    functions, nor under TYPE_CHECKING)."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(source.read_text())
    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    known = set(_modules("coordinator"))
    return {name for name in found if name in known}


def test_imports_run_one_way() -> None:
    upward = [
        f"{module} ({NAMES[layer(module)]}) imports {target} ({NAMES[layer(target)]})"
        for module in _modules("coordinator")
        for target in sorted(_imports(module))
        if layer(target) > layer(module)
    ]
    assert upward == []


def _top_level_names(package: str) -> dict[str, set[str]]:
    """The top-level packages each module of `package` imports, anywhere in it."""
    found: dict[str, set[str]] = {}
    for module in _modules(package):
        path = ROOT / Path(*module.split("."))
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        names: set[str] = set()
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.split(".")[0])
        found[module] = names
    return found


def test_the_server_imports_no_job() -> None:
    """The jobs run on the coordinator; the coordinator never needs one."""
    offending = [m for m, names in _top_level_names("coordinator").items() if "jobs" in names]
    assert offending == []


def test_the_sdk_imports_neither_the_server_nor_a_job() -> None:
    """The client installs without the server (tests/sdk/test_sdk_install.py proves the install):
    the service depends on the SDK's record batch, never the reverse."""
    offending = [
        m for m, names in _top_level_names("sdk").items() if names & {"coordinator", "jobs"}
    ]
    assert offending == []


def test_layer_table_knows_every_package() -> None:
    packages = {
        ".".join(p.relative_to(ROOT).parts) for p in (ROOT / "coordinator").iterdir() if p.is_dir()
    }
    packages = {p for p in packages if not p.endswith("__pycache__") and "static" not in p}
    assert packages <= set(LAYERS)


# Imported before forking, so each child pays only for the project's own modules: what an
# import cycle breaks is the order in which those import each other.
_PRELOAD = [
    "asyncio",
    "fastapi",
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.sqlite",
    "pydantic",
    "pydantic_settings",
    "httpx",
    "starlette",
    "uvicorn",
    "asyncpg",
    "aiosqlite",
    "prometheus_client",
    "orjson",
    "cramjam",
    "crc32c",
    "kio.schema.errors",
    "kio.static.primitive",
    "pyarrow",
    "pyspark.sql",
]

# Each module is imported in a fork of a parent that holds the layers below it (imported after
# that layer's own turn): the layer test above guarantees a module never imports one of a higher
# layer at import time, so an import cycle can only run within one layer, and importing the lower
# layers first changes nothing a module's import would do (it would import them whole anyway);
# it only spares each child the cost of importing them again.
_CHILD = """
import contextlib, importlib, os, sys, traceback
for name in {preload!r}:
    importlib.import_module(name)
failed = []
for batch in {batches!r}:
    for module in batch:
        pid = os.fork()
        if pid == 0:
            try:
                importlib.import_module(module)
            except BaseException:
                sys.stderr.write(module + ": " + traceback.format_exc().splitlines()[-1] + "\\n")
                os._exit(1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            failed.append(module)
    for module in batch:
        with contextlib.suppress(BaseException):
            importlib.import_module(module)
print(len(failed))
"""


@pytest.mark.parametrize("package", ["coordinator", "sdk"])
def test_every_module_imports_alone(package: str) -> None:
    """Each module imported first, in an interpreter where no other module of its layer or
    above is (`_CHILD`)."""
    modules = [m for m in _modules(package) if not m.endswith("__main__")]
    if package == "coordinator":
        batches = [[m for m in modules if layer(m) == n] for n in sorted(NAMES)]
    else:
        batches = [modules]
    assert sum(map(len, batches)) == len(modules)
    script = textwrap.dedent(_CHILD).format(preload=_PRELOAD, batches=batches)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout.strip(), done.stderr) == ("0", "")
