"""The order in which the test processes take the test modules: the longest first.

`make test` runs pytest in a few processes, a module to a process at a time (pytest-xdist's
``--dist loadfile``), handing out the modules in the order they were collected
(``--no-loadscope-reorder``: by default xdist orders them by how many tests they hold, which
says little of how long they take). A module of minutes handed out last keeps the other
processes idle while it runs; handed out first, the short ones fill in around it (the longest
first is within a third of the best order). Each module's seconds in a recent run are in
``durations.json`` beside this file, written by ``make durations``
(``--record-module-times``); a module not in it (a new one) goes first, its time unknown.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")

_times: defaultdict[str, float] = defaultdict(float)


def module_of(nodeid: str) -> str:
    """The module a test's id names, as ``durations.json`` keys it (``test_x.py``)."""
    return Path(nodeid.split("::", 1)[0]).name


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-module-times", action="store_true",
                     help=f"write each module's seconds (set-up, calls and teardown) to {DURATIONS.name}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The items of the longest modules first, each module's in its own order."""
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    collected = {module: index for index, module in enumerate(dict.fromkeys(module_of(i.nodeid) for i in items))}
    items.sort(key=lambda item: (-known.get(module_of(item.nodeid), float("inf")), collected[module_of(item.nodeid)]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _times[module_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``--record-module-times``, on the process that ran or gathered every test: the
    modules' seconds, kept with the ones this run did not run (another marker's)."""
    if not session.config.getoption("--record-module-times") or hasattr(session.config, "workerinput"):
        return
    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    known |= {module: round(seconds, 1) for module, seconds in _times.items()}
    DURATIONS.write_text(json.dumps(dict(sorted(known.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
