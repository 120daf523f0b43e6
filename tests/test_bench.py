"""The benchmarks are run by hand, not by the suite; this keeps them runnable: each script
imports (its helpers and the project's modules by the names it uses) and answers `--help`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))

# One interpreter runs every script's --help in turn (imports are most of the cost).
_DRIVER = """
import runpy, sys
failed = []
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (0, None):
            failed.append(f"{script}: exit {exc.code}")
    except BaseException as exc:
        failed.append(f"{script}: {exc!r}")
    else:
        failed.append(f"{script}: --help did not exit")
print("\\n".join(failed), file=sys.stderr)
sys.exit(1 if failed else 0)
"""


def test_every_benchmark_imports_and_answers_help() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, *(str(BENCH / s) for s in SCRIPTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=BENCH,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("usage:") == len(SCRIPTS), done.stdout[-3000:]
