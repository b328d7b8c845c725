"""Fetching what the catalogs found, with credentials that reach only where they belong:
Planetary Computer SAS tokens per container, renewed before they expire (and at once when
storage refuses one), shared by a worker's stage processes, asked again of a busy endpoint;
Planetary Computer's subscription key to its hosts only; the Earthdata token across the login
redirect and never to another host; no token, key or signature in any error text."""

from __future__ import annotations

import json
import logging
import multiprocessing
import secrets
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import date
from pathlib import Path

import httpx
import pytest
import responses
import respx

from bagpipe.azurite import Azurite
from bagpipe.earthdata import Earthdata
from bagpipe.planetary import Planetary
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import policy
from pipeline.modis.access import (
    SUBSCRIPTION_HEADER,
    TOKEN_BACKOFF_S,
    TOKEN_TRIES,
    Access,
    SasSigner,
    access_for,
    blob_container,
    subscription_headers,
    token_folder,
)
from pipeline.modis.access import Earthdata as EarthdataClient
from pipeline.modis.cmr import CmrCatalog
from pipeline.modis.granules import Granule
from pipeline.modis.products import CATALOG
from pipeline.modis.stac import StacCatalog
from pipeline.redact import RedactingFilter
from pipeline.settings import PLANETARY_COMPUTER_SAS, PLANETARY_COMPUTER_STAC, Settings

DAY = date(2022, 2, 2)
BOX = (-108.0, 35.0, -107.5, 35.5)  # inside h09v05


def snow_granule(planetary: Planetary) -> Granule:
    (found,) = StacCatalog(planetary.stac_url).search(CATALOG["MOD10A2"], BOX, DAY, DAY)
    return found


def test_blob_urls_are_read_as_the_azure_sdk_reads_them() -> None:
    assert blob_container("https://modiseuwest.blob.core.windows.net/modis-061-cogs/MOD10A2/09/05/x.tif") == (
        "modiseuwest", "modis-061-cogs")
    assert blob_container("http://127.0.0.1:10000/devstoreaccount1/modis-061-cogs/MOD10A2/x.tif") == (
        "devstoreaccount1", "modis-061-cogs")
    assert blob_container("https://n5eil01u.ecs.nsidc.org/DP4/MOST/x.hdf") is None


def test_the_imitation_makes_a_listed_file_on_its_first_signed_read_and_never_for_a_search(
        azurite: Azurite) -> None:
    with Planetary(azurite.connection_string, prefix=f"l{secrets.token_hex(4)}") as planetary:
        found = StacCatalog(planetary.stac_url).search(CATALOG["MOD10A2"], (-112.0, 34.0, -108.0, 37.0),
                                                       date(2020, 1, 1), date(2022, 12, 31))
        assert len(found) == 2 * 138 and planetary.files_made == 0  # three years of two tiles: nothing made
        href = found[-1].href("Maximum_Snow_Extent")
        assert httpx.get(href).status_code == 403 and planetary.files_made == 0  # unsigned: refused, not made
        access = Access(planetary.sas_url, "", "")
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(access.fetch, [href] * 4))
        assert planetary.files_made == 1 and len({g.data for g in got}) == 1  # made once, served to all
        assert got[0].md5 is not None and got[0].length == len(got[0].data)  # storage's own checks, passed on
        with pytest.raises(StageFailure, match="no "):  # a file the archive has not: 404, never made
            access.fetch(href.replace(found[-1].made, "2000001000000"))  # another production time
        assert planetary.files_made == 1


def test_a_sas_token_is_kept_then_renewed_before_it_expires(azurite: Azurite) -> None:
    with Planetary(azurite.connection_string, token_minutes=0.1) as planetary:  # tokens live 6 s
        href = snow_granule(planetary).href("Maximum_Snow_Extent")
        access = Access(planetary.sas_url, "", "")
        assert access.signer is not None
        first = access.fetch(href)
        assert access.fetch(href).data == first.data and access.signer.issued == 1  # kept
        time.sleep(5)  # past 3/4 of its life: renewed, never used expired
        assert access.fetch(href).data == first.data and access.signer.issued == 2
        assert "sig=" not in first.url


def test_a_token_storage_refuses_is_replaced_at_once(azurite: Azurite) -> None:
    with Planetary(azurite.connection_string, token_minutes=0.02) as planetary:  # 1.2 s
        href = snow_granule(planetary).href("Maximum_Snow_Extent")
        signer = SasSigner(planetary.sas_url)
        account, container = blob_container(href)  # type: ignore[misc]
        signer.token(account, container)
        token, expiry, _ = signer._tokens[(account, container)]
        signer._tokens[(account, container)] = (token, expiry, time.time() + 3600)  # believed good
        time.sleep(2)  # but expired: Azurite refuses it
        access = Access(planetary.sas_url, "", "")
        access.signer = signer
        assert access.fetch(href).data and signer.issued == 2


def test_the_earthdata_token_goes_to_the_login_and_archive_hosts_only(nasa: Earthdata) -> None:
    (granule,) = CmrCatalog(nasa.cmr_url).search(CATALOG["MOD10A2"], BOX, DAY, DAY)
    nasa.seen.clear()
    fetched = Access("", nasa.token, nasa.hosts).fetch(granule.href("hdf"))
    assert fetched.data[:4] == b"\x0e\x03\x13\x01"  # HDF4
    carried = {(service, "authorization" in headers) for service, _, headers in nasa.seen}
    assert carried == {("archive", True), ("login", True), ("bucket", False)}  # followed to the bucket, bare
    assert not any(nasa.token in str(headers) for service, _, headers in nasa.seen if service == "bucket")


def test_the_token_is_never_sent_to_a_host_outside_the_list_nor_in_clear() -> None:
    client = EarthdataClient("tok", frozenset({"urs.earthdata.nasa.gov", "127.0.0.2"}))
    assert client.allowed("https://urs.earthdata.nasa.gov/oauth/authorize")
    assert not client.allowed("http://urs.earthdata.nasa.gov/oauth/authorize")  # not over plain HTTP
    assert not client.allowed("https://lp-prod-protected.s3.us-west-2.amazonaws.com/x.hdf")
    assert not client.allowed("https://urs.earthdata.nasa.gov.evil.example/x")
    assert client.allowed("http://127.0.0.2:8000/x")  # this machine (the local stack)
    with pytest.raises(ValueError, match="Key Vault"):
        EarthdataClient("@Microsoft.KeyVault(SecretUri=https://v.vault.azure.net/secrets/t)", frozenset())


def test_no_credential_in_an_error_text_or_a_log_line(
        nasa: Earthdata, azurite: Azurite, caplog: pytest.LogCaptureFixture) -> None:
    (granule,) = CmrCatalog(nasa.cmr_url).search(CATALOG["MOD10A2"], BOX, DAY, DAY)
    wrong = "wrong-token-" + "x" * 20
    with pytest.raises(StageFailure) as refused:
        Access("", wrong, nasa.hosts).fetch(granule.href("hdf"))
    assert "401" in str(refused.value) and wrong not in str(refused.value)
    with Planetary(azurite.connection_string) as planetary:
        href = snow_granule(planetary).href("Maximum_Snow_Extent")
        access = Access(planetary.sas_url, "", "")
        signed = access.signer.sign(href)  # type: ignore[union-attr]
        with pytest.raises(StageFailure) as missing:
            access.fetch(href.replace("Maximum_Snow_Extent.tif", "Nothing.tif"))
        assert "sig=" not in str(missing.value) and "no " in str(missing.value)
    log = logging.getLogger("bagpipe.test")
    log.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, "bagpipe.test"):
        log.info("fetching %s with Bearer %s", signed, nasa.token)
    signature = signed.split("sig=")[1].split("&")[0]
    assert signature not in caplog.text and nasa.token not in caplog.text and "sig=***" in caplog.text


@respx.mock
def test_a_busy_archive_is_a_transient_failure_and_a_refusal_is_not() -> None:
    """Recorded answers of a DAAC: 503 and 429 (rate limits under many parallel requests) may
    well pass on a retry; 401 and 404 are about the file or the token, not the moment."""
    url = "https://data.lpdaac.earthdatacloud.nasa.gov/lp-prod-protected/MOD13A1.061/g/g.hdf"
    access = Access("", "token-" + "x" * 20, "data.lpdaac.earthdatacloud.nasa.gov")
    for status, failure in ((503, FailureClass.SERVER_BUSY), (429, FailureClass.SERVER_BUSY),
                            (500, FailureClass.SERVER_BUSY), (401, FailureClass.SOURCE_DOWNLOAD),
                            (404, FailureClass.SOURCE_DOWNLOAD), (410, FailureClass.SOURCE_DOWNLOAD)):
        respx.get(url).mock(return_value=httpx.Response(status, text="<html>busy</html>"))
        with pytest.raises(StageFailure) as caught:
            access.fetch(url)
        assert caught.value.failure is failure, status
        assert caught.value.failure.transient == (status in (429, 500, 503))


def test_a_busy_token_endpoint_is_asked_again_after_its_retry_after(azurite: Azurite) -> None:
    """Planetary Computer's token endpoint past its rate limit answers 429 with Retry-After
    (Azure API Management's answer): the attempt waits and asks again, where it failed at once
    (``source_download_failed``, and the task was DEAD after its second attempt)."""
    with Planetary(azurite.connection_string) as planetary:
        href = snow_granule(planetary).href("Maximum_Snow_Extent")
        planetary.busy_tokens = 2
        started = time.monotonic()
        fetched = Access(planetary.sas_url, "", "").fetch(href)
        assert fetched.data and planetary.busy_tokens == 0 and planetary.tokens_issued == 1
        assert time.monotonic() - started >= 2.0  # its Retry-After (1 s), twice
        asked = [path for path, _ in planetary.seen if path.startswith("/api/sas/")]
        assert len(asked) == 3


@respx.mock
def test_a_token_endpoint_busy_past_its_tries_is_a_transient_failure_and_a_refusal_is_not() -> None:
    endpoint = "https://planetarycomputer.microsoft.com/api/sas/v1/token"
    url = f"{endpoint}/modiseuwest/modis-061-cogs"
    waits: list[float] = []
    signer = SasSigner(endpoint, sleep=waits.append)
    route = respx.get(url).mock(return_value=httpx.Response(503, text="busy"))
    with pytest.raises(StageFailure) as caught:
        signer.token("modiseuwest", "modis-061-cogs")
    assert caught.value.failure is FailureClass.SERVER_BUSY and caught.value.failure.transient
    assert route.call_count == TOKEN_TRIES and len(waits) == TOKEN_TRIES - 1
    # no Retry-After: backoff doubling, with full jitter (each wait somewhere below its bound)
    assert all(0 <= wait <= TOKEN_BACKOFF_S * 2 ** n for n, wait in enumerate(waits))
    # the task is retried as a busy blob's is: the platform's failure, ten attempts
    settings = Settings(storage_connection="UseDevelopmentStorage=true")
    assert policy.budget(FailureClass.SERVER_BUSY, policy.Facts(attempt=2, last_failure="server_busy"),
                         policy.limits_for(settings, "modis")) == settings.max_transient_attempts
    waits.clear()
    respx.get(url).mock(side_effect=[httpx.Response(429, headers={"Retry-After": "3"}), httpx.Response(
        200, json={"msft:expiry": "2099-01-01T00:00:00Z", "token": "se=2099&sig=abc"})])
    assert signer.token("modiseuwest", "modis-061-cogs") == "se=2099&sig=abc"
    assert len(waits) == 1 and 3 <= waits[0] <= 3 + TOKEN_BACKOFF_S  # its Retry-After, and a little jitter
    respx.get(url).mock(return_value=httpx.Response(429, headers={"Retry-After": "3600"}))
    with pytest.raises(StageFailure) as caught:  # an hour: not waited for here, the task is retried later
        SasSigner(endpoint, sleep=waits.append).token("modiseuwest", "modis-061-cogs")
    assert caught.value.failure is FailureClass.SERVER_BUSY and len(waits) == 1
    for status in (403, 404):
        respx.get(url).mock(return_value=httpx.Response(status))
        with pytest.raises(StageFailure) as caught:
            SasSigner(endpoint, sleep=waits.append).token("modiseuwest", "modis-061-cogs")
        assert caught.value.failure is FailureClass.SOURCE_DOWNLOAD, status


def _token_in_another_process(endpoint: str, folder: str, account: str, container: str) -> str:
    return SasSigner(endpoint, Path(folder)).token(account, container)


def test_the_stage_processes_of_a_worker_ask_for_a_container_s_token_once(
        planetary: Planetary, tmp_path: Path) -> None:
    """Each slot's stage process is a process of its own: they share their tokens through
    the worker's folder, so that a new worker asks once per container, not once per slot."""
    href = snow_granule(planetary).href("Maximum_Snow_Extent")
    account, container = blob_container(href)  # type: ignore[misc]
    folder = tmp_path / "tokens"
    before = planetary.tokens_issued
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        tokens = list(pool.map(_token_in_another_process, *zip(*[(planetary.sas_url, str(folder), account,
                                                                   container)] * 8, strict=True)))
    assert len(set(tokens)) == 1 and planetary.tokens_issued == before + 1
    assert (folder.stat().st_mode & 0o777) == 0o700 and all((p.stat().st_mode & 0o777) == 0o600
                                                            for p in folder.iterdir())
    signer = SasSigner(planetary.sas_url, folder)
    assert signer.token(account, container) == tokens[0] and signer.issued == 0  # read, not asked
    signer.forget(href)  # storage refused it: the next process to sign asks anew
    assert _token_in_another_process(planetary.sas_url, str(folder), account, container) != tokens[0]
    assert planetary.tokens_issued == before + 2
    # a folder others may write to is not trusted: this process's tokens only
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o777)
    SasSigner(planetary.sas_url, open_folder).token(account, container)
    assert list(open_folder.iterdir()) == []
    assert access_for(Settings(storage_connection="x")).signer.folder == token_folder()  # type: ignore[union-attr]


def test_the_subscription_key_never_reaches_another_stac_api_or_token_endpoint(azurite: Azurite) -> None:
    key = "pc-key-" + secrets.token_hex(16)
    with Planetary(azurite.connection_string) as planetary:  # this machine, over HTTP: not Planetary Computer
        Access(planetary.sas_url, "", "", subscription_key=key).fetch(snow_granule(planetary).href(
            "Maximum_Snow_Extent"))
        StacCatalog(planetary.stac_url, subscription_key=key).search(CATALOG["MOD10A2"], BOX, DAY, DAY)
        asked = {path.split("/")[2] for path, _ in planetary.seen}
        assert {"stac", "sas"} <= asked and not any(key in json.dumps(headers) for _, headers in planetary.seen)


@respx.mock
@responses.activate
def test_the_subscription_key_goes_to_planetary_computer_s_hosts_only_and_is_never_shown(
        caplog: pytest.LogCaptureFixture) -> None:
    key = "pc-key-" + secrets.token_hex(16)
    sas = respx.get("https://planetarycomputer.microsoft.com/api/sas/v1/token/modiseuwest/modis-061-cogs").mock(
        return_value=httpx.Response(200, json={"msft:expiry": "2099-01-01T00:00:00Z", "token": "sig=abc"}))
    SasSigner(PLANETARY_COMPUTER_SAS, key=key).token("modiseuwest", "modis-061-cogs")
    assert sas.calls[0].request.headers[SUBSCRIPTION_HEADER] == key
    # the STAC API: the collection's check and every page of the search (pystac-client's requests)
    root = PLANETARY_COMPUTER_STAC
    checked = respx.get(f"{root}/collections/modis-10A2-061").mock(return_value=httpx.Response(200, json={}))
    responses.get(root, json={"type": "Catalog", "id": "microsoft-pc", "stac_version": "1.0.0", "description": "",
                              "conformsTo": ["https://api.stacspec.org/v1.0.0/core",
                                             "https://api.stacspec.org/v1.0.0/item-search"],
                              "links": [{"rel": "search", "href": f"{root}/search", "method": "POST",
                                         "type": "application/geo+json"},
                                        {"rel": "root", "href": root}, {"rel": "self", "href": root}]})
    responses.post(f"{root}/search", json={"type": "FeatureCollection", "features": [], "links": []})
    StacCatalog(root, subscription_key=key).search(CATALOG["MOD10A2"], BOX, DAY, DAY)
    assert checked.calls[0].request.headers[SUBSCRIPTION_HEADER] == key
    assert [call.request.headers.get(SUBSCRIPTION_HEADER) for call in responses.calls] == [key, key]
    # any other host, a look-alike one, or Planetary Computer over plain HTTP: never
    for url in ("https://example.org/api/sas/v1/token", "https://planetarycomputer.microsoft.com.example.org/x",
                "http://planetarycomputer.microsoft.com/api/sas/v1/token", "http://127.0.0.1:8000/api/sas/v1/token"):
        assert subscription_headers(url, key) == {}, url
    # a secret setting: out of repr, of a refusal's text, of the log
    settings = Settings(storage_connection="x", pc_subscription_key=key)
    assert key not in repr(settings) and Settings.from_env(settings.to_env()).pc_subscription_key == key
    respx.get("https://planetarycomputer.microsoft.com/api/sas/v1/token/modiseuwest/other").mock(
        return_value=httpx.Response(403, text=f"key {key} is not valid"))
    with pytest.raises(StageFailure) as refused:
        SasSigner(PLANETARY_COMPUTER_SAS, key=key).token("modiseuwest", "other")
    assert key not in str(refused.value)
    log = logging.getLogger("bagpipe.test")
    log.addFilter(RedactingFilter())
    with caplog.at_level(logging.INFO, "bagpipe.test"):
        log.info("asked with %s", {SUBSCRIPTION_HEADER: key})
        log.info("asked %s?subscription-key=%s", root, key)
    assert key not in caplog.text
    with pytest.raises(ValueError, match="Key Vault"):
        Access("https://x", "", "", subscription_key="@Microsoft.KeyVault(SecretUri=https://v.vault.azure.net/s/k)")
