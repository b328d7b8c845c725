"""The openEO test suite (``openeo-test-suite`` 0.2.2, from ``.tools/openeo``) against the local
stack: its collections module (WP2) and its process metadata module (WP3) over HTTP, its
individual process tests (WP5) of every process bagpipe lists through bagpipe's own runner in
process (``tests/openeo_suite.py``), and its API compliance module (WP4) with basic
authentication. Each module's counts, and why tests were skipped, are printed (``-s``) as
docs/standards.md reports them; each test asserts its module fails only what is listed here,
each with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack
from pipeline.modis.products import CATALOG
from tests import openeo_suite

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools" / "openeo"
PYTHON = TOOLS / "bin" / "python"
# what the compliance module fails, and why: what bagpipe does not offer — user-defined processes
# (the process_graphs endpoints) and synchronous processing (POST /result: a job's tasks are its
# way) —, OpenID Connect where no Entra ID is configured (the local stack: the endpoint is not
# there, as the API has it with no provider), and the API's document itself: its schema of a
# process's parameter and return types is a oneOf of three schemas that any type matches
# ("valid under each of"), so no back end serving the official specifications passes GET /processes
COMPLIANCE_FAILS = {"test_GET_process_graphs", "test_GET_process_graphs_process_id",
                    "test_PUT_process_graphs_process_id", "test_DELETE_process_graphs_process_id", "test_POST_result",
                    "test_GET_credentials_oidc", "test_GET_processes"}
# the individual process tests fail only where they reference an asset the openEO processes
# project does not have (mask's tests/assets/xyb-minimal-float.json5, at 2.0.0-rc.2 as today)
MISSING_ASSET = "Failed to load external reference assets/xyb-minimal-float.json5"


@pytest.fixture(scope="module")
def stack(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    if not (TOOLS / ".installed").exists():
        pytest.fail(f"the openEO test suite is not installed in {TOOLS}: `make setup` installs it")
    tmp = tmp_path_factory.mktemp("suite")
    with LocalStack(tmp / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=f"oes{tmp.name[-6:].replace('_', '')}") as running:
        yield running


def run(stack: LocalStack, where: Path, module: str, *args: str) -> tuple[Counter[str], dict[str, str]]:
    """One module of the suite; its counts (passed, failed, skipped, errors) and each failed
    test's message."""
    folder = openeo_suite.lay_out(where)
    report = where / f"{module.replace('/', '-')}.xml"
    suite = next((TOOLS / "lib").glob("python3*/site-packages/openeo_test_suite"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENEO_AUTH_METHOD": "basic",
           "OPENEO_AUTH_BASIC_USERNAME": "admin", "OPENEO_AUTH_BASIC_PASSWORD": stack.token}
    # (the compliance module joins its base URL and paths with no slash between, and sometimes one)
    url = f"{stack.api_url}/openeo/1.2" + ("/" if module == "general" else "")
    ran = subprocess.run([str(PYTHON), "-m", "pytest", str(suite / "tests" / module), "-p",
                          "openeo_test_suite.lib.pytest_plugin", "-p", "tests.openeo_suite", "-p", "no:cacheprovider",
                          f"--openeo-backend-url={url}", f"--junitxml={report}", "-q", "-W", "ignore",
                          "--rootdir", str(folder), *args],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=3000)
    if not report.exists():
        raise AssertionError(f"the suite did not run:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}")
    counts: Counter[str] = Counter()
    failed: dict[str, str] = {}
    skipped: Counter[str] = Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        found = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        counts["passed" if found is None else found.tag] += 1
        if found is not None and found.tag == "skipped":
            skipped[found.get("message", "")[:160]] += 1
        elif found is not None:
            failed[case.get("name", "")] = found.get("message", "")[:300]
    print(f"\nopenEO suite {module}: {dict(counts)}", file=sys.stderr)
    for why, times in skipped.most_common():
        print(f"  skipped {times}: {why}", file=sys.stderr)
    return counts, failed


def test_the_collections_module_finds_every_collection_valid(stack: LocalStack, tmp_path: Path) -> None:
    counts, failed = run(stack, tmp_path, "collections")
    assert not failed and counts["passed"] == 1 + 2 * len(CATALOG), (counts, failed)  # the list, two checks each


def test_every_listed_process_passes_the_process_metadata_module(stack: LocalStack, tmp_path: Path) -> None:
    counts, failed = run(stack, tmp_path, "processes/metadata")
    listed = len(list((ROOT / "pipeline" / "web" / "openeo" / "specs").glob("*.json")))
    assert not failed and counts["passed"] == 2 * listed, (counts, failed)  # functional and descriptive, each


def test_every_listed_process_passes_its_individual_tests_through_bagpipes_runner(
        stack: LocalStack, tmp_path: Path) -> None:
    counts, failed = run(stack, tmp_path, "processes/processing", "--runner", "bagpipe")
    assert all(MISSING_ASSET in why for why in failed.values()) and len(failed) <= 1, failed
    assert counts["passed"] >= 190, counts


def test_the_api_compliance_module_fails_only_what_is_not_offered_and_its_documents_own(
        stack: LocalStack, tmp_path: Path) -> None:
    counts, failed = run(stack, tmp_path, "general")
    assert set(failed) == COMPLIANCE_FAILS, {k: v for k, v in failed.items() if k not in COMPLIANCE_FAILS}
    assert counts["passed"] == 35, counts
