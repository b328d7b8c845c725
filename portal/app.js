// The bagpipe portal: submit a request on a map, watch a job, get its products, upload
// reducers. Pages by the URL's hash: #/ (submit), #/jobs (the list), #/jobs/<id> (one job),
// #/reducers, #/account (my tokens). Signing in and the API calls are session.js's.
import { accountPage } from "./account.js";
import { WorldMap, lonSpan } from "./map.js";
import { reducersPage } from "./reducers.js";
import { api, signOut, whoami } from "./session.js";
import { age, dollars, duration, h, latestOnly, stateBadge } from "./util.js";

const main = document.getElementById("main");
const FINISHED = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
let leave = () => {}; // stops the current page's polling when the page changes

// ---- submit --------------------------------------------------------------------------
async function submitPage() {
  const catalog = await api("GET", "/api/catalog");
  const region = { mode: "box", bbox: [-112, 34, -108, 37], tiles: [] };
  const field = (name, label, input, hint = "") =>
    h("div", { class: "field", "data-field": name }, h("label", { for: input.id }, label), input,
      hint ? h("p", { class: "hint" }, hint) : null, h("p", { class: "error", role: "alert" }));
  const input = (id, attrs = {}) => h("input", { id, name: id, ...attrs });

  const bboxInputs = ["west", "south", "east", "north"].map((side, i) =>
    input(`bbox-${side}`, { type: "number", step: "0.01", value: region.bbox[i], "aria-label": side,
      oninput: () => { region.bbox = bboxInputs.map((b) => Number(b.value)); changed(); } }));
  const tilesInput = input("tiles", { type: "text", placeholder: "h09v05, h10v05", oninput: () => {
    region.tiles = tilesInput.value.split(/[\s,]+/).filter(Boolean); changed(); } });
  const modes = h("fieldset", { class: "modes" }, h("legend", {}, "Region"),
    ...[["box", "Drag a box (lon/lat)"], ["tiles", "Click MODIS tiles"]].map(([value, label]) =>
      h("label", {}, h("input", { type: "radio", name: "mode", value, checked: value === region.mode,
        onchange: () => { region.mode = value; mapView.mode = value; changed(); } }), " ", label)));
  const products = h("fieldset", { class: "field", "data-field": "products" }, h("legend", {}, "Products"),
    ...catalog.products.map((p, i) => h("label", { class: "check" },
      h("input", { type: "checkbox", name: "products", value: p.name, checked: i === 0,
        onchange: () => { offerInputs(); changed(); } }),
      ` ${p.name} — ${p.title}`)), h("p", { class: "error", role: "alert" }));
  const reducer = h("select", { id: "reducer", name: "reducer", onchange: () => { describe(); changed(); } },
    h("option", { value: "" }, "none: the reprojected tiles only"),
    ...catalog.reducers.map((r) => h("option", { value: r.name }, r.version ? `${r.name} (v${r.version}, uploaded)` : r.name)));
  const reducerText = h("p", { class: "hint" });
  const describe = () => {
    const found = catalog.reducers.find((r) => r.name === reducer.value);
    reducerText.textContent = found ? found.description : "";
  };
  const args = h("textarea", { id: "args", name: "args", rows: 2, placeholder: '{"threshold": 0.5}', oninput: changed });
  const onFailure = h("select", { id: "on-failure", name: "on-failure", onchange: changed },
    h("option", { value: "fail" }, "fail the reduction"), h("option", { value: "run" }, "run it on the tiles that exist"));
  // reduce: a built-in reducer or an expression over layers of the products, by groups of dates
  const kind = h("select", { id: "reduce-kind", onchange: () => { showReduce(); changed(); } },
    h("option", { value: "" }, "none"), h("option", { value: "builtin" }, "a built-in reducer of each input"),
    h("option", { value: "expression" }, "an expression over the inputs"));
  const builtin = h("select", { id: "reduce-builtin", onchange: () => { showReduce(); changed(); } },
    ...catalog.builtins.map((b) => h("option", { value: b }, b)));
  const percentile = input("reduce-percentile", { type: "number", min: 0, max: 100, step: "any", value: 90, oninput: changed });
  const expression = input("reduce-expression", { type: "text", placeholder: "(a - b) / (a + b)", oninput: changed });
  const aggregate = h("select", { id: "reduce-aggregate", onchange: changed },
    ...catalog.aggregates.map((a) => h("option", { value: a }, a)));
  const by = h("select", { id: "reduce-by", onchange: () => { showReduce(); changed(); } },
    ...catalog.groupings.map((g) => h("option", { value: g }, g)));
  const days = input("reduce-days", { type: "number", min: 1, step: 1, value: 8, oninput: changed });
  const inputs = h("select", { id: "reduce-inputs", multiple: true, size: 4, onchange: changed });
  const inputsHint = h("p", { class: "hint" });
  const baselineStart = input("baseline-start", { type: "date", oninput: changed });
  const baselineEnd = input("baseline-end", { type: "date", oninput: changed });
  const reduceFields = {
    builtin: field("reduce.reducer", "Built-in", builtin), percentile: field("reduce.percentile", "Percentile", percentile),
    expression: field("reduce.expression", "Expression", expression,
      "arithmetic, comparisons, where, isnodata, clip, sqrt, log, min, max over the inputs by name; with a baseline, NAME.vci, NAME.tci, NAME.anomaly, NAME.zscore"),
    aggregate: field("reduce.aggregate", "Each input over a group by", aggregate),
    days: field("reduce.days", "Days a group", days),
  };
  const reduceBlock = h("div", { class: "reduce" },
    h("div", { class: "row" }, field("reduce.by", "Group dates by", by), reduceFields.days),
    field("reduce.inputs", "Inputs (PRODUCT.LAYER)", inputs), inputsHint,
    h("div", { class: "row" }, reduceFields.builtin, reduceFields.percentile, reduceFields.aggregate),
    reduceFields.expression,
    h("div", { class: "row", "data-field": "reduce.baseline" }, field("reduce.baseline.start", "Baseline from", baselineStart),
      field("reduce.baseline.end", "to", baselineEnd)));
  /** The inputs offered: every layer of the products checked, their default layers chosen. */
  function offerInputs() {
    const chosen = new Set([...inputs.selectedOptions].map((o) => o.value));
    const checked = [...document.querySelectorAll("input[name=products]:checked")].map((c) => c.value);
    const offered = catalog.products.filter((p) => checked.includes(p.name)).flatMap((p) => p.layers.map((l) => ({
      ref: `${p.name}.${l.name}`, unit: l.unit, chosen: chosen.size ? chosen.has(`${p.name}.${l.name}`) : l.name === p.default_layer })));
    inputs.replaceChildren(...offered.map((o) => h("option", { value: o.ref, selected: o.chosen }, o.unit ? `${o.ref} (${o.unit})` : o.ref)));
    inputsHint.textContent = "An expression names them as listed: " + [...inputs.selectedOptions].map((o) => o.value).join(", ");
  }
  function showReduce() {
    reduceBlock.hidden = !kind.value;
    reduceFields.builtin.hidden = kind.value !== "builtin";
    reduceFields.percentile.hidden = kind.value !== "builtin" || builtin.value !== "percentile";
    reduceFields.expression.hidden = reduceFields.aggregate.hidden = kind.value !== "expression";
    reduceFields.days.hidden = by.value !== "days:N";
  }
  // sites, zones or a polygon region from a file: kept first (POST /api/vectors), named by digest
  // (error: why the file chosen was refused, said beside the field until another file or kind
  // is chosen; an answer to an earlier choice is dropped)
  const vector = { kind: "", ref: null, error: "" };
  const choosing = latestOnly();
  const vectorKind = h("select", { id: "vector-kind", "aria-label": "What the file holds", onchange: () => keepFile() },
    h("option", { value: "sites" }, "sites: a series at each point (CSV id,lon,lat; JSON; GeoJSON points)"),
    h("option", { value: "zones" }, "zones: statistics over each polygon (GeoJSON, an id each)"),
    h("option", { value: "region" }, "a region: only the pixels in its polygon (GeoJSON)"));
  const vectorFile = input("vector-file", { type: "file", accept: ".csv,.json,.geojson,text/csv,application/json",
    onchange: () => keepFile() });
  const vectorStatus = h("p", { class: "hint", id: "vector-status", "aria-live": "polite" });
  const windowSize = h("select", { id: "sites-window", onchange: changed },
    ...[1, 3, 5].map((n) => h("option", { value: String(n) }, n === 1 ? "its pixel" : `its pixel and the mean of ${n} × ${n}`)));
  const vectorField = h("div", { class: "field", "data-field": "vectors" },
    h("label", { for: "vector-file" }, "Sites, zones or a polygon from a file (optional)"),
    h("div", { class: "row" }, vectorKind, vectorFile), vectorStatus,
    h("div", { id: "sites-options", hidden: true }, h("label", { for: "sites-window" }, "Each site's value: "), windowSize),
    h("p", { class: "error", role: "alert" }));
  const outputFormat = h("select", { id: "output-format", onchange: changed },
    h("option", { value: "" }, "Cloud-Optimized GeoTIFF tiles and mosaics"),
    h("option", { value: "netcdf" }, "also one netCDF cube per layer (and per reduction)"),
    h("option", { value: "zarr" }, "also one Zarr cube per layer (and per reduction)"));
  const start = input("start", { type: "date", value: "2022-01-01", required: true, oninput: changed });
  const end = input("end", { type: "date", value: "2022-02-17", required: true, oninput: changed });
  const crs = input("crs", { type: "text", placeholder: "EPSG:4326", oninput: changed });
  const tileSize = input("tile-size", { type: "number", step: "any", placeholder: "1 (° or m)", oninput: changed });
  const resolution = input("resolution", { type: "number", step: "any", placeholder: "0.005 (° or m)", oninput: changed });
  const email = input("email", { type: "email", placeholder: "you@example.org", oninput: changed });
  const label = input("label", { type: "text", maxlength: 200, placeholder: "what this is for", oninput: changed });
  const estimate = h("p", { id: "estimate", class: "estimate", "aria-live": "polite" });
  const submit = h("button", { type: "submit", class: "primary" }, "Submit");
  const form = h("form", { id: "submit-form", novalidate: true },
    h("div", { class: "field", "data-field": "region" }, modes,
      h("div", { class: "bbox" }, ...bboxInputs), field("region.tiles", "MODIS tiles", tilesInput),
      h("p", { class: "error", role: "alert" })),
    vectorField,
    h("div", { class: "row" }, field("start", "From", start), field("end", "To", end)),
    products,
    field("reduce", "Reduce over time", kind), reduceBlock,
    field("reducer", "Or run a program over each product's span", reducer), reducerText,
    field("reducer.args", "Its arguments (JSON)", args),
    field("reducer.on_dependency_failure", "If a tile of its span fails", onFailure),
    h("details", { class: "grid" }, h("summary", {}, "Output grid (for a box)"),
      h("div", { class: "row" }, field("grid.crs", "CRS", crs), field("grid.tile_size", "Tile size", tileSize),
        field("grid.resolution", "Pixel size", resolution))),
    field("output.format", "Output", outputFormat),
    h("div", { class: "row" }, field("email", "Email when done", email), field("label", "Label", label)),
    estimate, submit);
  const mapHost = h("section", { class: "map-panel", "aria-label": "Region map" });
  main.replaceChildren(h("h1", {}, "New request"), h("div", { class: "submit-layout" }, mapHost, form));

  const mapView = new WorldMap(mapHost, {
    label: "World map with the MODIS tile grid: drag a box or click tiles",
    onBox: (bbox) => { region.bbox = bbox; bboxInputs.forEach((b, i) => (b.value = bbox[i])); changed(); },
    onTile: (tile) => {
      region.tiles = region.tiles.includes(tile) ? region.tiles.filter((t) => t !== tile) : [...region.tiles, tile];
      tilesInput.value = region.tiles.join(", ");
      changed();
    },
  });
  mapView.mode = region.mode;
  mapView.drawLand();
  mapView.fit(region.bbox, 2);

  function request() {
    const body = { start: start.value, end: end.value,
      products: [...form.querySelectorAll("input[name=products]:checked")].map((c) => c.value),
      region: region.mode === "box" ? { bbox: region.bbox } : { tiles: region.tiles } };
    if (region.mode === "box" && (crs.value || tileSize.value || resolution.value)) {
      body.grid = {};
      if (crs.value) body.grid.crs = crs.value;
      if (tileSize.value) body.grid.tile_size = Number(tileSize.value);
      if (resolution.value) body.grid.resolution = Number(resolution.value);
    }
    if (reducer.value) {
      let parsed = {};
      if (args.value.trim()) {
        try { parsed = JSON.parse(args.value); } catch { throw new FieldError("reducer.args", "not valid JSON"); }
      }
      body.reducer = { name: reducer.value, args: parsed, on_dependency_failure: onFailure.value };
    }
    if (kind.value) {
      body.reduce = { by: by.value === "days:N" ? `days:${days.value}` : by.value,
        inputs: [...inputs.selectedOptions].map((o) => o.value) };
      if (!body.reduce.inputs.length) delete body.reduce.inputs; // the layers the request makes
      if (kind.value === "builtin") {
        body.reduce.reducer = builtin.value;
        if (builtin.value === "percentile") body.reduce.percentile = Number(percentile.value);
      } else {
        body.reduce.expression = expression.value;
        body.reduce.aggregate = aggregate.value;
      }
      if (baselineStart.value || baselineEnd.value) body.reduce.baseline = { start: baselineStart.value, end: baselineEnd.value };
      // the layers the inputs name are layers the request makes
      body.layers = {};
      for (const ref of body.reduce.inputs || []) {
        const [product, layer] = [ref.slice(0, ref.indexOf(".")), ref.slice(ref.indexOf(".") + 1)];
        (body.layers[product] = body.layers[product] || []).push(layer);
      }
      if (!Object.keys(body.layers).length) delete body.layers;
    }
    if (vector.ref && vector.kind === "region") body.region = { kept: { ref: vector.ref } };
    else if (vector.ref) {  // sampled where they are, or the zones' own box
      delete body.region;
      delete body.grid;
      if (vector.kind === "sites") body.sites = { kept: { ref: vector.ref }, window: Number(windowSize.value) };
      else body.zones = { kept: { ref: vector.ref } };
    }
    if (outputFormat.value) body.output = { format: outputFormat.value };
    if (email.value) body.email = email.value;
    if (label.value) body.label = label.value;
    return body;
  }

  function clearErrors() {
    for (const p of form.querySelectorAll(".error")) p.textContent = "";
    for (const i of form.querySelectorAll("[aria-invalid]")) i.removeAttribute("aria-invalid");
    vectorField.querySelector(".error").textContent = vector.error;  // the file's own refusal stays
  }

  function showErrors(errors) {
    for (const { field: name, message } of errors) {
      // the field whose name is the longest prefix of the error's path
      const slots = [...form.querySelectorAll("[data-field]")].filter((f) =>
        name === f.dataset.field || name.startsWith(f.dataset.field + "."));
      slots.sort((a, b) => b.dataset.field.length - a.dataset.field.length);
      const slot = slots[0] || form.querySelector("[data-field=region]");
      const p = slot.querySelector(":scope > .error") || slot.querySelector(".error");
      p.textContent = p.textContent ? `${p.textContent}; ${message}` : message;
      for (const i of slot.querySelectorAll("input, select, textarea")) i.setAttribute("aria-invalid", "true");
    }
  }

  function errorsOf(err) {
    if (err instanceof FieldError) return [{ field: err.field, message: err.message }];
    if (err.body.errors) return err.body.errors;
    return [{ field: err.body.field || "region", message: err.body.detail || err.message }];
  }

  let timer = null;
  const estimating = latestOnly();  // an answer to an earlier estimate arriving late is dropped
  function changed() {
    mapView.showSelection(region.mode === "box" ? region.bbox : null, region.mode === "tiles" ? region.tiles : []);
    clearTimeout(timer);
    // the figures shown were another request's: none is shown until this one's are in
    estimate.textContent = "Estimating…";
    delete estimate.dataset.tasks;
    timer = setTimeout(async () => {
      const latest = estimating();
      clearErrors();
      try {
        const found = await api("POST", "/api/estimate", request());
        if (!latest()) return;
        estimate.textContent = `This request makes ${found.tasks.toLocaleString()} tasks` + (found.known
          ? `: about ${duration(found.compute_s)} of compute, ${dollars(found.usd)} at Azure's prices ` +
            "(at most: tiles already made cost almost nothing)."
          : ` (compute time not known yet: too few runs of its stages so far; storage calls ${dollars(found.usd)}).`);
        estimate.dataset.tasks = found.tasks;
        estimate.title = found.prices;
      } catch (err) {
        if (!latest()) return;
        delete estimate.dataset.tasks;
        if (err.status === 429) {  // too many estimates: no field is at fault; the next change asks again
          estimate.textContent = err.message;
          return;
        }
        estimate.textContent = "This request cannot run yet: see the fields marked.";
        showErrors(errorsOf(err));
      }
    }, 250);
  }

  /** Keep the file chosen as the kind chosen, and show what it holds on the map; a file the
   * API refuses is said beside the field, and the request goes on without it. */
  async function keepFile() {
    const latest = choosing();
    const file = vectorFile.files[0];
    const slot = vectorField.querySelector(".error");
    const refuse = (message) => { vector.error = slot.textContent = message; };
    refuse("");
    Object.assign(vector, { kind: vectorKind.value, ref: null });
    document.getElementById("sites-options").hidden = vectorKind.value !== "sites";
    mapView.showFeatures([]);
    vectorStatus.textContent = "";
    if (!file) return changed();
    const text = await file.text();
    if (!latest()) return;  // another file or kind was chosen meanwhile
    let data = text;
    if (!/\.csv$/i.test(file.name)) {
      try { data = JSON.parse(text); } catch { refuse(`${file.name} is not JSON (or name a CSV file .csv)`); return changed(); }
    }
    try {
      const kept = await api("POST", "/api/vectors", { kind: vectorKind.value, data });
      if (!latest()) return;
      vector.ref = kept.ref;
      const what = { sites: "sites", zones: "zones", region: "polygon" }[kept.kind];
      vectorStatus.textContent = `${file.name}: ${kept.count.toLocaleString()} ${kept.count === 1 && what !== "polygon" ? what.slice(0, -1) : what} kept` +
        (kept.kind === "region" ? "" : " (they replace the region above)");
      const box = mapView.showFeatures(featuresOf(data));
      if (box) mapView.fit(box, 0.5);
    } catch (err) {
      if (!latest()) return;
      refuse(err.body?.detail ? `${err.body.field ? err.body.field + ": " : ""}${err.body.detail}` : err.message);
    }
    changed();
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors();
    submit.disabled = true;
    try {
      // a request that looks like a slip (a box across half the world, far more tasks than
      // my last job) is asked about first, as the command line asks
      const { confirm: doubts } = await api("POST", "/api/estimate", request());
      if (doubts.length && !window.confirm(`Check before it runs:\n${doubts.map((d) => `• ${d}`).join("\n")}` +
          "\n\nSubmit it as it is?")) return;
      const created = await api("POST", "/api/jobs", request());
      location.hash = `#/jobs/${created.job}`;
    } catch (err) {
      showErrors(errorsOf(err));
    } finally {
      submit.disabled = false;
    }
  });
  describe();
  offerInputs();
  showReduce();
  changed();
}

/** What to draw of an uploaded file: its points and polygons with their ids, read as the API
 * reads them (CSV with id, lon and lat columns; a list of {id, lon, lat}; GeoJSON). */
function featuresOf(data) {
  if (typeof data === "string") {
    const [head, ...lines] = data.trim().split(/\r?\n/).map((line) => line.split(",").map((cell) => cell.trim().replace(/^"|"$/g, "")));
    const at = (names) => head.findIndex((name) => names.includes(name.toLowerCase()));
    const [id, lon, lat] = [at(["id", "site", "name"]), at(["lon", "longitude", "x"]), at(["lat", "latitude", "y"])];
    return lines.filter((cells) => cells.length > Math.max(lon, lat)).map((cells, i) => ({
      id: id >= 0 ? cells[id] : String(i), geometry: { type: "Point", coordinates: [Number(cells[lon]), Number(cells[lat])] } }))
      .filter((f) => f.geometry.coordinates.every(Number.isFinite));
  }
  if (Array.isArray(data)) return data.map((p, i) => ({ id: p.id ?? String(i), geometry: { type: "Point", coordinates: [p.lon, p.lat] } }));
  if (data?.type === "FeatureCollection") return (data.features || []).filter((f) => f?.geometry).map((f, i) =>
    ({ id: f.id ?? f.properties?.id ?? f.properties?.name ?? String(i), geometry: f.geometry }));
  if (data?.type === "Feature") return data.geometry ? [{ id: data.id ?? "0", geometry: data.geometry }] : [];
  return data?.type ? [{ id: "0", geometry: data }] : [];
}

/** One site's or zone's series, a line per layer (or input) over time, a gap where it has no value. */
function seriesSvg(series, id) {
  const W = 480, H = 170, left = 44, right = 8, top = 10, bottom = 30;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  svg.classList.add("series");
  const points = series.flatMap((s) => s.points);
  const times = points.map(([t]) => Date.parse(t));
  const values = points.map(([, v]) => v).filter((v) => v !== null);
  svg.setAttribute("aria-label", `${id}: ${series.map((s) => s.name).join(", ")} over time`);
  if (!values.length) {
    svg.innerHTML = `<text x="${W / 2}" y="${H / 2}" text-anchor="middle">${id}: no data</text>`;
    return svg;
  }
  const [t0, t1, v0, v1] = [Math.min(...times), Math.max(...times), Math.min(...values), Math.max(...values)];
  const X = (t) => left + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - left - right);
  const Y = (v) => top + (v1 > v0 ? (v1 - v) / (v1 - v0) : 0.5) * (H - top - bottom);
  const unit = series[0].unit ? ` ${series[0].unit}` : "";
  const number = (v) => Number(v.toPrecision(4)).toString();
  const ns = "http://www.w3.org/2000/svg";
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.appendChild(node);
    return node;
  };
  add("line", { class: "axis", x1: left, x2: left, y1: top, y2: H - bottom });
  add("line", { class: "axis", x1: left, x2: W - right, y1: H - bottom, y2: H - bottom });
  add("text", { x: left - 4, y: top + 8, "text-anchor": "end", class: "y-high" }, number(v1));
  add("text", { x: left - 4, y: H - bottom, "text-anchor": "end", class: "y-low" }, number(v0));
  add("text", { x: left, y: H - bottom + 14, class: "x-first" }, new Date(t0).toISOString().slice(0, 10));
  add("text", { x: W - right, y: H - bottom + 14, "text-anchor": "end", class: "x-last" }, new Date(t1).toISOString().slice(0, 10));
  add("text", { x: left, y: H - 3, class: "names" }, series.map((s) => s.name).join(" · ") + unit);
  series.forEach((s, i) => {
    let d = "", gap = true;
    for (const [t, v] of s.points) {
      if (v === null) { gap = true; continue; }
      d += `${gap ? "M" : "L"}${X(Date.parse(t)).toFixed(1)} ${Y(v).toFixed(1)}`;
      gap = false;
    }
    add("path", { d, class: `line-${i % 4}`, "data-series": s.name });
    for (const [t, v] of s.points) {
      if (v === null) continue;
      const dot = add("circle", { cx: X(Date.parse(t)).toFixed(1), cy: Y(v).toFixed(1), r: 2.2, class: `line-${i % 4}`,
        "data-date": t, "data-value": v });
      dot.appendChild(document.createElementNS(ns, "title")).textContent =
        `${s.name} ${t}: ${number(v)}${s.unit ? " " + s.unit : ""}`;
    }
  });
  return svg;
}

/** A table's cell as read: none as a dash, a number to six significant digits (0.2062, not a
 * float's 0.20620000000000002). */
function cellText(cell) {
  if (cell === null) return "–";
  return typeof cell === "number" && !Number.isInteger(cell) ? String(Number(cell.toPrecision(6))) : String(cell);
}

/** A finished job's table: its first rows, and a plot of one site's or zone's series (chosen). */
async function tablePanel(id, kind) {
  const noun = kind === "sites" ? "site" : "zone";
  const choice = h("select", { id: "series-choice", "aria-label": `The ${noun} plotted` });
  const plot = h("figure", { class: "series-plot" });
  const rows = h("div", { class: "table-scroll" });
  const caption = h("p", { class: "hint" });
  const choosing = latestOnly();  // an answer for an earlier series chosen arriving late is dropped
  const show = async (wanted) => {
    const latest = choosing();
    const query = wanted === undefined ? "" : `&id=${encodeURIComponent(wanted)}`;
    const found = await api("GET", `/api/jobs/${id}/tables/${kind}?rows=10${query}`);
    if (!latest()) return;
    if (!choice.options.length) choice.replaceChildren(...found.ids.map((one) => h("option", { value: one }, one)));
    choice.value = found.id;
    plot.replaceChildren(seriesSvg(found.series, found.id),
      h("figcaption", {}, `${found.id}: ${found.series.map((s) => `${s.name}${s.unit ? " (" + s.unit + ")" : ""}`).join(", ")}`));
    caption.textContent = `The first ${found.rows.length} of ${found.total.toLocaleString()} rows; the whole table is ` +
      `${kind}/${kind}.csv and ${kind}/${kind}.parquet among the files below.`;
    rows.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ...found.columns.map((c) => h("th", {}, c)))),
      h("tbody", {}, ...found.rows.map((row) => h("tr", {}, ...row.map((cell) => h("td", {}, cellText(cell))))))));
  };
  choice.addEventListener("change", () => show(choice.value));
  await show();
  return h("section", { class: "table-preview", id: "table-preview" }, h("h3", {}, `The ${kind} table`),
    h("p", {}, h("label", { for: "series-choice" }, `Series of the ${noun} `), choice), plot, caption, rows);
}

class FieldError extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

// Calls `step` again once its answer is in (never two requests in flight): after `fast`
// ms while what it returns changes, twice as long each time it returns the same (or fails),
// up to `slow`; stops when it returns null. Returns what stops it (on leaving the page).
function poll(step, fast, slow) {
  let delay = fast;
  let last;
  let timer = null;
  let stopped = false;
  const run = async () => {
    let seen;
    try {
      seen = await step();
    } catch {
      seen = undefined;
    }
    if (stopped || seen === null) return;
    delay = seen === undefined || seen === last ? Math.min(delay * 2, slow) : fast;
    last = seen;
    timer = setTimeout(run, delay);
  };
  timer = setTimeout(run, fast);
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// ---- the jobs list -------------------------------------------------------------------
async function jobsPage() {
  const me = await whoami();
  const everyone = h("input", { type: "checkbox", id: "all-jobs", onchange: () => refresh() });
  const table = h("table", { class: "jobs" }, h("thead", {}, h("tr", {},
    h("th", {}, "Job"), h("th", {}, "Label"), h("th", {}, "Owner"), h("th", {}, "State"), h("th", {}, "Tasks"),
    h("th", {}, "Submitted"))));
  const body = h("tbody");
  table.append(body);
  main.replaceChildren(h("h1", {}, me.role === "admin" ? "Jobs" : "My jobs"),
    me.role === "admin" ? h("label", { class: "check" }, everyone, " everyone's (admin)") : "", table);
  const asking = latestOnly();  // a poll's answer for the list before "everyone's" was changed is dropped
  const refresh = async () => {
    const latest = asking();
    const jobs = await api("GET", `/api/jobs?limit=100${everyone.checked ? "&all=true" : ""}`);
    if (!latest()) return undefined;
    body.replaceChildren(...jobs.map((j) => h("tr", {},
      h("td", {}, h("a", { href: `#/jobs/${j.job}` }, j.job)), h("td", {}, j.label), h("td", {}, j.owner),
      h("td", {}, stateBadge(j.state)), h("td", { class: "num" }, String(j.total)),
      h("td", { title: j.created }, age(j.created)))));
    if (!jobs.length) body.append(h("tr", {}, h("td", { colspan: 6 }, "No jobs yet.")));
    return JSON.stringify(jobs);
  };
  await refresh();
  leave = poll(refresh, 5000, 30000);
}

// ---- one job -------------------------------------------------------------------------
function histogramSvg(stage, info) {
  const { bars, width_s: width, threshold_s: threshold, threshold_beyond: beyond } = info.histogram;
  const top = Math.max(1, ...bars);
  const W = 400, H = 120, n = bars.length;
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H + 16}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${stage}: runtimes of ${info.histogram.count} tasks; kill threshold ${duration(threshold)}`);
  svg.classList.add("histogram");
  let inner = "";
  bars.forEach((count, i) => {
    const bh = (count / top) * H;
    inner += `<rect class="bar" x="${(i * W) / n + 1}" y="${H - bh}" width="${W / n - 2}" height="${bh}"><title>${(i * width).toFixed(1)}–${((i + 1) * width).toFixed(1)} s: ${count}</title></rect>`;
  });
  if (threshold) {
    const tx = beyond ? W - 1 : Math.min(W - 1, (threshold / (width * n)) * W);
    inner += `<line class="threshold" x1="${tx}" x2="${tx}" y1="0" y2="${H}"/><text class="threshold-label" x="${Math.max(0, tx - 4)}" y="${H + 13}" text-anchor="end">${beyond ? "→ " : ""}kill at ${duration(threshold)}</text>`;
  }
  inner += `<text x="0" y="${H + 13}">0 s</text><text x="${W / 2}" y="${H + 13}" text-anchor="middle">${duration((width * n) / 2)}</text>`;
  svg.innerHTML = inner;
  return svg;
}

/** A ramp's legend as one colour bar: its stops ({value, colour, label}) placed by value, its two
 * ends labelled (the high end with the unit, once). */
function colourBar(stops, unit) {
  const bare = (label) => (unit && label.endsWith(` ${unit}`) ? label.slice(0, -unit.length - 1) : label);
  const low = stops[0].value, high = stops[stops.length - 1].value;
  const at = (value) => (high > low ? ((value - low) / (high - low)) * 100 : 0).toFixed(2);
  const gradient = stops.map((s) => `${s.colour} ${at(s.value)}%`).join(", ");
  return h("li", { class: "colour-bar" }, h("span", { class: "low" }, bare(stops[0].label)),
    h("span", { class: "bar", style: `background: linear-gradient(to right, ${gradient})` }),
    h("span", { class: "high" }, stops[stops.length - 1].label));
}

/** The job's overviews: a choice of layer and date, the chosen one on the map (``show``), its legend. */
function overviewPanel(overviews, show) {
  const legend = h("ul", { class: "overview-legend", "aria-label": "Legend" });
  const link = h("a", { target: "_blank", rel: "noopener", id: "overview-picture" }, "picture with legend");
  const choice = h("select", { id: "overview-choice", "aria-label": "Layer and date shown on the map" },
    ...overviews.map((o, i) => h("option", { value: String(i) }, o.name)));
  const pick = () => {
    const chosen = overviews[Number(choice.value)];
    show(chosen);
    link.href = chosen.picture;
    const ramp = chosen.legend.length > 1 && chosen.legend.every((entry) => typeof entry.value === "number");
    legend.replaceChildren(...(ramp ? [colourBar(chosen.legend, chosen.unit)] : chosen.legend.map((entry) =>
      h("li", {}, h("span", { class: "swatch", style: `background:${entry.colour}` }), entry.label))));
  };
  choice.addEventListener("change", pick);
  pick();
  return h("section", { class: "overview" }, h("h3", {}, "Overview of the region"),
    h("p", {}, choice, " ", link), legend);
}

/** How to open the job's products as STAC: where it lives (the API's collection, with one line of
 * Python that loads it), and the catalog ``bagpipe results`` writes beside the files. */
function stacPanel(id, results) {
  const band = results.tasks.find((t) => t.stage !== "reduce" && t.layers?.length)?.layers[0]; // the manifest's list
  const bands = band ? `, bands=['${band}']` : "";
  const api = `${location.origin}/api/stac`;
  const tiles = "if i.properties['bagpipe:stage'] == 'modis'";
  const remote = `python -c "import os, odc.stac, pystac_client; ` +
    `api = pystac_client.Client.open('${api}', headers={'Authorization': 'Bearer ' + os.environ['BAGPIPE_API_KEY']}); ` +
    `items = [i for i in api.search(collections=['${id}']).items() ${tiles}]; ` +
    `print(odc.stac.load(items${bands}))"`;
  const load = `bagpipe results ${id} --out ${id} && python -c "import odc.stac, pystac; ` +
    `items = [i for i in pystac.Collection.from_file('${id}/collection.json').get_items() ${tiles}]; ` +
    `print(odc.stac.load(items${bands}))"`;
  return h("section", { class: "stac" }, h("h3", {}, "Open it as STAC"),
    h("p", {}, "Where it is: the STAC collection ",
      h("a", { id: "stac-link", href: `${api}/collections/${id}` }, `${api}/collections/${id}`),
      ", in bagpipe's STAC API. pystac-client opens it with your API token (",
      h("code", {}, "BAGPIPE_API_KEY"), "), and odc.stac loads its items over short-lived signed links:"),
    h("pre", { id: "stac-api-snippet" }, remote),
    h("p", {}, "Or downloaded: the results folder is a STAC collection too (", h("code", {}, `${id}/collection.json`),
      "), with the region's mosaics, every link relative: QGIS's STAC plugin, pystac and odc.stac open it as it is."),
    h("pre", { id: "stac-snippet" }, load));
}

async function jobPage(id) {
  const title = h("h1", {}, `Job ${id}`);
  const summary = h("div", { class: "summary" });
  const progress = h("progress", { max: 1, value: 0, "aria-label": "progress" });
  const progressText = h("p", { class: "progress-text", "aria-live": "polite" });
  const cancel = h("button", { type: "button", class: "danger", id: "cancel" }, "Cancel job");
  const counts = h("dl", { class: "counts" });
  const histograms = h("div", { class: "histograms" });
  const failures = h("div", { class: "failures" });
  const workers = h("div", { class: "workers" });
  const products = h("div", { class: "products" });
  const mapHost = h("section", { class: "map-panel", "aria-label": "Target tiles by state" });
  const legend = h("ul", { class: "legend" }, ...["waiting", "running", "done", "nodata", "failed", "cancelled"].map((s) =>
    h("li", {}, h("span", { class: `swatch state-${s}` }), s === "nodata" ? "no data" : s)));
  main.replaceChildren(title, summary, h("div", { class: "job-layout" },
    h("div", {}, mapHost, legend),
    h("div", {}, progress, progressText, cancel, counts, h("h2", {}, "Task runtimes"), histograms,
      h("h2", {}, "Failures and monitor kills"),
      h("p", { class: "hint", id: "failures-hint" }, "An attempt that fails is tried again, and so is one the " +
        "monitor stopped for running far longer than its stage's usual time (a monitor kill); a task is dead " +
        "when every attempt it is allowed has failed. Backup attempts are second copies of slow attempts near " +
        "the job's end: the first to finish counts."),
      failures, h("h2", {}, "Workers"),
      h("p", { class: "hint", id: "workers-hint" }, "Runtime ratio: how long a worker's recent attempts ran " +
        "against their stage's usual time (1× is usual; a worker far slower than the others is replaced, its " +
        "attempts run again elsewhere)."),
      workers,
      h("h2", {}, "Products"), products)));
  const mapView = new WorldMap(mapHost, { label: "Target tiles coloured by state" });
  mapView.drawLand();
  let fitted = false;
  let done = false;
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      await api("POST", `/api/jobs/${id}/cancel`);
    } catch (err) {
      progressText.textContent = err.message;
    }
    refresh();
  });

  async function refresh() {
    let view;
    try {
      view = await api("GET", `/api/jobs/${id}/view`);
    } catch (err) {
      summary.replaceChildren(h("p", { class: "error" }, err.message));
      return;
    }
    title.replaceChildren(`Job ${id} `, stateBadge(view.state));
    summary.replaceChildren(h("p", {}, view.label || "(no label)", " · submitted ", age(view.created),
      view.finished ? ` · finished ${age(view.finished)}` : ""),
    // what the state alone does not say: a job that made nothing, one made from synthesized data
    ...(view.warning ? [h("p", { class: "warning", role: "status" }, view.warning)] : []),
    ...view.notes.map((note) => h("p", { class: "note" }, note)));
    progress.value = view.progress;
    const ended = Math.round(view.progress * view.total);
    progressText.textContent = `${ended} of ${view.total} tasks ended` +
      (view.eta_s !== null && view.eta_s !== undefined ? ` · about ${duration(view.eta_s)} left` : "");
    cancel.hidden = FINISHED.has(view.state) || view.state === "CANCELLING";
    counts.replaceChildren(...Object.entries(view.counts).filter(([, n]) => n).flatMap(([s, n]) =>
      [h("dt", {}, s), h("dd", { "data-state": s }, String(n))]),
    h("dt", { title: "attempts stopped for running far longer than their stage's usual time, then retried" },
      "monitor kills"), h("dd", { "data-kills": "" }, String(view.monitor_kills)),
    h("dt", { title: "second copies of slow attempts near the job's end: the first to finish counts" },
      "backup attempts"), h("dd", { "data-backups": "" }, String(view.speculative_attempts)));
    const tiles = view.tiles.filter((t) => t.bounds);
    mapView.showTiles(tiles);
    if (!fitted && tiles.length) {
      mapView.fit(lonSpan(tiles.map((t) => t.bounds))); // a region across ±180° in the map's middle
      fitted = true;
    }
    histograms.replaceChildren(...Object.entries(view.stages).map(([stage, info]) =>
      h("figure", {}, histogramSvg(stage, info), h("figcaption", {},
        `${stage}: ${info.histogram.count} runs here, mean ${duration(info.mean_s)} over ${info.runs} runs known; ${info.left} left`))));
    failures.replaceChildren(view.failed_attempts.length ? h("table", {}, h("thead", {}, h("tr", {},
      h("th", {}, "Task"), h("th", {}, "Attempt"), h("th", {}, "Class"), h("th", {}, "By"), h("th", {}, "Logs"))),
    h("tbody", {}, ...view.failed_attempts.map((f) => h("tr", {},
      h("td", {}, f.task), h("td", { class: "num" }, String(f.attempt)), h("td", { title: f.error }, f.class),
      h("td", {}, f.revoked_by || "worker"),
      h("td", {}, ...Object.entries(f.logs).map(([name, url]) => h("a", { href: url, target: "_blank", rel: "noopener" }, name, " "))))))) :
      h("p", {}, "None."));
    // per worker: attempts run for this job, committed, recent runtime ratio to history, state
    workers.replaceChildren(view.workers.length ? h("table", {}, h("thead", {}, h("tr", {},
      h("th", {}, "Worker"), h("th", {}, "Attempts"), h("th", {}, "Committed"), h("th", {}, "Runtime ratio"),
      h("th", {}, "State"))),
    h("tbody", {}, ...view.workers.map((w) => h("tr", {}, h("td", {}, w.worker),
      h("td", { class: "num" }, String(w.attempts)), h("td", { class: "num" }, String(w.committed)),
      h("td", { class: "num" }, w.recent_ratio === null ? "–" : `${w.recent_ratio}×`),
      h("td", { "data-worker-state": w.state }, w.state))))) : h("p", {}, "None yet."));
    if (FINISHED.has(view.state) && !done) {
      done = true;
      await showProducts();
    }
    return view;
  }

  async function showProducts() {
    const [results, pictures] = await Promise.all([
      api("GET", `/api/jobs/${id}/results`).catch(() => null), api("GET", `/api/jobs/${id}/quicklooks`)]);
    const looks = pictures.filter((q) => q.kind !== "overview");
    const overviews = pictures.filter((q) => q.kind === "overview");
    const overview = overviews.length ? overviewPanel(overviews, (chosen) => mapView.showImages([chosen], "overview")) : "";
    if (!overviews.length) mapView.showImages(looks);
    if (!results) {
      products.replaceChildren(h("p", {}, "No manifest."));
      return;
    }
    const items = results.tasks.flatMap((t) => Object.entries(t.links || {}).map(([blob, url]) =>
      h("li", {}, h("a", { href: url }, `${t.product} ${t.tile} ${t.date}${t.last ? "…" + t.last : ""}: ${blob.split("/").pop()}`))));
    const kind = ["sites", "zones"].find((k) => results.tasks.some((t) => (t.outputs || []).some((o) => o.endsWith(`/${k}.parquet`))));
    const table = kind ? await tablePanel(id, kind).catch((err) => h("p", { class: "error" }, err.message)) : "";
    products.replaceChildren(overview, table,
      h("p", {}, h("a", { href: results.manifest_url, id: "manifest-link" }, "manifest.json"),
        ` · links valid for a limited time · or: bagpipe results ${id} --out DIR`),
      stacPanel(id, results),
      h("div", { class: "quicklooks" }, ...looks.map((q) => h("figure", {},
        h("a", { href: q.url, target: "_blank", rel: "noopener" }, h("img", { src: q.url, alt: `quick-look of ${q.tile}`, class: "quicklook-thumb" })),
        h("figcaption", {}, `${q.tile}: ${q.name}`)))),
      h("details", {}, h("summary", {}, `${items.length} files`), h("ul", { class: "files" }, ...items)));
  }

  const first = await refresh();
  if (!first || !FINISHED.has(first.state)) {
    leave = poll(async () => {
      const view = await refresh();
      if (view && FINISHED.has(view.state)) return null;
      return view ? JSON.stringify({ ...view, as_of: undefined }) : undefined; // changed: not when summed
    }, 1500, 15000);
  }
}

// ---- routing -------------------------------------------------------------------------
async function route() {
  leave();
  leave = () => {};
  const hash = location.hash || "#/";
  for (const a of document.querySelectorAll("nav a")) a.toggleAttribute("aria-current", a.getAttribute("href") === hash);
  const job = hash.match(/^#\/jobs\/([\w-]+)$/);
  try {
    const me = await whoami();
    document.getElementById("who").textContent = `${me.user} (${me.role})`;
    document.getElementById("sign-out").hidden = false; // signed in: there is someone to sign out
    if (job) await jobPage(job[1]);
    else if (hash === "#/jobs") await jobsPage();
    else if (hash === "#/reducers") await reducersPage(main);
    else if (hash === "#/account") await accountPage(main);
    else await submitPage();
  } catch (err) {
    main.replaceChildren(h("p", { class: "error" }, err.message));
  }
}

document.getElementById("sign-out").addEventListener("click", async () => {
  document.getElementById("who").textContent = "";
  document.getElementById("sign-out").hidden = true;
  await signOut();
  route();
});
window.addEventListener("hashchange", route);
route();
