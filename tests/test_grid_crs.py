"""A target grid's CRS: every one the API accepts can be planned, warped and drawn, and the
others are refused at submission and at estimate with a 422 naming ``grid.crs``, at once
(geocentric, engineering, vertical, compound and 3-D CRSs, other bodies than the Earth, names
to search for, what GDAL cannot use)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import date
from typing import Any

import numpy as np
import pytest
import rasterio
from fastapi.testclient import TestClient
from PIL import Image

from bagpipe import modis_world as world
from pipeline.modis import overview
from pipeline.modis.products import CATALOG
from pipeline.modis.reprojection import Source, Target, warp
from pipeline.requests.expansion import expand
from pipeline.requests.request import Grid, JobRequest
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import decided_within, signed
from tests.test_api import GOOD, changed, nothing_written

SNOW = world.REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"
INSIDE_H09V05 = [-107.5, 35.0, -106.0, 36.5]  # the real granule's tile

ACCEPTED = [
    "EPSG:4326", "OGC:CRS84", "EPSG:32612", "EPSG:3413", "EPSG:3857", "ESRI:54009", "EPSG:2263",
    "EPSG:4807",  # lon/lat in grads from the Paris meridian
    "+proj=ortho +lat_0=40 +lon_0=-100", "+proj=longlat +ellps=WGS84 +towgs84=1,2,3",
]
REFUSED = [
    # (what, CRS, words the message holds)
    ("geocentric", "EPSG:4978", "Geocentric"),
    ("geocentric as a PROJ string", "+proj=geocent", "Geocentric"),
    ("engineering", 'LOCAL_CS["site",UNIT["metre",1]]', "Engineering"),
    ("vertical", "EPSG:5773", "Vertical"),
    ("compound", "EPSG:4326+5773", "Compound"),
    ("3-D geographic", "EPSG:4979", "3D"),
    ("the Moon", "IAU_2015:30100", "another body"),
    ("Mars", "IAU_2015:49900", "another body"),
    ("a sphere of the Moon's radius", "+proj=eqearth +R=1737400", "another body"),
    ("a name pyproj would search for", "nonsense", "AUTHORITY:CODE"),
    ("an unknown code", "EPSG:999999", "unknown CRS"),
    ("a projection without a transformation", "+proj=merc +k=1e-9", "out of reach"),
    ("a rotated pole, which a GeoTIFF cannot hold", "+proj=ob_tran +o_proj=longlat +o_lon_p=40 +o_lat_p=50",
     "a GeoTIFF cannot hold"),
]


@pytest.fixture
def api(settings: Settings, clients: Clients, admin_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=signed(admin_token)) as client:
        yield client


@pytest.mark.parametrize("path", ["/api/jobs", "/api/estimate"])
@pytest.mark.parametrize("what,crs,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_crs_no_tile_can_be_made_in_is_refused_naming_grid_crs(
        api: TestClient, clients: Clients, path: str, what: str, crs: str, words: str) -> None:
    response = api.post(path, json=changed(region={"bbox": INSIDE_H09V05}, grid={"crs": crs}))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "grid.crs" and words in response.json()["detail"], response.json()
    assert nothing_written(clients)


def test_a_crs_is_decided_in_milliseconds_once_known() -> None:
    for crs in ACCEPTED[:3]:
        Grid(crs=crs)
    with decided_within(1.0):
        for _ in range(100):
            for crs in ACCEPTED[:3]:
                Grid(crs=crs)
            with pytest.raises(ValueError):
                Grid(crs="EPSG:4978")


@pytest.mark.parametrize("crs", ACCEPTED)
def test_every_accepted_crs_is_planned_warped_and_drawn(clients: Clients, crs: str) -> None:
    """The tile of the real granule (h09v05, 2 February 2022) in the grid's CRS, made by
    the tile stage's warp and drawn by the finisher's overview."""
    request = JobRequest.model_validate(changed(region={"bbox": INSIDE_H09V05}, start="2022-02-02",
                                                end="2022-02-09", grid={"crs": crs}))
    specs = expand(request, 100)
    spec = next(s for s in specs if [t.name for t in s.target.sources()] == ["h09v05"])
    params = spec.params()
    target = Target(params["crs"], tuple(float(v) for v in params["bounds"].split(",")),  # type: ignore[arg-type]
                    float(params["res"]))
    made = warp([Source("MOD10A2.A2022033.h09v05", {"Maximum_Snow_Extent": SNOW})], CATALOG["MOD10A2"],
                "Maximum_Snow_Extent", target)
    with rasterio.open(io.BytesIO(made)) as tile:
        assert tile.crs is not None and (tile.read(1) != 255).mean() > 0.5  # covered by the granule
    blob = names.tile_blob("ab" * 32, "MOD10A2", "Maximum_Snow_Extent", date(2022, 2, 2).isoformat(), spec.tile)
    clients.transfers.upload(clients.tiles, blob, made, "image/tiff")
    entry: dict[str, Any] = params | {"task": "000000000", "stage": "modis",
                                      "outputs": [names.TILE_OUTPUT_PREFIX + blob]}
    (drawn,) = overview.build(clients, "j-crs", [json.loads(json.dumps(entry))])
    assert drawn["tiles"] == 1
    picture = np.asarray(Image.open(io.BytesIO(clients.transfers.download(clients.products, drawn["map"])[0])))
    assert (picture[..., 3] > 0).mean() > 0.3  # the tile is on the map, not a transparent image


def test_a_good_request_in_a_projected_crs_is_accepted(api: TestClient) -> None:
    body = changed(region={"bbox": INSIDE_H09V05}, grid={"crs": "EPSG:32612"})
    assert api.post("/api/estimate", json=body).status_code == 200
    assert api.post("/api/jobs", json=body).status_code == 202
    assert GOOD["region"] == {"tiles": ["h09v05"]}
