"""Settings declared once: the environment, a worker's environment, the operations table and
Bicep all come from the declarations, and `bagpipe up` hands a user's settings to its planner
and its workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bagpipe.client import STATE_FILE, TOKEN_FILE, Api
from pipeline.settings import Settings, declared_fields, deployed_settings, env_name, markdown_table
from tests.conftest import small_request, wait_for

REPO = Path(__file__).resolve().parents[1]


def _other(value: Any, choices: tuple[str, ...]) -> Any:
    """A valid value unlike ``value``."""
    if choices:
        return next(c for c in choices if c != value)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 3 + 7
    return f"{value}x" if value else "set"


def test_every_setting_goes_through_a_workers_environment_and_back() -> None:
    changed = {f.name: _other(f.default, f.metadata["choices"]) for f in declared_fields()}
    changed["storage_account"] = ""  # one storage: the connection string
    changed["entra_issuer"], changed["entra_client_id"] = "https://issuer.example", "client"
    changed |= {f.name: f"secret-{f.name}-value" for f in declared_fields() if f.metadata["secret"]}
    settings = Settings(**changed)
    env = settings.to_env()
    assert Settings.from_env(env) == settings
    # every declared setting is in it, by its own name, and nothing else
    assert set(env) == {f.metadata["env"] for f in declared_fields()} - {env_name("storage_account")}
    # a secret never shows in a repr (and so in no log line that prints settings)
    shown = repr(settings)
    assert "secret-" not in shown and "client" in shown


def test_unset_or_empty_keeps_the_default_and_none_empties_what_has_a_default() -> None:
    base = {env_name("storage_connection"): "UseDevelopmentStorage=true"}
    defaults = Settings.from_env(base)
    assert defaults == Settings(storage_connection="UseDevelopmentStorage=true")
    assert Settings.from_env(base | {env_name("window"): "", env_name("catalog"): ""}) == defaults
    assert Settings.from_env(base | {env_name("stac_sas_url"): "none"}).stac_sas_url == ""
    assert defaults.with_(stac_sas_url="").to_env()[env_name("stac_sas_url")] == "none"


@pytest.mark.parametrize(("name", "raw", "says"), [
    ("window", "many", "is not a whole number"),
    ("kill_factor", "0.5", "below its minimum 1.0"),
    ("lease_seconds", "2", "below its minimum 3"),
    ("kill_floor_s", "nan", "below its minimum"),
    ("catalog", "ftp", "one of stac, cmr"),
    ("log_format", "xml", "one of text, json"),
])
def test_a_bad_setting_is_refused_by_its_name(name: str, raw: str, says: str) -> None:
    env = {env_name("storage_connection"): "UseDevelopmentStorage=true", env_name(name): raw}
    with pytest.raises(ValueError, match=re.escape(env_name(name))) as refused:
        Settings.from_env(env)
    assert says in str(refused.value)


def test_the_operations_table_and_bicep_are_the_declarations() -> None:
    doc = (REPO / "docs/operations.md").read_text()
    table = doc.split("<!-- settings:begin -->\n")[1].split("<!-- settings:end -->")[0]
    assert table == markdown_table(), "run: python -m pipeline.settings, into docs/operations.md"
    for declared in declared_fields():
        assert f"`{declared.metadata['env']}`" in table
    deployed = json.loads((REPO / "infra/bicep/names.json").read_text())["settings"]
    assert deployed == deployed_settings()
    local = {f.metadata["env"] for f in declared_fields() if f.metadata["local"]}
    assert env_name("storage_connection") in local and not local & set(deployed.values())


def test_bagpipe_up_hands_the_environments_settings_to_its_planner_and_workers(tmp_path: Path) -> None:
    """Run as a user would: settings in the shell's environment, then `bagpipe up`. The planner
    must make tile tasks of the stage the environment names, the workers must import the
    modules it names and give up after the one attempt it allows."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BAGPIPE_", "BagpipeStorage"))} | {
        env_name("tile_stage"): "explode_one",  # registered only by tests/stages_for_tests.py
        env_name("stage_modules"): "tests.stages_for_tests",
        env_name("max_attempts"): "1",  # the default (3) would try the failing task twice
        env_name("window"): "3",
    }
    up = subprocess.Popen([sys.executable, "-m", "bagpipe.cli", "up", "--home", str(home), "--workers", "1"],
                          env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (home / STATE_FILE).exists() or up.poll() is not None, 90, "the stack to start")
        assert up.poll() is None, up.stdout.read() if up.stdout else ""
        api = Api(json.loads((home / STATE_FILE).read_text())["api"], (home / TOKEN_FILE).read_text())
        job = api.submit(small_request().model_dump(mode="json", exclude_none=True))["job"]
        wait_for(lambda: api.status(job)["state"] in ("SUCCEEDED", "FAILED"), 120, "the job to finish")
        status = api.get(f"/api/jobs/{job}/view")
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(90)
    assert status["state"] == "FAILED" and status["counts"]["DEAD"] == 1 and status["counts"]["SUCCEEDED"] == 7
    (failed,) = status["failed_attempts"]  # one attempt, as the environment allows
    assert failed["stage"] == "explode_one" and failed["attempt"] == 1 and "divided by zero" in failed["error"]


def test_the_tile_stage_setting_defaults_to_the_stage_tile_tasks_are_planned_for() -> None:
    """The planner searches granules for the tasks of ``modis.TILE_STAGE``; a deployment
    that sets nothing runs exactly those (the setting cannot import the MODIS stages)."""
    from pipeline import modis

    assert Settings(storage_connection="UseDevelopmentStorage=true").tile_stage == modis.TILE_STAGE
