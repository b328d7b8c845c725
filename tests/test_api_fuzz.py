"""The API against its own OpenAPI document, fuzzed by Schemathesis: for requests that follow
the schema and requests that break it, no 5xx, every 4xx says what was wrong, every response
matches the documented schema."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import signed

EXAMPLES = 25  # per operation and generation mode


def nothing_to_break(operation: Any) -> bool:
    """Whether no request to ``operation`` breaks its schema: its only parameters are path
    segments any text is (an openEO collection's or job's id)."""
    for parameter in operation.iter_parameters():
        schema = parameter.definition.get("schema", {})
        if parameter.definition.get("in") != "path" or schema.get("type") != "string" or set(schema) - {"type",
                                                                                                    "title"}:
            return False
    return True


@pytest.mark.timeout(900)  # 70 s on a quiet machine; past pytest-timeout's 300 s beside other work at load 30
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_api_holds_against_generated_requests(
    clients: Clients, settings: Settings, admin_token: str, mode: schemathesis.GenerationMode
) -> None:
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", create_app(settings.with_(requests_per_minute=0)))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20  # every route of the API, the portal's, accounts' and uploads''

    for operation in operations:
        @given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None,
                             suppress_health_check=list(HealthCheck))
        def holds(case: schemathesis.Case) -> None:
            response = case.call(headers=signed(admin_token))
            where = f"{case.method} {case.formatted_path} → {response.status_code} {response.text[:300]}"
            assert response.status_code < 500, where
            if response.status_code >= 400 and case.path.startswith("/openeo/"):
                body = response.json()  # openEO's error object, as its specification has it
                assert body.get("code") and body.get("message"), f"no message: {where}"
            elif response.status_code >= 400:
                assert response.json().get("detail"), f"no message: {where}"
            # a request can follow the schema and still be refused: products from the catalog,
            # start before end, a bbox or tiles but not both are rules beyond JSON Schema
            # and an invalid one may be refused with 413 (too large), a status Schemathesis's
            # rejection check does not list: the asserts above hold every 4xx to a message
            case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance,
                                                              schemathesis.checks.negative_data_rejection])

        try:
            holds()
        except Unsatisfiable:  # nothing to break in an operation with no parameter at all
            assert mode is schemathesis.GenerationMode.NEGATIVE and nothing_to_break(operation), operation.path


# CRSs a grid may name: good ones, and kinds no tile can be made in (tests/test_grid_crs.py)
CRS_CASES = ["EPSG:4326", "EPSG:32612", "EPSG:3413", "ESRI:54009", "+proj=ortho +lat_0=40 +lon_0=-100",
             "EPSG:4978", "+proj=geocent", "IAU_2015:30100", "IAU_2015:49900", 'LOCAL_CS["x",UNIT["metre",1]]',
             "EPSG:4326+5773", "EPSG:4979", "EPSG:5773", "+proj=ob_tran +o_proj=longlat +o_lon_p=40 +o_lat_p=50",
             "+proj=merc +k=1e-9", "+proj=eqearth +R=1737400"]


def test_no_grid_crs_makes_the_api_fail(clients: Clients, settings: Settings, admin_token: str) -> None:
    """Whatever the grid's CRS, size and box, the submission and the estimate answer below
    500, and a CRS no tile can be made in is a 422 naming grid.crs."""
    api = TestClient(create_app(settings.with_(requests_per_minute=0, max_tasks=50_000)), headers=signed(admin_token))

    @given(crs=st.one_of(st.sampled_from(CRS_CASES), st.text(max_size=64),
                         st.from_regex(r"[A-Z]{2,8}:[0-9]{1,6}", fullmatch=True)),
           size=st.one_of(st.none(), st.floats(min_value=1e-3, max_value=1e8)),
           box=st.sampled_from([[-107.5, 35.0, -106.0, 36.5], [170.0, -20.0, -170.0, -10.0], [-180, -90, 180, 90]]),
           path=st.sampled_from(["/api/jobs", "/api/estimate"]))
    @hypothesis_settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def holds(crs: str, size: float | None, box: list[float], path: str) -> None:
        grid = {"crs": crs} | ({"tile_size": size, "resolution": size / 100} if size else {})
        response = api.post(path, json={"region": {"bbox": box}, "start": "2022-01-01", "end": "2022-01-08",
                                        "products": ["MOD10A2"], "grid": grid})
        assert response.status_code < 500, (crs, size, box, response.text)
        if response.status_code >= 400:
            assert response.json().get("detail"), response.text
        if crs in CRS_CASES[5:]:
            assert response.status_code == 422 and response.json()["field"] == "grid.crs", (crs, response.text)

    holds()
