"""Named colour ramps for rasters whose makers say how they are to be coloured.

A reducer's manifest names the colour ramp of its outputs (``reducer.json``'s
``output.colormap``) by a matplotlib colormap's name; bagpipe's runtime has no matplotlib,
so the ramps a manifest may name are kept here, each as matplotlib draws it sampled at nine
evenly spaced points (``#rrggbb``, low to high), which the overviews interpolate between.
A name ending ``_r`` is its ramp reversed, as in matplotlib.
"""

from __future__ import annotations

RGB = tuple[int, int, int]

_RAMPS = {
    "viridis": "440154 472d7b 3b528b 2c728e 21918c 28ae80 5ec962 addc30 fde725",
    "plasma": "0d0887 4c02a1 7e03a8 aa2395 cc4778 e66c5c f89540 fdc527 f0f921",
    "inferno": "000004 210c4a 57106e 8a226a bc3754 e45a31 f98e09 f9cb35 fcffa4",
    "magma": "000004 1d1147 51127c 832681 b73779 e75263 fc8961 fec488 fcfdbf",
    "cividis": "00224e 1a386f 434e6c 61656f 7d7c78 9b9476 bcae6c dec958 fee838",
    "Blues": "f7fbff deebf7 c6dbef 9dcae1 6aaed6 4191c6 2070b4 08509b 08306b",
    "BuGn": "f7fcfd e5f5f9 ccece6 98d8c9 65c2a3 40ad75 228a44 006c2c 00441b",
    "BuPu": "f7fcfd e0ecf4 bfd3e6 9ebcda 8c95c6 8c6ab1 88409c 800f7b 4d004b",
    "GnBu": "f7fcf0 e0f3db ccebc5 a7ddb5 7accc4 4db2d3 2a8bbe 0867ab 084081",
    "Greens": "f7fcf5 e5f5e0 c7e9c0 a0d99b 73c476 40aa5d 228a44 006c2c 00441b",
    "Greys": "ffffff f0f0f0 d9d9d9 bdbdbd 959595 727272 515151 242424 000000",
    "Oranges": "fff5eb fee6ce fdd0a2 fdae6a fd8c3b f16813 d84801 a53603 7f2704",
    "OrRd": "fff7ec fee8c8 fdd49e fdba83 fc8c59 ef6447 d62f1e b20000 7f0000",
    "PuBu": "fff7fb ece7f2 d0d1e6 a5bddb 73a9cf 358fc0 056faf 04598c 023858",
    "PuBuGn": "fff7fb ece2f0 d0d1e6 a5bddb 66a9cf 3590bf 028189 016b58 014636",
    "PuRd": "f7f4f9 e7e1ef d4b9da c993c7 df64af e72989 cd1256 970042 67001f",
    "Purples": "fcfbfd efedf5 dadaeb bcbddc 9e9ac8 807cba 6950a3 53268f 3f007d",
    "RdPu": "fff7f3 fde0dd fcc5c0 fa9eb5 f767a1 dc3397 ad017e 790177 49006a",
    "Reds": "fff5f0 fee0d2 fcbba1 fc9272 fb694a ee3a2c ca181d a30f15 67000d",
    "YlGn": "ffffe5 f7fcb9 d9f0a3 acdd8e 77c679 40aa5c 228343 006737 004529",
    "YlGnBu": "ffffd9 edf8b1 c6e9b4 7ecdbb 40b5c4 1d90c0 225da8 243392 081d58",
    "YlOrBr": "ffffe5 fff7bc fee390 fec34f fe9829 eb6f14 cb4b02 983404 662506",
    "YlOrRd": "ffffcc ffeda0 fed976 feb24c fd8c3c fc4d2a e2191c bb0026 800026",
    "BrBG": "543005 995d13 cfa256 f1dfb3 f4f5f5 b4e2db 58b0a7 0c7169 003c30",
    "PiYG": "8e0152 cb3289 e897c4 fad6ea f7f7f6 d9f0bc 9acd61 589b28 276419",
    "PRGn": "40004b 7f3c8d ae8bbd dec9e2 f6f7f6 cbeac5 7ec37f 298440 00441b",
    "PuOr": "7f3b08 be630a ef9e3c fed7a2 f6f6f7 cecde4 988dbe 5d3790 2d004b",
    "RdBu": "67001f bb2a34 e58368 fbceb7 f6f7f7 c0dceb 68abd0 2870b1 053061",
    "RdGy": "67001f bb2a34 e58368 fbceb7 fefefe d6d6d6 9f9f9f 5a5a5a 1a1a1a",
    "RdYlBu": "a50026 de402e f98e52 fed485 feffc0 d1ecf4 8ec2dc 4f81ba 313695",
    "RdYlGn": "a50026 de402e f98e52 fed481 feffbe cbe982 84ca66 2aa054 006837",
    "Spectral": "9e0142 dd4a4c f98e52 fed481 ffffbe d6ee9b 86cfa5 3d95b8 5e4fa2",
    "coolwarm": "3b4cc0 6282ea 8db0fe b9d0f9 dddcdc f5c4ac f4987a dd5f4b b40426",
    "bwr": "0000ff 4040ff 8080ff c0c0ff fffefe ffbebe ff7e7e ff3e3e ff0000",
    "seismic": "00004c 0000a6 0101ff 8181ff fffdfd ff7d7d fe0000 be0000 800000",
    "terrain": "333399 0888ee 01cc66 81e680 fefe98 beac76 815e56 c1b0ac ffffff",
    "turbo": "30123b 466be3 28bceb 32f298 a4fc3c eecf3a fb7e21 d02f05 7a0403",
    "gist_earth": "000000 153978 2b737e 3b8e62 5ea04b 99af58 bdab62 dab7a0 fdfbfb",
    "ocean": "008000 005020 002040 001060 004080 0070a0 42a0c0 a2d0e0 ffffff",
}


def known(name: str) -> bool:
    """Whether ``name`` (or the ramp it reverses, ``NAME_r``) is a ramp kept here."""
    return name.removesuffix("_r") in _RAMPS


def stops(name: str) -> tuple[RGB, ...]:
    """The ramp's nine colours from its low end to its high one; KeyError if it is not kept here."""
    colours = tuple((int(c[:2], 16), int(c[2:4], 16), int(c[4:], 16)) for c in _RAMPS[name.removesuffix("_r")].split())
    return colours[::-1] if name.endswith("_r") else colours


def names() -> list[str]:
    """The ramps kept here, by name (each also reversed as ``NAME_r``)."""
    return sorted(_RAMPS, key=str.lower)
