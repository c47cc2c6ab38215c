// memcalc serve: the page's script. No libraries; every chart is SVG drawn here. The inputs'
// state lives in the address bar (the query string the API reads), so an answer can be shared.
"use strict";

const GIB = 2 ** 30;
const SELECTS = ["gpu", "precision", "optimizer", "optimizer_impl", "checkpointing", "attention",
                 "sharding", "quantization"];
const NUMBERS = ["micro_batch", "seq_len", "grad_accum", "checkpoint_every", "max_grad_norm",
                 "world_size", "lora_rank"];
const SELECT_DEFAULTS = {precision: "fp32", optimizer: "adamw", optimizer_impl: "", checkpointing: "none",
                         attention: "sdpa", sharding: "none", quantization: "none"};
const COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b",
                 "#9d755d", "#bab0ac", "#ff9da6", "#79706e", "#d67195"];
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
let options = null, pending = null, sequence = 0, colourOf = {};

const gib = (n) => (n / GIB).toFixed(2) + " GiB";
const bytes = (n) => n.toLocaleString("en-US") + " B";

function el(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fill(select, values, labels) {
  select.replaceChildren(...values.map((v, i) => {
    const o = document.createElement("option");
    o.value = v; o.textContent = labels ? labels[i] : v;
    return o;
  }));
}

async function init() {
  options = await (await fetch("/api/options")).json();
  fill($("model"), [...options.presets, "__hub", "__config"],
       [...options.presets, "hub id (org/name)…", "paste a config.json…"]);
  fill($("gpu"), Object.keys(options.gpus),
       Object.entries(options.gpus).map(([k, v]) => `${k} (${(v / GIB).toFixed(1)} GiB usable)`));
  for (const name of SELECTS.slice(1)) {
    fill($(name), options[name], options[name].map((v) => v === "" ? "torch default" : v));
  }
  fromURL();
  for (const node of document.querySelectorAll("#inputs select, #inputs input, #inputs textarea")) {
    node.addEventListener(node.tagName === "SELECT" ? "change" : "input", update);
  }
  update();
}

function fromURL() {
  const q = new URLSearchParams(location.search);
  const d = options.defaults;
  const model = q.get("model") || d.model;
  if (q.has("config")) { $("model").value = "__config"; $("config").value = q.get("config"); }
  else if (model.includes("/")) { $("model").value = "__hub"; $("hub").value = model; }
  else { $("model").value = model; }
  $("gpu").value = q.get("gpu") || d.gpu;
  for (const name of SELECTS.slice(1)) $(name).value = q.get(name) || SELECT_DEFAULTS[name];
  for (const name of NUMBERS) $(name).value = q.get(name) || d[name] || "";
}

function query() {
  const q = new URLSearchParams();
  const model = $("model").value;
  if (model === "__config") q.set("config", $("config").value);
  else q.set("model", model === "__hub" ? $("hub").value.trim() : model);
  q.set("gpu", $("gpu").value);
  for (const name of NUMBERS) if ($(name).value.trim() !== "") q.set(name, $(name).value.trim());
  for (const name of SELECTS.slice(1)) if ($(name).value !== SELECT_DEFAULTS[name]) q.set(name, $(name).value);
  return q.toString();
}

async function update() {
  const start = performance.now();
  $("hub-row").hidden = $("model").value !== "__hub";
  $("config-row").hidden = $("model").value !== "__config";
  $("every-row").hidden = $("checkpointing").value !== "every-k";
  const qs = query();
  history.replaceState(null, "", "?" + qs);
  if (pending) pending.abort();
  pending = new AbortController();
  const mine = ++sequence;
  document.body.dataset.state = "busy";
  let response, data;
  try {
    response = await fetch("/api/answer?" + qs, {signal: pending.signal});
    data = await response.json();
  } catch (err) {
    if (err.name === "AbortError") return;
    data = {error: "server: no answer (" + err.message + "); fix: is memcalc serve still running?"};
  }
  if (mine !== sequence) return;
  if (!response || !response.ok) showError(data.error);
  else render(data);
  const ms = performance.now() - start;
  document.body.dataset.lastMs = ms.toFixed(1);
  $("latency").textContent = `answered in ${ms.toFixed(0)} ms`;
  document.body.dataset.answers = String(Number(document.body.dataset.answers) + 1);
  document.body.dataset.state = response && response.ok ? "ready" : "error";
  if (response && response.ok && !data.fits) changes(qs, mine);
}

function showError(message) {
  $("error").hidden = false;
  $("error").textContent = message;
  $("verdict").className = "verdict";
  $("verdict").textContent = "No answer: fix the input named above";
  $("result").hidden = true;  // no numbers of an earlier state beside the error
}

function setBytes(id, n) {
  $(id).dataset.bytes = String(n);
  $(id).textContent = "(" + bytes(n) + ")";
}

function render(a) {
  $("error").hidden = true;
  $("result").hidden = false;
  const e = a.estimate;
  $("verdict").className = "verdict " + (a.fits ? "fits" : "nofit");
  $("verdict").textContent = a.fits
    ? `Fits on ${a.gpu}: ${gib(a.peak_bytes)} of ${gib(a.budget_bytes)}, headroom ${gib(a.headroom_bytes)}`
    : `Does not fit on ${a.gpu}: ${gib(a.peak_bytes)} > ${gib(a.budget_bytes)}, short by ${gib(-a.headroom_bytes)}`;
  $("peak").textContent = gib(a.peak_bytes); setBytes("peak-bytes", a.peak_bytes);
  $("budget").textContent = gib(a.budget_bytes); setBytes("budget-bytes", a.budget_bytes);
  $("headroom").textContent = gib(a.headroom_bytes); setBytes("headroom-bytes", a.headroom_bytes);
  $("first-step").textContent = gib(e.first_step_peak_bytes); setBytes("first-step-bytes", e.first_step_peak_bytes);
  $("moment").textContent = `${e.peak_phase}: ${e.moment} (${a.model}, ${a.params.toLocaleString("en-US")} parameters)`;
  table("phases", Object.entries(e.phases), "phase");
  table("components", Object.entries(e.components).filter(([, v]) => v), "category");
  bars(a);
  curve("micro_batch", a, "micro-batch", false);
  curve("seq_len", a, "sequence length (tokens)", true);
  $("changes-box").hidden = a.fits;
  if (!a.fits) $("changes").replaceChildren(li("looking for changes that fit…"));
}

function li(text) { const n = document.createElement("li"); n.textContent = text; return n; }

function table(id, rows, key) {
  $(id).tBodies[0].replaceChildren(...rows.map(([name, n]) => {
    const tr = document.createElement("tr");
    tr.dataset[key] = name; tr.dataset.bytes = String(n);
    for (const text of [name, (n / GIB).toFixed(3), n.toLocaleString("en-US")]) {
      const td = document.createElement("td"); td.textContent = text; tr.appendChild(td);
    }
    return tr;
  }));
}

async function changes(qs, mine) {
  // asked once the inputs rest (400 ms): check() simulates other steps, and the server runs one
  // computation at a time, so a search started mid-typing would hold up the next answer
  await new Promise((resolve) => setTimeout(resolve, 400));
  if (mine !== sequence) return;
  let data;
  try { data = await (await fetch("/api/changes?" + qs)).json(); } catch (err) { return; }
  if (mine !== sequence) return;
  const found = data.changes || [];
  $("changes").replaceChildren(...(found.length ? found.map((c) => {
    const fields = Object.entries(c.fields).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`);
    return li(`${fields.join(", ")}: peak ${gib(c.peak_bytes)} (${c.why})`);
  }) : [li(data.error || "no combination of up to three changes memcalc models makes it fit")]));
}

function colour(category) {
  if (!(category in colourOf)) colourOf[category] = COLOURS[Object.keys(colourOf).length % COLOURS.length];
  return colourOf[category];
}

function frame(id, w, h) {
  const svg = el("svg", {width: w, height: h, viewBox: `0 0 ${w} ${h}`, role: "img"});
  $(id).replaceChildren(svg);
  return svg;
}

function yAxis(svg, top, x0, y0, height, width) {
  const step = niceStep(top / GIB / 5);
  for (let v = 0; v * GIB <= top; v += step) {
    const y = y0 - v * GIB / top * height;
    svg.append(el("line", {x1: x0, x2: x0 + width, y1: y, y2: y, stroke: "#eef0f3"}));
    svg.append(el("text", {x: x0 - 6, y: y + 4, "text-anchor": "end", "font-size": 11}, `${+v.toFixed(2)} GiB`));
  }
}

function niceStep(raw) {
  const p = 10 ** Math.floor(Math.log10(raw || 1));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || raw;
}

function limitLine(svg, a, top, x0, y0, height, width) {
  const y = y0 - a.budget_bytes / top * height;
  svg.append(el("line", {x1: x0, x2: x0 + width, y1: y, y2: y, stroke: "#c62828", "stroke-dasharray": "6 4", "stroke-width": 2}));
  svg.append(el("text", {x: x0 + width, y: y - 5, "text-anchor": "end", fill: "#c62828", "font-size": 11},
                `${a.gpu} usable ${gib(a.budget_bytes)}`));
}

function bars(a) {
  const W = 720, H = 300, x0 = 70, y0 = H - 30, height = H - 50, width = 430;
  const svg = frame("bars", W, H);
  const phases = Object.entries(a.breakdown);
  const totals = phases.map(([, parts]) => Object.values(parts).reduce((s, v) => s + v, 0));
  const top = Math.max(a.budget_bytes, ...totals) * 1.08;
  yAxis(svg, top, x0, y0, height, width);
  const slot = width / phases.length, barW = Math.min(90, slot * 0.6);
  const seen = new Set();
  phases.forEach(([phase, parts], i) => {
    let y = y0;
    const x = x0 + slot * i + (slot - barW) / 2;
    for (const [category, n] of Object.entries(parts)) {
      if (!n) continue;
      seen.add(category);
      const h = n / top * height;
      const r = el("rect", {x, y: y - h, width: barW, height: Math.max(h, 0.5), fill: colour(category)});
      r.append(el("title", {}, `${phase} / ${category}: ${gib(n)} (${bytes(n)})`));
      svg.append(r);
      y -= h;
    }
    svg.append(el("text", {x: x + barW / 2, y: y0 + 16, "text-anchor": "middle", "font-size": 12}, phase));
    svg.append(el("text", {x: x + barW / 2, y: y - 4, "text-anchor": "middle", "font-size": 11}, gib(totals[i])));
  });
  limitLine(svg, a, top, x0, y0, height, width);
  [...seen].forEach((category, i) => {
    svg.append(el("rect", {x: x0 + width + 30, y: 20 + i * 18, width: 12, height: 12, fill: colour(category)}));
    svg.append(el("text", {x: x0 + width + 48, y: 30 + i * 18, "font-size": 12}, category));
  });
}

function curve(axis, a, label, log) {
  const W = 720, H = 260, x0 = 70, y0 = H - 40, height = H - 60, width = W - 100;
  const svg = frame("curve-" + axis, W, H);
  const points = a.curves[axis];
  if (!points.length) return;
  const xs = points.map((p) => p[0]), now = Number(a.query[axis]);
  const top = Math.max(a.budget_bytes, ...points.map((p) => p[1])) * 1.08;
  const f = log ? Math.log2 : (v) => v;
  const lo = f(Math.min(...xs)), hi = f(Math.max(...xs));
  const X = (v) => x0 + (hi === lo ? width / 2 : (f(v) - lo) / (hi - lo) * width);
  const Y = (n) => y0 - n / top * height;
  yAxis(svg, top, x0, y0, height, width);
  const drawn = [];  // the current value first, then others at least 40 px apart
  for (const v of [now, ...xs]) {
    if (xs.includes(v) && drawn.every((d) => Math.abs(X(d) - X(v)) >= 40)) drawn.push(v);
  }
  for (const v of drawn) svg.append(el("text", {x: X(v), y: y0 + 15, "text-anchor": "middle", "font-size": 11}, String(v)));
  svg.append(el("text", {x: x0 + width / 2, y: H - 6, "text-anchor": "middle", "font-size": 12}, label));
  limitLine(svg, a, top, x0, y0, height, width);
  svg.append(el("polyline", {points: points.map((p) => `${X(p[0])},${Y(p[1])}`).join(" "), fill: "none", stroke: "#4c78a8", "stroke-width": 2}));
  for (const [x, n] of points) {
    const c = el("circle", {cx: X(x), cy: Y(n), r: x === now ? 6 : 3, fill: n > a.budget_bytes ? "#c62828" : "#4c78a8",
                            "data-x": x, "data-bytes": n});
    c.append(el("title", {}, `${axis}=${x}: ${gib(n)} (${bytes(n)})`));
    svg.append(c);
  }
}

init();
