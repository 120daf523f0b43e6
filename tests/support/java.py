"""Kafka's Java client and tools, as the tests run them: the jars `mvn package` resolved."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def run_tools(commands: Sequence[Sequence[str]], timeout: float = 300) -> list[dict[str, Any]]:
    """Kafka's command-line tools, run in order in one JVM by `Tools.java` (each a list: the
    tool's name, then its arguments): for each, `{"command", "code", "out", "err"}`."""
    done = subprocess.run(
        java_command(main="coordinator.clients.Tools"),
        input="".join("\t".join(c) + "\n" for c in commands),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(commands), done.stdout + done.stderr[-4000:]
    return lines


def tool_ok(outcome: dict[str, Any]) -> str:
    """What a tool printed, once it exited 0."""
    assert outcome["code"] == 0, outcome["out"] + outcome["err"][-3000:]
    return str(outcome["out"])
