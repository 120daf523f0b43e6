"""A package's public names, imported on first use (PEP 562's module `__getattr__`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(
    package: str,
    homes: Mapping[str, tuple[str, ...]],
    namespace: dict[str, Any],
    *,
    home_of_classes: bool = False,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public names live in the modules of
    `homes` ({module: names}, a name `"x as y"` exporting the module's `x` as `y`). A name is
    imported on first use and kept in the package's `namespace`. With `home_of_classes`, a class
    defined in a private module of the package reports the package as its home (`sdk.Producer`,
    not `sdk._producer.Producer`), as httpx's do."""
    where: dict[str, tuple[str, str]] = {}
    for module, names in homes.items():
        for entry in names:
            source, _, public = entry.partition(" as ")
            where[public or source] = (module, source)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, source = where[name]
        value = getattr(importlib.import_module(module), source)
        if (
            home_of_classes
            and isinstance(value, type)
            and value.__module__.startswith(f"{package}._")
        ):
            value.__module__ = package
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
