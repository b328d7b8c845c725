"""Fetching what the catalogs found, with credentials that reach only where they belong:
Planetary Computer SAS tokens per container, renewed before they expire (and at once when
storage refuses one); the Earthdata token across the login redirect and never to another
host; no token or signature in any error text."""

from __future__ import annotations

import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date

import httpx
import pytest
import respx

from bagpipe.azurite import Azurite
from bagpipe.earthdata import Earthdata
from bagpipe.planetary import Planetary
from pipeline.failures import FailureClass, StageFailure
from pipeline.modis.access import Access, SasSigner, blob_container
from pipeline.modis.access import Earthdata as EarthdataClient
from pipeline.modis.cmr import CmrCatalog
from pipeline.modis.granules import Granule
from pipeline.modis.products import CATALOG
from pipeline.modis.stac import StacCatalog
from pipeline.redact import RedactingFilter

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
