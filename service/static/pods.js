// MLA Switchboard dashboard, part 2: the pod table. Every pod that runs now, paged by
// the service (GET /v1/pods, a cursor per page), filtered by what the service filters
// on, searched by pod or node prefix. The filters' choices and the "of N" come from
// GET /v1/pods/facets, read from the fleet's counts, so a fleet of thousands costs one
// page of rows and one small answer per look. Uses dashboard.js's helpers (h, api,
// timeEl, backendTag, ...); same rules: API strings reach the DOM as text only.
"use strict";

const POD_FILTERS = ["cluster", "backend", "source", "engine", "gpu", "stage", "q"];
const SEARCH_DEBOUNCE_MS = 300;

const pods = {
  // The cursor that starts each page seen so far: [null, c1, c2, ...]. "Previous" pops,
  // "Next" pushes the answer's next_cursor; any filter change starts again at [null].
  cursors: [null],
  limit: 100, // rows per page (the service takes 1-500)
  next: null,
  items: [],
  total: null, // pods the filters keep (facets), null while unknown (a search is on)
  facets: null,
  seq: 0, // answers to older requests are dropped
  searchTimer: null,
};

/** The filters as the form holds them (empty: no condition). */
function podFilters() {
  const f = {};
  for (const name of POD_FILTERS) f[name] = $(`pf-${name}`).value.trim();
  return f;
}

function podQuery(f, extra = {}) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries({ ...f, ...extra })) {
    if (v !== "" && v !== null && v !== undefined) params.set(k, String(v));
  }
  return params.toString();
}

/** Filters changed: back to the first page. */
function resetPaging() {
  pods.cursors = [null];
  pods.next = null;
}

/** Signed out: no pod of the old session stays on the page. */
function resetPods() {
  pods.seq += 1;
  resetPaging();
  pods.items = [];
  pods.total = null;
  pods.facets = null;
  for (const name of POD_FILTERS) $(`pf-${name}`).value = "";
  for (const name of ["cluster", "backend", "source", "engine", "gpu", "stage"]) {
    const select = $(`pf-${name}`);
    select.replaceChildren(select.options[0]);
  }
  $("pods-table").replaceChildren();
  closePodDrawer(); // layout.js: no pod of the old session stays open either
  $("pods-range").textContent = "";
  $("pods-count").textContent = "";
  $("pods-prev").disabled = true;
  $("pods-next").disabled = true;
}

/** The current page again (the auto-refresh and after an action): same cursor. */
function refreshPods() {
  return loadPods({ quiet: true });
}

async function loadPods({ quiet = false } = {}) {
  if (!state.token) return;
  const seq = ++pods.seq;
  const f = podFilters();
  const cursor = pods.cursors[pods.cursors.length - 1];
  if (!quiet) $("pods-table").setAttribute("aria-busy", "true");
  let page;
  let facets;
  try {
    [page, facets] = await Promise.all([
      api(`/v1/pods?${podQuery(f, { limit: pods.limit, cursor })}`),
      loadFacets(f),
    ]);
  } catch (err) {
    if (seq !== pods.seq) return;
    $("pods-table").removeAttribute("aria-busy");
    if (err.status === 404) { // a service without the live-fleet reads
      $("pods-table").replaceChildren(notAvailable("The pod list is", "/v1/pods"));
      return;
    }
    if (err.status === 422) { // a search the service refuses: say so where it was typed
      $("pods-table").replaceChildren(
        h("p", { class: "error-text" }, `Invalid filter: ${err.message}`));
      return;
    }
    throw err;
  }
  if (seq !== pods.seq) return; // a newer filter or page was asked for meanwhile
  $("pods-table").removeAttribute("aria-busy");
  const items = page.items || [];
  // The auto-refresh finds the same page most of the time: leave the rows (and where
  // the reader scrolled to) alone then; the ticker keeps their times current.
  const same = quiet && JSON.stringify(items) === JSON.stringify(pods.items);
  pods.items = items;
  pods.next = page.next_cursor || null;
  pods.facets = facets;
  pods.total = facets && !f.q ? facets.pods : null;
  fillFilterChoices(facets);
  renderPods(f, { rows: !same, keepScroll: quiet });
}

/** The facets for these filters, or null on a service without them (the table works,
 *  with fewer choices and no total). */
async function loadFacets(f) {
  const { q, ...rest } = f; // facets count without the search: it is a prefix scan
  return apiIfServed(`/v1/pods/facets?${podQuery(rest)}`);
}

/** Fill a filter's select with ``values`` ([name, label]), keeping what is chosen even
 *  when it left the fleet (so the filter stays visible, with no pod). */
function fillSelect(id, values, anyLabel) {
  const select = $(id);
  const chosen = select.value;
  const options = [h("option", { value: "" }, anyLabel)];
  const names = new Set();
  for (const [value, label] of values) {
    names.add(value);
    options.push(h("option", { value }, label));
  }
  if (chosen && !names.has(chosen)) {
    options.push(h("option", { value: chosen }, `${chosen} (none now)`));
  }
  select.replaceChildren(...options);
  select.value = chosen;
}

function facetChoices(list) {
  return (list || []).map((f) => [f.name, `${f.name} (${fmtCount(f.pods)})`]);
}

function fillFilterChoices(facets) {
  if (!facets) return;
  fillSelect("pf-cluster", facetChoices(facets.clusters), "every cluster");
  const counts = Object.fromEntries((facets.backends || []).map((b) => [b.name, b.pods]));
  fillSelect("pf-backend",
    orderBackends([...new Set([...knownBackends(), ...Object.keys(counts)])])
      .map((b) => [b, `${b} (${fmtCount(counts[b] || 0)})`]), "any");
  fillSelect("pf-source", facetChoices(facets.sources), "any");
  fillSelect("pf-engine", facetChoices(facets.engines), "any");
  fillSelect("pf-gpu", facetChoices(facets.gpus), "any");
  syncStageFilter();
}

/** "In stage of": the scopes whose rollout is active and partial (the service lists
 *  no stage for others), from the override list. */
function syncStageFilter() {
  const staged = (state.overrides || [])
    .filter((o) => o.rollout && o.rollout.state === "active" && o.rollout.percent < 100)
    .map((o) => [o.cluster, `${scopeText(o.cluster)} (${o.rollout.percent} %)`]);
  fillSelect("pf-stage", staged, "any pod");
}

function renderPods(f, { rows = true, keepScroll = false } = {}) {
  const first = (pods.cursors.length - 1) * pods.limit + 1;
  const last = first + pods.items.length - 1;
  const filtered = POD_FILTERS.some((k) => f[k]);
  const box = $("pods-table");
  box.setAttribute("data-filtered", String(filtered));
  if (!pods.items.length) {
    box.replaceChildren(h("p", { class: "empty-inline", id: "pods-empty" },
      filtered ? "No pod matches these filters."
        : "No pod runs now: pods appear once they call POST /v1/select."));
  } else if (rows) {
    const wrap = box.querySelector(".pods-wrap");
    // a refresh keeps the reader's place; a new page or filter starts at the top
    const scrolled = wrap && keepScroll ? wrap.scrollTop : 0;
    box.replaceChildren(podTable(pods.items));
    const fresh = box.querySelector(".pods-wrap");
    fitWholeRows(fresh);
    fresh.scrollTop = scrolled;
  }
  const range = $("pods-range");
  // A search has no total (it is a prefix scan, not counted): say more follow, not "of more".
  const of = pods.total !== null ? ` of ${fmtCount(pods.total)}`
    : pods.next ? " · more on the next page" : "";
  range.textContent = pods.items.length
    ? `${fmtCount(first)}–${fmtCount(last)}${of}`
    : "";
  range.setAttribute("data-first", pods.items.length ? first : 0);
  range.setAttribute("data-last", pods.items.length ? last : 0);
  range.setAttribute("data-total", pods.total ?? "");
  $("pods-count").textContent = pods.total !== null
    ? `${fmtCount(pods.total)} pod${pods.total === 1 ? "" : "s"}` : "";
  $("pods-prev").disabled = pods.cursors.length <= 1;
  $("pods-next").disabled = !pods.next;
}

/** The scroll box ends on a row's edge, within the stylesheet's height: a row cut in two
 *  at its bottom reads as a broken table. Measured once the rows are laid out (a CSSOM
 *  height, which the CSP allows, unlike a style attribute). */
function fitWholeRows(wrap) {
  if (!wrap) return;
  wrap.style.maxHeight = "";
  if (wrap.scrollHeight <= wrap.clientHeight) return; // every row shows
  const box = wrap.getBoundingClientRect();
  const shown = wrap.clientTop + wrap.clientHeight; // above a horizontal scrollbar, if any
  const below = wrap.offsetHeight - shown; // the lower border and that scrollbar
  let fits = 0;
  for (const row of wrap.querySelectorAll("tbody tr")) {
    const bottom = row.getBoundingClientRect().bottom - box.top + wrap.scrollTop;
    if (bottom > shown) break;
    fits = bottom;
  }
  if (fits > 0) wrap.style.maxHeight = `${Math.ceil(fits + below)}px`;
}

/** Two-line cells (pod over node, GPU over capability, ...) keep the table narrow; the
 *  backend comes right after the pod, and narrow screens drop other columns first. */
function podTable(items) {
  // Fixed column widths (the stylesheet's colgroup): a long GPU name ends in an ellipsis
  // with the whole text on hover instead of squeezing the pod column; the pod's own name
  // wraps in its column (its end tells pods apart).
  const stacked = (main, sub, mono, wrap) =>
    [h("div", { class: `${wrap ? "wrap-any" : "clip"}${mono ? " mono" : ""}`, title: main },
      main),
      h("div", { class: "sub clip", title: sub }, sub)];
  const rows = items.map((p) => {
    const device = p.device || {};
    const engine = p.engine;
    const row = h("tr", { "data-pod": p.pod, "data-cluster": p.cluster, "data-node": p.node,
      "data-backend": p.backend, "data-decision": p.decision_id, class: "pod-row" },
    h("td", { class: "col-pod" }, stacked(p.pod, `node ${p.node}`, true, true)),
    h("td", { class: "col-backend" },
      h("div", {}, backendTag(p.backend)), h("div", { class: "sub" }, p.source)),
    h("td", { class: "col-cluster mono clip", title: p.cluster }, p.cluster),
    h("td", { class: "col-device" }, stacked(device.name || "—", capText(device))),
    h("td", { class: "col-engine" }, engine
      ? stacked(engine.name, engine.version || "")
      : h("span", { class: "muted",
        title: "The pod named no serving engine: it runs our own kernels" }, "own kernels")),
    h("td", { class: "col-stage" }, (p.in_stage || []).map((scope) =>
      h("span", { class: "pill pill-stage",
        title: `In the stage of ${scopeText(scope)}'s rollout` }, scopeText(scope)))),
    h("td", { class: "col-time" }, timeEl(p.last_seen)),
    h("td", { class: "actions" }, h("button", { type: "button", class: "btn btn-small",
      "aria-label": `Decision detail for pod ${p.pod}`,
      "data-pod": p.pod, "aria-haspopup": "dialog",
      onclick: (ev) => { ev.stopPropagation(); openPodDetail(p, ev.currentTarget); } },
    "Detail")));
    // The whole row opens the detail (the button is there for keyboards).
    row.addEventListener("click", () => openPodDetail(p, row.querySelector(".actions button")));
    return row;
  });
  const heads = [["Pod", "col-pod"], ["Backend", "col-backend"], ["Cluster", "col-cluster"],
    ["GPU", "col-device"], ["Engine", "col-engine"], ["Stage", "col-stage"],
    ["Seen", "col-time"], ["", "col-actions"]];
  return h("div", { class: "table-wrap pods-wrap" },
    h("table", { class: "table pods-table", id: "pods" },
      h("colgroup", {}, heads.map(([, c]) => h("col", { class: c }))),
      h("thead", {}, h("tr", {}, heads.map(([t, c]) => h("th", { scope: "col", class: c },
        t || h("span", { class: "sr-only" }, "Actions"))))),
      h("tbody", {}, rows)));
}

/** A row's decision in the drawer beside the table (the page stays where it was). */
function openPodDetail(p, opener) {
  openPodDrawer(opener);
  showDecisionById(p.decision_id, p);
}

/** The fleet chart's cluster rows land here: the table filtered to that cluster. */
function filterPodsByCluster(cluster) {
  const select = $("pf-cluster");
  if (![...select.options].some((o) => o.value === cluster)) {
    select.append(h("option", { value: cluster }, cluster));
  }
  select.value = cluster;
  resetPaging();
  loadPods().catch(podsFailed);
  $("pods-card").scrollIntoView({ behavior: "smooth", block: "start" });
}

function podsFailed(err) {
  if (handleAuthError(err)) return;
  $("pods-table").replaceChildren(h("p", { class: "error-text" }, describeFailure(err)));
}

function initPods() {
  for (const name of ["cluster", "backend", "source", "engine", "gpu", "stage"]) {
    $(`pf-${name}`).addEventListener("change", () => {
      resetPaging();
      loadPods().catch(podsFailed);
    });
  }
  // Typing searches after a pause, not per key: each search is a request.
  $("pf-q").addEventListener("input", () => {
    clearTimeout(pods.searchTimer);
    pods.searchTimer = setTimeout(() => {
      resetPaging();
      loadPods().catch(podsFailed);
    }, SEARCH_DEBOUNCE_MS);
  });
  $("pods-filters").addEventListener("submit", (ev) => ev.preventDefault());
  $("pf-clear").addEventListener("click", () => {
    for (const name of POD_FILTERS) $(`pf-${name}`).value = "";
    resetPaging();
    loadPods().catch(podsFailed);
  });
  $("pods-next").addEventListener("click", () => {
    if (!pods.next) return;
    pods.cursors.push(pods.next);
    loadPods().catch(podsFailed);
  });
  // A new page size starts again at the first page: cursors stay, offsets would not.
  $("pods-limit").addEventListener("change", (ev) => {
    pods.limit = Number(ev.target.value) || 100;
    resetPaging();
    loadPods().catch(podsFailed);
  });
  $("pods-prev").addEventListener("click", () => {
    if (pods.cursors.length <= 1) return;
    pods.cursors.pop();
    loadPods().catch(podsFailed);
  });
  $("pods-prev").disabled = true;
  $("pods-next").disabled = true;
  // A new width wraps cells differently: the box ends on a row's edge again.
  let resizing = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => fitWholeRows($("pods-table").querySelector(".pods-wrap")), 150);
  });
}
