"""One names module: the deployment's names.json is what the code says, and namespaced
names stay valid Azure names."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.deployment import deployment_names
from pipeline.storage import names

REPO = Path(__file__).resolve().parents[1]


def test_bicep_names_are_the_codes() -> None:
    written = json.loads((REPO / "infra/bicep/names.json").read_text())
    assert written == deployment_names(), "run: python -m pipeline.deployment > infra/bicep/names.json"
    bicep = (REPO / "infra/bicep/main.bicep").read_text()
    assert "loadJsonContent('names.json')" in bicep
    for name in ("'plan'", "'tasks'", "'jobs'", "'products'"):
        assert name not in bicep, f"{name} is retyped in Bicep instead of loaded"


@pytest.mark.parametrize("namespace", ["", "t0123456789", "abc"])
def test_every_name_is_a_valid_azure_name(namespace: str) -> None:
    deployed = names.StorageNames(namespace)
    for table in names.TABLES:
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]{2,62}", deployed.table(table))
    for queue in deployed.all_queues(16):
        assert re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", queue), queue
    for container in names.CONTAINERS:
        assert re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", deployed.container(container))


def test_a_bad_namespace_is_refused() -> None:
    for bad in ("UPPER", "1abc", "a-b", "x" * 17):
        with pytest.raises(ValueError):
            names.StorageNames(bad)
