"""Process graphs compiled onto bagpipe requests: what each cube process becomes (region,
span, layers, derived layers, the grouped reduction), the derived expressions' values, and
the refusals, each naming its process."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import xarray
from openeo.udf import OpenEoUdfException, UdfData, XarrayDataCube
from openeo.udf.run_code import run_udf_code
from shapely.geometry import shape

from pipeline.reduction import udf
from pipeline.science import expressions
from pipeline.web.openeo import pixels
from pipeline.web.openeo.graph import CompileError, compile_graph

BOX = {"west": -108.0, "south": 35.2, "east": -107.5, "north": 35.8}
RED, NIR = "MCD43A4.Nadir_Reflectance_Band1", "MCD43A4.Nadir_Reflectance_Band2"


def reducer(process: str, **arguments: Any) -> dict[str, Any]:
    return {"process_graph": {"r": {"process_id": process, "arguments": {"data": {"from_parameter": "data"},
                                                                          **arguments}, "result": True}}}


def graph(*nodes: tuple[str, str, dict[str, Any]], product: str = "MCD43A4", bands: list[str] | None = None,
          extent: list[str] | None = None) -> dict[str, Any]:
    """load → the nodes in order (each reading the one before as ``data``) → save_result."""
    flat: dict[str, Any] = {"load": {"process_id": "load_collection", "arguments": {
        "id": product, "spatial_extent": BOX, "temporal_extent": extent or ["2022-03-01", "2022-03-03"],
        "bands": bands if bands is not None else ["red", "nir"]}}}
    before = "load"
    for key, process, arguments in nodes:
        flat[key] = {"process_id": process, "arguments": {"data": {"from_node": before}, **arguments}}
        before = key
    flat["save"] = {"process_id": "save_result", "arguments": {"data": {"from_node": before}, "format": "GTiff"},
                    "result": True}
    return {"process_graph": flat}


def values(text: str, **bands: float) -> float:
    """An expression's value on one pixel of the bands given (by PRODUCT.LAYER)."""
    found = expressions.parse(text).evaluate({f"MCD43A4.{k}": np.array([v]) for k, v in bands.items()}, np.float64)
    return float(found[0])


def test_load_and_filters_are_the_region_span_products_and_layers() -> None:
    process = graph(("bbox", "filter_bbox", {"extent": {"west": -107.9, "south": 35.0, "east": -107.0,
                                                        "north": 35.5}}),
                    ("time", "filter_temporal", {"extent": ["2022-03-02", "2022-04-01"]}),
                    ("bands", "filter_bands", {"bands": ["nir"]}))
    compiled = compile_graph(process)
    request = compiled.request
    assert request.region.bbox == (-107.9, 35.2, -107.5, 35.5)  # the two boxes' overlap
    assert (request.start.isoformat(), request.end.isoformat()) == ("2022-03-02", "2022-03-02")  # ends exclusive
    assert request.products == ["MCD43A4"] and request.layers == {"MCD43A4": ["Nadir_Reflectance_Band2"]}
    assert request.derive is None and request.reduce is None
    assert compiled.layers == {"MCD43A4": ["Nadir_Reflectance_Band2"]} and compiled.format == "GTiff"


def test_an_end_with_a_time_of_day_keeps_its_day_and_another_crs_is_transformed() -> None:
    process = graph(extent=["2022-03-01T00:00:00Z", "2022-03-03T12:00:00Z"])
    process["process_graph"]["load"]["arguments"]["spatial_extent"] = {
        "west": 500000, "south": 3900000, "east": 540000, "north": 3950000, "crs": 32613}
    request = compile_graph(process).request
    assert request.end.isoformat() == "2022-03-03"
    west, south, east, north = request.region.bbox  # type: ignore[misc]
    assert -105.1 < west < -104.9 and 35.2 < south < 35.3 and east < -104.5 and 35.6 < north < 35.7


def test_ndvi_is_a_derived_layer_of_the_common_name_bands() -> None:
    compiled = compile_graph(graph(("ndvi", "ndvi", {})))
    ((name, text),) = compiled.request.derive["MCD43A4"].items()  # type: ignore[index]
    assert name == "ndvi" and compiled.layers == {"MCD43A4": ["ndvi"]}
    assert values(text, Nadir_Reflectance_Band1=0.1, Nadir_Reflectance_Band2=0.5) == pytest.approx(0.4 / 0.6)
    kept = compile_graph(graph(("ndvi", "ndvi", {"target_band": "NDVI"})))
    assert kept.layers == {"MCD43A4": ["Nadir_Reflectance_Band1", "Nadir_Reflectance_Band2", "ndvi"]}
    for product, red, nir in (("MOD09A1", "sur_refl_b01", "sur_refl_b02"),  # any product with those bands
                              ("MYD13Q1", "250m_16_days_red_reflectance", "250m_16_days_NIR_reflectance")):
        other = compile_graph(graph(("ndvi", "ndvi", {}), product=product, extent=["2022-03-01", "2022-03-20"]))
        assert other.request.derive == {product: {"ndvi": f"(({product}.{nir} - {product}.{red}) / "
                                                          f"({product}.{nir} + {product}.{red}))"}}, product


def test_band_math_under_reduce_dimension_and_apply_are_expressions_per_pixel() -> None:
    math = {"process_graph": {
        "r": {"process_id": "array_element", "arguments": {"data": {"from_parameter": "data"}, "label": "red"}},
        "n": {"process_id": "array_element", "arguments": {"data": {"from_parameter": "data"}, "index": 1}},
        "d": {"process_id": "normalized_difference", "arguments": {"x": {"from_node": "n"}, "y": {"from_node": "r"}},
              "result": True}}}
    scale = {"process_graph": {"s": {"process_id": "linear_scale_range", "arguments": {
        "x": {"from_parameter": "x"}, "inputMin": -1, "inputMax": 1, "outputMax": 200}, "result": True}}}
    compiled = compile_graph(graph(("nd", "reduce_dimension", {"dimension": "bands", "reducer": math}),
                                   ("scaled", "apply", {"process": scale})))
    ((name, text),) = compiled.request.derive["MCD43A4"].items()  # type: ignore[index]
    assert compiled.layers == {"MCD43A4": [name]}
    assert values(text, Nadir_Reflectance_Band1=0.1, Nadir_Reflectance_Band2=0.3) == pytest.approx(150.0)
    assert values(text, Nadir_Reflectance_Band1=0.0, Nadir_Reflectance_Band2=0.0) != values(
        text, Nadir_Reflectance_Band1=0.0, Nadir_Reflectance_Band2=0.0)  # 0/0: no value (NaN)


def test_a_mask_by_a_quality_band_of_the_same_product_replaces_masked_pixels() -> None:
    flat = graph(bands=["red"])["process_graph"]
    flat["qa"] = {"process_id": "load_collection", "arguments": {
        "id": "MCD43A4", "spatial_extent": BOX, "temporal_extent": ["2022-03-01", "2022-03-03"],
        "bands": ["BRDF_Albedo_Band_Mandatory_Quality_Band1"]}}
    flat["masked"] = {"process_id": "mask", "arguments": {"data": {"from_node": "load"}, "mask": {"from_node": "qa"},
                                                          "replacement": -1}}
    flat["save"]["arguments"]["data"] = {"from_node": "masked"}
    compiled = compile_graph({"process_graph": flat})
    ((_, text),) = compiled.request.derive["MCD43A4"].items()  # type: ignore[index]
    assert values(text, Nadir_Reflectance_Band1=0.2, BRDF_Albedo_Band_Mandatory_Quality_Band1=0) == pytest.approx(0.2)
    assert values(text, Nadir_Reflectance_Band1=0.2, BRDF_Albedo_Band_Mandatory_Quality_Band1=1) == -1
    # a pixel the mask has no value for is kept (openEO replaces where the mask is non-zero or true)
    kept = values(text, Nadir_Reflectance_Band1=0.2, BRDF_Albedo_Band_Mandatory_Quality_Band1=float("nan"))
    assert kept == pytest.approx(0.2)
    # a mask of truth values (the quality band's gt 1): true replaces, false and no value keep
    flat["qa_bad"] = {"process_id": "apply", "arguments": {"data": {"from_node": "qa"}, "process": {"process_graph": {
        "gt": {"process_id": "gt", "arguments": {"x": {"from_parameter": "x"}, "y": 1}, "result": True}}}}}
    flat["masked"]["arguments"] |= {"mask": {"from_node": "qa_bad"}}
    ((_, text),) = compile_graph({"process_graph": flat}).request.derive["MCD43A4"].items()  # type: ignore[index]
    assert [values(text, Nadir_Reflectance_Band1=0.2, BRDF_Albedo_Band_Mandatory_Quality_Band1=qa)
            for qa in (3.0, 1.0, float("nan"))] == pytest.approx([-1, 0.2, 0.2])


@pytest.mark.parametrize(("how", "by"), [("reduce", "span"), ("month", "month"), ("season", "season"),
                                         ("year", "year")])
def test_temporal_reductions_are_the_grouped_reduction(how: str, by: str) -> None:
    if how == "reduce":
        node = ("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("median")})
    else:
        node = ("t", "aggregate_temporal_period", {"period": how, "reducer": reducer("median")})
    compiled = compile_graph(graph(("ndvi", "ndvi", {}), node))
    reduce = compiled.request.reduce
    assert reduce is not None and reduce.by == by and reduce.reducer == "median"
    assert reduce.inputs == ["MCD43A4.ndvi"] and compiled.reduction == "median" and compiled.layers == {}


def test_sd_is_the_sample_std_and_an_apply_after_the_reduction_an_expression_over_it() -> None:
    sd = compile_graph(graph(("ndvi", "ndvi", {}), ("t", "reduce_dimension", {"dimension": "t",
                                                                              "reducer": reducer("sd")})))
    assert sd.request.reduce is not None and sd.request.reduce.reducer == "std"
    double = {"process_graph": {"m": {"process_id": "multiply", "arguments": {"x": {"from_parameter": "x"}, "y": 2},
                                      "result": True}}}
    compiled = compile_graph(graph(("ndvi", "ndvi", {}), ("t", "reduce_dimension", {
        "dimension": "t", "reducer": reducer("max")}), ("twice", "apply", {"process": double})))
    reduce = compiled.request.reduce
    assert reduce is not None and reduce.expression == "(x * 2)" and reduce.aggregate == "max"
    assert reduce.inputs == {"x": "MCD43A4.ndvi"} and compiled.reduction == "result"
    after_sd = refused(graph(("ndvi", "ndvi", {}), ("t", "reduce_dimension", {
        "dimension": "t", "reducer": reducer("sd")}), ("twice", "apply", {"process": double})))
    assert after_sd.process == "apply" and "sd" in after_sd.message


def test_merge_cubes_of_two_products_is_a_reduction_of_several_inputs() -> None:
    flat = graph(("ndvi", "ndvi", {}))["process_graph"]
    del flat["save"]
    flat["lst"] = {"process_id": "load_collection", "arguments": {
        "id": "MOD11A1", "spatial_extent": BOX, "temporal_extent": ["2022-03-01", "2022-03-03"],
        "bands": ["LST_Day_1km"]}}
    flat["merged"] = {"process_id": "merge_cubes", "arguments": {"cube1": {"from_node": "ndvi"},
                                                                  "cube2": {"from_node": "lst"}}}
    flat["max"] = {"process_id": "reduce_dimension", "arguments": {"data": {"from_node": "merged"},
                                                                    "dimension": "t", "reducer": reducer("max")}}
    flat["save"] = {"process_id": "save_result", "arguments": {"data": {"from_node": "max"}, "format": "GTiff"},
                    "result": True}
    request = compile_graph({"process_graph": flat}).request
    assert request.products == ["MCD43A4", "MOD11A1"]
    assert request.reduce is not None and request.reduce.inputs == ["MCD43A4.ndvi", "MOD11A1.LST_Day_1km"]


def refused(process: dict[str, Any]) -> CompileError:
    with pytest.raises(CompileError) as caught:
        compile_graph(process)
    return caught.value


def test_what_cannot_run_per_tile_is_refused_naming_its_process() -> None:
    two = graph(("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("max")}),
                ("t2", "reduce_dimension", {"dimension": "t", "reducer": reducer("min")}))
    assert refused(two).process == "reduce_dimension" and "second temporal" in refused(two).message
    ignoring = graph(("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("max", ignore_nodata=False)}))
    assert refused(ignoring).process == "max" and refused(ignoring).code == "ProcessParameterUnsupported"
    quantile = graph(("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("quantiles")}))
    assert refused(quantile).process == "quantiles"
    after = graph(("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("max")}), ("n", "ndvi", {}))
    assert refused(after).process == "ndvi" and "after a temporal reduction" in refused(after).message
    nodata = {"process_graph": {"i": {"process_id": "is_nodata", "arguments": {"x": {"from_parameter": "x"}},
                                      "result": True}}}
    unsupported = refused(graph(("a", "apply", {"process": nodata})))
    assert unsupported.code == "ProcessUnsupported" and unsupported.process == "is_nodata"
    assert refused(graph(("n", "ndvi", {"red": "B04"}))).code == "RedBandAmbiguous"


def test_a_graph_that_is_not_one_is_process_graph_invalid() -> None:
    assert refused({"process_graph": {}}).code == "ProcessGraphMissing"
    no_result = graph()
    no_result["process_graph"]["save"]["result"] = False
    assert refused(no_result).code == "ProcessGraphInvalid"
    cycle = graph(("a", "apply", {"process": {"process_graph": {}}}))
    cycle["process_graph"]["load"] = {"process_id": "filter_bbox", "arguments": {"data": {"from_node": "a"}}}
    assert refused(cycle).code == "ProcessGraphInvalid"
    bad_id = graph()
    bad_id["process_graph"]["load"]["process_id"] = "load collection"
    assert refused(bad_id).code == "ProcessGraphInvalid"


def test_the_pixel_compiler_writes_each_process_as_the_expression_language_does() -> None:
    x = pixels.Expr("x")
    for process, arguments, expected in [
        ("add", {"x": 1, "y": 2}, 3.0), ("subtract", {"x": 1, "y": 2}, -1.0), ("power", {"base": 2, "p": 3}, 8.0),
        ("divide", {"x": 1, "y": 4}, 0.25), ("absolute", {"x": -2.5}, 2.5), ("clip", {"x": 5, "min": 0, "max": 3}, 3),
        ("if", {"value": {"from_parameter": "x"}, "accept": 7, "reject": 8}, 7.0),
        ("linear_scale_range", {"x": 0.5, "inputMin": 0, "inputMax": 1}, 0.5),
        ("linear_scale_range", {"x": 10, "inputMin": 100, "inputMax": 0}, 0.9),  # an input range upside down
        ("exp", {"p": 0}, 1.0),  # (exp's argument is p)
    ]:
        child = {"process_graph": {"p": {"process_id": process, "arguments": arguments, "result": True}}}
        text = pixels.expression(child, {"x": x}, "apply", ["x"]).text
        found = expressions.parse(text, ["x"]).evaluate({"x": np.array([1.0])}, np.float64)
        assert float(np.ravel(found)[0]) == pytest.approx(expected), (process, text)
    power = {"process_graph": {"p": {"process_id": "power", "arguments": {"base": 1, "p": None}, "result": True}}}
    text = pixels.expression(power, {"x": x}, "apply", ["x"]).text
    assert np.isnan(expressions.parse(text, ["x"]).evaluate({"x": np.array([1.0])}, np.float64))  # 1 ** no value
    swapped = {"process_graph": {"c": {"process_id": "clip", "arguments": {
        "x": {"from_parameter": "x"}, "min": 1, "max": -1}, "result": True}}}
    with pytest.raises(pixels.Invalid, match="MinMaxSwapped"):
        pixels.expression(swapped, {"x": x}, "apply", ["x"])


def ring(west: float, south: float, east: float, north: float) -> list[list[list[float]]]:
    return [[[west, south], [east, south], [east, north], [west, north], [west, south]]]


INSIDE = {"type": "Polygon", "coordinates": [[[-107.9, 35.3], [-107.6, 35.3], [-107.7, 35.7], [-107.9, 35.3]]]}


def test_polygons_are_the_regions_geometry_clipped_to_the_box() -> None:
    process = graph()
    process["process_graph"]["load"]["arguments"]["spatial_extent"] = INSIDE  # a load's extent as GeoJSON
    request = compile_graph(process).request
    assert request.region.geometry == INSIDE and request.region.bbox is None  # type: ignore[union-attr]
    within = compile_graph(graph(("clip", "filter_spatial", {"geometries": INSIDE}))).request
    assert within.region.geometry == INSIDE  # type: ignore[union-attr]  # inside the load's box: as given
    two = {"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {}, "geometry": INSIDE},
        {"type": "Feature", "properties": {}, "geometry": {"type": "Polygon", "coordinates": ring(
            -107.55, 35.0, -107.0, 35.3)}}]}  # a second polygon, across the box's south-east corner
    found = compile_graph(graph(("clip", "filter_spatial", {"geometries": two}))).request.region
    assert found is not None and found.geometry is not None and found.geometry["type"] == "MultiPolygon"
    parts = sorted(shape(found.geometry).geoms, key=lambda p: p.bounds[0])
    assert parts[0].equals(shape(INSIDE))  # their union
    corner = np.array(parts[1].exterior.coords)  # the other cut to the box: -107.55..-107.5, 35.2..35.3
    assert corner[:, 0].min() == -107.55 and corner[:, 0].max() == -107.5 and corner[:, 1].min() == 35.2
    box_after = compile_graph(graph(("clip", "filter_spatial", {"geometries": INSIDE}), ("b", "filter_bbox", {
        "extent": {"west": -108.0, "south": 35.5, "east": -107.0, "north": 36.0}}))).request.region
    assert box_after is not None and box_after.geometry is not None  # the polygon's part north of 35.5
    assert np.array(box_after.geometry["coordinates"][0])[:, 1].min() == 35.5


def test_polygons_that_cannot_be_a_region_are_refused_naming_the_process() -> None:
    point = refused(graph(("clip", "filter_spatial", {"geometries": {"type": "Point", "coordinates": [-107.8, 35.4]}})))
    assert point.process == "filter_spatial" and point.code == "ProcessParameterUnsupported" and "Point" in (
        point.message)
    crossing = {"type": "Polygon", "coordinates": [[[-107.9, 35.3], [-107.6, 35.7], [-107.6, 35.3],
                                                    [-107.9, 35.7], [-107.9, 35.3]]]}
    bowtie = refused(graph(("clip", "filter_spatial", {"geometries": crossing})))
    assert bowtie.code == "ProcessParameterInvalid" and "filter_spatial: geometries" in bowtie.message
    assert "Self-intersection" in bowtie.message
    elsewhere = refused(graph(("clip", "filter_spatial", {"geometries": {"type": "Polygon", "coordinates": ring(
        10.0, 10.0, 11.0, 11.0)}})))
    assert elsewhere.process == "filter_spatial" and "does not overlap" in elsewhere.message
    projected = refused(graph(("clip", "filter_spatial", {"geometries": INSIDE | {"crs": "EPSG:32613"}})))
    assert projected.code == "ProcessParameterUnsupported" and "EPSG:32613" in projected.message
    after = refused(graph(("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("count")}),
                          ("clip", "filter_spatial", {"geometries": INSIDE})))
    assert after.process == "filter_spatial" and "after a temporal reduction" in after.message
    huge = {"type": "Polygon", "coordinates": [[[-107.9 + i * 1e-7, 35.3] for i in range(100_001)]]}
    many = refused(graph(("clip", "filter_spatial", {"geometries": huge})))
    assert many.process == "filter_spatial" and "100,000 vertices" in many.message


def test_mask_polygon_masks_the_box_which_stays_the_extent() -> None:
    """mask_polygon is the box and the polygons (every tile of the box clipped to them), not
    the polygons alone as filter_spatial; inside true keeps the box less the polygons."""
    region = compile_graph(graph(("m", "mask_polygon", {"mask": INSIDE}))).request.region
    assert region is not None and region.bbox == (-108.0, 35.2, -107.5, 35.8) and region.geometry == INSIDE
    assert region.masked
    inverted = compile_graph(graph(("m", "mask_polygon", {"mask": INSIDE, "inside": True}))).request.region
    assert inverted is not None and inverted.bbox == (-108.0, 35.2, -107.5, 35.8) and inverted.geometry is not None
    kept = shape(inverted.geometry)
    assert kept.union(shape(INSIDE)).equals(shape({"type": "Polygon", "coordinates": ring(-108.0, 35.2, -107.5,
                                                                                          35.8)}))
    assert kept.intersection(shape(INSIDE)).area < 1e-12
    boxed = compile_graph(graph(("m", "mask_polygon", {"mask": INSIDE}), ("b", "filter_bbox", {
        "extent": {"west": -108.0, "south": 35.5, "east": -107.0, "north": 36.0}}))).request.region
    assert boxed is not None and boxed.bbox == (-108.0, 35.5, -107.5, 35.8)  # the box is still the extent
    assert boxed.geometry is not None and np.array(boxed.geometry["coordinates"][0])[:, 1].min() == 35.5
    clipped = compile_graph(graph(("m", "mask_polygon", {"mask": INSIDE}), ("c", "filter_spatial", {
        "geometries": INSIDE}))).request.region
    assert clipped is not None and clipped.bbox is None and clipped.geometry is not None  # filter_spatial's extent
    assert shape(clipped.geometry).equals(shape(INSIDE))


def test_what_mask_polygon_cannot_do_is_refused_naming_the_process() -> None:
    replaced = refused(graph(("m", "mask_polygon", {"mask": INSIDE, "replacement": 0})))
    assert replaced.process == "mask_polygon" and replaced.code == "ProcessParameterUnsupported"
    after = refused(graph(("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("max")}),
                          ("m", "mask_polygon", {"mask": INSIDE})))
    assert after.process == "mask_polygon" and "after a temporal reduction" in after.message
    whole = refused(graph(("m", "mask_polygon", {"mask": {"type": "Polygon", "coordinates": ring(
        -109.0, 35.0, -107.0, 36.0)}, "inside": True})))
    assert whole.process == "mask_polygon" and "no pixel" in whole.message
    point = refused(graph(("m", "mask_polygon", {"mask": {"type": "Point", "coordinates": [-107.8, 35.4]}})))
    assert point.process == "mask_polygon" and "mask_polygon: mask" in point.message


@pytest.mark.parametrize(("given", "output"), [("netCDF", "netcdf"), ("NetCDF", "netcdf"), ("ZARR", "zarr"),
                                               ("GTiff", None)])
def test_save_result_as_netcdf_or_zarr_is_the_requests_cube_output(given: str, output: str | None) -> None:
    process = graph(("t", "aggregate_temporal_period", {"period": "month", "reducer": reducer("max")}))
    process["process_graph"]["save"]["arguments"]["format"] = given
    compiled = compile_graph(process)
    found = compiled.request.output
    assert (found.format if found is not None else None) == output
    assert compiled.format == {"netcdf": "netCDF", "zarr": "Zarr", None: "GTiff"}[output]
    assert compiled.reduction == "max"
    process["process_graph"]["save"]["arguments"]["format"] = "JSON"
    assert refused(process).code == "FormatUnsuitable" and "netCDF" in refused(process).message


FIELDS = {"type": "FeatureCollection", "features": [
    {"type": "Feature", "id": "north", "properties": {}, "geometry": INSIDE},
    {"type": "Feature", "properties": {"name": "south"}, "geometry": {"type": "Polygon", "coordinates": ring(
        -107.9, 35.2, -107.7, 35.25)}}]}


def zonal(*before: tuple[str, str, dict[str, Any]], reducer_: dict[str, Any] | None = None,
          geometries: dict[str, Any] | None = None, fmt: str = "CSV") -> dict[str, Any]:
    """load → the nodes given → aggregate_spatial (a mean by default) → save_result as a table."""
    process = graph(*before, ("zones", "aggregate_spatial", {"geometries": geometries or FIELDS,
                                                             "reducer": reducer_ or reducer("mean")}))
    process["process_graph"]["save"]["arguments"]["format"] = fmt
    return process


def test_aggregate_spatial_is_the_requests_zones_per_date_counting_pixels_by_their_centre() -> None:
    compiled = compile_graph(zonal(("ndvi", "ndvi", {})))
    zones = compiled.request.zones
    assert zones is not None and zones.by == "date" and zones.weights == "centre"
    assert zones.statistics == ["mean"] and zones.percentiles == [] and zones.inputs == ["MCD43A4.ndvi"]
    assert [f["id"] for f in zones.features["features"]] == ["north", "south"]  # type: ignore[index]
    assert compiled.request.reduce is None and compiled.request.region.bbox == (  # type: ignore[union-attr]
        -108.0, 35.2, -107.5, 35.8)
    assert compiled.format == "CSV" and compiled.layers == {} and compiled.reduction == ""
    for process, statistics, percentiles in (("median", ["median"], []), ("sd", ["sd"], []),
                                             ("count", ["count"], []), ("sum", ["sum"], [])):
        found = compile_graph(zonal(reducer_=reducer(process))).request.zones
        assert found is not None and (found.statistics, found.percentiles) == (statistics, percentiles), process
    quantiles = compile_graph(zonal(reducer_=reducer("quantiles", probabilities=[0.1, 0.5, 0.9]), fmt="Parquet"))
    assert quantiles.request.zones is not None and quantiles.format == "Parquet"
    assert (quantiles.request.zones.statistics, quantiles.request.zones.percentiles) == ([], [10.0, 50.0, 90.0])
    for quarters in (reducer("quantiles", q=4), reducer("quantiles", probabilities=4)):  # 1.x's q, 2.0's number
        found = compile_graph(zonal(reducer_=quarters)).request.zones
        assert found is not None and found.percentiles == [25.0, 50.0, 75.0]
    descending = refused(zonal(reducer_=reducer("quantiles", probabilities=[0.9, 0.1])))
    assert descending.code == "AscendingProbabilitiesRequired" and descending.process == "quantiles"
    unsaved = zonal()
    del unsaved["process_graph"]["save"]
    unsaved["process_graph"]["zones"]["result"] = True
    assert compile_graph(unsaved).format == "CSV"  # a table not saved is saved as CSV
    one = compile_graph(zonal(geometries=INSIDE)).request.zones  # a polygon alone: one zone, 0
    assert one is not None and [f["id"] for f in one.features["features"]] == ["0"]  # type: ignore[index]
    unnamed = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": INSIDE},
                                                          {"type": "Feature", "geometry": INSIDE}]}
    two = compile_graph(zonal(geometries=unnamed)).request.zones  # labelled by their place, as openEO has it
    assert two is not None and [f["id"] for f in two.features["features"]] == ["0", "1"]  # type: ignore[index]


def test_aggregate_spatial_after_a_temporal_reduction_is_over_its_outputs() -> None:
    """After a temporal reduction the zones' statistics are of its outputs, a raster per group
    (a zone's mean of each pixel's monthly mean), whatever the two reducers."""
    for temporal, spatial in (("mean", "mean"), ("max", "mean"), ("median", "median"), ("sd", "sd"),
                              ("count", "sum")):
        compiled = compile_graph(zonal(("ndvi", "ndvi", {}), ("t", "aggregate_temporal_period", {
            "period": "month", "reducer": reducer(temporal)}), reducer_=reducer(spatial)))
        zones, reduce = compiled.request.zones, compiled.request.reduce
        assert zones is not None and zones.over == "reduction" and zones.statistics == [spatial], temporal
        assert zones.inputs is None and zones.by == "date" and zones.weights == "centre"
        assert reduce is not None and reduce.by == "month" and reduce.inputs == ["MCD43A4.ndvi"]
        assert reduce.reducer == ("std" if temporal == "sd" else temporal) and compiled.format == "CSV"
    double = {"process_graph": {"m": {"process_id": "multiply", "arguments": {"x": {"from_parameter": "x"}, "y": 2},
                                      "result": True}}}
    applied = compile_graph(zonal(("ndvi", "ndvi", {}), ("t", "reduce_dimension", {
        "dimension": "t", "reducer": reducer("max")}), ("twice", "apply", {"process": double}))).request
    assert applied.zones is not None and applied.zones.over == "reduction"
    assert applied.reduce is not None and applied.reduce.expression == "(x * 2)"


def point(lon: float, lat: float, **feature: Any) -> dict[str, Any]:
    return {"type": "Feature", "properties": {}, "geometry": {"type": "Point", "coordinates": [lon, lat]}, **feature}


SITES = {"type": "FeatureCollection", "features": [point(-107.8, 35.4, id="US-Vcm"), point(-107.6, 35.7)]}


def test_aggregate_spatial_at_points_is_the_requests_sites_saved_as_openeos_time_series() -> None:
    """Points are the request's sites (no region: sampled where they are), in the
    geometries' order, each named as a zone is; saved as JSON (the default), CSV or Parquet."""
    compiled = compile_graph(zonal(("ndvi", "ndvi", {}), geometries=SITES, fmt="JSON"))
    request = compiled.request
    assert request.sites is not None and request.sites.points == [
        {"id": "US-Vcm", "lon": -107.8, "lat": 35.4}, {"id": "1", "lon": -107.6, "lat": 35.7}]
    assert request.region is None and request.zones is None and request.reduce is None
    assert request.derive == {"MCD43A4": {"ndvi": compiled.request.derive["MCD43A4"]["ndvi"]}}  # type: ignore[index]
    assert request.output is not None and request.output.format == "json" and compiled.format == "JSON"
    for fmt in ("CSV", "Parquet"):
        saved = compile_graph(zonal(geometries=SITES, reducer_=reducer("first"), fmt=fmt))
        assert saved.format == fmt and saved.request.output is None and saved.request.sites is not None
    unsaved = zonal(geometries={"type": "Point", "coordinates": [-107.8, 35.4]})
    del unsaved["process_graph"]["save"]
    unsaved["process_graph"]["zones"]["result"] = True
    alone = compile_graph(unsaved)  # one Point: site 0; not saved: JSON
    assert alone.format == "JSON" and alone.request.sites.points == [  # type: ignore[union-attr]
        {"id": "0", "lon": -107.8, "lat": 35.4}]


def test_what_aggregate_spatial_at_points_cannot_do_is_refused_naming_the_process() -> None:
    outside = refused(zonal(geometries={"type": "FeatureCollection", "features": [point(-107.8, 35.4),
                                                                                  point(-100.0, 35.4)]}))
    assert outside.process == "aggregate_spatial" and "geometries[1]" in outside.message
    assert "outside" in outside.message
    clipped = refused(zonal(("clip", "filter_spatial", {"geometries": INSIDE}), geometries={
        "type": "Point", "coordinates": [-107.55, 35.75]}))
    assert "outside the data's spatial extent" in clipped.message  # in the box, not in the polygon
    several = refused(zonal(geometries={"type": "MultiPoint", "coordinates": [[-107.8, 35.4], [-107.6, 35.7]]}))
    assert several.code == "ProcessParameterUnsupported" and "MultiPoint" in several.message
    mixed = refused(zonal(geometries={"type": "FeatureCollection", "features": [point(-107.8, 35.4),
                                                                                FIELDS["features"][0]]}))
    assert "points and polygons" in mixed.message
    twice = refused(zonal(geometries={"type": "FeatureCollection", "features": [point(-107.8, 35.4, id="a"),
                                                                                point(-107.6, 35.7, id="a")]}))
    assert "given twice" in twice.message
    for name in ("count", "sd"):
        assert refused(zonal(geometries=SITES, reducer_=reducer(name))).process == name
    monthly = refused(zonal(("t", "aggregate_temporal_period", {"period": "month", "reducer": reducer("max")}),
                            geometries=SITES))
    assert monthly.process == "aggregate_spatial" and "temporal reduction" in monthly.message
    assert refused(zonal(geometries=SITES, fmt="GTiff")).code == "FormatUnsuitable"
    assert refused(zonal(fmt="JSON")).code == "FormatUnsuitable"  # polygons' statistics: CSV or Parquet


def test_what_aggregate_spatial_cannot_do_is_refused_naming_the_process() -> None:
    line = refused(zonal(geometries={"type": "LineString", "coordinates": [[-107.8, 35.4], [-107.7, 35.5]]}))
    assert line.process == "aggregate_spatial" and "LineString" in line.message
    twice = {"type": "FeatureCollection", "features": [FIELDS["features"][0], FIELDS["features"][0]]}
    assert "given twice" in refused(zonal(geometries=twice)).message
    first = refused(zonal(reducer_=reducer("first")))
    assert first.process == "first" and "no order" in first.message
    assert refused(zonal(reducer_=reducer("quantiles"))).code == "QuantilesParameterMissing"
    assert refused(zonal(fmt="GTiff")).code == "FormatUnsuitable"  # a table is CSV or Parquet
    raster = graph()
    raster["process_graph"]["save"]["arguments"]["format"] = "CSV"
    assert refused(raster).code == "FormatUnsuitable"  # a raster is not
    after = zonal()
    flat = after["process_graph"]
    flat["again"] = {"process_id": "apply", "arguments": {"data": {"from_node": "zones"}, "process": reducer("sd")}}
    flat["save"]["arguments"]["data"] = {"from_node": "again"}
    assert "after aggregate_spatial" in refused(after).message
    dimension = zonal()
    dimension["process_graph"]["zones"]["arguments"]["target_dimension"] = "result"
    assert refused(dimension).code == "ProcessParameterUnsupported"


@pytest.mark.parametrize("named", [True, False])
def test_geojson_names_its_crs_alike_for_a_region_zones_and_points(named: bool) -> None:
    """GeoJSON's crs member (a named CRS object of its 2008 draft, or a name alone) is read
    alike wherever GeoJSON is taken: lon/lat is taken, any other CRS refused naming it."""
    def crs(name: str) -> object:
        return {"type": "name", "properties": {"name": name}} if named else name

    lonlat, utm = crs("urn:ogc:def:crs:OGC:1.3:CRS84"), crs("EPSG:32613")
    clipped = compile_graph(graph(("clip", "filter_spatial", {"geometries": INSIDE | {"crs": lonlat}})))
    assert clipped.request.region is not None and clipped.request.region.geometry is not None
    assert compile_graph(zonal(geometries=FIELDS | {"crs": lonlat})).request.zones is not None
    assert compile_graph(zonal(geometries=SITES | {"crs": lonlat})).request.sites is not None
    for process, geojson in (("filter_spatial", graph(("clip", "filter_spatial", {"geometries": INSIDE | {
            "crs": utm}}))), ("aggregate_spatial", zonal(geometries=FIELDS | {"crs": utm})),
                             ("aggregate_spatial", zonal(geometries=SITES | {"crs": utm}))):
        found = refused(geojson)
        assert found.process == process and found.code == "ProcessParameterUnsupported", found.message
        assert "EPSG:32613" in found.message


UDF = """
from openeo.udf import XarrayDataCube


def apply_datacube(cube: XarrayDataCube, context: dict) -> XarrayDataCube:
    return XarrayDataCube(cube.get_array().max(dim="t"))
"""


def run_udf(code: str = UDF, **arguments: Any) -> dict[str, Any]:
    return reducer("run_udf", udf=code, runtime="Python", **arguments)


def test_a_udf_over_t_is_a_reduction_whose_program_is_its_content_addressed_bundle() -> None:
    compiled = compile_graph(graph(("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf(
        context={"from_parameter": "context"}), "context": {"k": 1}})))
    reduce = compiled.request.reduce
    assert reduce is not None and reduce.program is not None and reduce.program.name == "run_udf"
    assert (reduce.by, reduce.inputs, reduce.name, compiled.reduction) == ("span", [RED, NIR], "udf", "udf")
    bundle, program = compiled.bundle(), compiled.program()
    assert bundle is not None and program is not None and program.digest == bundle.digest
    # the mark by which the reduce stage keeps a UDF's outputs (a name is any uploader's to choose),
    # kept through the job's stored program
    assert program.params()["udf"] and type(program).from_json(program.to_json()).params() == program.params()
    assert sorted(bundle.files) == ["bagpipe_udf.py", "reducer.json", "udf.json", "udf.py"]
    assert bundle.files["udf.py"][0].decode() == UDF
    assert json.loads(bundle.files["udf.json"][0]) == {"context": {"k": 1}, "dimension": "t", "mode": "reduce"}
    same = compile_graph(graph(("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf(context={"k": 1})})))
    other = compile_graph(graph(("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf(context={"k": 2})})))
    assert same.program() == program and other.program() != program  # the code and its context are its address
    assert type(compiled).from_json(compiled.to_json()).program() == program
    monthly = compile_graph(graph(("m", "aggregate_temporal_period", {"period": "month", "reducer": run_udf()})))
    assert monthly.request.reduce is not None and monthly.request.reduce.by == "month"
    applied = compile_graph(graph(("a", "apply_dimension", {"dimension": "t", "process": run_udf()})))
    made = applied.bundle()
    assert made is not None and json.loads(made.files["udf.json"][0])["mode"] == "apply"


@pytest.mark.parametrize(("nodes", "code", "wanted"), [
    ([("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf("def f(:\n  pass\n")})],
     "ProcessParameterInvalid", "run_udf: udf: a syntax error at line 1"),
    ([("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf(UDF.replace("cube: XarrayDataCube", "cube"))})],
     "ProcessParameterInvalid", "apply_datacube's cube and its return must be annotated"),
    ([("t", "reduce_dimension", {"dimension": "t", "reducer": reducer("run_udf", udf=UDF, runtime="R")})],
     "InvalidRuntime", "run_udf: runtime 'R'"),
    ([("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf("udfs/max.py")})],
     "FileNotFound", "run_udf: udf: 'udfs/max.py' is a path"),
    ([("b", "reduce_dimension", {"dimension": "bands", "reducer": run_udf()})], "ProcessUnsupported", "run_udf"),
    ([("a", "apply", {"process": run_udf()})], "ProcessUnsupported", "run_udf"),
    ([("a", "apply_dimension", {"dimension": "bands", "process": run_udf()})], "ProcessParameterUnsupported",
     "apply_dimension: dimension 'bands'"),
    ([("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf()}),
      ("a", "apply", {"process": reducer("absolute", x={"from_parameter": "x"})})], "ProcessUnsupported",
     "apply: after run_udf"),
])
def test_a_udf_bagpipe_cannot_run_is_refused_naming_run_udf_and_its_field(
        nodes: list[tuple[str, str, dict[str, Any]]], code: str, wanted: str) -> None:
    with pytest.raises(CompileError) as refused:
        compile_graph(graph(*nodes))
    assert refused.value.code == code and wanted in refused.value.message, refused.value.message


def test_a_udf_s_results_are_geotiffs() -> None:
    process = graph(("t", "reduce_dimension", {"dimension": "t", "reducer": run_udf()}))
    process["process_graph"]["save"]["arguments"]["format"] = "netCDF"
    with pytest.raises(CompileError) as refused:
        compile_graph(process)
    assert refused.value.code == "FormatUnsuitable" and "run_udf" in refused.value.message


def test_an_entry_point_is_one_openeos_dispatch_finds_and_runs() -> None:
    """What the check takes, openEO's own dispatch (``run_udf_code``) calls; what it refuses
    for its annotations, the dispatch finds no UDF in."""
    array = xarray.DataArray(np.arange(8.0).reshape(2, 1, 2, 2), dims=("t", "bands", "y", "x"))
    quoted = UDF.replace("cube: XarrayDataCube", 'cube: "openeo.udf.xarraydatacube.XarrayDataCube"').replace(
        "-> XarrayDataCube", '-> "openeo.udf.xarraydatacube.XarrayDataCube"')
    taken = [UDF, quoted, UDF.replace("XarrayDataCube", "DataCube").replace("from openeo.udf import DataCube", ""),
             "import xarray\ndef apply_datacube(cube: xarray.DataArray, context: dict) -> xarray.DataArray:\n"
             "    return cube.max(dim='t')\n"]
    refused = ["from __future__ import annotations\n" + UDF, UDF.replace("-> XarrayDataCube", ""),
               UDF.replace("cube: XarrayDataCube", 'cube: "XarrayDataCube"')]
    for code in taken:
        assert udf.problem(code) == "", code
        found = run_udf_code(code, UdfData(datacube_list=[XarrayDataCube(array)], user_context={}))
        assert found.get_datacube_list()[0].get_array().values.tolist() == [[[4.0, 5.0], [6.0, 7.0]]], code
    for code in refused:
        assert "no entry point" in udf.problem(code) or "__future__" in udf.problem(code), code
        with pytest.raises(OpenEoUdfException):
            run_udf_code(code, UdfData(datacube_list=[XarrayDataCube(array)], user_context={}))
