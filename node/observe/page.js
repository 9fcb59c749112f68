"use strict";
// The observe page: polls /api/state every 2 s and redraws; charts are plain canvas drawing (no library,
// no CDN: nodes often run offline). Each chart canvas carries what it plotted in data-* attributes
// (series, points, last value and its round), so a test can check the drawing against /api/state.
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const POLL_MS = 2000;
const DIGITS = { "score": 2, "tok/s": 0, "s": 2, "grad norm": 2, "held-out": 2 };

function fmt(v, digits = 3) {
  if (v === null || v === undefined) return "-";
  if (typeof v === "number" && v !== 0 && Math.abs(v) < 1e-3) return v.toExponential(1);
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(digits);
  if (typeof v === "object") return Object.keys(v).sort().map(k => v[k]).join("/");
  return String(v);
}

function duration(s) {
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  return h ? `${h} h ${m} min` : m ? `${m} min ${s % 60} s` : `${s} s`;
}

function shortId(id) { return id && id.length > 20 ? `${id.slice(0, 10)}…${id.slice(-6)}` : id || "-"; }

function range(values, lo, hi) {
  let min = Math.min(lo, ...values), max = Math.max(hi, ...values);
  if (max - min < 1e-9) max = min + 1;
  return [min, max];
}

function drawChart(canvas, series, yFloor = 0, yCeil = 1) {
  const points = series.flatMap(s => s.points);
  const first = series.find(s => s.points.length);
  canvas.dataset.series = String(series.length);
  canvas.dataset.points = String(points.length);
  canvas.dataset.last = first ? String(first.points[first.points.length - 1][1]) : "";
  canvas.dataset.lastRound = first ? String(first.points[first.points.length - 1][0]) : "";
  const ratio = window.devicePixelRatio || 1, w = canvas.clientWidth, h = canvas.clientHeight;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px system-ui, 'DejaVu Sans', sans-serif";
  if (!points.length) {
    ctx.fillStyle = "#8a90a0";
    ctx.fillText("no data yet", w / 2 - 28, h / 2);
    return;
  }
  const pad = { l: 46, r: 14, t: 12, b: 28 };
  const [x0, x1] = range(points.map(p => p[0]), Infinity, -Infinity);
  const [y0, y1] = range(points.map(p => p[1]), yFloor, yCeil);
  const X = x => pad.l + (x - x0) / (x1 - x0) * (w - pad.l - pad.r);
  const Y = y => h - pad.b - (y - y0) / (y1 - y0) * (h - pad.t - pad.b);
  drawAxes(ctx, w, h, pad, [x0, x1], [y0, y1], X, Y);
  series.forEach((s, i) => drawLine(ctx, s.points, s.color || COLORS[i % COLORS.length], X, Y));
  if (series.length > 1) drawLegend(ctx, series, pad);
}

function niceStep(raw) {  // 1, 2 or 5 times a power of ten, at least 1 (rounds are integers)
  const power = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1))));
  return [1, 2, 5, 10].map(m => m * power).find(step => step >= raw) || 10 * power;
}

function drawAxes(ctx, w, h, pad, [x0, x1], [y0, y1], X, Y) {
  ctx.strokeStyle = "#e6e8ee";
  ctx.fillStyle = "#5f6675";
  ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const y = y0 + (y1 - y0) * i / 4;
    ctx.beginPath(); ctx.moveTo(pad.l, Y(y)); ctx.lineTo(w - pad.r, Y(y)); ctx.stroke();
    ctx.fillText(y.toFixed(2), 4, Y(y) + 4);
  }
  const step = niceStep((x1 - x0) / 6);
  for (let x = Math.ceil(x0 / step) * step; x <= x1; x += step) {
    ctx.beginPath(); ctx.moveTo(X(x), h - pad.b); ctx.lineTo(X(x), h - pad.b + 4); ctx.stroke();
    ctx.fillText(String(x), X(x) - 6, h - pad.b + 16);
  }
  ctx.fillText("round", w - pad.r - 30, h - 2);
}

function drawLine(ctx, points, color, X, Y) {
  ctx.strokeStyle = color;
  ctx.fillStyle = color;
  ctx.lineWidth = 1.8;
  ctx.beginPath();
  points.forEach(([x, y], i) => (i ? ctx.lineTo(X(x), Y(y)) : ctx.moveTo(X(x), Y(y))));
  ctx.stroke();
  if (points.length <= 60) {  // sparse curves (held-out evaluations): mark each point
    for (const [x, y] of points) { ctx.beginPath(); ctx.arc(X(x), Y(y), 2.5, 0, 2 * Math.PI); ctx.fill(); }
  }
}

function drawLegend(ctx, series, pad) {
  series.forEach((s, i) => {
    ctx.fillStyle = s.color || COLORS[i % COLORS.length];
    ctx.fillRect(pad.l + 8, pad.t + 4 + i * 15, 12, 3);
    ctx.fillText(s.name, pad.l + 26, pad.t + 9 + i * 15);
  });
}

function fillTable(table, headers, rows) {
  table.replaceChildren();
  const head = table.insertRow();
  headers.forEach((name, i) => {
    const th = document.createElement("th");
    th.textContent = name;
    if (i === 0) th.className = "l";
    head.appendChild(th);
  });
  if (!rows.length) {
    const td = table.insertRow().insertCell();
    td.colSpan = headers.length;
    td.className = "l muted";
    td.textContent = "none yet";
  }
  for (const cells of rows) {
    const tr = table.insertRow();
    cells.forEach((cell, i) => {
      const td = tr.insertCell();
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = fmt(cell, DIGITS[headers[i]] ?? 3);
      if (i === 0) td.className = "l";
    });
  }
}

function renderNode(s) {
  document.getElementById("title").textContent = s.title;
  const rejected = Object.values(s.rejected_by_reason || {}).reduce((a, b) => a + b, 0);
  document.getElementById("facts").textContent = [
    s.peer_id ? `peer id ${s.peer_id}` : "training alone (no swarm)",
    s.swarm && `swarm ${s.swarm}`, s.transport && `transport ${s.transport}`, `round ${s.round}`,
    `policy v${s.policy_version}`, `up ${duration(s.uptime_s)}`,
    s.peer_id && `peers connected ${s.connected}`,
    s.reachability && `reachability ${s.reachability}` + (s.relayed_peers ? ` (${s.relayed_peers} through a relay)` : ""),
    s.peer_id && `accepted ${s.accepted}`,
    s.peer_id && `rejected ${rejected}`].filter(Boolean).join(" · ");
  document.getElementById("addrs").textContent = (s.listen_addrs || []).map(a => `listening on ${a}`).join("  ");
  drawChart(document.getElementById("chart-reward"), [{ name: "reward", points: s.curves.reward }]);
  drawChart(document.getElementById("chart-heldout"), [
    { name: "pass@1", points: s.curves.heldout_pass1 }, { name: "pass@k", points: s.curves.heldout_passk }]);
  document.getElementById("left-title").textContent = `peers (${s.peers_tracked || 0} tracked, ` +
    `${s.peers_banned || 0} banned; lowest score first)`;
  fillTable(document.getElementById("left-table"), ["peer", "connected", "score", "banned", "accepted", "rejected"],
    (s.peers || []).map(p => [shortId(p.peer_id), p.connected ? "yes" : "no", p.score, p.banned ? "yes" : "no",
      p.accepted, p.rejected]));
  fillTable(document.getElementById("right-table"),
    ["round", "reward", "pass", "held-out", "loss", "grad norm", "groups", "ext used", "tiers", "peers", "tok/s", "s"],
    s.recent.slice().reverse().map(r => [r.round, r.reward_mean, r.pass_rate, r.heldout_pass1, r.loss, r.grad_norm,
      r.groups_trained, r.external_used, r.external_tiers, r.peers_connected, r.tokens_per_s, r.t_round]));
}

function link(url) {
  if (!url) return "-";
  const a = document.createElement("a");
  a.href = url;
  a.textContent = "page";
  return a;
}

function renderTestnet(s) {
  document.getElementById("title").textContent = s.title;
  document.getElementById("facts").textContent = `${s.nodes.length} nodes · run dir ${s.run_dir}`;
  const named = key => s.nodes.map(n => ({ name: n.name, points: n.curves[key] }));
  document.getElementById("reward-title").textContent = "reward per round, one line per node";
  document.getElementById("heldout-title").textContent = "held-out pass@1 per evaluation, one line per node";
  drawChart(document.getElementById("chart-reward"), named("reward"));
  drawChart(document.getElementById("chart-heldout"), named("heldout_pass1"));
  document.getElementById("left-title").textContent = "nodes";
  fillTable(document.getElementById("left-table"),
    ["node", "state", "round", "reward", "held-out", "peers", "ext used", "accepted", "rejected", "page"],
    s.nodes.map(n => [n.name, n.state, n.round, n.reward, n.heldout, n.peers, n.ext_used, n.accepted, n.rejected,
      link(n.url)]));
  document.getElementById("right-card").hidden = true;  // the nodes table takes the whole row
  document.querySelector(".grid.tables").style.gridTemplateColumns = "minmax(0, 1fr)";
}

async function poll() {
  const updated = document.getElementById("updated");
  try {
    const response = await fetch("api/state", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const state = await response.json();
    (state.kind === "testnet" ? renderTestnet : renderNode)(state);
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
    updated.textContent = `updated ${new Date().toLocaleTimeString()} (every ${POLL_MS / 1000} s)`;
    updated.className = "muted";
  } catch (err) {
    updated.textContent = `no answer from the node (${err.message}); retrying every ${POLL_MS / 1000} s`;
    updated.className = "bad";
  }
  setTimeout(poll, POLL_MS);
}

poll();
