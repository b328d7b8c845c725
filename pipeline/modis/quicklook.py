"""Quick-looks worth looking at: a colour map chosen for each layer and a legend with units.

Class layers get their classes' colours (MOD10A2's snow classes from the MOD10 user guide's
table), NDVI and EVI a vegetation ramp, land surface temperature a ramp in °C (stored
Kelvin × 0.02, shown less 273.15), other layers a grey ramp over their valid range in their
unit; a raster with no known layer (a reduction's output) a ramp over its own 2nd–98th
percentiles. Fill and nodata are transparent. A picture is the coloured image over a legend
panel (PNG, drawn with Pillow).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pipeline.modis.products import Layer

RGB = tuple[int, int, int]
LEGEND_ROW = 16  # pixels per legend line
TRANSPARENT = (0, 0, 0, 0)


@dataclass(frozen=True)
class Style:
    """How a layer is coloured: by class (stored value → label and colour), or by a ramp of
    colour stops over physical values (value = stored × scale + offset + shift)."""

    title: str
    unit: str = ""
    classes: tuple[tuple[int, str, RGB], ...] = ()
    stops: tuple[tuple[float, RGB], ...] = ()
    shift: float = 0.0  # added to the physical value before the ramp (Kelvin → °C: -273.15)

    def legend(self) -> list[tuple[str, RGB]]:
        """The legend's lines: each class, or the ramp's stops with their unit."""
        if self.classes:
            return [(f"{value} {label}", colour) for value, label, colour in self.classes]
        return [(f"{value:g} {self.unit}".strip(), colour) for value, colour in self.stops]


# MOD10A2 Maximum_Snow_Extent (MOD10 C6.1 user guide, table of the 8-day product's classes)
SNOW_CLASSES = (
    (0, "missing data", (128, 0, 128)), (1, "no decision", (255, 0, 255)), (11, "night", (20, 20, 20)),
    (25, "no snow", (60, 150, 60)), (37, "lake", (40, 90, 200)), (39, "ocean", (10, 30, 110)),
    (50, "cloud", (170, 170, 170)), (100, "lake ice", (150, 210, 255)), (200, "snow", (245, 250, 255)),
    (254, "detector saturated", (255, 140, 0)),
)
VEGETATION = ((-0.2, (120, 70, 20)), (0.0, (190, 160, 110)), (0.2, (235, 225, 130)), (0.4, (140, 200, 80)),
              (0.6, (50, 150, 50)), (0.8, (10, 90, 20)), (1.0, (0, 50, 10)))
TEMPERATURE_C = ((-30.0, (40, 40, 160)), (-10.0, (90, 160, 230)), (0.0, (235, 245, 250)), (15.0, (250, 220, 90)),
                 (30.0, (235, 110, 40)), (45.0, (150, 0, 30)))
GREY = ((0.0, (0, 0, 0)), (1.0, (255, 255, 255)))
VIRIDIS = ((0.0, (68, 1, 84)), (0.25, (59, 82, 139)), (0.5, (33, 145, 140)), (0.75, (94, 201, 98)),
           (1.0, (253, 231, 37)))


def style_for(layer: Layer | None, values: np.ndarray | None = None, name: str = "") -> Style:
    """The colour map of a layer (``values``: a raster with no known layer, ramped over its
    own range)."""
    if layer is None:
        found = values[np.isfinite(values)] if values is not None and values.size else np.array([0.0, 1.0])
        low, high = (np.percentile(found, [2, 98]) if found.size else (0.0, 1.0))
        high = high if high > low else low + 1.0
        return Style(name, stops=tuple((float(low + f * (high - low)), c) for f, c in VIRIDIS))
    if layer.name == "Maximum_Snow_Extent":
        return Style(layer.name, classes=SNOW_CLASSES)
    if layer.unit in ("NDVI", "EVI"):
        return Style(layer.name, layer.unit, stops=VEGETATION)
    if layer.unit == "Kelvin":
        return Style(layer.name, "°C", stops=TEMPERATURE_C, shift=-273.15)
    low, high = (v * layer.scale + layer.offset for v in layer.valid)
    return Style(layer.name, layer.unit, stops=tuple((low + f * (high - low), c) for f, c in GREY))


def colorize(stored: np.ndarray, style: Style, nodata: float | None, scale: float = 1.0,
             offset: float = 0.0) -> np.ndarray:
    """The RGBA image of ``stored`` values (fill, nodata and unknown classes transparent)."""
    out = np.zeros((*stored.shape, 4), dtype=np.uint8)
    valid = np.isfinite(stored) if stored.dtype.kind == "f" else np.ones(stored.shape, bool)
    if nodata is not None and not np.isnan(nodata):
        valid &= stored != nodata
    if style.classes:
        for value, _, colour in style.classes:
            out[valid & (stored == value)] = (*colour, 255)
        return out
    physical = stored.astype("float64") * scale + offset + style.shift
    points = [value for value, _ in style.stops]
    for channel in range(3):
        ramp = np.interp(physical, points, [colour[channel] for _, colour in style.stops])
        out[..., channel] = np.where(valid, ramp, 0).astype(np.uint8)
    out[..., 3] = np.where(valid, 255, 0)
    return out


def picture(rgba: np.ndarray, style: Style, caption: str = "") -> bytes:
    """A PNG of the image over its legend: the caption, then a swatch and a label per line
    (in columns as wide as the image allows)."""
    height, width = rgba.shape[:2]
    font = ImageFont.load_default(size=11)
    lines = style.legend()
    width_px = max(width, 240)
    per_column = max(1, min(len(lines), 8))
    columns = -(-len(lines) // per_column)
    column_w = max(120, width_px // max(columns, 1))
    legend_h = LEGEND_ROW * (per_column + 1) + 6
    canvas = Image.new("RGBA", (max(width_px, column_w * columns), height + legend_h), (255, 255, 255, 255))
    canvas.paste(Image.fromarray(rgba, "RGBA"), (0, 0))
    draw = ImageDraw.Draw(canvas)
    title = f"{caption or style.title}{f' ({style.unit})' if style.unit else ''}"
    draw.text((4, height + 3), title, fill=(0, 0, 0, 255), font=font)
    for i, (label, colour) in enumerate(lines):
        x = 4 + (i // per_column) * column_w
        y = height + 3 + LEGEND_ROW * (1 + i % per_column)
        draw.rectangle((x, y + 2, x + 11, y + 12), fill=(*colour, 255), outline=(90, 90, 90, 255))
        draw.text((x + 16, y + 1), label, fill=(0, 0, 0, 255), font=font)
    out = io.BytesIO()
    canvas.save(out, format="PNG", optimize=True)
    return out.getvalue()


def png(rgba: np.ndarray) -> bytes:
    """The bare image as a PNG (transparent where there is no data)."""
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, format="PNG", optimize=True)
    return out.getvalue()


def legend_json(style: Style) -> list[dict[str, object]]:
    """The legend as the portal draws it: label and colour (``#rrggbb``) per line."""
    return [{"label": label, "colour": "#{:02x}{:02x}{:02x}".format(*colour)} for label, colour in style.legend()]


def canvas_shape(bounds: Sequence[float], longest: int) -> tuple[int, int]:
    """(height, width) of an image of lon/lat ``bounds`` whose longer side is ``longest``."""
    west, south, east, north = bounds
    ratio = (north - south) / max(east - west, 1e-9)
    return (longest, max(1, round(longest / ratio))) if ratio > 1 else (max(1, round(longest * ratio)), longest)
