"""The Makefile sets up for each command what it needs, as if from a fresh clone (``make -n
-B``: every command it would run, nothing run): ``make demo`` the runtime alone, ``make
test`` the test toolchain as well. ``make demo`` installed Go, Toxiproxy, the STAC
validators and the test tools to run one job."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_ONLY = ("requirements-dev.txt", "toxiproxy", "requirements-stac.txt", "chromium", "max_composite.c")


def commands(target: str) -> str:
    """What ``make target`` would run from nothing."""
    return subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=True,
                          timeout=30).stdout


def test_the_demo_sets_up_the_runtime_and_the_tests_the_rest() -> None:
    demo = commands("demo")
    assert "-r requirements.txt" in demo and "npm install" in demo and "bagpipe demo" in demo, demo
    assert [tool for tool in TEST_ONLY if tool in demo] == [], demo
    test = commands("test")
    assert [tool for tool in TEST_ONLY if tool not in test] == [], test
    assert "-r requirements.txt" in test and "pytest" in test, test
