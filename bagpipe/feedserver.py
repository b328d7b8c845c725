"""The local stack's MODIS feed: an HTTP server laid out like NASA's archives that serves
the real granules in ``data/modis`` and, for every other (product, tile, date),
a synthesized one on the exact MODIS grid with the product's real encoding (data type,
fill value, scale factor), deterministic from (product, tile, date).

URL: ``/{product}.{collection}/{YYYY.MM.DD}/{product}.A{YYYYDDD}.{tile}.{collection}.{layer}.tif``
(the template :data:`TEMPLATE` under the server's base URL).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import sys
import threading
from collections import Counter
from datetime import date, datetime
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
from rasterio.io import MemoryFile

from pipeline.grid import RADIUS, Tile
from pipeline.products import CATALOG, Product
from pipeline.targets import native_transform, sinusoidal
from pipeline.transfer import md5_of

TEMPLATE = "/{product}.{collection}/{ymd}/{name}"
REAL_DATA = Path(__file__).resolve().parents[1] / "data" / "modis"
_PATH = re.compile(r"^/(\w+)\.(\d{3})/(\d{4}\.\d\d\.\d\d)/(\w+)\.A(\d{7})\.(h\d\dv\d\d)\.(\d{3})\.(\w+)\.tif$")


def real_granule(product: str, tile: str, day: date) -> Path | None:
    """The real layer file of a granule, if ``data/modis`` has it."""
    layer = CATALOG[product].layer.name
    stamp = f"A{day.year}{day.timetuple().tm_yday:03d}"
    found = sorted(REAL_DATA.glob(f"{product}.{stamp}.{tile}.*_{layer}.tif"))
    return found[0] if found else None


def _field(seed: bytes, shape: tuple[int, int], cells: int = 24) -> np.ndarray:
    """Smooth noise in [0, 1): a coarse random lattice, bilinearly upsampled."""
    rng = np.random.default_rng(int.from_bytes(seed[:8], "big"))
    coarse = rng.random((cells + 1, cells + 1))
    ys = np.linspace(0, cells, shape[0], endpoint=False)
    xs = np.linspace(0, cells, shape[1], endpoint=False)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    a, b = coarse[y0][:, x0], coarse[y0][:, x0 + 1]
    c, d = coarse[y0 + 1][:, x0], coarse[y0 + 1][:, x0 + 1]
    return (a * (1 - fx) + b * fx) * (1 - fy) + (c * (1 - fx) + d * fx) * fy


def _values(product: Product, tile: Tile, day: date) -> np.ndarray:
    layer = product.layer
    n = layer.pixels
    transform = native_transform(tile, n)
    cols = transform.c + (np.arange(n) + 0.5) * transform.a
    rows = transform.f + (np.arange(n) + 0.5) * transform.e
    lat = np.degrees(rows / RADIUS)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        lon = np.degrees(cols[None, :] / (RADIUS * np.cos(np.radians(lat))))
    on_globe = np.abs(lon) <= 180
    seed = hashlib.sha256(f"{product.name}/{tile.name}/{day.isoformat()}".encode()).digest()
    noise = _field(seed, (n, n))
    season = math.cos(2 * math.pi * (day.timetuple().tm_yday - 15) / 365.25)  # 1 in mid-January
    if product.name == "MOD10A2":
        snowline = 45 - 10 * season  # degrees of latitude, lower in winter
        out = np.where(np.abs(lat) + 12 * (noise - 0.5) > snowline, 200, 25)
        out = np.where(_field(seed[8:], (n, n)) > 0.8, 50, out)  # cloud
    else:
        low, high = {"MOD13A1": (0.05, 0.8), "MOD11A1": (250.0, 320.0), "MCD43A4": (0.02, 0.4)}[product.name]
        physical = low + (high - low) * (0.7 * noise + 0.3 * np.cos(np.radians(lat)))
        out = np.round((physical - layer.offset) / layer.scale)
    return np.where(on_globe, out, layer.nodata).astype(layer.dtype)


@lru_cache(maxsize=64)
def synthesize(product_name: str, tile_name: str, day: date) -> bytes:
    """A granule layer as a tiled, compressed GeoTIFF in the MODIS sinusoidal projection."""
    product, tile = CATALOG[product_name], Tile.parse(tile_name)
    layer = product.layer
    profile = {
        "driver": "GTiff", "width": layer.pixels, "height": layer.pixels, "count": 1, "dtype": layer.dtype,
        "crs": sinusoidal(), "transform": native_transform(tile, layer.pixels), "nodata": layer.nodata,
        "tiled": True, "blockxsize": 512, "blockysize": 512, "compress": "deflate",
    }
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(_values(product, tile, day), 1)
            dst.scales, dst.offsets = (layer.scale,), (layer.offset,)
            dst.update_tags(SHORTNAME=product_name, TILE=tile_name, RANGEBEGINNINGDATE=day.isoformat(),
                            _FillValue=str(layer.nodata), SYNTHESIZED="bagpipe feed server")
        return memory.read()


def granule(product: str, tile: str, day: date) -> bytes | None:
    """What the feed serves for a granule, or None (no such product, tile off the globe)."""
    if product not in CATALOG:
        return None
    try:
        parsed = Tile.parse(tile)
    except ValueError:
        return None
    if not parsed.has_land_pixels():
        return None
    real = real_granule(product, tile, day)
    return real.read_bytes() if real else synthesize(product, tile, day)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        match = _PATH.match(self.path.split("?")[0])
        data = None
        if match:
            product, _, ymd, name_product, _, tile, _, _ = match.groups()
            try:
                day = datetime.strptime(ymd, "%Y.%m.%d").date()
            except ValueError:
                day = None
            if day and name_product == product:
                data = granule(product, tile, day)
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.served[self.path] += 1  # type: ignore[attr-defined]
        if data is None:
            self.send_error(404, "no such granule")
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/tiff")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-MD5", base64.b64encode(md5_of(data)).decode())
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the stack's own log says what ran


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return  # the client went away mid-download (a killed worker): nothing to report
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class FeedServer:
    """The feed on a free port of 127.0.0.1, served from a thread."""

    def __init__(self, port: int = 0) -> None:
        self.server = _Server(("127.0.0.1", port), _Handler)
        self.server.daemon_threads = True
        self.server.served = Counter()  # type: ignore[attr-defined]  # requests per path
        self.server.lock = threading.Lock()  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, name="feed", daemon=True)

    @property
    def served(self) -> Counter[str]:
        """How often each path was asked for."""
        return self.server.served  # type: ignore[attr-defined,no-any-return]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def template(self) -> str:
        return self.url + TEMPLATE

    def start(self) -> FeedServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FeedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
