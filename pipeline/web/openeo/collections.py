"""The MODIS products as openEO's collections: STAC collections (1.1.0) with the data cube
extension's ``cube:dimensions`` (x and y on the default lon/lat grid, t by the product's
compositing period, bands the product's layers) and the EO extension's bands with their common
names, built from the product catalog (``pipeline.modis.products``), which owns each layer's
encoding. A collection's id is the product's short name (``MOD13A1``), as the native API
names products; where it comes from is Planetary Computer's collection or NASA's CMR
(``BAGPIPE_CATALOG``), named in its links."""

from __future__ import annotations

from typing import Any

from pipeline.modis.products import CATALOG, LP_DAAC, NSIDC, STEP_DAYS, Layer, Product
from pipeline.requests.request import Grid

STAC_VERSION = "1.1.0"
EXTENSIONS = ["https://stac-extensions.github.io/datacube/v2.2.0/schema.json",
              "https://stac-extensions.github.io/eo/v1.1.0/schema.json"]
# the first day of each product's data: Terra's, Aqua's (Planetary Computer's collections' extents),
# and of the products whose record starts later (their user guides' first granules)
FIRST = {"terra": "2000-02-18T00:00:00Z", "aqua": "2002-07-04T00:00:00Z", "terra,aqua": "2000-02-16T00:00:00Z"}
FIRST_OF = {"MCD64A1": "2000-11-01T00:00:00Z", "MCD12Q1": "2001-01-01T00:00:00Z", "MCD15A2H": "2002-07-04T00:00:00Z"}
# each DAAC: its name, and its data use policy
DAACS = {LP_DAAC: ("LP DAAC", "https://lpdaac.usgs.gov/data/data-citation-and-policies/"),
         NSIDC: ("NSIDC", "https://nsidc.org/about/use_copyright.html")}


def step(product: Product) -> str:
    """The product's compositing period as an ISO 8601 duration (the cube's t step)."""
    days = STEP_DAYS.get(product.cadence)
    return f"P{days}D" if days else "P1M" if product.cadence == "monthly" else "P1Y"


def band(product: Product, layer: Layer, common: dict[str, str]) -> dict[str, Any]:
    """A layer as an EO band: its name, common name where it has one, unit and encoding."""
    found: dict[str, Any] = {"name": layer.name, "description": f"{layer.name} ({layer.dtype}"
                             + (f", scale {layer.scale:g}" if layer.scale != 1 else "")
                             + (f", offset {layer.offset:g}" if layer.offset else "")
                             + (f", {layer.unit}" if layer.unit else "") + ")"}
    names = {v: k for k, v in common.items()}
    if layer.name in names:
        found["common_name"] = names[layer.name]
    return found


def collection(name: str, base: str, common: dict[str, str]) -> dict[str, Any]:
    """The collection of product ``name``, its links under ``base`` (the API's root)."""
    product = CATALOG[name]
    spec = Grid().spec()
    daac, licence = DAACS[product.daac]
    first = FIRST_OF.get(product.name, FIRST[product.platform])
    source = (f"Planetary Computer ({product.stac_collection}) or NASA's archives" if product.stac_collection
              else "NASA's archives")
    return {
        "stac_version": STAC_VERSION,
        "stac_extensions": EXTENSIONS,
        "type": "Collection",
        "id": product.name,
        "title": f"MODIS {product.name} v{product.collection[1:]}: {product.title}",
        "description": f"{product.title}: collection {product.collection} of NASA's MODIS product {product.name} "
                       f"({daac}; its layers: {', '.join(product.layer_names)}). bagpipe reads its granules from "
                       f"{source}, masks each layer by its quality layer where it has one, and reprojects it onto "
                       "the job's grid.",
        "keywords": ["MODIS", product.platform.replace(",", " "), product.name],
        "license": "proprietary",
        "providers": [{"name": "NASA", "roles": ["producer", "licensor"], "url": licence},
                      {"name": "bagpipe", "roles": ["processor"]}],
        "extent": {"spatial": {"bbox": [[-180.0, -90.0, 180.0, 90.0]]}, "temporal": {"interval": [[first, None]]}},
        "cube:dimensions": {
            "x": {"type": "spatial", "axis": "x", "extent": [-180.0, 180.0], "step": spec.resolution,
                  "reference_system": 4326},
            "y": {"type": "spatial", "axis": "y", "extent": [-90.0, 90.0], "step": spec.resolution,
                  "reference_system": 4326},
            "t": {"type": "temporal", "extent": [first, None], "step": step(product)},
            "bands": {"type": "bands", "values": product.layer_names},
        },
        "summaries": {
            "eo:bands": [band(product, layer, common) for layer in product.layers],
            "platform": product.platform.split(","),
            "instruments": ["modis"],
        },
        "links": [
            {"rel": "self", "href": f"{base}/collections/{product.name}", "type": "application/json"},
            {"rel": "root", "href": f"{base}/", "type": "application/json"},
            {"rel": "parent", "href": f"{base}/collections", "type": "application/json"},
            {"rel": "license", "href": licence, "type": "text/html", "title": "NASA's data use policy"},
            {"rel": "cite-as", "href": f"https://doi.org/10.5067/MODIS/{product.name}.{product.collection}"},
        ],
    }
