// The elasticps dashboard: a job table, one job's charts and events, the cluster over time.
// Charts are uPlot's (vendored: /static/uPlot.iife.min.js). Text is set with textContent only.
"use strict";

const REFRESH_MS = 2000;
const COLORS = {ps: "#d08a4a", workers: "#4a7bd0", rate: "#2e8b57", loss: "#c0504d", metric: "#7b52ab",
  batch: "#8a6d3b", ours: "#4a7bd0", others: "#d08a4a", free: "#9fd3a8", marker: "#888"};

function params() { return new URLSearchParams(location.hash.slice(1)); }
function go(changes) {
  const p = params();
  for (const [k, v] of Object.entries(changes)) { if (v == null) p.delete(k); else p.set(k, v); }
  location.hash = p.toString();
}

// -- DOM, text only
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "data") for (const [d, x] of Object.entries(v)) node.dataset[d] = x;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
function fill(parent, ...children) { parent.replaceChildren(...children.filter(c => c != null)); }

// -- numbers, times, durations
const pad = n => String(n).padStart(2, "0");
function clock(t) {
  const d = new Date(t * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}
function duration(s) {
  if (s == null || !isFinite(s)) return "-";
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60), sec = s % 60;
  return h ? `${h}h ${pad(m)}m` : m ? `${m}m ${pad(sec)}s` : `${sec}s`;
}
const num = (v, digits = 3) => v == null ? "-" : Number(v).toPrecision(digits).replace(/\.?0+$/, "").replace(/\.?0+e/, "e");
const shape = j => j.num_ps || j.num_workers ? `${j.num_ps} PS x ${j.num_workers} W` : "-";

// -- API
async function api(path) {
  const token = params().get("token");
  const r = await fetch(path, {headers: {Authorization: "Bearer " + token}});
  if (r.status === 401) throw Object.assign(new Error("the token in this address was refused"), {auth: true});
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.text()).slice(0, 200)}`);
  return r.json();
}

function showNotice(refused) {
  // no data to show without the token: no view either (an empty job list would read as an empty cluster)
  for (const v of ["jobs", "job", "cluster"]) document.getElementById(`${v}-view`).hidden = true;
  const box = document.getElementById("notice");
  const addr = `${location.origin}/#token=`;
  fill(box,
    el("strong", {text: refused ? "The token in this address was refused." : "This page needs the manager's token."}),
    el("p", {}, "Open the address ", el("code", {text: "elasticps server"}), " printed when it started (",
      el("code", {text: addr + "…"}), "), or add ", el("code", {text: "#token=<the contents of WORKDIR/token>"}),
      " to this address."));
  box.hidden = false;
}

// -- charts (uPlot)
const charts = new Map();  // key -> {plot, figure}

function markerPlugin(markers) {
  // vertical dashed lines at rescales, labelled with the new shape and the pause
  return {hooks: {draw: [u => {
    const ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
    ctx.save();
    ctx.font = `${10 * devicePixelRatio}px system-ui`;
    ctx.fillStyle = COLORS.marker; ctx.strokeStyle = COLORS.marker;
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    for (const m of markers) {
      const x = u.valToPos(m.at, "x", true);
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + h); ctx.stroke();
      ctx.fillText(m.label, x + 3 * devicePixelRatio, top + 11 * devicePixelRatio);
    }
    ctx.restore();
  }]}};
}

function chart(container, key, title, yLabel, x, series, opts = {}) {
  // series: [{label, values, color, stepped, fill}]; x: seconds since the epoch
  const data = [x, ...series.map(s => s.values)];
  const points = series.reduce((n, s) => n + s.values.filter(v => v != null).length, 0);
  let entry = charts.get(key);
  const width = Math.max(320, (container.clientWidth || 1100) / (opts.wide ? 1 : 2) - 40);
  if (entry && entry.signature === series.map(s => s.label).join("|") && entry.figure.isConnected) {
    entry.plot.setData(data);
  } else {
    if (entry) entry.plot.destroy();
    const figure = el("figure", {class: opts.wide ? "chart wide" : "chart"}, el("figcaption", {}, title, opts.note ? el("span", {class: "note", text: "  " + opts.note}) : null));
    const plot = new uPlot({
      width, height: opts.height || 200,
      scales: {x: {time: true}, y: opts.yRange ? {range: opts.yRange} : {}},
      axes: [{label: "time", labelSize: 20, stroke: "#555"},
        {label: yLabel, labelSize: 20, stroke: "#555", size: 56}],
      series: [{label: "time", value: (u, v) => v == null ? "-" : clock(v)}, ...series.map(s => ({
        label: s.label, stroke: s.color, width: s.width || 1.6, dash: s.dash, fill: s.fill,
        points: {show: s.values.length < 3},
        paths: s.stepped ? uPlot.paths.stepped({align: 1}) : undefined,
        value: (u, v) => v == null ? "-" : num(v, 4)}))],
      bands: opts.bands,
      legend: {live: false},
      plugins: opts.markers ? [markerPlugin(opts.markers)] : [],
    }, data, figure);
    entry = {plot, figure, signature: series.map(s => s.label).join("|")};
    charts.set(key, entry);
  }
  Object.assign(entry.figure.dataset, {chart: key, x: "time", y: yLabel, points: String(points)});
  return entry.figure;
}

function forget(prefix) {
  for (const [k, e] of charts) if (k.startsWith(prefix)) { e.plot.destroy(); charts.delete(k); }
}

// -- the job table
const COLUMNS = [["job"], ["state"], ["shape"], ["progress"], ["elapsed", "num"], ["ETA", "num"],
  ["samples/s", "num"], ["metric", "num"], ["why"]];

function jobRow(j) {
  const pct = j.progress == null ? null : Math.round(100 * j.progress);
  const bar = el("span", {class: "progress"}, el("span", {style: `width:${pct || 0}%`}));
  const epochs = j.epochs ? `epoch ${j.epoch}/${j.epochs}` : "";
  const why = j.reason || (j.move && j.move !== "keep" ? `last move: ${j.move}` : "");
  return el("tr", {data: {job: j.name, state: j.state}, onclick: () => go({job: j.name, view: null})},
    el("td", {text: j.name}),
    el("td", {}, el("span", {class: `state ${j.state}`, text: j.state})),
    el("td", {text: shape(j)}),
    el("td", {}, bar, pct == null ? "-" : `${pct}% ${epochs}`),
    el("td", {class: "num", text: duration(j.elapsed_s)}),
    el("td", {class: "num", title: j.eta_from || "", text: j.eta_s == null ? "-" : duration(j.eta_s)}),
    el("td", {class: "num", text: j.samples_per_s == null ? "-" : Math.round(j.samples_per_s)}),
    el("td", {class: "num", text: num(j.metric, 4)}),
    el("td", {class: "reason", text: why}));
}

function renderJobs(data) {
  const head = () => el("tr", {}, ...COLUMNS.map(([t, c]) => el("th", {class: c || "", text: t})));
  const active = data.jobs.filter(j => !j.ended), ended = data.jobs.filter(j => j.ended);
  const filter = document.getElementById("ended-filter").value;
  for (const [id, rows] of [["active-jobs", active], ["ended-jobs", ended.filter(j => !filter || j.state === filter)]]) {
    const table = document.getElementById(id);
    fill(table.tHead, head());
    fill(table.tBodies[0], ...rows.map(jobRow));
  }
  document.getElementById("no-active").hidden = active.length > 0;
  document.getElementById("ended-count").textContent = ended.length;
  const details = document.getElementById("ended");
  if (!details.dataset.touched) details.open = ended.length <= 10;  // folded once there are many, or when folded by hand
}

// -- one job
async function renderJob(name) {
  const d = await api(`/api/jobs/${encodeURIComponent(name)}`);
  const j = d.job;
  fill(document.getElementById("job-title"), j.name + " ", el("span", {class: `state ${j.state}`, text: j.state}));
  const parts = [`shape ${shape(j)} (PS ${j.ps_range.join("..")}, workers ${j.workers_range.join("..")})`,
    `submitted ${clock(j.submitted_at)}`, `elapsed ${duration(j.elapsed_s)}`];
  if (j.eta_s != null) parts.push(`ETA ${duration(j.eta_s)} (${j.eta_from})`);
  if (j.epochs) parts.push(`epoch ${j.epoch}/${j.epochs}`);
  if (j.metric != null) parts.push(`metric ${num(j.metric, 4)}`);
  document.getElementById("job-summary").textContent = parts.join(" · ");
  document.getElementById("job-reason").textContent = j.reason || "";

  const box = document.getElementById("job-charts");
  const c = d.curves;
  const markers = d.rescales.filter(r => r.ok).map(r => ({at: r.at,
    label: `${r.to[0]}x${r.to[1]} · paused ${Math.round(r.pause_s * 1000)} ms`}));
  const figures = [];
  const sx = d.shapes.map(s => s[0]);
  figures.push(chart(box, `job:${name}:shape`, "Shape over time", "tasks", sx, [
    {label: "PS", values: d.shapes.map(s => s[1]), color: COLORS.ps, stepped: true, dash: [6, 4], width: 2.5},
    {label: "workers", values: d.shapes.map(s => s[2]), color: COLORS.workers, stepped: true}],
    {markers, yRange: (u, lo, hi) => [0, Math.max(2, hi + 1)], note: "dashed: applied rescales and their pause"}));
  figures.push(chart(box, `job:${name}:rate`, "Throughput", "samples/s", c.at,
    [{label: "samples/s", values: c.samples_per_s, color: COLORS.rate}], {markers}));
  figures.push(chart(box, `job:${name}:loss`, "Training loss", "loss", c.at,
    [{label: "loss", values: c.loss, color: COLORS.loss}]));
  if (c.metric.some(v => v != null)) {
    figures.push(chart(box, `job:${name}:metric`, "Evaluation metric", "metric", c.at,
      [{label: "metric", values: c.metric, color: COLORS.metric, stepped: true}]));
  }
  if (d.adaptive_batch) {
    figures.push(chart(box, `job:${name}:batch`, "Global batch (adaptive)", "samples per step", c.at,
      [{label: "batch", values: c.batch, color: COLORS.batch, stepped: true}]));
  }
  fill(box, ...figures);
  fill(document.getElementById("job-events").tBodies[0], ...d.events.slice().reverse().map(e =>
    el("tr", {data: {kind: e.kind}}, el("td", {text: clock(e.at)}), el("td", {text: e.kind}), el("td", {text: e.message}))));
  document.getElementById("job-log").textContent = d.log.length ? d.log.map(l =>
    (l.step == null ? "event      " : `step ${String(l.step).padStart(6)}`) + "  " + l.text).join("\n") : "(no log lines from this manager's run of the job)";
}

// -- the cluster
async function renderCluster() {
  const d = await api("/api/cluster");
  const box = document.getElementById("node-charts");
  const ids = [...new Set(d.samples.flatMap(s => s.nodes.map(n => n.id)))];
  const figures = [];
  for (const id of ids) {
    const rows = d.samples.map(s => [s.at, s.nodes.find(n => n.id === id)]);
    for (const kind of ["cpu", "gpu"]) {
      if (kind === "gpu" && !rows.some(([, n]) => n && n[kind] > 0)) continue;
      const get = f => rows.map(([, n]) => n ? n[`${f}_${kind}`] : null);
      const ours = get("ours"), others = get("others"), free = get("free");
      const stack = (...parts) => ours.map((_, i) => parts.every(p => p[i] == null) ? null : parts.reduce((a, p) => a + (p[i] || 0), 0));
      const unit = kind === "cpu" ? "CPUs" : "GPUs";
      figures.push(chart(box, `node:${id}:${kind}`, `Node ${id.slice(0, 12)}: ${unit}`, unit, rows.map(r => r[0]), [
        {label: "our jobs", values: ours, color: COLORS.ours, fill: COLORS.ours + "99", stepped: true},
        {label: "+ other tenants", values: stack(ours, others), color: COLORS.others, fill: COLORS.others + "88", stepped: true},
        {label: "+ free", values: stack(ours, others, free), color: "#5a9a64", fill: COLORS.free + "66", stepped: true}],
        {wide: ids.length === 1, yRange: (u, lo, hi) => [0, Math.max(1, hi)],
          bands: [{series: [2, 1], fill: COLORS.others + "88"}, {series: [3, 2], fill: COLORS.free + "66"}]}));
    }
  }
  fill(box, ...(figures.length ? figures : [el("p", {class: "empty", text: "No node seen yet."})]));
  // each job's moves as they change (a job that keeps its shape, or waits for the same reason, adds nothing)
  const last = new Map(), rows = [];
  for (const r of d.rounds) {
    for (const m of r.moves) {
      if (last.get(m.job) === m.text) continue;
      last.set(m.job, m.text);
      if (m.action === "keep") continue;
      rows.push(el("tr", {data: {action: m.action}}, el("td", {text: clock(r.at)}), el("td", {text: m.job}),
        el("td", {text: m.why}), el("td", {text: m.text})));
    }
  }
  fill(document.getElementById("rounds").tBodies[0], ...rows.reverse().slice(0, 60));
}

// -- routing and refresh
let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  const p = params(), job = p.get("job"), view = job ? "job" : (p.get("view") || "jobs");
  for (const v of ["jobs", "job", "cluster"]) document.getElementById(`${v}-view`).hidden = v !== view;
  document.getElementById("nav-jobs").classList.toggle("current", view !== "cluster");
  document.getElementById("nav-cluster").classList.toggle("current", view === "cluster");
  try {
    if (!p.get("token")) { showNotice(false); return; }
    document.getElementById("notice").hidden = true;
    if (view === "job") await renderJob(job);
    else if (view === "cluster") await renderCluster();
    else renderJobs(await api("/api/overview"));
    document.getElementById("error").textContent = "";
    document.getElementById("updated").textContent = "updated " + clock(Date.now() / 1000);
  } catch (e) {
    if (e.auth) showNotice(true);
    else document.getElementById("error").textContent = "cannot load: " + e.message;
  } finally {
    busy = false;
  }
}

document.getElementById("nav-jobs").addEventListener("click", ev => { ev.preventDefault(); go({job: null, view: null}); });
document.getElementById("nav-cluster").addEventListener("click", ev => { ev.preventDefault(); go({job: null, view: "cluster"}); });
document.getElementById("back").addEventListener("click", ev => { ev.preventDefault(); go({job: null, view: null}); });
document.getElementById("ended-filter").addEventListener("change", refresh);
document.querySelector("#ended summary").addEventListener("click", () => { document.getElementById("ended").dataset.touched = "1"; });
window.addEventListener("hashchange", () => { forget(""); refresh(); });
refresh();
setInterval(refresh, REFRESH_MS);
