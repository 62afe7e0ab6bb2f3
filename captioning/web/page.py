"""The web page: one self-contained HTML file (no build step, nothing fetched from elsewhere).

It talks to the server only through the public API (GET /api/models, POST /api/caption), so
everything it shows a client script can get too. The per-word view draws each word's attention
map over the image in the browser, the way ``captioning.viz.pictures.overlay`` does (bicubic
stretch of the grid over the whole image, min-max normalised, the inferno colour map at 0.6
opacity; a hard model's chosen cell outlined over its faint soft map). The view selector draws
the other views of captioning/viz/views.py from the API's ``views`` arrays (``return_views``): the
alignment matrix, self-attention, the gate, the window, the sampled cell. :data:`ATLAS_PAGE` (``GET
/atlas``) shows every served model on one image and one word (``POST /api/atlas``). Kept in a Python
module rather than a data file so that it ships with the package without any package-data setting.
The two pages' visible strings are one table, :data:`STRINGS`, a column per language (``serve --lang``,
or the browser's Accept-Language: :func:`choose_language`); :func:`page` and :func:`atlas_page` fill them in.
"""

import functools
import html
import json
import re

PAGE = r"""<!doctype html>
<html lang="{{html_lang}}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{title}}</title>
<style>
  :root { --ink: #1d1d1f; --muted: #6b6b70; --line: #dedee3; --accent: #d63c00; --bg: #f6f6f8; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: var(--ink); background: var(--bg); }
  header { padding: 14px 24px; background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { margin: 0; font-size: 20px; }
  header p { margin: 2px 0 0; color: var(--muted); }
  header .lang-switch { margin-left: 12px; font-size: 13px; font-weight: normal; color: var(--muted); }
  main { display: grid; grid-template-columns: 300px 1fr; gap: 20px; padding: 20px 24px; align-items: start; }
  aside, .card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 16px; }
  aside h2, .card h2 { margin: 0 0 10px; font-size: 16px; }
  #drop { display: block; border: 2px dashed var(--line); border-radius: 8px; padding: 14px; text-align: center; cursor: pointer; color: var(--muted); }
  #drop.over { border-color: var(--accent); color: var(--accent); }
  #focus-area { position: relative; margin: 10px auto 0; width: fit-content; max-width: 100%; cursor: crosshair; user-select: none; touch-action: none; }
  #focus-area img { max-width: 100%; max-height: 220px; display: block; -webkit-user-drag: none; }
  #focus-box { position: absolute; border: 2px solid var(--accent); background: rgba(214, 60, 0, .15); pointer-events: none; }
  .focus-row { display: flex; gap: 8px; align-items: center; margin: 4px 0; }
  .focus-row button { font: inherit; padding: 2px 8px; }
  #file-input { display: none; }
  .examples { display: flex; flex-wrap: wrap; gap: 6px; margin: 8px 0 14px; }
  .examples img { width: 56px; height: 56px; object-fit: cover; border-radius: 6px; border: 2px solid transparent; cursor: pointer; image-rendering: auto; }
  .examples img:hover { border-color: var(--accent); }
  label.field { display: grid; grid-template-columns: 1fr 120px; align-items: center; gap: 8px; margin: 6px 0; }
  label.field input, label.field select { width: 100%; padding: 4px 6px; font: inherit; }
  .models label { display: block; margin: 4px 0; }
  button#run { width: 100%; margin-top: 12px; padding: 8px; font: inherit; font-weight: 600; color: #fff; background: var(--ink); border: 0; border-radius: 6px; cursor: pointer; }
  button#run:disabled { opacity: .5; cursor: default; }
  .hint { color: var(--muted); font-size: 13px; }
  #results { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 20px; }
  .caption-text { font-size: 22px; font-weight: 600; margin: 4px 0 2px; }
  .score { color: var(--muted); font-size: 13px; }
  .beams { margin: 8px 0; padding-left: 22px; color: var(--muted); font-size: 14px; }
  .beams li span { font-variant-numeric: tabular-nums; margin-left: 6px; }
  .words { display: flex; flex-wrap: wrap; gap: 4px; margin: 12px 0 6px; }
  .word { font: inherit; padding: 2px 8px; border: 1px solid var(--line); border-radius: 14px; background: #fff; cursor: pointer; }
  .word.active { background: var(--accent); border-color: var(--accent); color: #fff; }
  .word-slider { width: 100%; margin: 4px 0 8px; }
  .views { display: flex; flex-wrap: wrap; gap: 12px; align-items: flex-start; }
  .views figure { margin: 0; flex: 1 1 180px; min-width: 0; max-width: 360px; }
  .views figcaption { color: var(--muted); font-size: 12px; margin-top: 2px; }
  canvas.word-map, img.gif { display: block; width: 100%; height: auto; border-radius: 6px; background: #eee; }
  table.description { border-collapse: collapse; font-size: 13px; flex: 1 1 240px; }
  table.description th { text-align: left; color: var(--muted); font-weight: normal; padding: 2px 10px 2px 0; white-space: nowrap; vertical-align: top; width: 1%; }
  table.description td { padding: 2px 0; word-break: break-word; }
  .status { color: var(--muted); font-size: 13px; min-height: 18px; }
  .error { color: #b00020; background: #fdecee; border-radius: 6px; padding: 6px 10px; margin: 6px 0; }
  .hidden { display: none !important; }
  canvas.view-matrix { display: block; max-width: 100%; height: auto; margin-top: 8px; }
  .gate { display: flex; align-items: flex-end; gap: 6px; font-size: 12px; color: var(--muted); }
  .gate-bar { width: 18px; height: 120px; background: #ebebee; border: 1px solid #888; position: relative; }
  .gate-fill { position: absolute; bottom: 0; left: 0; right: 0; background: var(--accent); }
  .view-note { color: var(--muted); font-size: 13px; margin: 4px 0; }
  @media (max-width: 800px) { main { grid-template-columns: 1fr; } }
</style>
</head>
<body>
<header>
  <h1>{{heading}} <a class="lang-switch" href="?lang={{other_lang}}" hreflang="{{other_html_lang}}">{{other_language}}</a></h1>
  <p>{{intro}} <a href="/atlas?lang={{lang}}">{{atlas_link}}</a>{{atlas_link_rest}}</p>
</header>
<main>
  <aside>
    <h2>{{image}}</h2>
    <label id="drop" for="file-input">
      <span id="drop-text">{{drop}}</span>
    </label>
    <input id="file-input" type="file" accept="image/*">
    <div id="focus-area" class="hidden" title="{{focus_area_title}}">
      <img id="preview" alt="{{preview_alt}}" draggable="false">
      <div id="focus-box" class="hidden"></div>
    </div>
    <div id="focus-block" class="hidden">
      <div class="hint" id="focus-text">{{focus_hint}}</div>
      <div class="focus-row"><button id="focus-clear" type="button" disabled>{{focus_clear}}</button></div>
      <label class="field">{{focus_strength}} <input id="focus-strength" type="number" min="0" step="any" placeholder="10" title="{{focus_strength_title}}"></label>
    </div>
    <div id="examples-block" class="hidden">
      <div class="hint">{{examples}}</div>
      <div class="examples" id="examples"></div>
    </div>
    <h2>{{generation}}</h2>
    <label class="field">{{num_beams}} <input id="num-beams" type="number" min="1" max="10" value="3"></label>
    <label class="field">{{num_beam_groups}} <input id="num-beam-groups" type="number" min="1" max="10" value="1"></label>
    <label class="field">{{diversity_penalty}} <input id="diversity-penalty" type="number" min="0" max="10" step="0.1" placeholder="0.5"></label>
    <label class="field">{{max_new_tokens}} <input id="max-new-tokens" type="number" min="1" max="100" placeholder="{{models_own}}"></label>
    <label class="field">{{length_penalty}} <input id="length-penalty" type="number" min="-5" max="5" step="0.1" placeholder="{{models_own}}"></label>
    <label class="field" title="{{prefix_title}}">{{prefix}} <input id="prefix" type="text" placeholder="{{prefix_placeholder}}"></label>
    <label class="field hidden" id="mode-field">{{attention_mode}}
      <select id="attention-mode">
        <option value="">{{models_own}}</option><option value="expected">{{mode_expected}}</option><option value="argmax">{{mode_argmax}}</option><option value="sample">{{mode_sample}}</option>
      </select>
    </label>
    <label class="field" title="{{view_title}}">{{view}}
      <select id="view">
        <option value="maps">{{view_maps}}</option><option value="alignment">{{view_alignment}}</option>
        <option value="self">{{view_self}}</option><option value="gate">{{view_gate}}</option>
        <option value="window">{{view_window}}</option><option value="sample">{{view_sample}}</option>
      </select>
    </label>
    <details id="more-block" class="hidden"><summary class="hint">{{more_settings}}</summary><div id="more-fields"></div></details>
    <div id="models-block" class="models hidden"><h2>{{models}}</h2><div id="model-list"></div></div>
    <button id="run" disabled>{{run}}</button>
    <div id="global-error" class="error hidden"></div>
  </aside>
  <div id="results"></div>
</main>
<script>
"use strict";
const INFERNO = ["#000004", "#1b0c42", "#4b0c6b", "#781c6d", "#a52c60", "#cf4446", "#ed6925", "#fb9a06", "#f7d03c", "#fcffa4"]
  .map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
const ALPHA = 0.6;
const state = { models: [], blob: null, name: null, cards: {}, focus: null, drag: null };  // focus: [x0, y0, x1, y1] in the image's own pixels
const $ = id => document.getElementById(id);
const STRINGS = {{strings_json}};  // this language's column of captioning/web/page.py: STRINGS
function t(key, vars = {}) { return STRINGS[key].replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m)); }

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// ---------------------------------------------------------------- attention maps, as visualize.overlay draws them
function cubicWeights(t) {  // PyTorch's bicubic (A = -0.75)
  const A = -0.75;
  const c1 = x => ((A + 2) * x - (A + 3)) * x * x + 1;
  const c2 = x => ((A * x - 5 * A) * x + 8 * A) * x - 4 * A;
  return [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)];
}
function upsample(grid, W, H) {  // (gh, gw) -> Float64Array(H * W), align_corners=False, clipped at 0
  const gh = grid.length, gw = grid[0].length;
  const tmp = new Float64Array(gh * W), out = new Float64Array(H * W);
  for (let x = 0; x < W; x++) {
    const real = gw / W * (x + 0.5) - 0.5, i0 = Math.floor(real), w = cubicWeights(real - i0);
    for (let r = 0; r < gh; r++) {
      let v = 0;
      for (let k = 0; k < 4; k++) v += w[k] * grid[r][Math.min(Math.max(i0 - 1 + k, 0), gw - 1)];
      tmp[r * W + x] = v;
    }
  }
  for (let y = 0; y < H; y++) {
    const real = gh / H * (y + 0.5) - 0.5, i0 = Math.floor(real), w = cubicWeights(real - i0);
    for (let x = 0; x < W; x++) {
      let v = 0;
      for (let k = 0; k < 4; k++) v += w[k] * tmp[Math.min(Math.max(i0 - 1 + k, 0), gh - 1) * W + x];
      out[y * W + x] = Math.max(v, 0);
    }
  }
  return out;
}
function colour(v) {
  const pos = Math.min(Math.max(v, 0), 1) * (INFERNO.length - 1), i = Math.min(Math.floor(pos), INFERNO.length - 2), t = pos - i;
  return [0, 1, 2].map(k => INFERNO[i][k] * (1 - t) + INFERNO[i + 1][k] * t);
}
function cellBox(cell, gh, gw, W, H) {
  const [r, c] = cell;
  return [Math.round(c * W / gw), Math.round(r * H / gh), Math.round((c + 1) * W / gw), Math.round((r + 1) * H / gh)];
}
function drawMap(canvas, image, grid, cell) {
  const W = canvas.width, H = canvas.height, ctx = canvas.getContext("2d");
  ctx.imageSmoothingEnabled = true; ctx.imageSmoothingQuality = "high";
  ctx.drawImage(image, 0, 0, W, H);
  if (!grid) return;
  const gh = grid.length, gw = grid[0].length;
  let m = upsample(grid, W, H), lo = Infinity, hi = -Infinity;
  for (const v of m) { if (v < lo) lo = v; if (v > hi) hi = v; }
  const flat = hi - lo <= 1e-12 * Math.max(Math.abs(hi), 1);
  for (let i = 0; i < m.length; i++) m[i] = flat ? 1 : (m[i] - lo) / (hi - lo);
  let box = null;
  if (cell) {
    box = cellBox(cell, gh, gw, W, H);
    for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) {
      const inside = x >= box[0] && x < box[2] && y >= box[1] && y < box[3];
      m[y * W + x] = 0.3 * m[y * W + x] + (inside ? 0.7 : 0);
    }
  }
  const pixels = ctx.getImageData(0, 0, W, H), d = pixels.data;
  for (let i = 0; i < m.length; i++) {
    const c = colour(m[i]);
    for (let k = 0; k < 3; k++) d[4 * i + k] = Math.round((1 - ALPHA) * d[4 * i + k] + ALPHA * c[k]);
  }
  ctx.putImageData(pixels, 0, 0);
  if (box) {
    const width = Math.max(1, Math.round(Math.min(W, H) / 100));
    ctx.lineWidth = width + 1; ctx.strokeStyle = "#000";
    ctx.strokeRect(box[0] + (width + 1) / 2, box[1] + (width + 1) / 2, box[2] - box[0] - width - 1, box[3] - box[1] - width - 1);
    ctx.lineWidth = width; ctx.strokeStyle = "#fff";
    ctx.strokeRect(box[0] + 1 + width / 2, box[1] + 1 + width / 2, box[2] - box[0] - width - 2, box[3] - box[1] - width - 2);
  }
}

function drawFocus(canvas, box, size) {  // the focus box (the image's own pixels) on a canvas of the whole image, dashed
  const ctx = canvas.getContext("2d"), sx = canvas.width / size[0], sy = canvas.height / size[1];
  const r = [box[0] * sx, box[1] * sy, (box[2] - box[0]) * sx, (box[3] - box[1]) * sy];
  ctx.save(); ctx.setLineDash([6, 4]); ctx.lineWidth = 3; ctx.strokeStyle = "#000"; ctx.strokeRect(...r);
  ctx.lineWidth = 1.5; ctx.strokeStyle = "#fff"; ctx.strokeRect(...r); ctx.restore();
}

// ---------------------------------------------------------------- the other views (captioning/viz/views.py draws them so)
function grey(v) { const g = Math.round(255 * Math.min(Math.max(v, 0), 1)); return `rgb(${g},${g},${g})`; }
function drawWindow(canvas, win, gh, gw) {  // centre (row, col) and extent in cells: the box centre +- extent
  const [row, col, extent] = win, ctx = canvas.getContext("2d"), sx = canvas.width / gw, sy = canvas.height / gh;
  const cx = (col + 0.5) * sx, cy = (row + 0.5) * sy, w = Math.max(2, Math.round(Math.min(canvas.width, canvas.height) / 120));
  ctx.save();
  for (const [colour, width] of [["#000", w + 2], ["#00d2ff", w]]) {
    ctx.lineWidth = width; ctx.strokeStyle = colour;
    ctx.strokeRect(cx - extent * sx, cy - extent * sy, 2 * extent * sx, 2 * extent * sy);
  }
  ctx.fillStyle = "#00d2ff"; ctx.beginPath(); ctx.arc(cx, cy, 2 * w, 0, 2 * Math.PI); ctx.fill(); ctx.stroke();
  ctx.restore();
}
function drawAlignment(canvas, image, maps, list, current) {  // words down, locations across, the cells on top
  const T = list.length, gh = maps[0].length, gw = maps[0][0].length, L = gh * gw;
  const cell = Math.max(4, Math.min(24, Math.floor(1000 / L))), gap = 2, left = 90, top = cell + 8;
  canvas.width = left + L * cell + (gh - 1) * gap + 4; canvas.height = top + T * cell + 4;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  let hi = 1e-12;
  for (let t = 0; t < T; t++) for (const row of maps[t]) for (const v of row) hi = Math.max(hi, v);
  const x = j => left + j * cell + Math.floor(j / gw) * gap;
  const W = image.naturalWidth, H = image.naturalHeight;
  for (let j = 0; j < L; j++) {
    const r = Math.floor(j / gw), col = j % gw;
    ctx.drawImage(image, col * W / gw, r * H / gh, W / gw, H / gh, x(j), 2, cell, cell);
  }
  ctx.font = `${Math.min(14, Math.max(10, cell))}px system-ui, sans-serif`; ctx.textAlign = "right"; ctx.textBaseline = "middle";
  for (let t = 0; t < T; t++) {
    ctx.fillStyle = t === current ? "#d63c00" : "#1d1d1f";
    ctx.fillText(list[t], left - 6, top + t * cell + cell / 2);
    for (let j = 0; j < L; j++) { ctx.fillStyle = grey(maps[t][Math.floor(j / gw)][j % gw] / hi); ctx.fillRect(x(j), top + t * cell, cell, cell); }
  }
  ctx.strokeStyle = "#d63c00"; ctx.lineWidth = 2; ctx.strokeRect(left - 1, top + current * cell, canvas.width - left - 3, cell);
  canvas.title = t("alignment_title", { gh, gw, white: hi.toFixed(3) });
}
function drawSelf(canvas, views, list, current) {  // each layer's and head's matrix: the words', then the grid refiner's
  const parts = [];
  if (views.self) parts.push(["word", views.self.values.map(step => step), views.self.shape]);
  if (views.refiner) parts.push(["grid", views.refiner.values, views.refiner.shape]);
  const blocks = parts.map(([kind, values, shape]) => {
    const layers = kind === "word" ? shape[1] : shape[0], heads = kind === "word" ? shape[2] : shape[1];
    const n = kind === "word" ? shape[0] : shape[2], cell = Math.max(1, Math.min(16, Math.floor(200 / n)));
    const at = kind === "word" ? (l, h, a, b) => values[a][l][h][b] : (l, h, a, b) => values[l][h][a][b];
    return { kind, layers, heads, n, cell, at };
  });
  const gap = 12, title = 18, left = 70;
  canvas.width = Math.max(...blocks.map(b => left + b.heads * (b.n * b.cell + gap)), 200);
  canvas.height = blocks.reduce((s, b) => s + title + b.layers * (b.n * b.cell + gap + title), 0) + 4;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.font = "12px system-ui, sans-serif"; ctx.textBaseline = "top";
  let y = 0;
  for (const b of blocks) {
    ctx.fillStyle = "#1d1d1f";
    ctx.fillText(b.kind === "word" ? t("self_words") : t("self_grid"), 4, y + 2);
    y += title;
    for (let l = 0; l < b.layers; l++) {
      for (let h = 0; h < b.heads; h++) {
        const x0 = left + h * (b.n * b.cell + gap);
        let hi = 1e-12;
        if (b.kind === "grid") for (let a = 0; a < b.n; a++) for (let k = 0; k < b.n; k++) hi = Math.max(hi, b.at(l, h, a, k));
        ctx.fillStyle = "#1d1d1f"; ctx.fillText(t("layer_head", { layer: l, head: h }), x0, y);
        for (let a = 0; a < b.n; a++) for (let k = 0; k < b.n; k++) {
          ctx.fillStyle = grey(b.kind === "word" ? b.at(l, h, a, k) : b.at(l, h, a, k) / hi);
          ctx.fillRect(x0 + k * b.cell, y + title + a * b.cell, b.cell, b.cell);
        }
        if (b.kind === "word") { ctx.strokeStyle = "#d63c00"; ctx.lineWidth = 1.5; ctx.strokeRect(x0, y + title + current * b.cell, b.n * b.cell, b.cell); }
      }
      y += title + b.n * b.cell + gap;
    }
  }
  canvas.title = t("quoted", { word: list[current] }) + t("row_outlined");
}

// ---------------------------------------------------------------- focus: a box dragged over the image
function shownScale() {  // the preview's displayed size against the image's own pixels
  const img = $("preview"), r = img.getBoundingClientRect();
  return [img.naturalWidth / r.width, img.naturalHeight / r.height, r];
}
function pointIn(e) {  // the pointer in the displayed image's coordinates, clamped to it
  const [, , r] = shownScale();
  return [Math.min(Math.max(e.clientX - r.left, 0), r.width), Math.min(Math.max(e.clientY - r.top, 0), r.height)];
}
function placeBox(x0, y0, x1, y1) {  // the overlay at displayed coordinates
  const b = $("focus-box");
  Object.assign(b.style, { left: `${Math.min(x0, x1)}px`, top: `${Math.min(y0, y1)}px`,
    width: `${Math.abs(x1 - x0)}px`, height: `${Math.abs(y1 - y0)}px` });
  b.classList.remove("hidden");
}
function showFocus() {
  const [sx, sy] = shownScale(), f = state.focus;
  $("focus-clear").disabled = !f;
  $("focus-area").dataset.focus = f ? f.join(",") : "";
  if (!f) { $("focus-box").classList.add("hidden"); $("focus-text").textContent = t("focus_hint"); return; }
  placeBox(f[0] / sx, f[1] / sy, f[2] / sx, f[3] / sy);
  $("focus-text").textContent = t("focus_shown", { box: f.join(", "), width: $("preview").naturalWidth, height: $("preview").naturalHeight });
}
function endDrag(e) {
  if (!state.drag) return;
  const [a, b] = [state.drag, pointIn(e)], [sx, sy] = shownScale();
  state.drag = null;
  const W = $("preview").naturalWidth, H = $("preview").naturalHeight, clamp = (v, hi) => Math.min(Math.max(v, 0), hi);
  const box = [clamp(Math.round(Math.min(a[0], b[0]) * sx), W), clamp(Math.round(Math.min(a[1], b[1]) * sy), H),
               clamp(Math.round(Math.max(a[0], b[0]) * sx), W), clamp(Math.round(Math.max(a[1], b[1]) * sy), H)];
  if (box[2] - box[0] < 1 || box[3] - box[1] < 1) { showFocus(); return; }  // a click, not a box: the old box stays
  state.focus = box;
  showFocus();
  run();
}
function clearFocus(rerun) {
  const had = state.focus !== null;
  state.focus = null; state.drag = null;
  showFocus();
  if (rerun && had) run();
}

// ---------------------------------------------------------------- model cards
function fmt(value) {
  if (value === null || value === undefined || value === "") return t("unknown");
  if (typeof value === "number") return Number.isInteger(value) ? value.toLocaleString("en") : value.toFixed(3);
  if (Array.isArray(value)) return value.map(fmt).join(", ");
  if (typeof value === "object") return Object.entries(value).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  return String(value);
}
function describe(model) {
  const d = model.description || {}, rows = [
    ["row_attention", d.attention], ["row_encoder", d.encoder], ["row_vocabulary", d.vocab_size], ["row_image_size", d.image_size],
    ["row_grid", model.grid ? model.grid.join(t("by")) : null],
    ["row_maps_of", d.attention_layer === undefined ? null : d.attention_layer === "mean" ? t("layers_mean") : t("layer_n", { layer: d.attention_layer })],
    ["row_training_data", d.training_data],
    ["row_test_scores", d.test_scores || t("no_test_scores")], ["row_parameters", d.parameters], ["row_checkpoint", d.checkpoint]];
  const table = el("table", { class: "description" });
  for (const [k, v] of rows) if (!((k === "row_grid" || k === "row_maps_of") && v === null)) table.append(el("tr", {}, el("th", { text: t(k) }), el("td", { text: fmt(v) })));
  return table;
}
function card(model) {
  if (state.cards[model.name]) return state.cards[model.name];
  const c = {
    root: el("section", { class: "card", "data-model": model.name }),
    status: el("div", { class: "status" }), error: el("div", { class: "error hidden" }),
    caption: el("p", { class: "caption-text" }), score: el("div", { class: "score" }),
    beams: el("ol", { class: "beams" }), words: el("div", { class: "words" }),
    slider: el("input", { class: "word-slider hidden", type: "range", min: "0", max: "0", value: "0", "aria-label": t("word") }),
    canvas: el("canvas", { class: "word-map hidden", width: "1", height: "1" }),
    mapLabel: el("figcaption"), gif: el("img", { class: "gif hidden", alt: t("gif_alt") }),
    gifLabel: el("figcaption", { class: "hidden", text: t("gif_label") }),
    description: describe(model), result: null, image: null,
    canvas2: el("canvas", { class: "word-map hidden", width: "1", height: "1" }),
    gate: el("div", { class: "gate hidden" }), gateFill: el("div", { class: "gate-fill" }), gateText: el("span"),
    viewNote: el("div", { class: "view-note hidden" }), matrix: el("canvas", { class: "view-matrix hidden", width: "1", height: "1" }),
    model,
  };
  c.gate.append(el("div", { class: "gate-bar" }, c.gateFill), c.gateText);
  const d = model.description || {};
  c.root.append(el("h2", { text: `${model.name}` }, el("span", { class: "hint", text: "  " + t("card_kind", { attention: d.attention || "", encoder: d.encoder || "" }) })),
    c.status, c.error, c.caption, c.score, c.beams, c.words, c.slider, c.viewNote,
    el("div", { class: "views" }, el("figure", {}, c.canvas, c.mapLabel), el("figure", { class: "second" }, c.canvas2), c.gate,
      el("figure", {}, c.gif, c.gifLabel), c.description), c.matrix);
  c.slider.addEventListener("input", () => select(c, Number(c.slider.value)));
  $("results").append(c.root);
  state.cards[model.name] = c;
  return c;
}
function words(result) {
  // one button per token; a subword tokenizer's word mark (U+2581) is not shown
  const tokens = result.tokens.map((t) => t.replace(/^\u2581/, ""));
  if (tokens.length && tokens[tokens.length - 1] === "<end>") tokens.pop();
  return tokens;
}
function viewOf(c) {  // the view drawn for this card: the chosen one once the model's answer carries it, else its maps
  const view = $("view").value, offered = c.model.views || ["maps"], r = c.result;
  const arrived = r && r.views && (view === "alignment" || (view === "self" ? r.views.self || r.views.refiner : r.views[view]));
  let note = null;
  if (view !== "maps" && !offered.includes(view)) note = t("no_such_view", { view, views: offered.join(", ") });
  else if (view !== "maps" && !arrived) note = t("asking_view", { view });
  c.viewNote.classList.toggle("hidden", note === null);
  if (note !== null) c.viewNote.textContent = note;
  return note === null ? view : "maps";
}
function select(c, i) {
  const r = c.result;
  if (!r || !c.image) return;
  const list = words(r);
  if (!list.length) return;
  i = Math.min(Math.max(i, 0), list.length - 1);
  c.slider.value = String(i);
  c.words.querySelectorAll(".word").forEach((b, j) => b.classList.toggle("active", j === i));
  const hard = r.attention_kind === "hard", view = viewOf(c), v = r.views || {};
  c.root.dataset.view = view;
  c.canvas2.classList.toggle("hidden", view !== "sample");
  c.gate.classList.toggle("hidden", view !== "gate");
  c.matrix.classList.toggle("hidden", view !== "alignment" && view !== "self");
  drawMap(c.canvas, c.image, r.attention[i], hard && view !== "sample" ? r.locations[i] : null);
  if (r.focus) drawFocus(c.canvas, r.focus.box, r.image_size);
  c.canvas.dataset.word = String(i);
  c.mapLabel.textContent = t("quoted", { word: list[i] }) + (hard && view !== "sample" ? t("chosen_cell", { row: r.locations[i][0], column: r.locations[i][1] }) : "");
  if (view === "gate") {
    const beta = v.gate.values[i];
    c.gateFill.style.height = `${Math.round(Math.min(Math.max(beta, 0), 1) * 100)}%`;
    c.gateText.textContent = t("gate_value", { beta: beta.toFixed(2) });
  } else if (view === "window") {
    drawWindow(c.canvas, v.window.values[i], r.attention[i].length, r.attention[i][0].length);
    const [row, col, extent] = v.window.values[i];
    c.mapLabel.textContent += t("window_value", { row: row.toFixed(1), column: col.toFixed(1), extent: extent.toFixed(1) });
  } else if (view === "sample") {
    c.canvas2.width = c.canvas.width; c.canvas2.height = c.canvas.height;
    const cell = v.sample.values[i], first = Array.isArray(cell[0]) ? cell[0] : cell;
    drawMap(c.canvas2, c.image, r.attention[i], first);
    c.mapLabel.textContent += t("sampled_cell", { row: first[0], column: first[1] });
  } else if (view === "alignment") {
    drawAlignment(c.matrix, c.image, r.attention, list, i);
  } else if (view === "self") {
    drawSelf(c.matrix, v, list, i);
  }
}
async function show(c, result, seconds) {
  c.result = result;
  c.error.classList.add("hidden");
  c.caption.textContent = result.generated_text || t("empty_caption");
  c.score.textContent = t("score", { score: result.score.toFixed(3) });
  c.beams.replaceChildren(...(result.beams.length > 1 ? result.beams : []).map(b =>
    el("li", {}, b.generated_text, el("span", { text: b.score.toFixed(3) }))));
  const list = words(result);
  c.words.replaceChildren(...list.map((w, i) => {
    const b = el("button", { class: "word", type: "button", text: w, "data-index": String(i) });
    b.addEventListener("click", () => select(c, i));
    b.addEventListener("mouseenter", () => select(c, i));
    return b;
  }));
  c.slider.max = String(Math.max(list.length - 1, 0));
  c.slider.classList.toggle("hidden", list.length < 2);
  if (result.gif) { c.gif.src = result.gif; c.gif.classList.remove("hidden"); c.gifLabel.classList.remove("hidden"); }
  const image = new Image();
  image.src = result.image;
  await image.decode();
  c.image = image;
  const w = image.naturalWidth, h = image.naturalHeight;
  const scale = Math.min(Math.max(1, 256 / Math.min(w, h)), 400 / Math.max(w, h));
  c.canvas.width = Math.max(1, Math.round(w * scale)); c.canvas.height = Math.max(1, Math.round(h * scale));
  c.canvas.classList.remove("hidden");
  select(c, 0);
  const ms = result.timing_ms || {};
  c.status.textContent = t("answered", { seconds: seconds.toFixed(2), model: Math.round(ms.caption || 0) }) +
    (ms.batch > 1 ? t("in_batch", { batch: ms.batch }) : "") + t("answered_rest", { gif: Math.round(ms.render || 0), queue: Math.round(ms.queue || 0) }) +
    t("image_size", { size: result.image_size.join(t("by")) }) +
    (result.focus ? t("focused_on", { box: result.focus.box.join(", "), strength: result.focus.strength }) : "");
  c.root.dataset.focus = result.focus ? result.focus.box.join(",") : "";
  if (state.models.length > 1) {  // the grid is known once a model has answered
    const m = state.models.find(x => x.name === result.model);
    if (m && !m.grid) { m.grid = result.attention_shape.slice(1); const t2 = describe(m); c.description.replaceWith(t2); c.description = t2; }
  }
}

// ---------------------------------------------------------------- requests
function selectedModels() {
  if (state.models.length < 2) return state.models;
  return state.models.filter(m => $("model-" + m.name) && $("model-" + m.name).checked);
}
async function run() {
  if (!state.blob) return;
  $("global-error").classList.add("hidden");
  const chosen = selectedModels();
  for (const name of Object.keys(state.cards)) state.cards[name].root.classList.toggle("hidden", !chosen.some(m => m.name === name));
  $("run").disabled = true;
  await Promise.all(chosen.map(async model => {
    const c = card(model);
    c.root.classList.remove("hidden");
    c.status.textContent = t("captioning");
    const form = new FormData();
    form.append("image", state.blob, state.name || "image");
    form.append("model", model.name);
    form.append("num_beams", $("num-beams").value);
    for (const [field, id] of [["max_new_tokens", "max-new-tokens"], ["length_penalty", "length-penalty"], ["attention_mode", "attention-mode"],
                               ["num_beam_groups", "num-beam-groups"], ["diversity_penalty", "diversity-penalty"]])
      if ($(id).value !== "") form.append(field, $(id).value);
    for (const input of document.querySelectorAll("#more-fields [name]")) if (input.value !== "") form.append(input.name, input.value);
    if ($("prefix").value.trim() !== "") form.append("prefix", $("prefix").value.trim());
    if (state.focus) {
      form.append("focus", state.focus.join(","));
      if ($("focus-strength").value !== "") form.append("focus_strength", $("focus-strength").value);
    }
    form.append("return_gif", "1");
    form.append("return_image", "1");
    const view = $("view").value;
    if (view !== "maps" && (model.views || []).includes(view)) {
      form.append("return_views", "1");
      if (view === "sample" && model.attention_modes.length && $("attention-mode").value === "") form.append("attention_mode", "sample");
    }
    const start = performance.now();
    try {
      const response = await fetch("/api/caption", { method: "POST", body: form });
      const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
      if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
      await show(c, body, (performance.now() - start) / 1000);
    } catch (err) {
      c.status.textContent = "";
      c.error.textContent = err.message;
      c.error.classList.remove("hidden");
    }
  }));
  $("run").disabled = false;
}
// the decoding fields of /api/models' "options" that the form above lacks: one input each, empty for the model's own
const SHOWN = ["num_beams", "num_beam_groups", "diversity_penalty", "max_new_tokens", "length_penalty", "attention_mode",
               "num_return_sequences", "prefix", "focus", "focus_strength"];
function optionInput(o) {
  let input;
  if (o.type === "bool" || o.choices) {
    input = el("select", { name: o.name }, el("option", { value: "", text: t("models_own") }));
    for (const c of o.choices || ["true", "false"]) input.append(el("option", { text: c }));
  } else if (o.type === "int" || o.type === "float") {
    input = el("input", { name: o.name, type: "number", step: o.type === "int" ? "1" : "any", placeholder: t("models_own") });
    if (o.min !== null) input.min = o.min;
    if (o.max !== null) input.max = o.max;
  } else {
    input = el("input", { name: o.name, type: "text", placeholder: t("models_own") });
  }
  input.addEventListener("change", run);
  return el("label", { class: "field", title: o.help }, t("option_label", { name: o.name, spaced: o.name.replaceAll("_", " ") }), input);
}

function setImage(blob, name) {
  if (!blob) return;
  state.blob = blob; state.name = name;
  const preview = $("preview");
  if (preview.src.startsWith("blob:")) URL.revokeObjectURL(preview.src);
  clearFocus(false);  // a box belongs to its image
  preview.src = URL.createObjectURL(blob);
  $("focus-area").classList.remove("hidden");
  $("focus-block").classList.remove("hidden");
  $("drop-text").textContent = t("drop_another", { name: name || t("pasted_image") });
  run();
}

async function init() {
  try {
    const info = await (await fetch("/api/models")).json();
    state.models = info.models;
    for (const m of state.models) card(m);
    if (state.models.some(m => m.attention_modes.length)) $("mode-field").classList.remove("hidden");
    const more = (info.options || []).filter(o => !SHOWN.includes(o.name));
    for (const o of more) $("more-fields").append(optionInput(o));
    if (more.length) $("more-block").classList.remove("hidden");
    const first = state.models[0].defaults || {};
    for (const [id, value] of [["max-new-tokens", first.max_new_tokens], ["length-penalty", first.length_penalty]])
      if (value !== null && value !== undefined) { $(id).placeholder = String(value); $(id).title = t("empty_default", { value }); }
    if (state.models.length > 1) {
      $("models-block").classList.remove("hidden");
      for (const m of state.models)
        $("model-list").append(el("label", {}, el("input", { type: "checkbox", id: "model-" + m.name, checked: "" }), ` ${m.name}`));
    }
    if (info.examples.length) {
      $("examples-block").classList.remove("hidden");
      for (const ex of info.examples) {
        const img = el("img", { src: ex.url, alt: ex.name, title: ex.name, class: "example" });
        img.addEventListener("click", async () => setImage(await (await fetch(ex.url)).blob(), ex.name));
        $("examples").append(img);
      }
    }
  } catch (err) {
    $("global-error").textContent = t("unreachable", { message: err.message });
    $("global-error").classList.remove("hidden");
  }
  $("run").disabled = false;
  document.body.dataset.ready = "1";
}

$("file-input").addEventListener("change", e => { const f = e.target.files[0]; if (f) setImage(f, f.name); });
$("run").addEventListener("click", run);
for (const id of ["num-beams", "max-new-tokens", "length-penalty", "attention-mode", "num-beam-groups", "diversity-penalty", "prefix"]) $(id).addEventListener("change", run);
$("view").addEventListener("change", () => {  // at once: the cards without the view say so; then ask for the views
  for (const c of Object.values(state.cards)) if (c.result) select(c, Number(c.slider.value));
  run();
});
$("focus-strength").addEventListener("change", () => { if (state.focus) run(); });
$("focus-clear").addEventListener("click", () => clearFocus(true));
const area = $("focus-area");
area.addEventListener("pointerdown", e => {
  if (!state.blob || e.button !== 0) return;
  e.preventDefault();
  area.setPointerCapture(e.pointerId);
  state.drag = pointIn(e);
  placeBox(...state.drag, ...state.drag);
});
area.addEventListener("pointermove", e => { if (state.drag) placeBox(...state.drag, ...pointIn(e)); });
area.addEventListener("pointerup", endDrag);
area.addEventListener("pointercancel", () => { state.drag = null; showFocus(); });
window.addEventListener("resize", () => { if (state.focus) showFocus(); });
const drop = $("drop");
drop.addEventListener("dragover", e => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", e => { e.preventDefault(); drop.classList.remove("over"); const f = e.dataTransfer.files[0]; if (f) setImage(f, f.name); });
document.addEventListener("paste", e => {
  for (const item of e.clipboardData.items) if (item.kind === "file" && item.type.startsWith("image/")) { setImage(item.getAsFile(), t("pasted_image")); break; }
});
init();
</script>
</body>
</html>
"""

#: The page's languages: the code ``serve --lang`` takes -> (the HTML lang attribute, the language's own name).
LANGUAGES = {"en": ("en", "English"), "zh": ("zh-CN", "中文")}
#: What the Chinese page keeps as written: the paper's title, a key, a file format, a score's name, the English
#: page's name.
KEPT = ("Show, Attend and Tell", "Ctrl+V", "GIF", "F1", "English")

#: Every visible string of the page, one column per language: ``{{key}}`` in the HTML, ``t("key", {...})``
#: in the script, ``{name}`` a value filled in by the script. The API's own text (captions, model names
#: and descriptions, the decoding options' names and help, error messages) is shown as the API sends it.
STRINGS: dict[str, dict[str, str]] = {
    "title": {"en": "Show, Attend and Tell: try a model", "zh": "Show, Attend and Tell：试用模型"},
    "heading": {"en": "Show, Attend and Tell", "zh": "Show, Attend and Tell：看图说话"},
    "intro": {
        "en": "Upload, paste (Ctrl+V) or pick an image; read its captions; click or slide over the words to see "
        "where the model looked; drag a box over the image to caption that region.",
        "zh": "上传、粘贴（Ctrl+V）或选择一张图片，读模型为它写的描述；点击或滑过每个词，看模型写这个词时注意了图中"
        "哪里；在图片上拖出一个框，只描述框里的区域。",
    },
    "image": {"en": "Image", "zh": "图片"},
    "drop": {"en": "Drop an image here or click to choose one", "zh": "把图片拖到这里，或点击选择一张"},
    "drop_another": {"en": "{name}: drop or click for another", "zh": "{name}：拖入或点击换一张"},
    "pasted_image": {"en": "pasted image", "zh": "粘贴的图片"},
    "focus_area_title": {"en": "drag a box: the caption describes that region", "zh": "拖出一个框：描述只讲这个区域"},
    "preview_alt": {
        "en": "the image: drag a box over it to focus the caption there",
        "zh": "当前图片：在上面拖出一个框，让描述聚焦到那里",
    },
    "focus_hint": {
        "en": "Drag a box over the image to caption that region.",
        "zh": "在图片上拖出一个框，为该区域生成描述。",
    },
    "focus_shown": {
        "en": "focus: {box} (pixels of the {width} x {height} image)",
        "zh": "聚焦区域：{box}（以 {width}×{height} 原图的像素计）",
    },
    "focus_clear": {"en": "Clear the box", "zh": "清除选框"},
    "focus_strength": {"en": "focus strength", "zh": "聚焦强度"},
    "focus_strength_title": {
        "en": "how much attention score the cells outside the box lose (0: no focus)",
        "zh": "框外网格单元的注意力得分减去多少（0：不聚焦）",
    },
    "examples": {"en": "Examples", "zh": "示例"},
    "generation": {"en": "Generation", "zh": "生成设置"},
    "num_beams": {"en": "beams", "zh": "束宽"},
    "num_beam_groups": {"en": "diverse groups", "zh": "多样性分组数"},
    "diversity_penalty": {"en": "diversity penalty", "zh": "多样性惩罚"},
    "max_new_tokens": {"en": "maximum length", "zh": "最大长度"},
    "length_penalty": {"en": "length penalty", "zh": "长度惩罚"},
    "models_own": {"en": "model's", "zh": "模型默认"},
    "empty_default": {"en": "empty: the model's default ({value})", "zh": "留空：用模型的默认值（{value}）"},
    "prefix": {"en": "starts with", "zh": "开头词语"},
    "prefix_title": {
        "en": "the caption continues these words, e.g. 'a large'",
        "zh": "描述接着这些词往下写，例如“左上角有”",
    },
    "prefix_placeholder": {"en": "e.g. a large", "zh": "例如：左上角有"},
    "attention_mode": {"en": "attention mode (hard models)", "zh": "注意力方式（硬注意力模型）"},
    "mode_expected": {"en": "expected", "zh": "期望上下文"},
    "mode_argmax": {"en": "argmax", "zh": "权重最大的位置"},
    "mode_sample": {"en": "sample", "zh": "采样"},
    "more_settings": {"en": "more settings", "zh": "更多设置"},
    "option_label": {"en": "{spaced}", "zh": "{name}"},  # a decoding option of /api/models: zh shows its API name
    "models": {"en": "Models", "zh": "模型"},
    "run": {"en": "Caption", "zh": "生成描述"},
    "unreachable": {"en": "could not reach the server: {message}", "zh": "无法连接服务器：{message}"},
    "unknown": {"en": "unknown", "zh": "未知"},
    "row_attention": {"en": "attention", "zh": "注意力"},
    "row_encoder": {"en": "encoder", "zh": "编码器"},
    "row_vocabulary": {"en": "vocabulary", "zh": "词表大小"},
    "row_image_size": {"en": "image size", "zh": "图像尺寸"},
    "row_grid": {"en": "attention grid", "zh": "注意力网格"},
    "row_maps_of": {"en": "maps of", "zh": "注意力图取自"},
    "layers_mean": {"en": "the mean over the layers", "zh": "各层的平均"},
    "layer_n": {"en": "layer {layer}", "zh": "第 {layer} 层"},
    "row_training_data": {"en": "training data", "zh": "训练数据"},
    "row_test_scores": {"en": "test scores", "zh": "测试得分"},
    "no_test_scores": {"en": "not recorded in the checkpoint", "zh": "检查点中没有记录"},
    "row_parameters": {"en": "parameters", "zh": "参数量"},
    "row_checkpoint": {"en": "checkpoint", "zh": "检查点"},
    "card_kind": {"en": "{attention} attention, {encoder}", "zh": "{attention} 注意力，编码器 {encoder}"},
    "word": {"en": "word", "zh": "词"},
    "gif_alt": {"en": "attention GIF", "zh": "注意力动图"},
    "gif_label": {"en": "the attention GIF: a frame per word", "zh": "注意力 GIF 动图：每个词一帧"},
    "quoted": {"en": '"{word}"', "zh": "“{word}”"},
    "chosen_cell": {
        "en": ": chosen cell (row {row}, column {column})",
        "zh": "：选中的单元（第 {row} 行，第 {column} 列）",
    },
    "empty_caption": {"en": "(empty caption)", "zh": "（空描述）"},
    "score": {
        "en": "score {score} (log-probability, length-normalised)",
        "zh": "得分 {score}（对数概率，按长度归一化）",
    },
    "captioning": {"en": "captioning…", "zh": "正在生成描述…"},
    "answered": {"en": "answered in {seconds} s (model {model} ms", "zh": "{seconds} 秒内返回（模型 {model} 毫秒"},
    "in_batch": {"en": " in a batch of {batch}", "zh": "，同一批 {batch} 个请求"},
    "answered_rest": {"en": ", GIF {gif} ms, waited {queue} ms)", "zh": "，GIF {gif} 毫秒，排队 {queue} 毫秒）"},
    "image_size": {"en": "; image {size}", "zh": "；图像 {size}"},
    "by": {"en": " x ", "zh": "×"},  # between a width and a height
    "focused_on": {"en": "; focused on {box} (strength {strength})", "zh": "；聚焦于 {box}（强度 {strength}）"},
    # the view selector and the views (captioning attend --view)
    "view": {"en": "view", "zh": "视图"},
    "view_title": {
        "en": "what to draw for each model (captioning attend --view)",
        "zh": "为每个模型画出哪一种注意力视图（与命令行画的相同）",
    },
    "view_maps": {"en": "maps: each word's map", "zh": "注意力图：每个词一张"},
    "view_alignment": {"en": "alignment: words x locations", "zh": "对齐矩阵：词 × 位置"},
    "view_self": {"en": "self-attention", "zh": "自注意力"},
    "view_gate": {"en": "gate beta_t", "zh": "门控 β（每步一个）"},
    "view_window": {"en": "window: centre and extent", "zh": "窗口：中心与范围"},
    "view_sample": {"en": "sampled cell (hard)", "zh": "采样的单元（硬注意力）"},
    "no_such_view": {
        "en": "this model has no {view} view (its views: {views}): its maps instead",
        "zh": "这个模型没有“{view}”视图（它有：{views}），改为显示注意力图",
    },
    "asking_view": {"en": "asking for the {view} view…", "zh": "正在请求“{view}”视图…"},
    "gate_value": {"en": "gate beta = {beta}", "zh": "门控 β = {beta}"},
    "window_value": {
        "en": ": window centre ({row}, {column}), extent {extent} cells",
        "zh": "：窗口中心（{row}，{column}），范围 {extent} 个单元",
    },
    "sampled_cell": {
        "en": ": its soft map, and the cell sampled from it (row {row}, column {column})",
        "zh": "：软注意力图，以及从中采样的单元（第 {row} 行，第 {column} 列）",
    },
    "alignment_title": {
        "en": "rows: the words; columns: the {gh} x {gw} locations, row by row (their cells above); white: {white}",
        "zh": "行：词；列：{gh}×{gw} 个位置，逐行排列（上方是对应的图像单元）；白色：{white}",
    },
    "self_words": {
        "en": "words: row = the word written, column = the word read (<start> first)",
        "zh": "词：行 = 正在写的词，列 = 被读的词（第一列是起始符）",
    },
    "self_grid": {
        "en": "grid refiner: row i = how location i reads every location",
        "zh": "网格精炼器：每一行 = 该行的位置如何读取每个位置",
    },
    "layer_head": {"en": "layer {layer}, head {head}", "zh": "第 {layer} 层，第 {head} 个头"},
    "row_outlined": {"en": ": its row outlined", "zh": "：其所在行已框出"},
    # the atlas page (GET /atlas), and the main page's link to it
    "atlas_link": {"en": "The atlas", "zh": "注意力图谱"},
    "atlas_link_rest": {
        "en": ": every model on one image and one word.",
        "zh": "：所有模型在同一张图、同一个词上的对比。",
    },
    "atlas_title": {"en": "Show, Attend and Tell: the attention atlas", "zh": "Show, Attend and Tell：注意力图谱"},
    "atlas_heading": {"en": "The attention atlas", "zh": "注意力图谱"},
    "atlas_intro": {
        "en": "Every served model on one image and one word: each panel titled with its mechanism and equation, "
        "its caption and, for an example of the shapes data, its object F1.",
        "zh": "所有已加载的模型在同一张图、同一个词上的注意力：每个面板标出机制名称和公式、模型的描述，对形状数据的"
        "示例图片还给出物体 F1。",
    },
    "atlas_back": {"en": "Back to the captioning page", "zh": "返回描述页面"},
    "atlas_back_rest": {"en": ".", "zh": "。"},
    "atlas_word_placeholder": {"en": "the first shared object word", "zh": "默认：各描述共有的第一个物体词"},
    "atlas_draw": {"en": "Draw the atlas", "zh": "画出图谱"},
    "atlas_alt": {"en": "the atlas", "zh": "注意力图谱"},
    "atlas_model": {"en": "model", "zh": "模型"},
    "atlas_mechanism": {"en": "mechanism", "zh": "机制"},
    "atlas_equation": {"en": "equation", "zh": "公式"},
    "atlas_caption": {"en": "caption", "zh": "描述"},
    "atlas_object_f1": {"en": "object F1", "zh": "物体 F1"},
    "atlas_captioning": {"en": "every model is captioning…", "zh": "所有模型正在生成描述…"},
    "atlas_not_in_caption": {"en": "(not in the caption)", "zh": "（描述中没有这个词）"},
    "atlas_status_word": {"en": '{models} models, the word "{word}"', "zh": "{models} 个模型，词“{word}”"},
    "atlas_status_each": {"en": "{models} models, the word of each caption", "zh": "{models} 个模型，各自描述中的词"},
    "atlas_seconds": {"en": "; {seconds} s", "zh": "；{seconds} 秒"},
}


def choose_language(asked: str | None, fixed: str | None, accept_language: str | None) -> str:
    """The page's language: ``asked`` (the page's ``?lang=`` link) when it is one of :data:`LANGUAGES`, else
    ``fixed`` (``serve --lang``), else the first language of the browser's Accept-Language header that the
    page has (by its primary subtag: ``zh-TW`` is ``zh``), else English."""
    if asked in LANGUAGES:
        return asked
    if fixed is not None:
        return fixed
    ranked = []
    for i, part in enumerate((accept_language or "").split(",")):
        tag, _, params = part.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        ranked.append((-q, i, tag.strip().lower().split("-")[0]))
    return next((code for q, _, code in sorted(ranked) if q < 0 and code in LANGUAGES), "en")


def _fill(template: str, language: str) -> str:
    """``template`` (:data:`PAGE` or :data:`ATLAS_PAGE`) with ``language``'s column of :data:`STRINGS`."""
    if language not in LANGUAGES:
        raise ValueError(f"the page's language: expected one of {', '.join(LANGUAGES)}, got {language!r}")
    other = next(code for code in LANGUAGES if code != language)
    words = {key: column[language] for key, column in STRINGS.items()}
    fill = {
        **{key: html.escape(value) for key, value in words.items()},
        "lang": language,
        "html_lang": LANGUAGES[language][0],
        "other_lang": other,
        "other_html_lang": LANGUAGES[other][0],
        "other_language": LANGUAGES[other][1],
        "strings_json": json.dumps(words, ensure_ascii=False).replace("</", "<\\/"),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: fill[m.group(1)], template)


@functools.cache
def page(language: str = "en") -> str:
    """The page in ``language`` (a key of :data:`LANGUAGES`): :data:`PAGE` with its strings filled in."""
    return _fill(PAGE, language)


@functools.cache
def atlas_page(language: str = "en") -> str:
    """The atlas page (``GET /atlas``) in ``language``: :data:`ATLAS_PAGE` with its strings filled in."""
    return _fill(ATLAS_PAGE, language)


ATLAS_PAGE = r"""<!doctype html>
<html lang="{{html_lang}}">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{atlas_title}}</title>
<style>
  :root { --ink: #1d1d1f; --muted: #6b6b70; --line: #dedee3; --accent: #d63c00; --bg: #f6f6f8; }
  body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; color: var(--ink); background: var(--bg); }
  header { padding: 14px 24px; background: #fff; border-bottom: 1px solid var(--line); }
  header h1 { margin: 0; font-size: 20px; }
  header p { margin: 2px 0 0; color: var(--muted); }
  main { padding: 20px 24px; display: grid; gap: 16px; }
  .card { background: #fff; border: 1px solid var(--line); border-radius: 10px; padding: 16px; }
  .examples { display: flex; flex-wrap: wrap; gap: 6px; margin: 8px 0; }
  .examples img { width: 56px; height: 56px; object-fit: cover; border-radius: 6px; border: 2px solid transparent; cursor: pointer; }
  .examples img.chosen, .examples img:hover { border-color: var(--accent); }
  .row { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; }
  button { font: inherit; font-weight: 600; color: #fff; background: var(--ink); border: 0; border-radius: 6px; padding: 6px 14px; cursor: pointer; }
  button:disabled { opacity: .5; }
  #atlas { max-width: 100%; height: auto; display: block; }
  table { border-collapse: collapse; font-size: 14px; }
  th, td { text-align: left; padding: 4px 10px 4px 0; vertical-align: top; border-bottom: 1px solid var(--line); }
  td.eq { font-family: ui-monospace, monospace; font-size: 12px; color: #46465a; }
  .status { color: var(--muted); font-size: 13px; }
  .error { color: #b00020; background: #fdecee; border-radius: 6px; padding: 6px 10px; }
  .hidden { display: none !important; }
</style>
</head>
<body>
<header>
  <h1>{{atlas_heading}}</h1>
  <p>{{atlas_intro}} <a href="/?lang={{lang}}">{{atlas_back}}</a>{{atlas_back_rest}}</p>
</header>
<main>
  <section class="card">
    <div class="row">
      <label>{{image}} <input id="file" type="file" accept="image/*"></label>
      <label>{{word}} <input id="word" type="text" placeholder="{{atlas_word_placeholder}}"></label>
      <button id="draw" disabled>{{atlas_draw}}</button>
      <span id="status" class="status"></span>
    </div>
    <div id="examples" class="examples"></div>
    <div id="error" class="error hidden"></div>
  </section>
  <section class="card hidden" id="result">
    <img id="atlas" alt="{{atlas_alt}}">
    <table id="panels"><thead><tr><th>{{atlas_model}}</th><th>{{atlas_mechanism}}</th><th>{{atlas_equation}}</th><th>{{atlas_caption}}</th><th>{{word}}</th><th>{{atlas_object_f1}}</th></tr></thead><tbody></tbody></table>
  </section>
</main>
<script>
"use strict";
const STRINGS = {{strings_json}};  // this language's column of captioning/web/page.py: STRINGS
function t(key, vars = {}) { return STRINGS[key].replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m)); }
const $ = id => document.getElementById(id);
const state = { blob: null, name: null, example: null };
function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }
function choose(blob, name, example) {
  state.blob = blob; state.name = name; state.example = example;
  document.querySelectorAll("#examples img").forEach((img, i) => img.classList.toggle("chosen", i === example));
  $("draw").disabled = false;
  draw();
}
async function draw() {
  if (!state.blob) return;
  $("draw").disabled = true; $("error").classList.add("hidden"); $("status").textContent = t("atlas_captioning");
  const form = new FormData();
  form.append("image", state.blob, state.name || "image");
  if ($("word").value.trim()) form.append("word", $("word").value.trim());
  if (state.example !== null) form.append("example", String(state.example));
  const start = performance.now();
  try {
    const response = await fetch("/api/atlas", { method: "POST", body: form });
    const body = await response.json().catch(() => ({ error: `HTTP ${response.status}` }));
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    $("atlas").src = body.atlas;
    const rows = body.panels.map(p => {
      const tr = document.createElement("tr");
      tr.append(cell(p.label), cell(p.mechanism), cell(p.equations.join("\n"), "eq"), cell(p.caption), cell(p.word === null ? t("atlas_not_in_caption") : p.word),
                cell(p.object_f1 === null ? "" : p.object_f1.toFixed(2)));
      return tr;
    });
    $("panels").tBodies[0].replaceChildren(...rows);
    $("result").classList.remove("hidden");
    const counted = { models: body.panels.length, word: body.word };
    $("status").textContent = (body.word === null ? t("atlas_status_each", counted) : t("atlas_status_word", counted)) +
      (body.note ? ` (${body.note})` : "") + t("atlas_seconds", { seconds: ((performance.now() - start) / 1000).toFixed(2) });
    document.body.dataset.drawn = String(body.panels.length);
  } catch (err) {
    $("status").textContent = ""; $("error").textContent = err.message; $("error").classList.remove("hidden");
  }
  $("draw").disabled = false;
}
async function init() {
  const info = await (await fetch("/api/models")).json();
  info.examples.forEach((ex, i) => {
    const img = document.createElement("img");
    img.src = ex.url; img.alt = ex.name; img.title = ex.name;
    img.addEventListener("click", async () => choose(await (await fetch(ex.url)).blob(), ex.name, i));
    $("examples").append(img);
  });
  document.body.dataset.ready = "1";
}
$("file").addEventListener("change", e => { const f = e.target.files[0]; if (f) choose(f, f.name, null); });
$("draw").addEventListener("click", draw);
$("word").addEventListener("change", draw);
init();
</script>
</body>
</html>
"""
