// The console: plain JS over the service's public API (GET /models, GET /history, POST /recommend,
// POST /events, POST /next-location). No build step, no third-party code, nothing kept between visits:
// the events API key lives in its input only.
"use strict";

const $ = (id) => document.getElementById(id);
let models = [];

function showError(err) {
  const box = $("error");
  box.textContent = err ? String(err.message || err) : "";
  box.hidden = !err;
}

async function api(method, path, { body, key } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (key) headers["X-API-Key"] = key;
  const resp = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    const e = data && data.error;
    const where = e && e.details && e.details.length ? ` (at ${e.details[0].loc.join(".")}: ${e.details[0].msg})` : "";
    throw new Error(`${resp.status} ${e ? e.message : resp.statusText}${where}`);
  }
  return data;
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

function details(fields) {
  if (!fields) return "";
  return Object.entries(fields)
    .filter(([name]) => name !== "title")
    .map(([name, v]) => `${name}: ${Array.isArray(v) ? v.join(", ") : v}`)
    .join(" · ");
}

function itemCell(row, id, fields) {
  const td = row.insertCell();
  const title = fields && fields.title;
  const strong = document.createElement("span");
  strong.className = "title";
  strong.textContent = title || id;
  td.appendChild(strong);
  if (title) {
    const small = document.createElement("span");
    small.className = "muted";
    small.textContent = ` (${id})`;
    td.appendChild(small);
  }
  return td;
}

function when(ts) {
  return ts === null || ts === undefined ? "" : new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function current() {
  return models.find((m) => m.name === $("model").value);
}

// The panel that queries each route: what a model shows follows from the route that serves it, and its
// labels from what it ranks (GET /models says both), never from its task's name.
const PANELS = { "/recommend": "user-panel", "/next-location": "stay-panel" };

function isUserModel(m) {
  return Boolean(m) && PANELS[m.route] === "user-panel";
}

function selectModel() {
  const m = current();
  showError(null);
  for (const panel of Object.values(PANELS)) $(panel).hidden = !(m && PANELS[m.route] === panel);
  if (!m) return;
  $("model-info").textContent =
    `${m.kind}, ${m.task}, ${m.catalog_size} ${m.ranks}` +
    (m.fields.length ? `, fields: ${m.fields.join(", ")}` : "");
  $("user-label").firstChild.textContent = "User id ";
  const one = m.ranks.replace(/s$/, "");
  $("event-item-label").firstChild.textContent = `${one[0].toUpperCase()}${one.slice(1)} id `;
  $("exclude-seen").checked = m.exclude_seen_default !== false;
  const actions = m.actions || [];
  $("action-label").hidden = !actions.length;
  const select = $("event-action");
  select.replaceChildren(
    ...actions.filter((a) => !a.startsWith("<-")).map((a) => new Option(a, a))
  );
  for (const id of ["history", "answer", "places", "similar", "hidden"]) $(id).tBodies[0].replaceChildren();
  $("excluded").textContent = "";
  $("similar-of").textContent = "";
  loadOnline();
  loadRules();
}

const COLORS = ["#2f5bea", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285"];

function svg(tag, attrs, text) {
  const el = document.createElementNS($("online-chart").namespaceURI, tag); // the page's own <svg> says which
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// One line per version/variant: NDCG@10 of each time bucket (drawn here, no chart library). A version's
// "floor" (its own popularity list under the same exclusions, scored on the same events) is drawn dashed.
function drawOnline(data) {
  const chart = $("online-chart");
  chart.replaceChildren();
  const series = Object.entries(data.series);
  const points = series.flatMap(([, pts]) => pts);
  const totals = Object.entries(data.totals).map(
    ([key, f]) => `${key}: n ${f.n}, NDCG@10 ${f.ndcg10.toFixed(4)} [${f.ndcg10_ci.map((x) => x.toFixed(4)).join(", ")}],` +
      ` HR@10 ${f.hr10.toFixed(4)}`
  );
  const cand = data.candidate ? `candidate ${data.candidate.version} (${data.candidate.mode}, share ${data.candidate.share}). ` : "";
  $("online-summary").textContent = cand + (totals.length ? totals.join(" · ") : "nothing scored yet");
  drawBreakdown(data);
  if (!points.length) return;
  const [W, H, L, B] = [900, 220, 50, 24];
  const t0 = Math.min(...points.map((p) => p[0])), t1 = Math.max(...points.map((p) => p[0])) || t0 + 1;
  const top = Math.max(0.01, ...points.map((p) => p[2]));
  const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - 10);
  const y = (v) => H - B - (v / top) * (H - B - 10);
  chart.append(svg("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: "#999" }));
  chart.append(svg("text", { x: 4, y: y(top) + 4, "font-size": 11 }, top.toFixed(3)));
  chart.append(svg("text", { x: 4, y: H - B, "font-size": 11 }, "0"));
  chart.append(svg("text", { x: L, y: H - 6, "font-size": 11 }, when(t0)));
  chart.append(svg("text", { x: W - 130, y: H - 6, "font-size": 11 }, when(t1)));
  series.forEach(([key, pts], n) => {
    const color = COLORS[n % COLORS.length];
    const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[2]).toFixed(1)}`).join(" ");
    const floor = key.endsWith("/floor") ? { "stroke-dasharray": "5 4" } : {};
    chart.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 2, ...floor }));
    chart.append(svg("text", { x: L + 8, y: 14 + 14 * n, fill: color, "font-size": 12 }, key));
  });
}

// Per version/variant: NDCG@10 (and lists scored) by segment, and what its lists showed over the window.
const SEGMENTS = ["users_known", "users_new", "users_fallback", "lists_fresh", "lists_catalog"];

function drawBreakdown(data) {
  const body = $("online-breakdown").tBodies[0];
  body.replaceChildren();
  const keys = [...new Set([...Object.keys(data.segments), ...Object.keys(data.exposure)])].sort();
  for (const key of keys) {
    const row = body.insertRow();
    cell(row, key);
    const groups = data.segments[key] || {};
    for (const group of SEGMENTS) {
      const f = groups[group];
      cell(row, f ? `${f.ndcg10.toFixed(4)} (n ${f.n})` : "-", "num");
    }
    const e = data.exposure[key];
    cell(row, e ? e.lists : "-", "num");
    cell(row, e ? `${(100 * e.coverage).toFixed(1)}% (${e.items})` : "-", "num");
    cell(row, e ? `${(100 * e.head_share).toFixed(1)}%` : "-", "num");
  }
}

async function loadOnline() {
  const m = current();
  $("online-panel").hidden = !isUserModel(m);
  if (!isUserModel(m)) return;
  try {
    drawOnline(await api("GET", `models/${encodeURIComponent(m.name)}/online`));
  } catch (err) {
    $("online-summary").textContent = "online figures unavailable";
  }
}

async function loadModels() {
  const data = await api("GET", "models");
  models = data.models;
  const defaults = Object.values(data.defaults || {});
  $("model").replaceChildren(...models.map((m) => new Option(`${m.name} (${m.task})`, m.name)));
  const asked = new URLSearchParams(window.location.search);
  const named = models.find((m) => m.name === asked.get("model"));
  const first = named || models.find((m) => defaults.includes(m.name) && isUserModel(m)) || models[0];
  if (first) $("model").value = first.name;
  selectModel();
  if (named && asked.get("user") && isUserModel(named)) {
    $("user").value = asked.get("user");
    await recommend();
  }
}

async function showHistory(m, user) {
  const params = new URLSearchParams({ model: m.name, user_id: user, limit: "20" });
  for (const f of m.fields) params.append("fields", f);
  const body = $("history").tBodies[0];
  body.replaceChildren();
  let data;
  try {
    data = await api("GET", `history?${params}`, { key: $("api-key").value });
  } catch (err) {
    const row = body.insertRow();
    cell(row, `history not shown: ${err.message}`, "muted").colSpan = 5;
    return;
  }
  data.events.forEach((e, n) => {
    const row = body.insertRow();
    cell(row, n + 1);
    itemCell(row, e.item_id, e.fields);
    cell(row, [e.action, details(e.fields)].filter(Boolean).join(" · "));
    cell(row, when(e.timestamp));
    cell(row, e.source + (e.known ? "" : ", unknown to the model"));
  });
}

async function recommend(event) {
  if (event) event.preventDefault();
  const m = current();
  const user = $("user").value.trim();
  if (!m || !user) return;
  showError(null);
  const query = {
    user_id: user,
    k: Number($("k").value) || 10,
    exclude_seen: $("exclude-seen").checked,
    exclude_future: $("exclude-future").checked,
    exclude_items: $("exclude-items").value.split(",").map((s) => s.trim()).filter(Boolean),
  };
  if (m.fields.length) query.fields = m.fields;
  try {
    const filter = $("filter").value.trim();
    if (filter) query.filter = JSON.parse(filter);
    const spread = $("max-per").value.trim();
    if (spread) {
      query.max_per = Object.fromEntries(spread.split(",").map((kv) => kv.split("=").map((s) => s.trim()))
        .map(([f, n]) => [f, Number(n)]));
    }
  } catch (err) {
    return showError(new Error(`the filter is not JSON: ${err.message}`));
  }
  share(m, user);
  try {
    const [data] = await Promise.all([api("POST", "recommend", { body: { model: m.name, queries: [query] }, key: $("api-key").value }), showHistory(m, user)]);
    const r = data.results[0];
    const body = $("answer").tBodies[0];
    body.replaceChildren();
    r.items.forEach((it, n) => {
      const row = body.insertRow();
      cell(row, n + 1);
      itemCell(row, it.item_id, it.fields);
      cell(row, details(it.fields));
      cell(row, it.score.toFixed(3), "num");
      const use = document.createElement("button");
      use.type = "button";
      use.textContent = "as event";
      use.title = "put this id in the event form";
      use.addEventListener("click", () => { $("event-item").value = it.item_id; $("event-item").focus(); });
      const like = document.createElement("button");
      like.type = "button";
      like.textContent = "similar";
      like.title = "the items most like this one (POST /similar-items)";
      like.addEventListener("click", () => similar(m, it.item_id));
      const actions = row.insertCell();
      actions.append(use, " ", like);
    });
    const x = r.excluded;
    const unknown = r.unknown_items.length ? `; unknown: ${r.unknown_items.join(", ")}` : "";
    const from = r.source === "model" ? "" : ` (a user the model does not know: ${r.source.replace("_", " ")} items)`;
    $("excluded").textContent =
      `${data.model} ${data.version}${from}: excluded ${x.seen} seen, ${x.future} future, ${x.requested} requested, ` +
      `${x.filtered} filtered or hidden${unknown}` +
      (r.history_truncated ? "; history longer than the model reads (newest part used)" : "");
  } catch (err) {
    showError(err);
  }
}

function eventId() {
  if (window.crypto && crypto.randomUUID) return `console-${crypto.randomUUID()}`;
  return `console-${Date.now()}-${Math.random().toString(36).slice(2)}`;
}

async function postEvent(event) {
  event.preventDefault();
  const m = current();
  const user = $("user").value.trim();
  if (!m || !user) return showError(new Error("type a user id first"));
  showError(null);
  const e = { event_id: eventId(), user_id: user, item_id: $("event-item").value.trim(), timestamp: Date.now() / 1000 };
  if (!$("action-label").hidden) e.action = $("event-action").value;
  try {
    const out = await api("POST", "events", { body: { model: m.name, events: [e] }, key: $("api-key").value });
    const r = out.results[0];
    $("event-status").textContent = `${r.status}${r.unknown_item ? " (unknown to the model until retrained)" : ""}`;
    await recommend();
  } catch (err) {
    $("event-status").textContent = "";
    showError(err);
  }
}

function localInput(d) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

function withOffset(value) {
  // datetime-local gives "YYYY-MM-DDTHH:MM" in local time; the API wants RFC 3339 with an offset.
  const d = new Date(value);
  const off = -d.getTimezoneOffset();
  const sign = off >= 0 ? "+" : "-";
  const pad = (n) => String(Math.floor(Math.abs(n))).padStart(2, "0");
  return `${value.length === 16 ? value + ":00" : value}${sign}${pad(off / 60)}:${pad(off % 60)}`;
}

function addStay(location = "", start = null, minutes = 60) {
  const t0 = start || new Date(Date.now() - 3 * 3600e3);
  const row = $("stays").tBodies[0].insertRow();
  const input = (type, value) => {
    const el = document.createElement("input");
    el.type = type;
    el.value = value;
    el.required = true;
    row.insertCell().appendChild(el);
    return el;
  };
  input("text", location).className = "stay-location";
  input("datetime-local", localInput(t0)).className = "stay-start";
  input("datetime-local", localInput(new Date(t0.getTime() + minutes * 60e3))).className = "stay-end";
  const del = document.createElement("button");
  del.type = "button";
  del.textContent = "remove";
  del.addEventListener("click", () => row.remove());
  row.insertCell().appendChild(del);
}

async function nextPlaces(event) {
  event.preventDefault();
  const m = current();
  showError(null);
  const history = [...$("stays").tBodies[0].rows].map((row) => ({
    location_id: row.querySelector(".stay-location").value.trim(),
    started_at: withOffset(row.querySelector(".stay-start").value),
    finished_at: withOffset(row.querySelector(".stay-end").value),
  }));
  const query = { history, k: Number($("stay-k").value) || 5 };
  const user = $("stay-user").value.trim();
  if (user) query.user_id = user;
  try {
    const data = await api("POST", "next-location", { body: { model: m.name, queries: [query] } });
    const body = $("places").tBodies[0];
    body.replaceChildren();
    data.results[0].locations.forEach((loc, n) => {
      const row = body.insertRow();
      cell(row, n + 1);
      cell(row, loc.location_id === null ? "(a place not seen in training)" : loc.location_id);
      cell(row, loc.probability.toFixed(3), "num");
    });
  } catch (err) {
    showError(err);
  }
}

// The console's address names the model and the user it shows: a link opens the same answer.
function share(m, user) {
  const url = new URL(window.location.href);
  url.search = new URLSearchParams({ model: m.name, user }).toString();
  window.history.replaceState(null, "", url);
  $("share").href = url.toString();
}

async function similar(m, item) {
  showError(null);
  const body = { model: m.name, item_id: item, k: Number($("k").value) || 10 };
  if (m.fields.length) body.fields = m.fields;
  const filter = $("filter").value.trim();
  try {
    if (filter) body.filter = JSON.parse(filter);
    const data = await api("POST", "similar-items", { body });
    $("similar-of").textContent = `(like ${item}, from ${data.source}${data.complete ? "" : "; fewer than k left"})`;
    const rows = $("similar").tBodies[0];
    rows.replaceChildren();
    data.items.forEach((it, n) => {
      const row = rows.insertRow();
      cell(row, n + 1);
      itemCell(row, it.item_id, it.fields);
      cell(row, details(it.fields));
      cell(row, it.score.toFixed(3), "num");
    });
  } catch (err) {
    showError(err);
  }
}

// What the store holds for the model: its hidden items, and its named filters (a pick fills the JSON in).
async function loadRules() {
  const m = current();
  const pick = $("filter-pick");
  pick.replaceChildren(new Option("none", ""));
  if (!isUserModel(m)) return;
  const name = encodeURIComponent(m.name);
  try {
    const [hidden, named] = await Promise.all([api("GET", `models/${name}/items/hidden`), api("GET", `models/${name}/filters`)]);
    const rows = $("hidden").tBodies[0];
    rows.replaceChildren();
    hidden.items.forEach((h) => {
      const row = rows.insertRow();
      cell(row, h.item_id);
      cell(row, h.until === null ? "until shown again" : when(h.until));
      cell(row, h.reason);
    });
    for (const [fname, expression] of Object.entries(named.filters)) {
      const option = new Option(fname, JSON.stringify({ name: fname, params: {} }));
      option.title = JSON.stringify(expression);
      pick.append(option);
    }
  } catch (err) {
    $("hidden").tBodies[0].replaceChildren();
  }
}

$("filter-pick").addEventListener("change", () => { $("filter").value = $("filter-pick").value; });
$("model").addEventListener("change", selectModel);
$("user-form").addEventListener("submit", recommend);
$("event-form").addEventListener("submit", postEvent);
$("stay-form").addEventListener("submit", nextPlaces);
$("add-stay").addEventListener("click", () => addStay());
addStay();
loadModels().catch(showError);
setInterval(() => { if (!document.hidden) loadOnline(); }, 15000);
