// The world map of the portal: an SVG in plate carrée whose user units are degrees
// (x = lon + 180, y = 90 - lat), with the coastlines of world-atlas, the MODIS sinusoidal
// tile grid, a box or tiles to pick, target tiles coloured by state and quick-looks laid
// on top. Wheel or the +/- buttons zoom around a point; drag draws a box. The world is
// drawn again a turn east and a turn west of itself, so that a region across ±180° is
// shown whole, in the middle of the map: a box across it is [west, south, east, north]
// with west > east, as GeoJSON has it, and is laid from west to east + 360.
/* global topojson */

const SVG = "http://www.w3.org/2000/svg";
// The MODIS sinusoidal grid: sphere radius, tile side, and the grid's top-left corner (m).
const R = 6371007.181;
const TILE = 1111950.5197665;
const X0 = -20015109.354;
const Y0 = 10007554.677;
const DEG = Math.PI / 180;

export const x = (lon) => lon + 180;
export const y = (lat) => 90 - lat;
let maps = 0; // the world's copies name it: one id per map on the page

/** A longitude brought within [-180, 180): ``east`` keeps 180 for a box's east edge. */
function wrapped(lon, east = false) {
  const turns = east ? Math.ceil((lon - 180) / 360) : Math.floor((lon + 180) / 360);
  return lon - 360 * turns;
}

/** A box's east edge on the line of its west: past 180 when it crosses ±180° (west > east). */
const eastOf = ([w, , e]) => (e < w ? e + 360 : e);

/**
 * The smallest lon/lat box holding ``boxes`` ([w, s, e, n], w > e across ±180°): the turn of the
 * Earth less the widest stretch of longitude none covers. Across ±180° its west is above its east.
 */
export function lonSpan(boxes) {
  const spans = boxes.map((b) => [b[0], eastOf(b)]).sort((a, b) => a[0] - b[0]);
  const joined = [];
  for (const [w, e] of spans) {
    if (joined.length && w <= joined[joined.length - 1][1]) joined[joined.length - 1][1] = Math.max(joined[joined.length - 1][1], e);
    else joined.push([w, e]);
  }
  let widest = -1, at = 0;
  for (let i = 0; i + 1 < joined.length; i++) {
    if (joined[i + 1][0] - joined[i][1] > widest) [widest, at] = [joined[i + 1][0] - joined[i][1], i];
  }
  const south = Math.min(...boxes.map((b) => b[1])), north = Math.max(...boxes.map((b) => b[3]));
  if (joined[0][0] + 360 - joined[joined.length - 1][1] >= widest) {
    return [joined[0][0], south, wrapped(joined[joined.length - 1][1], true), north];
  }
  return [joined[at + 1][0], south, joined[at][1], north];
}

function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

/** The lon/lat outline of MODIS tile (h, v), or null when it lies off the globe. */
export function modisOutline(h, v, steps = 8) {
  const left = X0 + h * TILE, top = Y0 - v * TILE;
  const edge = [];
  for (let i = 0; i <= steps; i++) edge.push([left + (TILE * i) / steps, top]);
  for (let i = 1; i <= steps; i++) edge.push([left + TILE, top - (TILE * i) / steps]);
  for (let i = 1; i <= steps; i++) edge.push([left + TILE - (TILE * i) / steps, top - TILE]);
  for (let i = 1; i < steps; i++) edge.push([left, top - TILE + (TILE * i) / steps]);
  let onGlobe = false;
  const points = edge.map(([mx, my]) => {
    const lat = my / R;
    const cos = Math.max(Math.cos(lat), 1e-9);
    const lon = mx / (R * cos) / DEG;
    if (Math.abs(lon) <= 180) onGlobe = true;
    return [Math.max(-180, Math.min(180, lon)), lat / DEG];
  });
  return onGlobe ? points : null;
}

/** The MODIS tile name (h09v05) under a lon/lat point. */
export function modisTileAt(lon, lat) {
  const my = lat * DEG * R;
  const mx = lon * DEG * R * Math.cos(lat * DEG);
  const h = Math.floor((mx - X0) / TILE), v = Math.floor((Y0 - my) / TILE);
  if (h < 0 || h > 35 || v < 0 || v > 17 || !modisOutline(h, v)) return null;
  return `h${String(h).padStart(2, "0")}v${String(v).padStart(2, "0")}`;
}

function ringPath(ring) {
  let d = "";
  let last = null;
  for (const [lon, lat] of ring) {
    // a jump across the antimeridian starts a new piece instead of a line across the map
    d += (last === null || Math.abs(lon - last) > 180 ? "M" : "L") + x(lon).toFixed(2) + " " + y(lat).toFixed(2);
    last = lon;
  }
  return d + "Z";
}

export class WorldMap {
  /**
   * @param {HTMLElement} host where the map goes
   * @param {{onBox?: Function, onTile?: Function, label?: string}} options
   */
  constructor(host, options = {}) {
    this.options = options;
    this.view = { x: 0, y: 0, w: 360, h: 180 };
    this.wrap = document.createElement("div");
    this.wrap.className = "map";
    host.appendChild(this.wrap);
    this.svg = el("svg", { viewBox: "0 0 360 180", role: "img", "aria-label": options.label || "World map" }, this.wrap);
    const world = el("g", { class: "world", id: `world-${++maps}` }, this.svg);
    el("rect", { x: 0, y: 0, width: 360, height: 180, class: "sea" }, world);
    this.land = el("g", { class: "land" }, world);
    this.grid = el("g", { class: "modis-grid" }, world);
    this.layers = el("g", { class: "layers" }, world);
    this.overlay = el("g", { class: "overlay" }, world);
    this.features = el("g", { class: "features" }, world);
    this.selection = el("g", { class: "selection" }, world);
    // its copies a turn west and east, beneath it (the world itself over what runs past its edges)
    for (const turn of [-360, 360]) this.svg.insertBefore(el("use", { href: `#${world.id}`, x: turn, "aria-hidden": "true" }), world);
    this._zoomButtons();
    this._drawGrid();
    this._interactions();
  }

  async drawLand(url = "/portal/vendor/land-50m.json") {
    const topo = await fetch(url).then((r) => r.json());
    const land = topojson.feature(topo, topo.objects.land);
    let d = "";
    for (const feature of land.features || [land]) {
      const geometry = feature.geometry || feature;
      const polygons = geometry.type === "Polygon" ? [geometry.coordinates] : geometry.coordinates;
      for (const polygon of polygons) for (const ring of polygon) d += ringPath(ring);
    }
    el("path", { d }, this.land);
  }

  _drawGrid() {
    this.tiles = new Map();
    for (let v = 0; v < 18; v++) {
      for (let h = 0; h < 36; h++) {
        const outline = modisOutline(h, v);
        if (!outline) continue;
        const name = `h${String(h).padStart(2, "0")}v${String(v).padStart(2, "0")}`;
        const points = outline.map(([lon, lat]) => `${x(lon).toFixed(2)},${y(lat).toFixed(2)}`).join(" ");
        const poly = el("polygon", { points, "data-tile": name }, this.grid);
        el("title", {}, poly).textContent = name;
        this.tiles.set(name, poly);
      }
    }
  }

  _zoomButtons() {
    const bar = document.createElement("div");
    bar.className = "zoom";
    for (const [label, factor, name] of [["+", 0.5, "Zoom in"], ["−", 2, "Zoom out"], ["⌂", 0, "Whole world"]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = label;
      b.title = name;
      b.setAttribute("aria-label", name);
      b.addEventListener("click", () =>
        factor ? this.zoom(factor, this.view.x + this.view.w / 2, this.view.y + this.view.h / 2) : this.fit([-180, -90, 180, 90]));
      bar.appendChild(b);
    }
    this.wrap.appendChild(bar);
  }

  _point(event) {
    const p = this.svg.createSVGPoint();
    p.x = event.clientX;
    p.y = event.clientY;
    const q = p.matrixTransform(this.svg.getScreenCTM().inverse());
    return { sx: q.x, sy: q.y, lon: q.x - 180, lat: 90 - q.y }; // lon past ±180 on the world's copies
  }

  _setView() {
    const v = this.view;
    this.svg.setAttribute("viewBox", `${v.x} ${v.y} ${v.w} ${v.h}`);
    this.svg.style.setProperty("--px", (v.w / 360).toString()); // stroke widths follow the zoom
  }

  zoom(factor, cx, cy) {
    const v = this.view;
    const w = Math.min(360, Math.max(0.5, v.w * factor));
    const h = w / 2;
    this.view = {
      x: Math.min(540 - w, Math.max(-180, cx - ((cx - v.x) * w) / v.w)),
      y: Math.min(180 - h, Math.max(0, cy - ((cy - v.y) * h) / v.h)),
      w, h,
    };
    this._setView();
  }

  /** Show [west, south, east, north] with a margin (west > east: across ±180°, in the map's middle). */
  fit([west, south, e, north], margin = 0.25) {
    const east = eastOf([west, south, e, north]);
    const mw = (east - west) * margin + 0.5, mh = (north - south) * margin + 0.5;
    let w = Math.min(360, Math.max(east - west + 2 * mw, 2 * (north - south + 2 * mh)));
    w = Math.max(w, 1);
    const h = w / 2;
    const cx = x((west + east) / 2), cy = y((south + north) / 2);
    this.view = { x: Math.min(540 - w, Math.max(-180, cx - w / 2)), y: Math.min(180 - h, Math.max(0, cy - h / 2)), w, h };
    this._setView();
  }

  _interactions() {
    this.svg.addEventListener("wheel", (event) => {
      event.preventDefault();
      const p = this._point(event);
      this.zoom(event.deltaY > 0 ? 1.25 : 0.8, p.sx, p.sy);
    }, { passive: false });
    let start = null;
    let rect = null;
    this.svg.addEventListener("pointerdown", (event) => {
      if (event.button !== 0 || event.target.closest(".zoom")) return;
      start = this._point(event);
      this.svg.setPointerCapture(event.pointerId);
    });
    this.svg.addEventListener("pointermove", (event) => {
      if (!start || !this.options.onBox || this.mode !== "box") return;
      const p = this._point(event);
      if (!rect) rect = el("rect", { class: "drag" }, this.selection);
      rect.setAttribute("x", Math.min(start.sx, p.sx));
      rect.setAttribute("y", Math.min(start.sy, p.sy));
      rect.setAttribute("width", Math.abs(p.sx - start.sx));
      rect.setAttribute("height", Math.abs(p.sy - start.sy));
    });
    this.svg.addEventListener("pointerup", (event) => {
      if (!start) return;
      const p = this._point(event);
      const moved = Math.abs(p.sx - start.sx) + Math.abs(p.sy - start.sy) > this.view.w / 200;
      if (rect) rect.remove();
      rect = null;
      if (moved && this.mode === "box" && this.options.onBox) {
        const round = (v) => Math.round(v * 100) / 100;
        const [a, b] = [Math.min(start.lon, p.lon), Math.max(start.lon, p.lon)];
        const [west, east] = b - a >= 360 ? [-180, 180] : [wrapped(a), wrapped(b, true)]; // west > east: across ±180°
        this.options.onBox([round(west), round(Math.max(-90, Math.min(start.lat, p.lat))),
          round(east), round(Math.min(90, Math.max(start.lat, p.lat)))]);
      } else if (!moved && this.mode === "tiles" && this.options.onTile) {
        const tile = modisTileAt(wrapped(p.lon), p.lat);
        if (tile) this.options.onTile(tile);
      }
      start = null;
    });
  }

  /** The picked region: a box, or MODIS tiles highlighted. */
  showSelection(bbox, tiles = []) {
    for (const node of [...this.selection.children]) node.remove();
    for (const [name, poly] of this.tiles) poly.classList.toggle("picked", tiles.includes(name));
    if (bbox && bbox.every(Number.isFinite)) {
      const [w, s, e, n] = bbox;
      const north = Math.max(s, n);
      // west > east: the box crosses ±180°, drawn as its two halves
      for (const [a, b] of w <= e ? [[w, e]] : [[w, 180], [-180, e]])
        el("rect", { x: x(a), y: y(north), width: b - a, height: Math.abs(n - s), class: "bbox" }, this.selection);
    }
  }

  /** Target tiles coloured by state: [{tile, bounds:[w,s,e,n], state}]. */
  showTiles(tiles) {
    for (const node of [...this.layers.children]) node.remove();
    for (const t of tiles) {
      const [w, s, , n] = t.bounds;
      const e = eastOf(t.bounds);
      const r = el("rect", { x: x(w), y: y(n), width: e - w, height: n - s, class: `tile state-${t.state}`, "data-tile": t.tile }, this.layers);
      el("title", {}, r).textContent = `${t.tile}: ${t.state}`;
    }
  }

  /** Uploaded points and polygons (GeoJSON geometries in lon/lat), each titled by its id:
   * [{id, geometry}]. Returns their [west, south, east, north], or null if there are none. */
  showFeatures(features) {
    for (const node of [...this.features.children]) node.remove();
    let box = null;
    const grow = ([lon, lat]) => {
      box = box ? [Math.min(box[0], lon), Math.min(box[1], lat), Math.max(box[2], lon), Math.max(box[3], lat)] : [lon, lat, lon, lat];
    };
    for (const { id, geometry } of features) {
      let node = null;
      if (geometry.type === "Point") {
        node = el("circle", { cx: x(geometry.coordinates[0]), cy: y(geometry.coordinates[1]), r: 0.3,
          class: "site", "data-id": id }, this.features);
        grow(geometry.coordinates);
      } else if (geometry.type === "Polygon" || geometry.type === "MultiPolygon") {
        const polygons = geometry.type === "Polygon" ? [geometry.coordinates] : geometry.coordinates;
        node = el("path", { d: polygons.flat().map(ringPath).join(""), class: "zone", "data-id": id }, this.features);
        polygons.flat(2).forEach(grow);
      }
      if (node) el("title", {}, node).textContent = String(id);
    }
    return box;
  }

  /** Images laid on their lon/lat bounds: [{url, bounds, name}] (``kind``: their class). */
  showImages(images, kind = "quicklook") {
    for (const node of [...this.overlay.children]) node.remove();
    for (const image of images) {
      const [w, s, , n] = image.bounds;
      const e = eastOf(image.bounds);
      const node = el("image", { href: image.url, x: x(w), y: y(n), width: e - w, height: n - s,
        preserveAspectRatio: "none", class: kind }, this.overlay);
      el("title", {}, node).textContent = image.name;
    }
  }
}
