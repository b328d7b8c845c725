"""The web portal in a real headless browser (Debian's Chromium driven by Playwright) against
the local stack: submit through the form and the map, watch the job reach done, open a
quick-look; an invalid request shows its error beside the field; cancel; no token, no data;
a scientist uploads a reducer, runs a job with it and sees only their own jobs.
Screenshots of each page are kept in ``out/portal/``."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Dialog, Page, Route, expect, sync_playwright

from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack
from tests.test_bundles import python_reducer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parent.parent / "out" / "portal"
# ceilings, not goals: the API and the page answer in milliseconds, and past httpx's and
# Playwright's 5 s beside other work at load 30
http = httpx.Client(timeout=60)
expect.set_options(timeout=30_000)

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (make test installs it)")


@pytest.fixture(scope="module")
def stack(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    extra = tmp_path_factory.mktemp("reducers")
    (extra / "crash").mkdir()
    (extra / "crash" / "reducer.json").write_text(json.dumps({
        "name": "crash", "description": "fails on purpose",
        "argv": ["{python}", "-c", "import sys; print('bad pixel', file=sys.stderr); sys.exit(4)"]}))
    with LocalStack(tmp_path_factory.mktemp("portal"), workers=1, slots=2, connection=azurite.connection_string,
                    namespace="portal", overrides={"reducers_path": str(extra), "max_attempts": 2}) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield found
        found.close()


@pytest.fixture
def page(browser: Browser, stack: LocalStack) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    opened.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" and "401" not in msg.text
              and "422" not in msg.text and "400" not in msg.text and "404" not in msg.text
              and "403" not in msg.text and "429" not in msg.text else None)
    yield opened
    context.close()
    assert not errors, errors  # no script error on any page


def _enter_key(page: Page, key: str) -> None:
    expect(page.locator("#key-dialog")).to_be_visible()
    page.fill("#key-input", key)
    page.click("#key-dialog button[type=submit]")


def _shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _submitted_until_succeeded(page: Page) -> str:
    """Submit the form, follow it to the job's page and wait there until the job has
    succeeded: its id."""
    page.click("#submit-form button[type=submit]")
    expect(page).to_have_url(re.compile(r"#/jobs/[\w-]+$"))
    expect(page.locator("h1 .badge")).to_have_text("SUCCEEDED", timeout=150_000)
    return page.url.rsplit("/", 1)[-1]


def _fill_small_request(page: Page) -> None:
    """Two target tiles on one date of MOD10A2, summarized by snow_fraction: 3 tasks, a tile
    task warping both tiles and a reduction of each."""
    for side, value in zip(("west", "south", "east", "north"), ("-110.5", "34.2", "-109.6", "34.8"), strict=True):
        page.fill(f"#bbox-{side}", value)
    page.fill("#start", "2022-02-02")
    page.fill("#end", "2022-02-09")
    for checked in page.locator("input[name=products]:checked").all():
        checked.uncheck()
    page.check("input[name=products][value=MOD10A2]")  # what snow_fraction accepts
    page.click("details.grid summary")
    page.fill("#resolution", "0.01")
    page.select_option("#reducer", "snow_fraction")
    page.fill("#email", "scientist@example.org")
    page.fill("#label", "portal test")


def test_without_a_token_nothing_is_served_and_a_wrong_token_is_asked_again(page: Page, stack: LocalStack) -> None:
    for path in ("/api/jobs", "/api/catalog", "/api/jobs/x/view", "/api/reducers", "/api/me"):
        assert http.get(stack.api_url + path).status_code == 401
    assert http.get(stack.api_url + "/").status_code == 200  # the page itself holds no data
    page.goto(stack.api_url + "/#/jobs")
    expect(page.locator("#sign-out")).to_be_hidden()  # nobody to sign out yet
    expect(page.locator("#platform-login")).to_be_hidden()  # no Microsoft sign-in on a local stack
    _enter_key(page, "not-the-key")
    expect(page.locator("#key-message")).to_contain_text("refused")
    expect(page.locator("#sign-out")).to_be_hidden()
    _enter_key(page, stack.token)
    expect(page.locator("table.jobs")).to_be_visible()
    expect(page.locator("#sign-out")).to_be_visible()
    page.click("#sign-out")
    expect(page.locator("#key-dialog")).to_be_visible()
    expect(page.locator("#sign-out")).to_be_hidden()


def test_submit_on_the_map_watch_it_finish_and_open_a_quicklook(page: Page, stack: LocalStack) -> None:
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    expect(page.locator("#submit-form")).to_be_visible()
    expect(page.locator(".modis-grid polygon[data-tile=h09v05]")).to_have_count(1)
    expect(page.locator(".land path")).to_have_count(1)

    # a box dragged on the map becomes the request's bbox
    box = page.locator(".map svg").bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.3)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.6, steps=5)
    page.mouse.up()
    west, east = float(page.input_value("#bbox-west")), float(page.input_value("#bbox-east"))
    assert west < east and (west, east) != (-112.0, -108.0)
    # clicking MODIS tiles picks them
    page.check("input[name=mode][value=tiles]")
    page.click("button[title='Whole world']")
    tile = page.locator(".modis-grid polygon[data-tile=h09v05]").bounding_box()
    assert tile is not None
    page.mouse.click(tile["x"] + tile["width"] / 2, tile["y"] + tile["height"] / 2)
    expect(page.locator("#tiles")).to_have_value("h09v05")
    expect(page.locator(".modis-grid polygon.picked")).to_have_count(1)
    page.check("input[name=mode][value=box]")

    _fill_small_request(page)
    # 2 target tiles x 1 period + 2 reductions, counted before submitting
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 3 tasks.*\$\d+\.\d\d"))  # and their cost
    _shot(page, "submit")
    job = _submitted_until_succeeded(page)
    expect(page.locator(".map .tile.state-done")).to_have_count(2)
    expect(page.locator("progress")).to_have_attribute("value", "1")
    expect(page.locator(".histogram .threshold")).to_have_count(2)  # tile stage and reductions
    # the region's overview on the map, a choice of its layers and dates, the chosen one's legend
    expect(page.locator(".map image.overview")).to_have_count(1)
    options = page.locator("#overview-choice option")
    expect(options).to_have_count(2)  # the reductions' snow fraction, and the snow classes of 2 February
    # a fraction is continuous: one colour bar from its low end to its high one, not swatches
    expect(page.locator(".overview-legend .colour-bar .bar")).to_have_attribute("style", re.compile("linear-gradient"))
    expect(page.locator(".overview-legend .swatch")).to_have_count(0)
    # the reducer declares its fraction's unit, "1": the high end says it, once
    low = float(page.locator(".overview-legend .colour-bar .low").inner_text())
    high, unit = page.locator(".overview-legend .colour-bar .high").inner_text().split()
    assert low < float(high) and unit == "1"
    # the program's own picture of the fraction, in colours of its own, is among the files, not shown beside it
    expect(page.locator(".quicklook-thumb")).to_have_count(0)
    first = page.locator(".map image.overview").get_attribute("href")
    page.select_option("#overview-choice", label="MOD10A2 Maximum_Snow_Extent 2022-02-02")
    expect(page.locator(".overview-legend")).to_contain_text("200 snow")
    shown = page.locator(".map image.overview").get_attribute("href") or ""
    assert shown != first and "Maximum_Snow_Extent" in shown
    assert http.get(shown).content.startswith(b"\x89PNG")
    picture = http.get(page.locator("#overview-picture").get_attribute("href") or "")
    assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG")
    # how to open it as STAC, in one line
    expect(page.locator("#stac-snippet")).to_contain_text(f"bagpipe results {job} --out {job}")
    expect(page.locator("#stac-snippet")).to_contain_text(f"{job}/collection.json")
    expect(page.locator("#stac-snippet")).to_contain_text("odc.stac.load(items, bands=['Maximum_Snow_Extent'])")
    # the finished job's page fits the window: no line of it runs past the side
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), page.evaluate(
        "[document.documentElement.scrollWidth, window.innerWidth]")
    # where it lives: the API's collection, and the line that loads it from there, run as a scientist would
    link = page.locator("#stac-link").get_attribute("href") or ""
    served = http.get(link, headers={"Authorization": f"Bearer {stack.token}"}).json()
    assert served["id"] == job and any(lk["rel"] == "items" for lk in served["links"])
    line = page.locator("#stac-api-snippet").inner_text()
    assert line.startswith('python -c "') and line.endswith('"')
    ran = subprocess.run([sys.executable, "-c", line.removeprefix('python -c "').removesuffix('"')],
                         env=os.environ | {"BAGPIPE_API_KEY": stack.token}, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "Maximum_Snow_Extent" in ran.stdout and "time: 1" in ran.stdout, ran.stdout
    pngs = page.locator(".files a", has_text="snow_fraction.png")
    expect(pngs).to_have_count(2)  # a reduction's per target tile
    png = http.get(pngs.first.get_attribute("href") or "")
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")
    manifest = http.get(page.locator("#manifest-link").get_attribute("href") or "").json()
    assert manifest["job"] == job and manifest["state"] == "SUCCEEDED"
    _shot(page, "job")

    # the email links the job's page, at the local stack's own address
    (email,) = [m for _, m in stack.mail.messages() if job in str(m["Subject"])]
    text = email.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    (link,) = re.findall(r"https?://\S+#/jobs/\S+", text)
    assert link == f"{stack.api_url}/#/jobs/{job}"
    page.goto(stack.api_url + "/#/jobs")
    page.goto(link)
    expect(page.locator("h1")).to_contain_text(f"Job {job}")
    expect(page.locator("h1 .badge")).to_have_text("SUCCEEDED")

    page.goto(stack.api_url + "/#/jobs")
    row = page.locator("table.jobs tr", has_text=job)
    expect(row).to_contain_text("SUCCEEDED")
    expect(row).to_contain_text("ago")
    _shot(page, "jobs")


def test_a_job_across_the_antimeridian_is_shown_whole_in_the_middle_of_its_map(page: Page, stack: LocalStack) -> None:
    """A box of Chukotka (land on both sides), 179.5°E to 179.6°W: its job's page shows its two
    target tiles side by side in the middle of the map, and its overview as one image across
    ±180° — not the world with a speck at either edge."""
    created = http.post(stack.api_url + "/api/jobs", headers=stack.headers, json={
        "region": {"bbox": [179.5, 66.2, -179.6, 66.8]}, "grid": {"resolution": 0.01},
        "start": "2022-02-02", "end": "2022-02-09", "products": ["MOD10A2"], "label": "Chukotka"})
    assert created.status_code == 202, created.text
    job = created.json()["job"]
    page.goto(f"{stack.api_url}/#/jobs/{job}")
    _enter_key(page, stack.token)
    expect(page.locator("h1 .badge")).to_have_text("SUCCEEDED", timeout=150_000)
    expect(page.locator(".map .tile")).to_have_count(2)
    left, _, width, _ = (float(v) for v in (page.locator(".map svg").get_attribute("viewBox") or "").split())
    assert width < 20 and abs(left + width / 2 - 360) < width / 10, (left, width)  # x = lon + 180: ±180° at 360
    expect(page.locator(".map image.overview")).to_have_count(1)
    image = page.locator(".map image.overview")
    assert float(image.get_attribute("x") or 0) == pytest.approx(359) and float(image.get_attribute("width") or 0) == 2
    shown, whole = image.bounding_box(), page.locator(".map svg").bounding_box()
    assert shown is not None and whole is not None
    assert shown["width"] > whole["width"] / 10 and whole["x"] < shown["x"] < shown["x"] + shown["width"] < whole[
        "x"] + whole["width"]  # large, and inside the map
    _shot(page, "antimeridian")


def test_an_invalid_request_shows_the_error_beside_its_field(page: Page, stack: LocalStack) -> None:
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    _fill_small_request(page)
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 3 tasks.*\$\d+\.\d\d"))  # and their cost
    page.fill("#crs", "EPSG:999999")
    crs_error = page.locator("[data-field='grid.crs'] .error")
    expect(crs_error).to_contain_text("unknown CRS")
    expect(page.locator("#crs")).to_have_attribute("aria-invalid", "true")
    page.fill("#crs", "")
    expect(crs_error).to_be_empty()
    page.fill("#bbox-west", "179.5")  # west of east no more: the box crosses ±180°, drawn as its two halves
    page.fill("#bbox-east", "-179.5")
    # its two target tiles, either side of ±180°, read MODIS tiles at either end of the grid: a
    # tile task each, and a reduction each
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 4 tasks.*\$\d+\.\d\d"))  # and their cost
    expect(page.locator(".map rect.bbox")).to_have_count(2)
    page.fill("#bbox-south", "35")  # south of north no more: an empty region
    expect(page.locator("[data-field=region] > .error")).to_contain_text("empty")
    page.click("#submit-form button[type=submit]")  # refused by the API too: nothing submitted
    expect(page).not_to_have_url(re.compile("#/jobs/"))
    _shot(page, "invalid")


def test_a_monthly_maximum_asked_for_on_the_form_with_no_program(page: Page, stack: LocalStack) -> None:
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    _fill_small_request(page)
    page.select_option("#reducer", "")  # no program
    page.select_option("#reduce-kind", "expression")
    expect(page.locator("#reduce-inputs option:checked")).to_have_count(1)  # the product's default layer
    page.fill("#reduce-expression", "__import__('os')")  # refused beside its field, nothing run
    expect(page.locator("[data-field='reduce.expression'] .error")).not_to_be_empty()
    expect(page.locator("#reduce-expression")).to_have_attribute("aria-invalid", "true")
    page.select_option("#reduce-kind", "builtin")
    expect(page.locator("#reduce-expression")).to_be_hidden()
    page.select_option("#reduce-builtin", "max")
    page.select_option("#reduce-by", "month")
    # 2 target tiles x 1 period + 2 reductions (one month a tile)
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 3 tasks"))
    job = _submitted_until_succeeded(page)
    taken = http.get(f"{stack.api_url}/api/jobs/{job}", headers=stack.headers).json()
    assert taken["request"]["reduce"] == {**taken["request"]["reduce"], "by": "month", "reducer": "max",
                                          "inputs": ["MOD10A2.Maximum_Snow_Extent"]}
    assert "reducer" not in taken["request"] or taken["request"]["reducer"] is None
    # what the state alone does not say is said beside it: here, data the local stack synthesized
    for note in taken["notes"]:
        expect(page.locator(".summary .note", has_text=note)).to_have_count(1)
    expect(page.locator(".summary .warning")).to_have_count(0)  # it made something
    expect(page.locator(".quicklook-thumb, .map image.overview").first).to_be_visible()


def test_sites_uploaded_on_the_form_are_shown_on_the_map_and_their_table_and_series_on_the_job_page(
        page: Page, stack: LocalStack, tmp_path: Path) -> None:
    sites = tmp_path / "towers.csv"
    sites.write_text("id,lon,lat\ntower-1,-107.6,35.5\ntower-2,-106.25,34.05\nbuoy,-150.0,2.0\n")
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    page.fill("#start", "2022-01-01")
    page.fill("#end", "2022-01-31")
    for checked in page.locator("input[name=products]:checked").all():
        checked.uncheck()
    page.check("input[name=products][value=MOD13A1]")
    page.select_option("#vector-kind", "sites")
    page.set_input_files("#vector-file", str(sites))
    expect(page.locator("#vector-status")).to_contain_text("3 sites kept")
    expect(page.locator(".features circle.site")).to_have_count(3)
    expect(page.locator(".features circle.site[data-id=tower-2] title")).to_have_text("tower-2")
    page.select_option("#sites-window", "3")
    # a point task per (MODIS tile holding sites, date): the towers' h09v05 and the buoy's, × 2 composites;
    # and the gather
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 5 tasks"))
    job = _submitted_until_succeeded(page)
    taken = http.get(f"{stack.api_url}/api/jobs/{job}", headers=stack.headers).json()
    assert taken["request"]["sites"]["window"] == 3 and taken["request"].get("region") is None
    expect(page.locator("#table-preview tbody tr")).to_have_count(6)  # 3 sites × 2 dates, fewer than 10
    preview = http.get(f"{stack.api_url}/api/jobs/{job}/tables/sites", headers=stack.headers,
                        params={"id": "tower-2"}).json()
    expect(page.locator("#series-choice option")).to_have_count(3)
    page.select_option("#series-choice", "tower-2")
    dots = page.locator("svg.series circle")
    expect(dots).to_have_count(sum(1 for _, v in preview["series"][0]["points"] if v is not None))
    assert [(d.get_attribute("data-date"), float(d.get_attribute("data-value") or "nan")) for d in dots.all()] == [
        (t, v) for t, v in preview["series"][0]["points"] if v is not None]
    expect(page.locator(".series-plot figcaption")).to_contain_text("tower-2: 500m_16_days_NDVI (NDVI)")
    page.select_option("#series-choice", "buoy")  # over the ocean: no value on any date
    expect(page.locator("svg.series")).to_contain_text("buoy: no data")
    _shot(page, "sites-table")


def test_zones_and_a_bad_file_on_the_form(page: Page, stack: LocalStack, tmp_path: Path) -> None:
    """Zones uploaded are drawn on the map and replace the region in the estimate; a file the
    API refuses is said beside the field, naming what is wrong, and nothing is kept."""
    square = [[[-109.9, 34.3], [-109.7, 34.3], [-109.7, 34.5], [-109.9, 34.5], [-109.9, 34.3]]]
    zones = tmp_path / "fields.geojson"
    zones.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "id": name, "properties": {}, "geometry": {"type": "Polygon", "coordinates": ring}}
        for name, ring in (("north", square), ("south", [[[x, y - 0.3] for x, y in square[0]]]))]}))
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    page.select_option("#vector-kind", "zones")
    page.set_input_files("#vector-file", str(zones))
    expect(page.locator("#vector-status")).to_contain_text("2 zones kept")
    expect(page.locator(".features path.zone")).to_have_count(2)
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes \d+ tasks"))
    bad = tmp_path / "bad.csv"
    bad.write_text("id,lon,lat\na,west,35\n")
    page.select_option("#vector-kind", "sites")  # the zones, now asked to be sites, are refused too
    with page.expect_response(lambda answer: answer.url.endswith("/api/estimate")):
        page.set_input_files("#vector-file", str(bad))  # ... but only the latest choice is said
    # and the estimate that follows (which clears the request's own errors) leaves it said
    expect(page.locator("[data-field=vectors] .error")).to_have_text(
        "data line 2, column lon: longitude 'west' is not a number")
    expect(page.locator(".features *")).to_have_count(0)
    expect(page.locator("#vector-status")).to_be_empty()


def test_a_box_across_half_the_world_is_asked_about_before_it_is_submitted(page: Page, stack: LocalStack) -> None:
    """West and east swapped make a box across ±180° of 5,000 tasks: the form asks, naming
    the box meant, and submits nothing when told no."""
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    _fill_small_request(page)
    before = http.get(stack.api_url + "/api/jobs", headers=stack.headers).json()
    page.fill("#bbox-west", "-109")
    page.fill("#bbox-east", "-110")
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes (?!3 tasks)[\d,]+ tasks"),
                                                  timeout=60_000)  # 359 target tiles counted
    asked: list[str] = []

    def answer(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", answer)
    page.click("#submit-form button[type=submit]")
    expect(page.locator("#submit-form button[type=submit]")).to_be_enabled()
    assert len(asked) == 1 and "did you mean -110," in asked[0], asked
    expect(page).not_to_have_url(re.compile("#/jobs/"))
    assert http.get(stack.api_url + "/api/jobs", headers=stack.headers).json() == before


def test_too_many_estimates_are_said_where_the_estimate_is(page: Page, stack: LocalStack) -> None:
    """A 429 marks no field: the estimate's line says to wait, and the next change asks again."""
    page.goto(stack.api_url + "/")
    _enter_key(page, stack.token)
    _fill_small_request(page)
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 3 tasks"))
    refusal = {"detail": "too many submissions and estimates: at most 60 a minute; retry in 7 s", "retry_after": 7}
    page.route("**/api/estimate", lambda route: route.fulfill(status=429, json=refusal, headers={"Retry-After": "7"}))
    page.fill("#end", "2022-02-10")
    expect(page.locator("#estimate")).to_have_text(refusal["detail"])
    expect(page.locator("[aria-invalid=true]")).to_have_count(0)
    page.unroute("**/api/estimate")
    page.fill("#end", "2022-02-09")
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 3 tasks"))


def test_cancel_a_running_job(page: Page, stack: LocalStack) -> None:
    api = stack.headers
    created = http.post(stack.api_url + "/api/jobs", headers=api, json={
        "region": {"bbox": [-111.5, 34.2, -108.6, 36.8]}, "grid": {"resolution": 0.01},
        "start": "2020-01-01", "end": "2022-12-31", "products": ["MOD10A2"], "label": "to cancel"}).json()
    page.goto(f"{stack.api_url}/#/jobs/{created['job']}")
    _enter_key(page, stack.token)
    expect(page.locator("#cancel")).to_be_visible()
    # the page says what its figures are, for a scientist
    expect(page.locator("#failures-hint")).to_contain_text("monitor kill")
    expect(page.locator("#failures-hint")).to_contain_text("Backup attempts are")
    expect(page.locator("#workers-hint")).to_contain_text("Runtime ratio: ")
    expect(page.locator("dt", has_text="monitor kills")).to_have_attribute("title", re.compile("usual time"))
    page.click("#cancel")
    expect(page.locator("h1 .badge")).to_have_text("CANCELLED", timeout=60_000)
    expect(page.locator("#cancel")).to_be_hidden()
    status = http.get(f"{stack.api_url}/api/jobs/{created['job']}", headers=api).json()
    assert status["state"] == "CANCELLED" and status["counts"]["CANCELLED"] > 0


def test_failures_show_their_class_and_link_the_attempt_logs(page: Page, stack: LocalStack) -> None:
    api = stack.headers
    created = http.post(stack.api_url + "/api/jobs", headers=api, json={
        "region": {"bbox": [-110.5, 34.2, -110.1, 34.8]}, "grid": {"resolution": 0.01},
        "start": "2022-02-02", "end": "2022-02-09", "products": ["MOD10A2"], "reducer": {"name": "crash"}}).json()
    page.goto(f"{stack.api_url}/#/jobs/{created['job']}")
    _enter_key(page, stack.token)
    expect(page.locator("h1 .badge")).to_have_text("FAILED", timeout=120_000)
    rows = page.locator(".failures tbody tr")
    expect(rows).to_have_count(2)  # the reduction's two attempts
    expect(rows.first).to_contain_text("user_code_error")
    stderr = rows.first.locator("a", has_text="stderr.txt").get_attribute("href")
    assert "bad pixel" in http.get(stderr or "").text
    expect(page.locator(".map .tile.state-failed")).to_have_count(1)
    expect(page.locator("dd[data-backups]")).to_have_text("0")  # no attempt outran its history
    expect(page.locator(".workers [data-worker-state]").first).to_be_visible()  # who ran its attempts
    _shot(page, "failed")


def test_a_scientist_signs_in_uploads_a_reducer_runs_a_job_with_it_and_sees_only_their_jobs(
    page: Page, stack: LocalStack, tmp_path: Path
) -> None:
    admin = stack.headers
    assert http.post(stack.api_url + "/api/users", headers=admin,
                      json={"name": "ada", "email": "ada@example.org"}).status_code == 201
    token = http.post(stack.api_url + "/api/tokens", headers=admin, json={"user": "ada"}).json()["token"]
    others = http.post(stack.api_url + "/api/jobs", headers=admin, json={
        "region": {"tiles": ["h09v05"]}, "start": "2022-02-02", "end": "2022-02-09", "products": ["MOD10A2"],
        "label": "the admin's"}).json()["job"]
    folder = python_reducer(tmp_path / "mean")

    page.goto(stack.api_url + "/#/reducers")
    _enter_key(page, token)
    expect(page.locator("#who")).to_have_text("ada (scientist)")
    expect(page.locator("#my-reducers")).to_contain_text("None yet")
    page.set_input_files("#upload-folder", str(folder))  # a folder: its files keep their paths (lib/…)
    page.click("#upload-form button[type=submit]")
    expect(page.locator("#upload-status")).to_have_text("Uploaded ada/mean@1.")
    expect(page.locator("table.versions[data-reducer=mean] tbody tr")).to_have_count(1)
    # a broken upload is refused with the reason, and nothing changes
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "reducer.json").write_text('{"name": "broken", "argv": ["{here}/missing"]}')
    page.set_input_files("#upload-files", [str(tmp_path / "broken" / "reducer.json")])
    page.click("#upload-form button[type=submit]")
    expect(page.locator("#upload-status")).to_contain_text("not in the bundle")
    expect(page.locator("section.reducer")).to_have_count(1)
    _shot(page, "reducers")

    page.goto(stack.api_url + "/#/")
    _fill_small_request(page)
    page.select_option("#reducer", "mean")
    page.fill("#label", "with my reducer")
    expect(page.locator("#estimate")).to_have_text(re.compile(r"makes 3 tasks.*\$\d+\.\d\d"))  # and their cost
    job = _submitted_until_succeeded(page)
    expect(page.locator(".products")).to_contain_text("summary.json")

    page.goto(stack.api_url + "/#/jobs")
    expect(page.locator("h1")).to_have_text("My jobs")
    expect(page.locator("table.jobs tbody tr")).to_have_count(1)
    expect(page.locator("table.jobs tbody")).to_contain_text(job)
    expect(page.locator("table.jobs tbody")).not_to_contain_text(others)
    page.goto(f"{stack.api_url}/#/jobs/{others}")  # the admin's job: as if it did not exist
    expect(page.locator("main .error")).to_contain_text(f"no job '{others}'")
    page.goto(stack.api_url + "/#/reducers")
    expect(page.locator("table.versions[data-reducer=mean] .jobs-used")).to_contain_text(job)
    _shot(page, "my-jobs")

    # my tokens: a token cannot make another; revoking the one this browser uses signs it out
    page.click("#who")
    expect(page.locator("table.tokens tbody tr")).to_have_count(1)
    expect(page.locator("#token-form")).to_contain_text("A token makes no other")  # not offered: refused (403)
    expect(page.locator("#token-form button")).to_have_count(0)
    expect(page.locator("p.hint").first).to_contain_text("--key TOKEN")
    page.click("table.tokens button.danger")
    expect(page.locator("#key-message")).to_contain_text("refused")
    assert http.get(stack.api_url + "/api/me", headers={"X-Bagpipe-Token": token}).status_code == 401


def test_the_job_page_polls_one_request_at_a_time_and_backs_off_while_nothing_changes(
        page: Page, stack: LocalStack) -> None:
    """Each poll waits for the last answer (a slow API never has two in flight), and the
    wait doubles while the job's view is unchanged. The API's answers are held for a
    second each, and are a running job's real view that does not change."""
    api = stack.headers
    created = http.post(stack.api_url + "/api/jobs", headers=api, json={
        "region": {"bbox": [-110.5, 34.2, -110.1, 34.8]}, "grid": {"resolution": 0.01},
        "start": "2022-02-02", "end": "2022-02-09", "products": ["MOD10A2"], "label": "still"}).json()
    view = http.get(f"{stack.api_url}/api/jobs/{created['job']}/view", headers=api).json() | {"state": "RUNNING"}
    held: list[tuple[float, Route]] = []
    asked: list[float] = []

    def hold(route: Route) -> None:
        asked.append(time.monotonic())
        held.append((time.monotonic(), route))

    page.route(f"**/api/jobs/{created['job']}/view", hold)
    page.goto(f"{stack.api_url}/#/jobs/{created['job']}")
    _enter_key(page, stack.token)
    most = 0
    start = time.monotonic()
    while time.monotonic() - start < 20:
        page.wait_for_timeout(100)
        most = max(most, len(held))
        while held and time.monotonic() - held[0][0] >= 1.0:
            held.pop(0)[1].fulfill(status=200, content_type="application/json", body=json.dumps(view))
    assert most == 1, "two requests in flight"
    gaps = [b - a for a, b in itertools.pairwise(asked)]
    assert 3 <= len(asked) <= 6, asked  # every 1.5 s without back-off: 9 or more
    assert gaps[-1] > 2 * gaps[0], gaps


@pytest.mark.parametrize("request_body", [
    {"region": {"tiles": ["h09v05"]}},  # as the portal's "Click MODIS tiles" sends it: the tiles' own grid
    {"region": {"bbox": [-110.5, 34.2, -109.6, 34.8]}, "grid": {"crs": "EPSG:5070"}},  # a projected CRS
], ids=["modis-tiles", "projected"])
def test_the_job_page_renders_whatever_the_grid(page: Page, stack: LocalStack, request_body: dict) -> None:
    api = stack.headers
    created = http.post(stack.api_url + "/api/jobs", headers=api, json=request_body | {
        "start": "2022-02-02", "end": "2022-02-09", "products": ["MOD10A2"], "label": "any grid"})
    assert created.status_code == 202, created.text
    job = created.json()["job"]
    try:
        assert http.get(f"{stack.api_url}/api/jobs/{job}/view", headers=api).status_code == 200
        page.goto(f"{stack.api_url}/#/jobs/{job}")
        _enter_key(page, stack.token)
        expect(page.locator("h1 .badge")).to_be_visible()
        expect(page.locator(".map .tile").first).to_be_visible()
        box = page.locator(".map .tile").first.bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0  # drawn at its lon/lat place
        expect(page.locator("dd[data-state]").first).to_be_visible()
    finally:
        http.post(f"{stack.api_url}/api/jobs/{job}/cancel", headers=api)
