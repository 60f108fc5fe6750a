"""The stylesheet and script inlined into the HTML report (no network at view time).

The script reads the JSON in ``<script id="explain-data">``, draws one canvas heatmap per layer
and head, a large labelled view of the chosen map, and the residual-stream chart (SVG). When it
is done it writes ``data-status="ok"`` (or ``"error"``) on ``#status``, which the browser test
reads back.
"""

CSS = r"""
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg: #fafbfc; --accent: #2f6fdb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); margin: 0; padding: 24px 32px 48px; max-width: 1280px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.summary, .muted { color: var(--muted); }
.tokens span { display: inline-block; padding: 1px 6px; margin: 2px 3px 2px 0;
  border: 1px solid var(--line); border-radius: 4px; background: #fff; font-family: monospace; }
.tokens span.pad { color: #aab; border-style: dashed; }
.notes li { margin: 2px 0; } .ok { color: #17803d; } .bad { color: #b42318; font-weight: 600; }
.controls { margin: 8px 0; } .controls label { margin-right: 16px; }
.grid { display: grid; gap: 6px 6px; align-items: center; overflow-x: auto; }
.grid .rowlabel, .grid .collabel { font-size: 12px; color: var(--muted); white-space: nowrap; }
.grid canvas { border: 1px solid var(--line); cursor: pointer; image-rendering: pixelated;
  background: #fff; }
.grid canvas.selected { outline: 2px solid var(--accent); outline-offset: 1px; }
.focus { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
.focus > div { max-width: 100%; overflow-x: auto; }  /* a long text's large view scrolls */
#focus-canvas { border: 1px solid var(--line); background: #fff; }
#hover { font-family: monospace; min-height: 1.5em; }
.legend { display: flex; align-items: center; gap: 8px; font-size: 12px; color: var(--muted); }
.legend canvas { border: 1px solid var(--line); }
.swatch { display: inline-block; width: 14px; height: 14px; border: 1px solid var(--line);
  vertical-align: middle; background: repeating-linear-gradient(45deg, #e4e6eb 0 3px,
  #c2c6cf 3px 5px); }
#stream svg { background: #fff; border: 1px solid var(--line); }
details { background: #fff; border: 1px solid var(--line); border-radius: 6px; margin: 8px 0;
  padding: 4px 12px; } summary { cursor: pointer; font-weight: 600; padding: 4px 0; }
table.steps { border-collapse: collapse; width: 100%; font-size: 13px; }
table.steps td, table.steps th { border-top: 1px solid var(--line); padding: 6px 8px;
  vertical-align: top; text-align: left; }
table.steps pre { margin: 0; font-size: 12px; white-space: pre-wrap; }
table.steps .formula { font-family: "STIX Two Math", "Cambria Math", serif; font-size: 14px; }
table.steps .where { color: var(--muted); font-size: 12px; }
table.steps .stats { font-family: monospace; font-size: 12px; white-space: nowrap; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
"""

JS = r"""
(function () {
  "use strict";
  const status = document.getElementById("status");
  function fail(msg) { status.dataset.status = "error"; status.textContent = "error: " + msg; }
  window.addEventListener("error", function (e) { fail(e.message); });
  const data = JSON.parse(document.getElementById("explain-data").textContent);
  const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  function colour(v) {  // v in [0, 1] -> viridis-like RGB
    const x = Math.min(Math.max(v, 0), 1) * (STOPS.length - 1);
    const i = Math.min(Math.floor(x), STOPS.length - 2), f = x - i, a = STOPS[i], b = STOPS[i + 1];
    return "rgb(" + [0, 1, 2].map(k => Math.round(a[k] + f * (b[k] - a[k]))).join(",") + ")";
  }
  let hatch = null;
  function hatchPattern(ctx) {
    if (hatch) return hatch;
    const c = document.createElement("canvas"); c.width = c.height = 6;
    const g = c.getContext("2d"); g.fillStyle = "#e4e6eb"; g.fillRect(0, 0, 6, 6);
    g.strokeStyle = "#b8bcc6"; g.lineWidth = 1.5; g.beginPath();
    g.moveTo(0, 6); g.lineTo(6, 0); g.stroke();
    hatch = ctx.createPattern(c, "repeat"); return hatch;
  }
  const T = data.tokens[0].length, H = data.n_heads;
  // The view to open with, from the address: report.html#sequence=1&layer=2&head=3
  const wanted = new URLSearchParams(location.hash.slice(1));
  function pick(name, n) {
    const v = parseInt(wanted.get(name) || "0", 10);
    return v >= 0 && v < n ? v : 0;
  }
  const state = { seq: pick("sequence", data.tokens.length), layer: pick("layer",
    data.layers.length), head: pick("head", H) };
  // A cell is drawn hatched when the key is masked for this query, or the query is padding.
  function allowed(layer, b, h, i, j) {
    if (!data.mask[b][i]) return false;
    const m = data.layers[layer].mask;
    if (m === null) return true;
    return m === "keys" ? data.mask[b][j] === 1 : m[b][h][i][j] === 1;
  }
  function drawMap(ctx, layer, b, h, x0, y0, cell) {
    const w = data.layers[layer].weights[b][h];
    let max = 0;
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++)
      if (allowed(layer, b, h, i, j)) max = Math.max(max, w[i][j]);
    for (let i = 0; i < T; i++) for (let j = 0; j < T; j++) {
      ctx.fillStyle = allowed(layer, b, h, i, j) ? colour(max > 0 ? w[i][j] / max : 0)
                                                  : hatchPattern(ctx);
      ctx.fillRect(x0 + j * cell, y0 + i * cell, cell, cell);
    }
    return max;
  }
  const grid = document.getElementById("grid");
  let drawn = 0;
  // Pixels per cell: up to 96 px a map, less where a layer's heads would not fit the page's
  // width (12 heads of MiniLM at 1280 px did not); at 1 px a cell the grid scrolls instead.
  const GAP = 6, BORDER = 2;
  function gridCell(labelWidth) {
    const room = (grid.clientWidth - labelWidth - GAP) / H - GAP - BORDER;
    const wanted = Math.max(2, Math.floor(96 / T));
    return Math.max(1, Math.min(wanted, Math.floor(room / T)));
  }
  function buildGrid() {
    grid.innerHTML = "";
    // max-content, not auto: an auto column would take the room the maps leave.
    grid.style.gridTemplateColumns = "max-content repeat(" + H + ", max-content)";
    const widest = document.createElement("span"); widest.className = "rowlabel";
    widest.textContent = "layer " + (data.layers.length - 1); grid.appendChild(widest);
    const cell = gridCell(Math.ceil(widest.getBoundingClientRect().width));
    grid.innerHTML = "";
    grid.appendChild(document.createElement("span"));
    for (let h = 0; h < H; h++) {
      const s = document.createElement("span"); s.className = "collabel";
      s.textContent = "head " + h; grid.appendChild(s);
    }
    drawn = 0;
    data.layers.forEach(function (layer, l) {
      const label = document.createElement("span"); label.className = "rowlabel";
      label.textContent = "layer " + l; grid.appendChild(label);
      for (let h = 0; h < H; h++) {
        const c = document.createElement("canvas");
        c.width = c.height = cell * T; c.dataset.layer = l; c.dataset.head = h;
        c.className = "heatmap" + (l === state.layer && h === state.head ? " selected" : "");
        c.title = "layer " + l + ", head " + h;
        drawMap(c.getContext("2d"), l, state.seq, h, 0, 0, cell);
        c.addEventListener("click", function () { state.layer = l; state.head = h; refresh(); });
        grid.appendChild(c); drawn++;
      }
    });
  }
  const focus = document.getElementById("focus-canvas");
  const FOCUS = { label: 0, cell: 0 };
  function drawFocus() {
    const ctx = focus.getContext("2d"), labels = data.tokens[state.seq];
    ctx.font = "12px monospace";
    const label = Math.ceil(Math.max.apply(null, labels.map(t => ctx.measureText(t).width))) + 10;
    const cell = Math.max(8, Math.min(40, Math.floor(560 / T)));
    focus.width = focus.height = label + cell * T + 2;
    ctx.font = "12px monospace"; ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, focus.width, focus.height);
    const max = drawMap(ctx, state.layer, state.seq, state.head, label, label, cell);
    ctx.fillStyle = "#1d2330"; ctx.textBaseline = "middle";
    for (let i = 0; i < T; i++) {
      ctx.textAlign = "right"; ctx.fillText(labels[i], label - 5, label + (i + 0.5) * cell);
      ctx.save(); ctx.translate(label + (i + 0.5) * cell, label - 5); ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left"; ctx.fillText(labels[i], 0, 0); ctx.restore();
    }
    FOCUS.label = label; FOCUS.cell = cell;
    document.getElementById("focus-title").textContent = "layer " + state.layer + ", head " +
      state.head + " (sequence " + state.seq + "): colour = weight / " + max.toFixed(3) +
      " (the largest weight of this map)";
    const lost = data.layers[state.layer].lost_keys[state.seq][state.head];
    const parts = [];
    for (let i = 0; i < T; i++) if (data.mask[state.seq][i] && lost[i] > 0)
      parts.push("“" + labels[i] + "” " + lost[i]);
    document.getElementById("lost").textContent = parts.length
      ? "keys each query lost to the mask: " + parts.join(", ")
      : "no query lost a key to the mask";
  }
  focus.addEventListener("mousemove", function (e) {
    const r = focus.getBoundingClientRect();
    const j = Math.floor((e.clientX - r.left - FOCUS.label) / FOCUS.cell);
    const i = Math.floor((e.clientY - r.top - FOCUS.label) / FOCUS.cell);
    const out = document.getElementById("hover"), labels = data.tokens[state.seq];
    if (i < 0 || j < 0 || i >= T || j >= T) { out.textContent = ""; return; }
    const w = data.layers[state.layer].weights[state.seq][state.head][i][j];
    out.textContent = "query " + labels[i] + " → key " + labels[j] + ": " +
      (allowed(state.layer, state.seq, state.head, i, j) ? w.toFixed(4) : "masked");
  });
  function drawStream() {
    const box = document.getElementById("stream"), ns = "http://www.w3.org/2000/svg";
    const pts = data.stream, labels = data.tokens[state.seq], keep = data.mask[state.seq];
    const W = 900, Hh = 300, L = 56, R = 20, Tp = 16, B = 70;
    const real = []; for (let t = 0; t < T; t++) if (keep[t]) real.push(t);
    let ymax = 0;
    pts.forEach(p => real.forEach(t => { ymax = Math.max(ymax, p.norms[state.seq][t]); }));
    ymax = ymax > 0 ? ymax * 1.05 : 1;
    const x = k => L + (pts.length > 1 ? k * (W - L - R) / (pts.length - 1) : 0);
    const y = v => Tp + (Hh - Tp - B) * (1 - v / ymax);
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", Hh);
    function add(tag, attrs, text) {
      const el = document.createElementNS(ns, tag);
      Object.keys(attrs).forEach(k => el.setAttribute(k, attrs[k]));
      if (text !== undefined) el.textContent = text; svg.appendChild(el); return el;
    }
    for (let g = 0; g <= 4; g++) {
      const v = ymax * g / 4;
      add("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#eceef2" });
      add("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11,
                    fill: "#5b6475" }, v.toFixed(1));
    }
    pts.forEach(function (p, k) {
      add("text", { x: x(k), y: Hh - B + 14, "font-size": 11, fill: "#5b6475",
        "text-anchor": "end", transform: "rotate(-40 " + x(k) + " " + (Hh - B + 14) + ")" },
        p.label);
    });
    real.forEach(function (t) {
      const d = pts.map((p, k) => (k ? "L" : "M") + x(k) + " " + y(p.norms[state.seq][t]));
      const line = add("path", { d: d.join(" "), fill: "none", stroke: "#9db4e0",
                                 "stroke-width": 1.2 });
      const title = document.createElementNS(ns, "title");
      title.textContent = labels[t]; line.appendChild(title);
    });
    const mean = pts.map(p => real.reduce((s, t) => s + p.norms[state.seq][t], 0) /
                              Math.max(real.length, 1));
    add("path", { d: mean.map((v, k) => (k ? "L" : "M") + x(k) + " " + y(v)).join(" "),
                  fill: "none", stroke: "#2f6fdb", "stroke-width": 3 });
    add("text", { x: L + 4, y: Tp + 2, "font-size": 12, fill: "#2f6fdb" },
        "‖x‖₂ per token (thin), mean over real tokens (bold)");
    box.innerHTML = ""; box.appendChild(svg);
  }
  function refresh() { buildGrid(); drawFocus(); drawStream(); }
  // How the grid sits in the page, a check that it fits: how many heatmaps reach past its
  // visible edge, and the share of its width a layer's maps span (shrunk no more than needed).
  function fit() {
    const box = grid.getBoundingClientRect();
    let cut = 0, left = Infinity, right = -Infinity;
    document.querySelectorAll("canvas.heatmap").forEach(function (c) {
      const r = c.getBoundingClientRect();
      if (r.right > box.right + 0.5) cut++;
      left = Math.min(left, r.left); right = Math.max(right, r.right);
    });
    status.dataset.cut = String(cut);
    status.dataset.fill = ((right - left) / grid.clientWidth).toFixed(2);
  }
  let resized = null;
  window.addEventListener("resize", function () {
    clearTimeout(resized);
    resized = setTimeout(function () { buildGrid(); fit(); }, 150);
  });
  // How many heatmaps hold more than one colour: a check that drawing really happened.
  function painted() {
    let n = 0;
    document.querySelectorAll("canvas.heatmap").forEach(function (c) {
      const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
      for (let k = 4; k < px.length; k += 4) {
        if (px[k] !== px[0] || px[k + 1] !== px[1] || px[k + 2] !== px[2]) { n++; break; }
      }
    });
    return n;
  }
  const seq = document.getElementById("sequence");
  if (seq) {
    seq.value = String(state.seq);
    seq.addEventListener("change", function () { state.seq = +seq.value; refresh(); });
  }
  try {
    refresh();
    status.dataset.heatmaps = String(drawn);
    status.dataset.painted = String(painted());
    fit();
    status.dataset.status = "ok";
    status.textContent = "drawn " + drawn + " heatmaps";
  } catch (e) { fail(e.message); }
})();
"""
