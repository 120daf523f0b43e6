"""A package's public names, imported on first use (PEP 562's module `__getattr__`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def public(homes: Mapping[str, tuple[str, ...]], *own: str) -> list[str]:
    """The names of `homes` ({module: names}, as `exports` takes them) and the package's `own`,
    for `__all__`, in isort's order: constants, then classes, then functions."""
    names = [*(name for names in homes.values() for name in names), *own]
    return sorted(names, key=lambda name: (not name.isupper(), not name[0].isupper(), name))


def exports(
    package: str,
    homes: Mapping[str, tuple[str, ...]],
    namespace: dict[str, Any],
    *,
    home_of_classes: bool = False,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public names live in the modules of
    `homes` ({module: names}). A name is imported on first use and kept in the package's
    `namespace`. With `home_of_classes`, a class defined in a private module of the package
    reports the package as its home (`sdk.Producer`, not `sdk._producer.Producer`), as httpx's
    do."""
    where = {name: module for module, names in homes.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
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
