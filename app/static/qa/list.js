// The calls list (/qa): filters and paging go to GET /api/calls through the page's own query string
// (so a filtered view can be linked, as Grafana does); sorting orders the page's calls; the overview
// charts read GET /api/overview for the same time window.
import {
  apiUrl, badge, callPageUrl, el, formatDuration, formatMs, formatTime, getJSON, STAGES, toIso, toLocalInput,
} from "./common.js";
import {drawOverview} from "./overview.js";

const FILTERS = ["since", "until", "transport", "status", "min_v2v_ms"];
const COLUMNS = [
  {key: "started_at", label: "started", cell: (c) => el("a", {href: callPageUrl(c.id)}, formatTime(c.started_at))},
  {key: "id", label: "call", cell: (c) => el("a", {href: callPageUrl(c.id), class: "mono", title: c.id}, c.id.slice(0, 12))},
  {key: "transport", label: "transport"},
  {key: "duration_s", label: "duration", numeric: true, cell: (c) => formatDuration(c.duration_s)},
  {key: "turns", label: "turns", numeric: true},
  {key: "v2v_median_ms", label: "median v2v (ms)", numeric: true, cell: (c) => formatMs(c.v2v_median_ms)},
  {key: "v2v_max_ms", label: "worst v2v (ms)", numeric: true, cell: (c) => formatMs(c.v2v_max_ms)},
  {key: "interruptions", label: "interruptions", numeric: true},
  {key: "errors", label: "errors", numeric: true},
  {key: "status", label: "status", cell: (c) => badge(c.status, c.status)},
];
const AROUND_S = 300; // ?around=<epoch ms> (a Grafana data link): the calls within 5 minutes of it

const page = {state: "loading", calls: [], total: 0, nextOffset: null, sort: null, dir: "asc"};
window.qaPage = page;

const form = document.getElementById("filters");
const table = document.getElementById("calls");

// The view's settings from the URL: filters, page and sort.
function readQuery() {
  const query = new URLSearchParams(location.search);
  if (query.has("around")) {
    const at = Number(query.get("around"));
    query.delete("around");
    if (Number.isFinite(at)) {
      query.set("since", new Date(at - AROUND_S * 1000).toISOString());
      query.set("until", new Date(at + AROUND_S * 1000).toISOString());
    }
    history.replaceState(null, "", "?" + query);
  }
  return query;
}

function fillForm(query) {
  form.since.value = toLocalInput(toIso(query.get("since")));
  form.until.value = toLocalInput(toIso(query.get("until")));
  for (const name of ["transport", "status", "min_v2v_ms"]) form[name].value = query.get(name) || "";
  const limit = query.get("limit") || "50";
  if (![...form.limit.options].some((option) => option.value === limit)) form.limit.append(el("option", {}, limit));
  form.limit.value = limit;
}

function formQuery() {
  const query = new URLSearchParams();
  const values = {
    since: toIso(form.since.value), until: toIso(form.until.value), transport: form.transport.value,
    status: form.status.value, min_v2v_ms: form.min_v2v_ms.value,
    limit: form.limit.value === "50" ? "" : form.limit.value,
  };
  for (const [name, value] of Object.entries(values)) if (value) query.set(name, value);
  if (page.sort) {
    query.set("sort", page.sort);
    query.set("dir", page.dir);
  }
  return query;
}

function go(query) {
  history.pushState(null, "", "?" + query);
  load();
}

function filterParams(query) {
  return Object.fromEntries(FILTERS.map((name) => [name, query.get(name)]));
}

async function load() {
  const query = readQuery();
  fillForm(query);
  page.sort = query.get("sort");
  page.dir = query.get("dir") === "desc" ? "desc" : "asc";
  page.offset = Number(query.get("offset")) || 0;
  page.limit = Number(query.get("limit")) || 50;
  document.body.dataset.state = page.state = "loading";
  showError(null);
  const filters = filterParams(query);
  for (const format of ["jsonl", "csv"]) {
    document.getElementById(`export-${format}`).href = apiUrl("calls/export", {format, ...filters});
  }
  try {
    const [list, overview] = await Promise.all([
      getJSON(apiUrl("calls", {...filters, limit: page.limit, offset: page.offset})),
      getJSON(apiUrl("overview", {since: filters.since, until: filters.until})),
    ]);
    page.calls = list.calls;
    page.total = list.total;
    page.nextOffset = list.next_offset;
    page.overview = overview;
    renderCalls();
    page.charts = drawOverview(overview, STAGES);
    document.getElementById("overview-window").textContent =
      `${formatTime(overview.since)} – ${formatTime(overview.until)}, ${overview.bucket_s / 60} min buckets`;
    document.body.dataset.state = page.state = "ready";
  } catch (error) {
    showError(`Could not load the calls: ${error.message}`);
    document.body.dataset.state = page.state = "error";
  }
}

function compare(a, b, key) {
  const x = a[key];
  const y = b[key];
  if (x === null || x === undefined) return y === null || y === undefined ? 0 : 1; // missing: always last
  if (y === null || y === undefined) return -1;
  const order = typeof x === "number" ? x - y : String(x).localeCompare(String(y));
  return page.dir === "desc" ? -order : order;
}

function renderHead() {
  const row = table.tHead.rows[0];
  row.replaceChildren(...COLUMNS.map((column) => {
    const sorted = page.sort === column.key;
    const arrow = sorted ? (page.dir === "desc" ? " ▼" : " ▲") : "";
    const th = el("th", {class: column.numeric ? "num" : null, "data-key": column.key,
                         "aria-sort": sorted ? (page.dir === "desc" ? "descending" : "ascending") : "none"},
                  el("button", {type: "button", class: "sort"}, column.label + arrow));
    th.querySelector("button").addEventListener("click", () => sortBy(column.key));
    return th;
  }));
}

function sortBy(key) {
  page.dir = page.sort === key && page.dir === "asc" ? "desc" : "asc";
  page.sort = key;
  const query = new URLSearchParams(location.search);
  query.set("sort", key);
  query.set("dir", page.dir);
  history.replaceState(null, "", "?" + query);
  renderCalls();
}

function renderCalls() {
  renderHead();
  const calls = page.sort ? [...page.calls].sort((a, b) => compare(a, b, page.sort)) : page.calls;
  table.tBodies[0].replaceChildren(...calls.map((call) => el("tr", {"data-call-id": call.id},
    COLUMNS.map((column) => el("td", {class: column.numeric ? "num" : null},
                               column.cell ? column.cell(call) : String(call[column.key] ?? "–"))))));
  page.shown = calls.map((call) => call.id);
  document.getElementById("empty").hidden = calls.length > 0;
  document.getElementById("count").textContent = `(${page.total})`;
  const first = page.total ? page.offset + 1 : 0;
  document.getElementById("page").textContent = `${first}–${page.offset + calls.length} of ${page.total}`;
  document.getElementById("prev").disabled = page.offset === 0;
  document.getElementById("next").disabled = page.nextOffset === null;
}

function showError(message) {
  const box = document.getElementById("error");
  box.hidden = !message;
  box.textContent = message || "";
}

function turnPage(offset) {
  const query = new URLSearchParams(location.search);
  if (offset > 0) query.set("offset", String(offset));
  else query.delete("offset");
  go(query);
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  go(formQuery());
});
form.addEventListener("reset", (event) => {
  event.preventDefault();
  page.sort = null;
  go(new URLSearchParams());
});
for (const button of form.querySelectorAll("[data-range]")) {
  button.addEventListener("click", () => {
    const seconds = Number(button.dataset.range);
    form.since.value = seconds ? toLocalInput(new Date(Date.now() - seconds * 1000).toISOString()) : "";
    form.until.value = "";
    go(formQuery());
  });
}
document.getElementById("prev").addEventListener("click", () => turnPage(Math.max(0, page.offset - page.limit)));
document.getElementById("next").addEventListener("click", () => turnPage(page.nextOffset));
window.addEventListener("popstate", load);

load();
