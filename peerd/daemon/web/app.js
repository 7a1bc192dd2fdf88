"use strict";
// The daemon's live page: polls api/status and draws its tables and SVG charts
// itself (no library, nothing fetched from elsewhere). Parts of the page are
// kept from one poll to the next, so a scrolled table stays where it was.

const POLL_MS = 1000;
const POINTS = 200; // asked of the daemon per member and curve
const LINE_POINTS = 300; // drawn per line: about one per two pixels
const SVG = "http://www.w3.org/2000/svg";
const W = 440, H = 210, PAD = { l: 54, r: 10, t: 10, b: 22 };
const CURVES = [
  ["loss", () => "training loss (EMA)"],
  ["metric", (job) => job.metric_name + (job.consensus !== null ? " (dashed: the consensus)" : "")],
  ["lr", () => "learning rate"],
  ["samples_per_s", () => "samples/s"],
];
const TEXT_COLUMNS = 4; // the first ones are words, the rest numbers
const MEMBER_COLUMNS = [
  ["member", (m) => m.member], ["daemon", (m) => m.daemon || "-"],
  ["state", (m) => m.state + (m.collapsed ? " · collapsed" : "")], // collapsed: docs/operations.md
  ["why not training", (m) => m.why], ["round", (m) => m.round], ["epoch", (m) => fmt(m.epochs, 3)],
  ["loss", (m) => fmt(m.loss)], ["metric", (m) => fmt(m.metric)], ["lr", (m) => fmt(m.lr)],
  ["LR factor", (m) => fmt(m.lr_scale)], // the LR law's, this daemon's workers only (docs/operations.md)
  ["global batch", (m) => m.global_batch || "-"], ["batch", (m) => m.local_batch || "-"],
  ["share", (m) => (m.share === null || !m.share ? "-" : (100 * m.share).toFixed(1) + "%")],
  ["samples/s", (m) => fmt(m.samples_per_s)], ["disagreement", (m) => fmt(m.disagreement)],
  ["misses", (m) => m.segment_misses], ["refused", (m) => m.rejected],
  ["restarts", (m) => (m.restarts === null ? "-" : m.restarts)],
  ["last Hello", (m) => (m.local ? "here" : fmt(m.seen_s, 2) + " s")],
];

let lastOk = 0;

// Values are numbers, or null when not known (docs/operations.md, "JSON output"): null is NaN here.
function num(v) {
  if (typeof v === "number") return v;
  if (typeof v === "string" && v !== "") return Number(v);
  return NaN;
}

function fmt(v, digits = 4) {
  const x = num(v);
  if (!Number.isFinite(x)) return "-";
  if (x !== 0 && Math.abs(x) < 1e-3) return x.toExponential(2);
  return Math.abs(x) >= 10000 ? x.toFixed(0) : String(Number(x.toPrecision(digits)));
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function svgEl(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

// A member keeps its colour whatever joins or leaves: a hue from its name.
function colour(name) {
  let h = 0;
  for (const c of name) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return `hsl(${(h * 137.508) % 360}, 65%, 42%)`;
}

// At most `limit` indices of 0..count-1, evenly spread, the first and last kept.
function thin(count, limit) {
  if (count <= limit) return [...Array(count).keys()];
  const step = (count - 1) / (limit - 1), out = new Set();
  for (let k = 0; k < limit; k++) out.add(Math.round(k * step));
  return [...out].sort((a, b) => a - b);
}

// peer-2 before peer-10.
function natural(a, b) {
  return a.localeCompare(b, undefined, { numeric: true });
}

function ago(seconds) {
  const s = Math.abs(Math.round(seconds));
  if (s === 0) return "now";
  return "-" + (s >= 120 ? Math.round(s / 60) + " min" : s + " s");
}

function range(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (lo === Infinity) return null;
  if (lo === hi) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  const pad = (hi - lo) * 0.05;
  return [lo >= 0 ? Math.max(0, lo - pad) : lo - pad, hi + pad]; // a loss or a speed never below 0
}

// A tick's label with as many decimals as its step needs (0.0498, 0.0499, not 0.05 twice).
function tick(v, step) {
  if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e6)) return v.toExponential(2);
  return v.toFixed(Math.min(8, Math.max(0, 1 - Math.floor(Math.log10(step)))));
}

function axes(svg, xr, yr, overTime = true, log = false) {
  const [y0, y1] = yr;
  for (let k = 0; k <= 4; k++) {
    const y = PAD.t + (H - PAD.t - PAD.b) * (k / 4), v = y1 - (y1 - y0) * (k / 4);
    svg.append(svgEl("line", { class: "grid", x1: PAD.l, x2: W - PAD.r, y1: y, y2: y }));
    svg.append(svgEl("text", { x: PAD.l - 4, y: y + 4, "text-anchor": "end" },
      log ? fmt(10 ** v, 2) : tick(v, (y1 - y0) / 4)));
  }
  for (let k = 0; k <= 3 && overTime; k++) {
    const x = PAD.l + (W - PAD.l - PAD.r) * (k / 3);
    svg.append(svgEl("text", { x, y: H - 6, "text-anchor": k === 0 ? "start" : k === 3 ? "end" : "middle" },
      ago(xr[0] + (xr[1] - xr[0]) * (k / 3))));
  }
}

// One line per member over time: its path breaks where a value is missing.
// A loss that falls by decades is drawn on a log scale, so its tail stays visible.
function drawCurves(svg, history, key, consensus) {
  svg.replaceChildren();
  const members = Object.entries(history);
  let ys = members.flatMap(([, s]) => s[key].map(num)).concat(consensus === null ? [] : [consensus]);
  const ts = members.flatMap(([, s]) => s.t.map(num));
  const seen = ys.filter(Number.isFinite);
  const log = key === "loss" && seen.length > 0 && Math.min(...seen) > 0 && Math.max(...seen) / Math.min(...seen) > 30;
  const f = log ? Math.log10 : (v) => v;
  ys = ys.map(f);
  const yr = range(ys);
  if (yr === null || ts.length === 0) {
    svg.append(svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no values yet"));
    return;
  }
  const xr = [Math.min(...ts, -1), 0];
  axes(svg, xr, yr, true, log);
  if (log) svg.append(svgEl("text", { x: W - PAD.r, y: PAD.t + 10, "text-anchor": "end" }, "log scale"));
  const sx = (t) => PAD.l + (W - PAD.l - PAD.r) * (t - xr[0]) / (xr[1] - xr[0]);
  const sy = (v) => H - PAD.b - (H - PAD.t - PAD.b) * (f(v) - yr[0]) / (yr[1] - yr[0]);
  for (const [name, s] of members) {
    let d = "", pen = "M";
    for (const i of thin(s.t.length, LINE_POINTS)) {
      const v = num(s[key][i]);
      if (!Number.isFinite(v)) { pen = "M"; continue; }
      d += `${pen}${sx(num(s.t[i])).toFixed(1)},${sy(v).toFixed(1)}`;
      pen = "L";
    }
    if (!d) continue;
    const path = svgEl("path", { class: "line", d, stroke: colour(name), "data-member": name });
    path.append(svgEl("title", {}, name));
    svg.append(path);
  }
  if (consensus !== null) {
    const y = sy(consensus);
    svg.append(svgEl("line", { class: "consensus", x1: PAD.l, x2: W - PAD.r, y1: y, y2: y }));
    svg.append(svgEl("text", { class: "consensus-label", x: W - PAD.r - 2, y: y - 4, "text-anchor": "end" },
      "consensus " + fmt(consensus)));
  }
}

// DBS at a glance: each member's local batch, its speed in the bar's tooltip.
function drawBatches(svg, members) {
  svg.replaceChildren();
  const rows = members.filter((m) => m.local_batch > 0);
  if (rows.length === 0) {
    svg.append(svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" }, "no steps yet"));
    return;
  }
  const hi = Math.max(...rows.map((m) => m.local_batch));
  axes(svg, null, [0, hi * 1.05], false);
  const width = (W - PAD.l - PAD.r) / rows.length;
  rows.forEach((m, k) => {
    const h = (H - PAD.t - PAD.b) * m.local_batch / (hi * 1.05);
    const bar = svgEl("rect", { x: PAD.l + k * width + width * 0.1, y: H - PAD.b - h, width: Math.max(width * 0.8, 0.5),
      height: h, fill: colour(m.member) });
    bar.append(svgEl("title", {}, `${m.member}: batch ${m.local_batch}, ${fmt(m.samples_per_s)} samples/s`));
    svg.append(bar);
  });
  if (rows.length <= 12) { // room for words: each bar's member below it, its speed above it
    rows.forEach((m, k) => {
      const x = PAD.l + (k + 0.5) * width, h = (H - PAD.t - PAD.b) * m.local_batch / (hi * 1.05);
      svg.append(svgEl("text", { x, y: H - 6, "text-anchor": "middle" }, m.member));
      const inside = h >= 20; // else above the bar, in the axes' colour
      svg.append(svgEl("text", { class: inside ? "bar-label" : "", x, y: H - PAD.b - h + (inside ? 14 : -4),
        "text-anchor": "middle" }, `${m.local_batch} · ${fmt(m.samples_per_s, 3)}/s`));
    });
  }
}

function chart(title) {
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img" });
  const box = el("div", { class: "chart" }, el("h3", {}, title), svg);
  return { box, svg, title: box.querySelector("h3") };
}

function jobSection(name) {
  const section = el("section", { class: "job", "data-job": name });
  const summary = el("span", { class: "summary" });
  section.append(el("h2", {}, "job ", el("span", { class: "job-name" }, name), summary));
  const charts = el("div", { class: "charts" });
  const curves = CURVES.map(([key]) => { const c = chart(key); c.svg.classList.add("curve-" + key); return c; });
  const batches = chart("local batch per member (DBS) · samples/s");
  for (const c of [...curves, batches]) charts.append(c.box);
  const tbody = el("tbody");
  const head = el("tr", {}, ...MEMBER_COLUMNS.map(([h], k) => el("th", { class: k < TEXT_COLUMNS ? "text" : "" }, h)));
  const table = el("table", { class: "members" }, el("thead", {}, head), tbody);
  const messages = el("div", { class: "messages" });
  section.append(charts, el("div", { class: "table-wrap" }, table), messages);
  return { section, summary, curves, batches, tbody, messages, metricHead: head.cells[7] };
}

function memberRow(m) {
  const row = el("tr", { "data-member": m.member });
  MEMBER_COLUMNS.forEach(([h, get], k) => {
    const cell = el("td", { class: k < TEXT_COLUMNS ? "text" : "" }, String(get(m)));
    if (k === 0) cell.prepend(el("span", { class: "swatch" }));
    if (h === "state") cell.classList.add("state", "state-" + m.state, ...(m.collapsed ? ["state-collapsed"] : []));
    if (h === "why not training") { cell.classList.add("why"); if (m.message) cell.title = m.message; }
    row.append(cell);
  });
  row.querySelector(".swatch").style.background = colour(m.member); // CSSOM: allowed by the page's CSP
  return row;
}

function updateJob(part, job, history) {
  const training = job.members.filter((m) => m.state === "running" && !m.why).length;
  const bits = [`round ${job.round}`, `epoch ${fmt(job.epochs, 3)}`, `global batch ${job.global_batch || "-"}`,
    `${job.members.length} members, ${training} training`, job.here ? `here: ${job.state}` : "not run here"];
  if (job.lr_law) bits.push(`LR: ${job.lr_law}`);
  if (job.outer) bits.push(job.outer);
  if (job.consensus !== null) bits.push(`consensus ${job.metric_name} ${fmt(job.consensus)} of ${job.consensus_peers}`);
  const collapsed = job.members.filter((m) => m.collapsed).map((m) => m.member);
  if (collapsed.length) bits.push(`training collapsed: ${collapsed.join(", ")}`);
  part.summary.textContent = bits.join(" · ");
  part.summary.dataset.round = job.round;
  part.metricHead.textContent = job.metric_name;
  CURVES.forEach(([key, title], k) => {
    part.curves[k].title.textContent = title(job);
    drawCurves(part.curves[k].svg, history, key, key === "metric" ? job.consensus : null);
  });
  drawBatches(part.batches.svg, job.members);
  part.tbody.replaceChildren(...job.members.map(memberRow));
  part.messages.replaceChildren(...job.members.filter((m) => m.message || m.collapse_reason).map((m) =>
    el("pre", { class: "message" }, [m.message && `${m.member}: ${m.state}: ${m.message}`,
      m.collapse_reason && `${m.member}: ${m.collapse_reason}`].filter(Boolean).join("\n"))));
}

const jobParts = new Map();

function updateJobs(data) {
  const box = document.getElementById("jobs");
  const names = new Set(data.view.map((j) => j.name));
  for (const [name, part] of jobParts) if (!names.has(name)) { part.section.remove(); jobParts.delete(name); }
  document.getElementById("no-jobs").hidden = data.view.length > 0;
  for (const job of data.view) {
    if (!jobParts.has(job.name)) { const part = jobSection(job.name); jobParts.set(job.name, part); box.append(part.section); }
    updateJob(jobParts.get(job.name), job, data.history[job.name] || {});
  }
}

function updatePeers(data) {
  const s = data.status;
  const mine = el("tr", { class: "me", "data-peer": s.peer_id }, el("td", {}, s.peer_id + " (this one)"),
    el("td", { class: "state state-alive" }, "alive"), el("td", {}, s.peer_address), el("td", {}, s.locality || "-"),
    el("td", {}, s.version), el("td", {}, s.jobs.map((j) => j.name).join(", ") || "-"), el("td", {}, "-"));
  const rows = [...data.peers.peers].sort((a, b) => natural(a.peer_id, b.peer_id)).map((p) => el("tr", { "data-peer": p.peer_id }, el("td", {}, p.peer_id),
    el("td", { class: "state state-" + p.state }, p.state), el("td", {}, p.address), el("td", {}, p.locality || "-"),
    el("td", {}, p.version), el("td", {}, p.jobs.join(", ") || "-"), el("td", {}, fmt(p.last_seen_s, 2) + " s ago")));
  document.querySelector("#peers tbody").replaceChildren(mine, ...rows);
}

function updateHeader(data) {
  const s = data.status;
  document.title = `peerd ${s.peer_id}`;
  document.getElementById("me").textContent = s.peer_id;
  document.getElementById("daemon").textContent = `version ${s.version} · up ${fmt(s.uptime_s, 3)} s · ` +
    `address ${s.peer_address} · locality ${s.locality || "-"} · ${s.peers_known} peers known`;
}

function showLive() {
  const live = document.getElementById("live");
  const age = (Date.now() - lastOk) / 1000;
  const ok = lastOk && age < 5;
  live.className = "live " + (ok ? "ok" : "stale");
  live.textContent = !lastOk ? "connecting" : ok ? "live" : `no answer for ${Math.round(age)} s: retrying`;
}

async function poll() {
  try {
    const reply = await fetch(`api/status?points=${POINTS}`, { cache: "no-store" });
    if (!reply.ok) throw new Error(reply.status);
    const data = await reply.json();
    updateHeader(data);
    updatePeers(data);
    updateJobs(data);
    lastOk = Date.now();
  } catch (err) {
    console.warn("poll failed:", err);
  }
  showLive();
  setTimeout(poll, POLL_MS);
}

poll();
