"""Kafka's Java client and tools, as the tests run them: the jars `mvn package` resolved."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

JAVA = Path(__file__).resolve().parents[1] / "clients" / "java"


def java_command(*args: str, main: str = "coordinator.clients.Scenarios") -> list[str]:
    """A JVM running `main` (the scenarios, or Kafka's tools) on the jars `mvn package` left in
    target/."""
    java = shutil.which("java")
    classes, lib = JAVA / "target" / "classes", JAVA / "target" / "lib"
    if java is None or not (classes / "coordinator" / "clients" / "Scenarios.class").exists():
        pytest.fail(
            "the Java client is not built: run the README's test command "
            "(mvn -f tests/clients/pom.xml package, with Java 17 and Maven)"
        )
    return [
        java,
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        f"{classes}:{lib}/*",
        main,
        *args,
    ]
