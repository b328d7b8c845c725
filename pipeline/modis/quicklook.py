"""Quick-looks worth looking at: a colour map chosen for each layer and a legend with units.

Class layers get their classes' colours (MOD10A2's snow classes from the MOD10 user guide's
table), NDVI and EVI a vegetation ramp, land surface temperature a ramp in °C (stored
Kelvin × 0.02, shown less 273.15), other layers a grey ramp over their valid range in their
unit; a raster with no known layer (a reduction's output) a ramp over its own 2nd–98th
percentiles in the unit its file gives, the ramp its maker declared (a reducer's
``output.colormap``) or viridis. Fill and nodata are transparent. A picture is the coloured image, its corners'
longitudes and latitudes above and below it, over a legend panel (PNG, drawn with Pillow): a
swatch per class of a class layer, a continuous colour bar over its range, with its unit,
for any other.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pipeline.modis.products import Layer
from pipeline.science import ramps

RGB = tuple[int, int, int]
LEGEND_ROW = 16  # pixels per legend line
TRANSPARENT = (0, 0, 0, 0)
# zlib's fastest level: an 800 × 600 overview encodes in 0.06 s of CPU and 8% larger than
# with PIL's optimize (0.88 s), which made most of a finisher's time after the last commit
PNG_LEVEL = 1


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
        return [(f"{_number(value)} {self.unit}".strip(), colour) for value, colour in self.stops]

    def colour_at(self, values: np.ndarray) -> np.ndarray:
        """The ramp's colours (uint8 RGB, one row per value) at physical values on its scale."""
        points = [value for value, _ in self.stops]
        return np.stack([np.interp(values, points, [colour[c] for _, colour in self.stops]) for c in range(3)],
                        axis=-1).astype(np.uint8)


def _number(value: float) -> str:
    """A value of a ramp as a legend writes it: three significant digits at most."""
    return f"{value:.3g}"


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


def style_for(layer: Layer | None, values: np.ndarray | None = None, name: str = "", unit: str = "",
              colormap: str = "") -> Style:
    """The colour map of a layer (``values``: a raster with no known layer, ramped over its
    own range in its ``unit``, on the named ``colormap`` its maker declared, else viridis)."""
    if layer is None:
        found = values[np.isfinite(values)] if values is not None and values.size else np.array([0.0, 1.0])
        low, high = (np.percentile(found, [2, 98]) if found.size else (0.0, 1.0))
        high = high if high > low else low + 1.0
        colours = ramps.stops(colormap) if colormap and ramps.known(colormap) else tuple(c for _, c in VIRIDIS)
        fractions = np.linspace(0.0, 1.0, len(colours))
        return Style(name, unit, stops=tuple((float(low + f * (high - low)), c) for f, c in zip(fractions, colours,
                                                                                               strict=True)))
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
    out[..., :3] = np.where(valid[..., None], style.colour_at(np.where(valid, physical, 0.0)), 0)
    out[..., 3] = np.where(valid, 255, 0)
    return out


def corners(bounds: Sequence[float]) -> tuple[str, str, str, str]:
    """The corners of a lon/lat box (its east past 180° when it crosses ±180°) as a picture
    writes them: north-west, north-east, south-west, south-east, in degrees E/W and N/S."""
    west, south, east, north = bounds
    places = 3 if min(east - west, north - south) < 1 else 2

    def lon(value: float) -> str:
        value = (value + 180.0) % 360.0 - 180.0 if abs(value) > 180.0 else value
        return f"{abs(value):.{places}f}°{'W' if value < 0 else 'E'}"

    def lat(value: float) -> str:
        return f"{abs(value):.{places}f}°{'S' if value < 0 else 'N'}"

    return (f"{lon(west)} {lat(north)}", f"{lon(east)} {lat(north)}", f"{lon(west)} {lat(south)}",
            f"{lon(east)} {lat(south)}")


def picture(rgba: np.ndarray, style: Style, caption: str = "", bounds: Sequence[float] | None = None) -> bytes:
    """A PNG of the image over its legend: the caption, then a swatch and a label per class
    (in columns as wide as the image allows), or the ramp's colour bar from its low end to
    its high one, labelled with its values and unit. ``bounds``: the image's lon/lat box,
    whose corners are written above and below it."""
    height, width = rgba.shape[:2]
    font = ImageFont.load_default(size=11)
    lines = style.legend() if style.classes else []
    width_px = max(width, 240)
    per_column = max(1, min(len(lines), 8))
    columns = -(-len(lines) // per_column)
    column_w = max(120, width_px // max(columns, 1))
    band = LEGEND_ROW if bounds is not None else 0  # a line of corner coordinates above and below the image
    legend_h = LEGEND_ROW * (per_column + 1) + 6 if lines else LEGEND_ROW + BAR + LEGEND_ROW + 10
    canvas = Image.new("RGBA", (max(width_px, column_w * columns), 2 * band + height + legend_h),
                       (255, 255, 255, 255))
    canvas.paste(Image.fromarray(rgba, "RGBA"), (0, band))
    draw = ImageDraw.Draw(canvas)
    if bounds is not None:
        north_west, north_east, south_west, south_east = corners(bounds)
        for text, y, right in ((north_west, 2, False), (north_east, 2, True), (south_west, band + height + 2, False),
                               (south_east, band + height + 2, True)):
            x = canvas.width - 4 - draw.textlength(text, font=font) if right else 4
            draw.text((x, y), text, fill=(60, 60, 60, 255), font=font)
    top = 2 * band + height
    title = f"{caption or style.title}{f' ({style.unit})' if style.unit else ''}"
    draw.text((4, top + 3), title, fill=(0, 0, 0, 255), font=font)
    for i, (label, colour) in enumerate(lines):
        x = 4 + (i // per_column) * column_w
        y = top + 3 + LEGEND_ROW * (1 + i % per_column)
        draw.rectangle((x, y + 2, x + 11, y + 12), fill=(*colour, 255), outline=(90, 90, 90, 255))
        draw.text((x + 16, y + 1), label, fill=(0, 0, 0, 255), font=font)
    if not lines:
        _colour_bar(draw, style, (4, top + 3 + LEGEND_ROW, canvas.width - 5), font)
    out = io.BytesIO()
    canvas.save(out, format="PNG", compress_level=PNG_LEVEL)
    return out.getvalue()


BAR = 12  # pixels: the height of a ramp's colour bar


def _colour_bar(draw: ImageDraw.ImageDraw, style: Style, where: tuple[int, int, int],
                font: ImageFont.FreeTypeFont | ImageFont.ImageFont) -> None:
    """A ramp's colour bar from ``left`` to ``right`` at ``top``: each column the colour of
    its value, the low end, the middle and the high end labelled (the high end with the unit)."""
    left, top, right = where
    low, high = style.stops[0][0], style.stops[-1][0]
    values = np.linspace(low, high, right - left + 1)
    for x, colour in zip(range(left, right + 1), style.colour_at(values), strict=True):
        draw.line((x, top, x, top + BAR - 1), fill=(*map(int, colour), 255))
    draw.rectangle((left, top, right, top + BAR - 1), outline=(90, 90, 90, 255))
    labels = (_number(low), _number((low + high) / 2), f"{_number(high)} {style.unit}".strip())
    for text, at in zip(labels, (0.0, 0.5, 1.0), strict=True):
        length = draw.textlength(text, font=font)
        placed = min(max(left, left + at * (right - left) - length / 2), right - length)
        draw.text((placed, top + BAR + 2), text, fill=(0, 0, 0, 255), font=font)


def png(rgba: np.ndarray) -> bytes:
    """The bare image as a PNG (transparent where there is no data)."""
    out = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(out, format="PNG", compress_level=PNG_LEVEL)
    return out.getvalue()


def legend_json(style: Style) -> list[dict[str, object]]:
    """The legend as the portal draws it: label and colour (``#rrggbb``) per class, or per
    stop of a ramp with its ``value`` too (the portal draws a ramp as one colour bar)."""
    if style.classes:
        return [{"label": label, "colour": "#{:02x}{:02x}{:02x}".format(*colour)} for label, colour in style.legend()]
    return [{"label": label, "colour": "#{:02x}{:02x}{:02x}".format(*colour), "value": value}
            for (label, colour), (value, _) in zip(style.legend(), style.stops, strict=True)]


def canvas_shape(bounds: Sequence[float], longest: int) -> tuple[int, int]:
    """(height, width) of an image of lon/lat ``bounds`` whose longer side is ``longest``."""
    west, south, east, north = bounds
    ratio = (north - south) / max(east - west, 1e-9)
    return (longest, max(1, round(longest / ratio))) if ratio > 1 else (max(1, round(longest * ratio)), longest)
