// MLA Switchboard dashboard: plain ES2020, no build step, no dependencies. This file
// holds the session, the API access and the read panels; pods.js the server-paged pod
// table; console.js the controls an admin token gets (override editor, rollout steering,
// clearing failures). They are classic scripts sharing one global scope, run in that
// order (defer), and init() runs once all three are in.
//
// Security rules this file keeps (the page runs under a strict CSP):
//  - every string from the API reaches the DOM as a text node or an attribute value,
//    never through innerHTML, so pod names like "<script>" stay text;
//  - no inline handlers or inline styles: listeners are attached here, colours come
//    from CSS classes;
//  - the token lives in sessionStorage (this tab only) and goes out only as a Bearer
//    header to this origin.
"use strict";

const REFRESH_MS = 10_000;
const TOKEN_KEY = "switchboard.viewerToken";
// A person signed in through the identity provider: no token in the page, the session
// is an HttpOnly cookie, and writes carry the session's CSRF token in a header.
const SESSION = "(signed-in session)";
const SVG_NS = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- DOM helpers

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    // Strings become text nodes: this is what keeps API data from being parsed as HTML.
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  return el;
}

/** h("td", {class: "x"}, "text", child...) -> an HTML element. */
function h(tag, attrs, ...children) {
  return append(setAttrs(document.createElement(tag), attrs), children);
}

/** Same for SVG elements (they need the SVG namespace). */
function s(tag, attrs, ...children) {
  return append(setAttrs(document.createElementNS(SVG_NS, tag), attrs), children);
}

// ---------------------------------------------------------------- backends
// The backends, their order and colours come from GET /v1/backends (the service's
// registry): this file names none, so a new backend needs no edit here.

/** The known backends' names, in the registry's display order. */
function knownBackends() {
  return state.backends.map((b) => b.name);
}

/** The CSS class of a backend's palette slot; unknown backends get none, and the
 *  stylesheet's fallback colour. */
function backendClass(name) {
  const known = state.backends.find((b) => b.name === name);
  return known ? `bc-${known.colour}` : "";
}

/** ``names`` with the known backends first, in display order, then any others sorted. */
function orderBackends(names) {
  const known = knownBackends();
  const others = names.filter((b) => !known.includes(b)).sort();
  return [...known.filter((b) => names.includes(b)), ...others];
}

function swatch(name) {
  return h("span", { class: `swatch ${backendClass(name)}`.trim(), "aria-hidden": "true" });
}

function backendTag(name) {
  return h("span", { class: "backend-tag" }, swatch(name), name);
}

// ---------------------------------------------------------------- time helpers

/** Parse API timestamps: microsecond fractions and zone-less ISO strings (read as UTC). */
function parseTime(iso) {
  if (!iso) return null;
  let text = String(iso).replace(/(\.\d{3})\d+/, "$1");
  if (!/(Z|[+-]\d\d:?\d\d)$/.test(text)) text += "Z";
  const t = Date.parse(text);
  return Number.isNaN(t) ? null : t;
}

/** A duration as a person says it: "45 s", "23 min", "2 h 5 min", "3 d". */
function span(ms) {
  const secs = Math.round(Math.abs(ms) / 1000);
  if (secs < 60) return `${secs} s`;
  const mins = Math.round(secs / 60);
  if (mins < 60) return `${mins} min`;
  const hours = Math.floor(mins / 60);
  const rest = mins % 60;
  if (hours < 24) return hours < 6 && rest ? `${hours} h ${rest} min` : `${hours} h`;
  return `${Math.round(hours / 24)} d`;
}

/** The absolute time every hover shows: UTC, the same for every reader, whatever the
 *  browser's zone ("2026-12-01 04:03:04 UTC"). */
function utcText(iso) {
  const t = parseTime(iso);
  if (t === null) return String(iso ?? "");
  return new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** From now, as a person says it: "3 min ago", "in 2 h", "just now". */
function relative(iso, now = Date.now()) {
  const t = parseTime(iso);
  if (t === null) return "at an unknown time";
  const d = t - now;
  if (Math.abs(d) < 1000) return "just now";
  return d > 0 ? `in ${span(d)}` : `${span(d)} ago`;
}

/** The one way the page shows a time: relative text (after ``prefix``), the UTC time on
 *  hover, the instant in ``datetime``. tickTimes() keeps the text current. */
function timeEl(iso, prefix = "") {
  return h("time", { class: "rel", datetime: iso, title: utcText(iso), "data-prefix": prefix },
    prefix + relative(iso));
}

/** Relative times go stale as the page sits open: rewrite them from their datetime. */
function tickTimes() {
  const now = Date.now();
  for (const el of document.querySelectorAll("time.rel")) {
    el.textContent = (el.dataset.prefix || "") + relative(el.getAttribute("datetime"), now);
  }
}

// ---------------------------------------------------------------- API access

class ApiError extends Error {
  constructor(status, message, path) {
    super(message);
    this.status = status; // 0: the request never got an answer
    this.path = path;
  }
}

/** An answer to a request sent with a token that has since been signed out. */
class StaleError extends Error {}

/** The requests made with the page's current credentials, aborted when they end
 *  (``signOut``): a request still on its way when the session is ended would be answered
 *  401, which the browser reports as an error whatever the page does with it. */
let sessionRequests = new AbortController();

/** The signal of the current credentials' requests (a new one after a sign-out). */
function sessionSignal() {
  if (sessionRequests.signal.aborted) sessionRequests = new AbortController();
  return sessionRequests.signal;
}

const state = {
  token: null, // a bearer token, or SESSION
  csrf: null, // {header, token}: what a session's writes carry (GET /auth/session)
  backends: [], // GET /v1/backends: {name, order, colour, ...} in display order
  summary: null, // last good summary, kept across failed refreshes
  activeOverrides: null,
  excludedClusters: 0,
  overrides: [], // the last override list, for the rollouts panel's effects
  timer: null,
  inflight: null,
  inflightToken: null,
  lastUpdated: null,
  lookupSeq: 0,
  me: null, // GET /v1/whoami: {name, role, clusters, may_edit_fleet}; decides the controls
  situations: [], // measurement situations with failure reports (GET /v1/measurements/summary)
  noticeTimer: null,
  fleetFilter: "", // kept across refreshes, like the sort
  fleetSort: "name", // "name" or "pods"
};

// The last answer and ETag of each polled path: a poll sends If-None-Match, and a
// 304 (nothing changed) reuses the body without the service recomputing anything.
// ``seq`` orders the requests: two reads of one path overlap (the live counts' read
// and a refresh), and an answer to an earlier one may arrive after a later one's.
const etags = new Map();
let requestSeq = 0;

/** A token goes as a Bearer header; a session's cookie goes by itself, and its writes
 *  carry the CSRF token (a cross-site page can neither read it nor set the header). */
function authHeaders(token, write) {
  if (token !== SESSION) return { Authorization: `Bearer ${token}`, Accept: "application/json" };
  const headers = { Accept: "application/json" };
  if (write && state.csrf) headers[state.csrf.header] = state.csrf.token;
  return headers;
}

/** Why a 401 ended the page's session, as the person reads it. */
function rejectedMessage() {
  return state.token === SESSION
    ? "Your session expired or was signed out; sign in again."
    : "Token rejected: the service does not know this token (or it was revoked).";
}

async function api(path) {
  const token = state.token;
  if (!token) throw new StaleError(); // signed out: a request now could only be refused
  const seq = ++requestSeq;
  const kept = etags.get(path);
  const headers = authHeaders(token, false);
  if (kept && kept.token === token && kept.etag) headers["If-None-Match"] = kept.etag;
  let res;
  try {
    res = await timedFetch(path, { headers, cache: "no-store" }, READ_LIMIT_MS, sessionSignal()); // live.js
  } catch (err) {
    if (err.timeout || err instanceof StaleError) throw err;
    throw new ApiError(0, "the service cannot be reached", path);
  }
  // Signed out (or in as someone else) meanwhile: nothing from this answer may show.
  if (state.token !== token) throw new StaleError();
  if (res.status === 304 && kept) return newestAnswer(path, token, seq, kept.body);
  if (res.ok) {
    const body = await res.json();
    if (state.token !== token) throw new StaleError();
    const newest = newestAnswer(path, token, seq, body);
    if (newest === body) etags.set(path, { etag: res.headers.get("ETag"), body, token, seq });
    return newest;
  }
  let message = `${res.status} ${res.statusText}`;
  try {
    const body = await res.json();
    const detail = body && body.detail;
    if (typeof detail === "string") message = detail;
    else if (detail && typeof detail.message === "string") message = detail.message;
  } catch (err) {
    // not JSON: keep the status line
  }
  throw new ApiError(res.status, message, path);
}

/** ``body``, the answer to request ``seq`` of ``path``, unless a later request's answer
 *  came in first: then that one, so an older answer never replaces what a newer one
 *  showed (a page that drew the booted pods must not go back to before they booted). */
function newestAnswer(path, token, seq, body) {
  const newest = etags.get(path);
  return newest && newest.token === token && newest.seq > seq ? newest.body : body;
}

/** ``path``'s answer, or null when this server does not have the endpoint (it answers
 *  404: an older service), so that its panel can say so and the rest still shows. Other
 *  errors are thrown to refreshAll: auth errors sign out, others show the banner. */
async function apiIfServed(path) {
  try {
    return await api(path);
  } catch (err) {
    if (err.status === 404) return null;
    throw err;
  }
}

/** Why the service refused, in one line: its message, or each 422 problem with its field
 *  ("rollout.percent: Input should be less than or equal to 100"). */
function problemText(status, body) {
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (detail && typeof detail.message === "string") return detail.message;
  if (Array.isArray(detail)) {
    return detail.map((d) => {
      const loc = (Array.isArray(d.loc) ? d.loc : []).filter((part, i) =>
        !(i === 0 && ["body", "query", "header", "path"].includes(part)));
      return loc.length ? `${loc.join(".")}: ${d.msg}` : String(d.msg ?? "");
    }).join("; ");
  }
  return `the service answered ${status}`;
}

/** A write, or a read that must not come from the ETag cache (the ETag an edit starts
 *  from): every status goes back to the caller, which shows a 412, 409 or 422 where the
 *  user acted. Only a 401 ends the session; a 403 here is a refused write, not a
 *  session without the viewer role. */
async function send(method, path, { body, ifMatch, key } = {}) {
  const token = state.token;
  if (!token) throw new StaleError(); // signed out: a request now could only be refused
  const headers = authHeaders(token, true);
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (ifMatch) headers["If-Match"] = ifMatch;
  if (key) headers["Idempotency-Key"] = key;
  let res;
  try {
    res = await timedFetch(path, {
      method, headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    }, method === "GET" ? READ_LIMIT_MS : WRITE_LIMIT_MS, sessionSignal()); // live.js
  } catch (err) {
    if (err.timeout || err instanceof StaleError) throw err;
    throw new ApiError(0, "the service cannot be reached", path);
  }
  if (state.token !== token) throw new StaleError();
  let data = null;
  try {
    data = await res.json();
  } catch (err) {
    // no body, or not JSON
  }
  if (state.token !== token) throw new StaleError();
  if (res.status === 401) {
    signOut(rejectedMessage());
    throw new StaleError();
  }
  return { status: res.status, ok: res.ok, body: data, etag: res.headers.get("ETag"),
    message: res.ok ? "" : problemText(res.status, data) };
}

/** A fresh Idempotency-Key per user action: a double click or a retry of the same
 *  action then applies once. randomUUID needs a secure context; plain http to a
 *  service by name is not one, so build a v4 UUID from getRandomValues there. */
function newKey() {
  if (typeof crypto.randomUUID === "function") return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const x = [...b].map((v) => v.toString(16).padStart(2, "0")).join("");
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}

// ---------------------------------------------------------------- who is signed in

/** Admin tokens may write; one limited to cluster globs only those clusters, never *. */
function isAdmin() {
  return Boolean(state.me && state.me.role === "admin");
}

/** A token glob as the service reads it: * and ? over cluster names. */
function globMatch(glob, name) {
  const re = String(glob).replace(/[.+^${}()|[\]\\-]/g, "\\$&")
    .replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp(`^${re}$`).test(name);
}

/** Whether this token may change ``scope``'s override (the service decides again). */
function mayTouch(scope) {
  if (!isAdmin()) return false;
  if (scope === "*") return Boolean(state.me.may_edit_fleet);
  const globs = state.me.clusters;
  return globs === null || globs === undefined || globs.some((g) => globMatch(g, scope));
}

function mayEditFleet() {
  return isAdmin() && Boolean(state.me.may_edit_fleet);
}

async function loadMe() {
  try {
    state.me = await api("/v1/whoami");
  } catch (err) {
    if (err.status !== 404) throw err;
    // A service without whoami: read-only, as for a viewer (its writes would check anyway).
    state.me = { name: "", role: "viewer", clusters: null, may_edit_fleet: false };
    $("whoami").textContent = "";
    return;
  }
  const me = state.me;
  const scope = me.clusters ? ` · ${me.clusters.join(", ")}` : "";
  const el = $("whoami");
  el.textContent = `${me.name} (${me.role}${scope})`;
  el.setAttribute("data-role", me.role);
  el.title = me.role === "admin"
    ? (me.may_edit_fleet ? "Admin: every cluster and the whole fleet"
      : "Admin of the clusters listed: their overrides only")
    : "Viewer: the page shows no controls";
}

// ---------------------------------------------------------------- notices

/** What an action did, shown until the next one (or 20 s); ``content`` is text, or
 *  text and nodes (describeFailure's times). */
function notice(content, kind = "ok") {
  const el = $("notice");
  el.className = `notice notice-${kind}`;
  el.replaceChildren(...[content].flat());
  el.hidden = false;
  clearTimeout(state.noticeTimer);
  state.noticeTimer = setTimeout(() => { el.hidden = true; }, 20_000);
}

/** 401/403 end the session: back to the token form with the reason. */
function handleAuthError(err) {
  if (err instanceof StaleError) return true; // nothing to say: the session is gone
  if (!(err instanceof ApiError)) return false;
  if (err.status === 401) {
    signOut(rejectedMessage());
    return true;
  }
  if (err.status === 403) {
    signOut("This token lacks the viewer role.");
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- banner

function showBanner(content, kind = "error") {
  const banner = $("banner");
  banner.className = `banner banner-${kind}`;
  banner.replaceChildren(...[content].flat());
  banner.hidden = false;
}

function hideBanner() {
  $("banner").hidden = true;
}

/** A failed request as a person reads it, and since when the page shows older data (in
 *  the page's one time format): text and a <time>, for h(), notice() or showBanner(). */
function describeFailure(err) {
  const since = state.lastUpdated
    ? [" Showing data loaded ", timeEl(state.lastUpdated.toISOString()), "."] : [];
  if (err.timeout) return slowFailure(since); // live.js
  if (err.status === 0) {
    return ["Cannot reach the service.", ...since, ` Retrying every ${REFRESH_MS / 1000} s.`];
  }
  return [`The service answered ${err.status} on ${err.path}: ${err.message}.`, ...since];
}

// ---------------------------------------------------------------- session

function showSignin(message) {
  $("app").hidden = true;
  $("session").hidden = true;
  $("signin").hidden = false;
  hideBanner();
  $("signin-error").textContent = message || "";
  const input = $("token-input");
  input.value = "";
  input.setAttribute("aria-invalid", message ? "true" : "false");
  // with an identity provider, signing in through it is the way most people take
  const provider = $("oidc-signin");
  (provider.hidden ? input : provider).focus();
}

/** After signing in, the form that held the focus is gone: the focus goes to the first
 *  skip link, so that the next Tab starts at the top of the page (the skip links, then
 *  the console) as after a reload, not on the page body past them. */
function focusFirstStop() {
  const first = document.querySelector(".skip-links a");
  if (first) first.focus();
  else $("app").focus();
}

function showApp() {
  $("signin").hidden = true;
  $("app").hidden = false;
  $("session").hidden = false;
}

function signOut(message) {
  sessionRequests.abort(); // before the session ends: none of them is answered 401
  let ended = Promise.resolve();
  if (state.token === SESSION) {
    // the row goes on the service (every replica), the cookie in this browser
    // with the CSRF header like any write: another site cannot sign a person out
    const headers = state.csrf ? { [state.csrf.header]: state.csrf.token } : {};
    const logout = fetch("/auth/logout", { method: "POST", cache: "no-store", headers })
      .catch(() => null);
    // the sign-in card once the service has ended the session (at most 3 s): a reload
    // before that would find the session still open and start the console on it
    ended = Promise.race([logout, new Promise((done) => setTimeout(done, 3000))]);
  }
  state.csrf = null;
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  etags.clear();
  state.summary = null;
  state.backends = [];
  state.activeOverrides = null;
  state.overrides = [];
  state.lastUpdated = null;
  state.lookupSeq += 1; // drop answers still in flight
  state.me = null;
  state.situations = [];
  clearInterval(state.timer);
  state.timer = null;
  stopLive(); // live.js
  closeDialog(); // a half-made change must not outlive the token that was making it
  resetPods();
  // Data read with a token that is now gone must not stay in the page.
  for (const id of ["chart", "legend", "fleet-kpis", "detail", "overrides", "whoami",
    "audit", "overrides-count", "audit-count", "cluster-names", "rollouts", "rollouts-count",
    "excluded", "excluded-count", "regret", "refused", "refused-count", "situations",
    "overrides-tools", "notice"]) {
    $(id).replaceChildren();
  }
  $("notice").hidden = true;
  $("rollouts-card").hidden = true;
  $("excluded-card").hidden = true;
  $("refused-card").hidden = true;
  renderUpdated();
  ended.then(() => {
    if (!state.token) showSignin(message);
  });
}

async function signIn(event) {
  event.preventDefault();
  const token = $("token-input").value.trim();
  if (!token) return;
  // HTTP headers carry printable ASCII only; fetch would throw on anything else.
  if (!/^[\x21-\x7e]+$/.test(token)) {
    $("signin-error").textContent = "A token is printable ASCII without spaces.";
    return;
  }
  const button = event.submitter || $("signin-form").querySelector("button");
  button.disabled = true;
  state.token = token;
  try {
    // Check the token before showing anything, so a bad one stays on this form. The
    // backend list comes along (a failure there shows on the next refresh).
    const backends = loadBackends().catch(() => null);
    const summary = await api("/v1/selections/summary");
    await backends;
    await loadMe().catch(() => null); // no controls until the service says what it may do
    sessionStorage.setItem(TOKEN_KEY, token);
    start(summary);
    focusFirstStop();
  } catch (err) {
    state.token = null;
    if (!handleAuthError(err)) {
      $("signin-error").textContent = err.status === 0
        ? "Cannot reach the service; try again."
        : `The service answered ${err.status}: ${err.message}`;
    }
  } finally {
    button.disabled = false;
  }
}

function start(summary) {
  showApp();
  if (summary) {
    state.summary = summary;
    state.lastUpdated = new Date();
    renderSummary();
  }
  refreshAll();
  startLive(); // live.js: changes as they happen
  clearInterval(state.timer);
  state.timer = setInterval(() => {
    // Hidden tabs skip their turn; becoming visible refreshes at once (see below). A
    // live stream tells every change: the poll is then only a rare safety net.
    if (!document.hidden && !liveSaysFresh()) refreshAll();
  }, REFRESH_MS);
}

// ---------------------------------------------------------------- refresh

/** Reload the three periodic panels; one refresh at a time. */
function refreshAll() {
  if (!state.token) return Promise.resolve();
  // One refresh at a time, unless the running one belongs to a signed-out token.
  if (state.inflight && state.inflightToken === state.token) return state.inflight;
  state.inflightToken = state.token;
  const run = (async () => {
    // The backend list first, once: every panel's colours and order come from it.
    const first = await Promise.allSettled([
      ...(state.backends.length ? [] : [loadBackends()]),
      ...(state.me ? [] : [loadMe()]),
    ]);
    const rest = await Promise.allSettled([loadSummary(), loadOverrides(), loadAudit(),
      loadRefusals(), loadSituations(), refreshPods(), loadDrift()]);
    const results = [...first, ...rest];
    const failures = results.filter((r) => r.status === "rejected").map((r) => r.reason);
    for (const err of failures) {
      if (handleAuthError(err)) return;
    }
    if (failures.length) {
      showBanner(describeFailure(failures[0]));
    } else {
      hideBanner();
    }
    renderUpdated();
  })().finally(() => {
    if (state.inflight === run) state.inflight = null;
  });
  state.inflight = run;
  return run;
}

/** A refresh that reads after now (the Refresh button): one in flight may have read
 *  before the change its user expects to see, so wait for it and read again. */
async function refreshAnew() {
  if (state.inflight) await state.inflight.catch(() => null);
  return refreshAll();
}

function renderUpdated() {
  const el = $("last-updated");
  if (state.lastUpdated) {
    el.replaceChildren("Last updated ", timeEl(state.lastUpdated.toISOString()),
      ...freshnessNote()); // live.js
  } else {
    el.textContent = "not loaded yet";
  }
  el.setAttribute("data-updated", state.lastUpdated ? state.lastUpdated.toISOString() : "");
}

async function loadBackends() {
  const doc = await api("/v1/backends");
  state.backends = [...doc.backends].sort((a, b) => a.order - b.order);
  if (state.summary) renderSummary();
}

async function loadSummary() {
  state.summary = await api("/v1/selections/summary");
  state.lastUpdated = new Date();
  renderSummary();
}

// ---------------------------------------------------------------- fleet chart

function totals(clusters) {
  const fleet = {};
  for (const counts of Object.values(clusters)) {
    for (const [backend, pods] of Object.entries(counts)) {
      fleet[backend] = (fleet[backend] || 0) + pods;
    }
  }
  return fleet;
}

/** Known backends in their fixed order, then any others the API reports. */
function backendOrder(fleet) {
  return orderBackends([...new Set([...knownBackends(), ...Object.keys(fleet)])]);
}

function renderSummary() {
  const clusters = (state.summary && state.summary.clusters) || {};
  const fleet = totals(clusters);
  const order = backendOrder(fleet);
  const pods = Object.values(fleet).reduce((a, b) => a + b, 0);
  const names = Object.keys(clusters).sort();

  renderKpis(pods, names.length);

  $("legend").replaceChildren(
    ...order
      .filter((b) => knownBackends().includes(b) || fleet[b])
      .map((b) =>
        h(
          "li",
          { class: fleet[b] ? "" : "unused", "data-backend": b },
          swatch(b),
          h("span", { class: "legend-name" }, b),
          h("span", { class: "legend-count" }, fmtCount(fleet[b] || 0)),
        ),
      ),
  );

  $("cluster-names").replaceChildren(...names.map((n) => h("option", { value: n })));
  renderChart();
  renderRegret((state.summary && state.summary.regret) || {});
  renderExcluded((state.summary && state.summary.excluded) || {});
  renderRollouts();
}

/** The chart for the clusters the filter keeps, in the chosen order. With hundreds of
 *  clusters one alphabetical list hides the big ones; sorting by pods shows them first. */
function renderChart() {
  const clusters = (state.summary && state.summary.clusters) || {};
  const order = backendOrder(totals(clusters));
  const all = Object.keys(clusters).sort();
  const needle = state.fleetFilter.trim().toLowerCase();
  const shown = needle ? all.filter((n) => n.toLowerCase().includes(needle)) : all;
  if (state.fleetSort === "pods") {
    const pods = (n) => Object.values(clusters[n]).reduce((a, b) => a + b, 0);
    shown.sort((a, b) => pods(b) - pods(a) || (a < b ? -1 : a > b ? 1 : 0));
  }
  $("fleet-count").textContent = needle
    ? `${shown.length} of ${plural(all.length, "cluster")}`
    : plural(all.length, "cluster");
  if (all.length && !shown.length) {
    $("chart").replaceChildren(
      h("div", { class: "empty", id: "chart-empty" },
        h("strong", {}, `No cluster matches “${state.fleetFilter.trim()}”.`),
        h("span", {}, "Clear the filter to see every cluster.")),
    );
    return;
  }
  drawChart(clusters, shown, order);
}

/** Regret per cluster: only clusters whose pods have measured evidence. */
function renderRegret(regret) {
  const rows = Object.entries(regret)
    .filter(([, r]) => r.pods_measured > 0)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (rows.length === 0) {
    $("regret").replaceChildren(
      h("p", { class: "empty" }, "No measured evidence yet: pods report it with ",
        h("code", {}, "switchboard bench"), "."),
    );
    return;
  }
  // A share measured on a handful of a cluster's pods is not the cluster's loss: below
  // SMALL_SAMPLE of its pods (or under 10 pods) it is shown neutral, with the sample.
  const clusters = (state.summary && state.summary.clusters) || {};
  const podsIn = (c) => Object.values(clusters[c] || {}).reduce((a, b) => a + b, 0);
  const alternatives = (r) =>
    Object.entries(r.best_alternatives || {})
      .map(([b, n]) => `${b} (${n})`)
      .join(", ") || "–";
  $("regret").replaceChildren(
    h(
      "table",
      { class: "regret-table" },
      h("thead", {}, h("tr", {},
        h("th", { scope: "col" }, "Cluster"),
        h("th", { scope: "col", class: "num" }, "Lost"),
        h("th", { scope: "col", class: "num" }, "On best"),
        h("th", { scope: "col" }, "Faster choice"))),
      h(
        "tbody",
        {},
        ...rows.map(([cluster, r]) =>
          h(
            "tr",
            { "data-cluster": cluster, "data-lost": String(r.throughput_lost_pct) },
            h("th", { scope: "row" }, cluster),
            regretCell(r, Math.max(podsIn(cluster), r.pods_measured)),
            h("td", { class: "num" }, `${fmtCount(r.pods_on_best)}/${fmtCount(r.pods_measured)}`),
            h("td", {}, alternatives(r)),
          ),
        ),
      ),
    ),
  );
}

const SMALL_SAMPLE = 0.2;

/** The "Lost" cell: the share, and on how many of the cluster's pods it was measured. */
function regretCell(r, pods) {
  const small = r.pods_measured < 10 || r.pods_measured < pods * SMALL_SAMPLE;
  const cls = r.throughput_lost_pct > 0 ? (small ? " small-sample" : " lost") : "";
  return h("td", { class: `num${cls}`, "data-small-sample": String(small) },
    h("div", {}, `${r.throughput_lost_pct.toFixed(1)} %`),
    h("div", { class: "sub regret-sample" },
      `measured on ${fmtCount(r.pods_measured)} of ${fmtCount(pods)} pods`));
}

function renderKpis(pods, clusterCount) {
  const active = state.activeOverrides;
  const kpi = (label, value, id) =>
    h("div", { class: "kpi" }, h("dt", {}, label), h("dd", { id }, value));
  $("fleet-kpis").replaceChildren(
    kpi("Pods", fmtCount(pods), "kpi-pods"),
    kpi("Clusters", fmtCount(clusterCount), "kpi-clusters"),
    kpi("Active overrides", active === null ? "–" : fmtCount(active), "kpi-overrides"),
  );
}

// Text width for layout; a canvas measures with the page's own font.
const measureCtx = document.createElement("canvas").getContext("2d");
function textWidth(text, font) {
  measureCtx.font = font;
  return measureCtx.measureText(text).width;
}

/** A round axis step (1, 2, 5 x 10^n whole pods) giving at most maxTicks intervals,
 *  the smallest such, so the longest bar fills most of the width. */
function niceStep(max, maxTicks = 8) {
  const mag = 10 ** Math.floor(Math.log10(Math.max(1, max / maxTicks)));
  for (const m of [1, 2, 5, 10, 20]) {
    if (Math.ceil(max / (m * mag)) <= maxTicks) return m * mag;
  }
  return 20 * mag;
}

function plural(n, word) {
  return `${fmtCount(n)} ${word}${n === 1 ? "" : "s"}`;
}

function drawChart(clusters, names, order) {
  const box = $("chart");
  if (!names.length) {
    box.replaceChildren(
      h(
        "div",
        { class: "empty", id: "chart-empty" },
        h("strong", {}, "No pods have asked for a backend yet."),
        h("span", {}, "Clusters appear here once their pods call POST /v1/select."),
      ),
    );
    return;
  }

  const family = getComputedStyle(document.body).fontFamily;
  const labelFont = `600 13px ${family}`;
  const smallFont = `600 12px ${family}`;

  const width = Math.max(box.clientWidth, 260);
  const longest = Math.max(...names.map((n) => textWidth(n, labelFont)));
  // Labels get what they need, up to 220 px or a third of a narrow chart.
  const labelW = Math.min(Math.max(longest + 20, 80), 220, width / 3);
  const marks = Object.fromEntries(names.map((n) => [n, clusterMarks(n)]));
  const marked = names.some((n) => marks[n].length);
  // room right of the longest bar for its "1,000 pods" and its badges
  const totalW = Math.max(70, ...names.map((n) => 16 + marks[n].length * 19 + textWidth(
    plural(Object.values(clusters[n]).reduce((a, b) => a + b, 0), "pod"), smallFont)));
  const barX = labelW;
  const barW = Math.max(width - labelW - totalW, 80);
  const rowH = 28;
  const gap = 14;
  const top = 4;
  const axisH = 26;
  const height = top + names.length * (rowH + gap) - gap + axisH;

  const rowTotals = names.map((n) => Object.values(clusters[n]).reduce((a, b) => a + b, 0));
  const max = Math.max(...rowTotals, 1);
  const step = niceStep(max);
  const axisMax = Math.ceil(max / step) * step;
  const x = (v) => (v / axisMax) * barW;

  const svg = s("svg", {
    id: "fleet-chart",
    width,
    height,
    viewBox: `0 0 ${width} ${height}`,
    // "group", not "img": the rows inside are buttons a screen reader must reach
    role: "group",
    "aria-labelledby": "chart-title",
    class: "chart-svg",
  });
  svg.append(
    s(
      "title",
      { id: "chart-title" },
      `Pods per backend in ${plural(names.length, "cluster")}. ` +
        "Select a cluster to list its pods.",
    ),
  );

  // Grid lines and axis labels first, so bars draw over them.
  const grid = s("g", { class: "grid", "aria-hidden": "true" });
  const chartBottom = height - axisH;
  for (let v = 0; v <= axisMax; v += step) {
    const gx = barX + x(v);
    grid.append(
      s("line", { x1: gx, x2: gx, y1: 0, y2: chartBottom + 4, class: v ? "" : "baseline" }),
      s("text", { x: gx, y: chartBottom + 18, "text-anchor": "middle" }, fmtCount(v)),
    );
  }
  svg.append(grid);

  names.forEach((name, i) => {
    const counts = clusters[name];
    const total = rowTotals[i];
    const y = top + i * (rowH + gap);
    const row = s("g", {
      class: "row",
      tabindex: 0,
      role: "button",
      "data-cluster": name,
      "data-total": total,
      "aria-label": `${name}: ${plural(total, "pod")}. ${order
        .filter((b) => counts[b])
        .map((b) => `${b} ${counts[b]}`)
        .join(", ")}. Show pods.`,
    });

    // Full-width hit area: the whole row is clickable, not just the coloured part.
    row.append(s("rect", { class: "hit", x: 0, y: y - gap / 2, width, height: rowH + gap }));

    const label = fitText(name, labelW - 16, labelFont);
    row.append(
      s(
        "text",
        { class: "cluster-label", x: labelW - 12, y: y + rowH / 2, "text-anchor": "end",
          "dominant-baseline": "central" },
        s("title", {}, name),
        label,
      ),
    );

    // Rounded ends for the whole stack: clip the segments to one rounded rectangle.
    const clipId = `clip-${i}`;
    row.append(
      s("clipPath", { id: clipId },
        s("rect", { x: barX, y, width: Math.max(x(total), 1), height: rowH, rx: 5 })),
    );
    const bar = s("g", { "clip-path": `url(#${clipId})` });
    let cx = barX;
    for (const backend of order) {
      const pods = counts[backend];
      if (!pods) continue;
      const w = x(pods);
      const pct = Math.round((pods / total) * 100);
      const seg = s(
        "g",
        {},
        s(
          "rect",
          {
            class: `seg ${backendClass(backend)}`.trim(),
            x: cx,
            y,
            // a hairline gap keeps neighbouring segments apart
            width: Math.max(w - 1.5, 1),
            height: rowH,
            "data-backend": backend,
            "data-pods": pods,
          },
          s("title", {}, `${name} · ${backend}: ${plural(pods, "pod")} (${pct}%)`),
        ),
      );
      // Label inside the segment only when it fits; the tooltip always has it.
      const text = fmtCount(pods);
      if (textWidth(text, smallFont) + 10 <= w - 1.5) {
        seg.append(
          s("text", { class: "seg-label", x: cx + (w - 1.5) / 2, y: y + rowH / 2,
            "text-anchor": "middle", "dominant-baseline": "central", "aria-hidden": "true" },
          text),
        );
      }
      bar.append(seg);
      cx += w;
    }
    row.append(bar);
    row.append(
      s("text", { class: "row-total", x: barX + x(total) + 8, y: y + rowH / 2,
        "dominant-baseline": "central" }, plural(total, "pod")),
    );
    // A badge per thing that steers this cluster: O an override in force, S a stage.
    let mx = barX + x(total) + 8 + textWidth(plural(total, "pod"), smallFont) + 6;
    for (const m of marks[name]) {
      row.append(s("g", { class: `mark mark-${m.kind}`, "data-mark": m.kind },
        s("title", {}, m.title),
        s("rect", { class: `mark-${m.kind}`, x: mx, y: y + rowH / 2 - 8, width: 16, height: 16,
          rx: 3 }),
        s("text", { class: "mark-text", x: mx + 8, y: y + rowH / 2, "text-anchor": "middle",
          "dominant-baseline": "central", "aria-hidden": "true" }, m.letter)));
      mx += 19;
    }
    if (marks[name].length) {
      row.setAttribute("aria-label", row.getAttribute("aria-label").replace(
        / Show pods\.$/, ` ${marks[name].map((m) => m.title).join(". ")}. Show pods.`));
    }

    const open = () => filterPodsByCluster(name);
    row.addEventListener("click", open);
    row.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter" || ev.key === " ") {
        ev.preventDefault();
        open();
      }
    });
    svg.append(row);
  });

  const legend = marked ? h("ul", { class: "chart-marks", id: "chart-marks",
    "aria-label": "Chart marks" },
  h("li", {}, h("span", { class: "mark-key mark-override", "aria-hidden": "true" }, "O"),
    "override in force"),
  h("li", {}, h("span", { class: "mark-key mark-stage", "aria-hidden": "true" }, "S"),
    "rollout stage in progress")) : null;
  box.replaceChildren(svg, ...(legend ? [legend] : []));
}

/** What steers a cluster now: an override in force over it (not expired, not halted)
 *  and a rollout whose stage is partial; each as a chart badge. */
function clusterMarks(name) {
  const now = Date.now();
  const covers = (o) => o.cluster === "*" || globMatch(o.cluster, name);
  const out = [];
  const inForce = (state.overrides || []).filter((o) => covers(o) && !isExpired(o, now)
    && !(o.rollout && o.rollout.state === "halted"));
  if (inForce.length) {
    out.push({ kind: "override", letter: "O",
      title: `Under override ${inForce.map((o) => scopeText(o.cluster)).join(", ")}` });
  }
  const staged = ((state.summary && state.summary.rollouts) || []).filter((p) =>
    p.rollout && p.rollout.state === "active" && Number(p.rollout.percent) < 100 && covers(p));
  if (staged.length) {
    out.push({ kind: "stage", letter: "S",
      title: `In a rollout stage: ${staged.map((p) => `${scopeText(p.cluster)} at ${
        p.rollout.percent} %`).join(", ")}` });
  }
  return out;
}

/** Shorten a label with an ellipsis to fit; the full name stays in the tooltip. */
function fitText(text, maxWidth, font) {
  if (textWidth(text, font) <= maxWidth) return text;
  let cut = text;
  while (cut.length > 1 && textWidth(`${cut}…`, font) > maxWidth) cut = cut.slice(0, -1);
  return `${cut}…`;
}

// ---------------------------------------------------------------- devices

function capText(device) {
  return device && Array.isArray(device.capability)
    ? `sm ${device.capability.join(".")}`
    : "no GPU";
}

function deviceText(device) {
  if (!device) return "—";
  return device.name ? `${device.name} (${capText(device)})` : capText(device);
}

// ---------------------------------------------------------------- decision detail

async function lookup(event) {
  event.preventDefault();
  const cluster = $("lookup-cluster").value.trim();
  const pod = $("lookup-pod").value.trim();
  if (!cluster || !pod) return;
  const out = $("detail");
  const seq = ++state.lookupSeq;
  out.replaceChildren(h("p", { class: "muted" }, "Looking up…"));
  try {
    const q = `cluster=${encodeURIComponent(cluster)}&pod=${encodeURIComponent(pod)}&limit=1`;
    const page = await api(`/v1/selections?${q}`);
    if (seq !== state.lookupSeq) return; // a newer lookup started meanwhile
    if (!page.items.length) {
      out.replaceChildren(
        h("p", { class: "empty-inline", id: "detail-empty" },
          "No decision recorded for pod ", h("span", { class: "mono" }, pod),
          " in cluster ", h("span", { class: "mono" }, cluster), "."),
      );
      return;
    }
    await showDecisionById(page.items[0].decision_id, page.items[0], seq);
  } catch (err) {
    if (handleAuthError(err)) return;
    out.replaceChildren(lookupError(err));
  }
}

/** Show one pod's latest decision, as if typed into the lookup form, in the drawer
 *  beside what was clicked (a rollout's "Tripped by" pod). */
function lookupPod(cluster, pod) {
  const opener = document.activeElement instanceof HTMLElement ? document.activeElement : null;
  $("lookup-cluster").value = cluster;
  $("lookup-pod").value = pod;
  $("lookup").requestSubmit();
  openPodDrawer(opener);
}

function lookupError(err) {
  if (err.status === 422) return h("p", { class: "error-text" }, `Invalid input: ${err.message}`);
  return h("p", { class: "error-text" }, describeFailure(err));
}

async function showDecisionById(id, item, seq) {
  const out = $("detail");
  if (seq === undefined) {
    seq = ++state.lookupSeq;
    if (item) {
      $("lookup-cluster").value = item.cluster || "";
      $("lookup-pod").value = item.pod || "";
    }
    out.replaceChildren(h("p", { class: "muted" }, "Loading…"));
    $("detail-title").scrollIntoView({ behavior: "smooth", block: "start" });
  }
  let detail;
  try {
    detail = await api(`/v1/selections/${encodeURIComponent(id)}`);
  } catch (err) {
    if (handleAuthError(err)) return;
    if (seq === state.lookupSeq) out.replaceChildren(lookupError(err));
    return;
  }
  if (seq !== state.lookupSeq) return;
  out.replaceChildren(renderDecision(detail));
}

function renderDecision(d) {
  const answer = d.answer || {};
  const model = d.model || {};
  const dims = [model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim];
  const facts = [
    ["Pod", h("span", { class: "mono" }, d.pod ?? "—")],
    ["Node", h("span", { class: "mono" }, d.node ?? "—")],
    ["Cluster", h("span", { class: "mono" }, d.cluster)],
    ["Device", deviceText(d.device)],
    ["Model", model.name || "—"],
    ["MLA dims", dims.every((v) => v !== undefined) ? `(${dims.join(", ")})` : "—"],
    ["dtype", d.dtype],
    ["Decided", [timeEl(d.time), ` · rules r${d.rules_revision}`]],
  ];

  const result = h(
    "div",
    { class: "decision-result", id: "decision", "data-decision-id": d.decision_id,
      "data-backend": answer.backend || d.backend, "data-source": answer.source || d.source },
    h("div", { class: "chosen" },
      h("span", { class: "muted small" }, "Chosen backend"),
      h("span", { class: "chosen-backend" }, backendTag(answer.backend || d.backend))),
    h("div", { class: "chosen" },
      h("span", { class: "muted small" }, "Source"),
      h("span", { class: "pill pill-strong" }, answer.source || d.source)),
  );

  const parts = [
    result,
    h("dl", { class: "facts" }, facts.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
  ];

  const messages = answer.messages || [];
  if (messages.length) {
    parts.push(
      h("h3", {}, "Why"),
      h("ul", { class: "messages", id: "decision-messages" },
        messages.map((m) => h("li", {}, m))),
    );
  }

  const overrides = answer.overrides || [];
  if (overrides.length) {
    const applied = overrides.filter((o) => o.effect !== "none");
    parts.push(
      h("h3", {}, applied.length === overrides.length ? "Overrides that applied" : "Overrides"),
      h("ul", { class: "messages", id: "decision-overrides" },
        overrides.map((o) => h("li", { "data-applied": String(o.effect !== "none") },
          h("strong", {}, scopeText(o.cluster)), ": ", overrideEffect(o),
          o.note ? h("span", { class: "muted" }, ` — “${o.note}”`) : null))),
    );
  }

  const candidates = answer.candidates || [];
  parts.push(
    h("h3", {}, "Candidates"),
    h("div", { class: "table-wrap" },
      h("table", { class: "table candidates", id: "candidates" },
        h("thead", {}, h("tr", {},
          h("th", { scope: "col" }, "Backend"),
          h("th", { scope: "col" }, "Role"),
          h("th", { scope: "col" }, "Valid"),
          h("th", { scope: "col" }, "Reasons"))),
        h("tbody", {}, candidates.map((c) =>
          h("tr", { "data-backend": c.backend, "data-valid": String(Boolean(c.valid)),
            class: c.backend === (answer.backend || d.backend) ? "chosen-row" : "" },
            h("td", {}, backendTag(c.backend)),
            h("td", {}, c.role ? h("span", { class: "pill" }, c.role) : "—"),
            h("td", { class: c.valid ? "ok" : "bad" },
              h("span", { "aria-hidden": "true" }, c.valid ? "✓" : "✗"),
              h("span", { class: "sr-only" }, c.valid ? "valid" : "not valid")),
            h("td", { class: "reasons" }, (c.reasons || []).length
              ? h("ul", {}, c.reasons.map((r) => h("li", {}, r)))
              : h("span", { class: "muted" }, "—")),
          ))))),
  );

  // Reported build/run failures: relative, with the UTC time on hover, like every time here.
  const failures = d.failures || [];
  if (failures.length) {
    parts.push(
      h("h3", {}, "Reported failures"),
      h("ul", { class: "messages failures", id: "decision-failures" },
        failures.map((f) => h("li", { "data-backend": f.backend ?? "" },
          timeEl(f.at), " ",
          f.backend ? backendTag(f.backend) : null, " ",
          h("span", { class: "failure-error" }, f.error ?? summarize(f))))),
    );
  }
  return h("div", { class: "decision" }, parts);
}

/** What an override did to a decision, in words: its effect ("force X"), or, for one
 *  that touched it without applying (the service's effect "none"), why not. */
function overrideEffect(o) {
  if (o.effect !== "none") return o.effect ?? "";
  const r = o.rollout;
  if (r && r.state === "halted") return "not applied: its rollout is halted";
  if (r && r.in_stage === false) return `not applied: this pod is outside its ${r.percent} % stage`;
  return "not applied to this pod";
}

/** A one-line text for an object of unknown shape (failures, audit before/after). */
function summarize(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "object") return String(value);
  return Object.entries(value)
    .map(([k, v]) => `${k}: ${typeof v === "object" && v !== null ? JSON.stringify(v) : v}`)
    .join(" · ");
}

// ---------------------------------------------------------------- overrides

function scopeText(cluster) {
  return cluster === "*" ? "whole fleet" : cluster;
}

function isExpired(o, now) {
  if (o.expired) return true;
  const t = parseTime(o.expires_at);
  return t !== null && t <= now;
}

/** A panel for an endpoint the server does not have yet (404). */
function notAvailable(what, path) {
  return h("p", { class: "empty-inline not-available" },
    `${what} not available on this server (`, h("code", {}, path), " answered 404).");
}

async function loadOverrides() {
  const data = await apiIfServed("/v1/overrides");
  if (data === null) {
    state.activeOverrides = null;
    const kpi = $("kpi-overrides");
    if (kpi) kpi.textContent = "–";
    $("overrides-count").textContent = "";
    $("overrides").replaceChildren(notAvailable("Overrides", "/v1/overrides"));
    return;
  }
  renderOverrides(data.items || []);
}

/** Drift from the last applied overrides file (docs/gitops.md), beside the overrides'
 *  count: how many resources differ from it now, and (on hover) who changed what by
 *  hand since. Hidden when nothing differs, no file was applied, or the server is older. */
async function loadDrift() {
  const el = $("overrides-drift");
  if (!el) return;
  const drift = await apiIfServed("/v1/drift");
  if (!drift || !drift.managed || !drift.drifted) {
    el.hidden = true;
    el.replaceChildren();
    return;
  }
  const n = drift.resources.length;
  const hands = (drift.hand_changes || []).map(
    (c) => `${c.actor}: ${c.action} ${c.target}${c.note ? ` (${c.note})` : ""}`);
  el.replaceChildren(`${n} ${n === 1 ? "differs" : "differ"} from overrides file rev `,
    h("code", {}, drift.file_revision));
  el.title = hands.length ? `Changed by hand since it was applied:\n${hands.join("\n")}` : "";
  el.hidden = false;
}

function renderOverrides(items) {
  const now = Date.now();
  const active = items.filter((o) => !isExpired(o, now));
  state.activeOverrides = active.length;
  state.overrides = items;
  renderRollouts(); // its rows name each override's effect
  renderSituations(); // they cite the measured policy only while an override sets it
  if (state.summary) renderChart(); // its marks follow the overrides
  const kpi = $("kpi-overrides");
  if (kpi) kpi.textContent = fmtCount(active.length);
  $("overrides-count").textContent = items.length ? `${active.length} active` : "";
  renderOverrideTools(); // console.js: "New override" for admins
  syncStageFilter(); // pods.js: the "in stage of" choices follow the active rollouts

  if (!items.length) {
    $("overrides").replaceChildren(
      h("p", { class: "empty-inline" }, "No overrides: every cluster follows the priority rules."),
    );
    return;
  }
  // Halted rollouts first (they need someone); then active ones, soonest expiry first,
  // never-expiring ones after; expired last.
  const key = (o) => {
    const t = parseTime(o.expires_at);
    const rank = isExpired(o, now) ? 2 : o.rollout && o.rollout.state === "halted" ? 0 : 1;
    return [rank, t === null ? Infinity : t];
  };
  const sorted = [...items].sort((a, b) => {
    const [ea, ta] = key(a);
    const [eb, tb] = key(b);
    return ea - eb || ta - tb;
  });
  // A redraw (a poll, a live change) replaces the buttons of a changed override: one
  // that held the keyboard's focus hands it to its redrawn copy rather than dropping it
  // to the page body.
  const had = document.activeElement;
  const held =
    had && $("overrides").contains(had) && had.dataset.act
      ? { cluster: had.closest("li.override")?.dataset.cluster, act: had.dataset.act }
      : null;
  keepUnchanged($("overrides"), "ul.override-list",
    h("ul", { class: "override-list" }, sorted.map((o) => overrideItem(o, now))));
  if (held && held.cluster !== undefined) {
    const again = $("overrides").querySelector(
      `li.override[data-cluster="${CSS.escape(held.cluster)}"] button[data-act="${CSS.escape(held.act)}"]`,
    );
    if (again) again.focus();
  }
}

/** Put ``fresh`` (a list whose items carry ``data-cluster``) in ``holder``, drawn into
 *  what is shown (``patched``): a click is a press and a release on one element, so a
 *  redraw between the two (a live change, a poll) that replaced the button swallowed the
 *  click. Only an item's changed parts are replaced; its times tick without a new node. */
function keepUnchanged(holder, selector, fresh) {
  const shown = holder.querySelector(selector);
  if (!shown || holder.firstElementChild !== shown || holder.children.length !== 1) {
    holder.replaceChildren(fresh);
    return;
  }
  const byKey = new Map([...shown.children].map((el) => [el.dataset.cluster, el]));
  const want = [...fresh.children].map((el) => {
    const was = byKey.get(el.dataset.cluster);
    byKey.delete(el.dataset.cluster); // drawn into once
    return was ? patched(was, el) : el;
  });
  place(shown, want);
}

/** ``fresh`` drawn into ``old``: an element with the same tag and the same attributes is
 *  kept, its children drawn into the same way and its text updated; any other node is
 *  replaced by its fresh copy. An element's handlers act on what its attributes name
 *  (data-act, the scope in its label), so a kept one does what its fresh copy would.
 *  Returns the node to show. */
function patched(old, fresh) {
  if (old.nodeType !== fresh.nodeType || old.nodeName !== fresh.nodeName) return fresh;
  if (old.nodeType === Node.TEXT_NODE) {
    if (old.nodeValue !== fresh.nodeValue) old.nodeValue = fresh.nodeValue;
    return old;
  }
  if (old.nodeType !== Node.ELEMENT_NODE || !sameAttributes(old, fresh)) return fresh;
  const olds = [...old.childNodes];
  place(old, [...fresh.childNodes].map((f, i) => (olds[i] ? patched(olds[i], f) : f)));
  return old;
}

function sameAttributes(a, b) {
  if (a.attributes.length !== b.attributes.length) return false;
  for (const { name, value } of a.attributes) {
    if (b.getAttribute(name) !== value) return false;
  }
  return true;
}

/** ``parent``'s children become ``nodes``; a kept child is never moved (taken out and
 *  put back, it would lose a press on it), as ``nodes`` keeps their order. */
function place(parent, nodes) {
  const keep = new Set(nodes);
  for (const child of [...parent.childNodes]) if (!keep.has(child)) child.remove();
  nodes.forEach((node, i) => {
    if (parent.childNodes[i] !== node) parent.insertBefore(node, parent.childNodes[i] || null);
  });
}

/** What an override does, as tags: force X, deny Y, policy Z. */
function overrideEffects(o) {
  const effects = [];
  if (o.force) effects.push(h("span", { class: "effect" }, "force ", backendTag(o.force)));
  for (const b of o.deny || []) {
    effects.push(h("span", { class: "effect effect-deny" }, "deny ", backendTag(b)));
  }
  if (o.policy) effects.push(h("span", { class: "effect" }, `policy ${o.policy}`));
  return effects;
}

function overrideItem(o, now) {
  const expired = isExpired(o, now);
  const effects = overrideEffects(o);
  if (!effects.length) effects.push(h("span", { class: "muted" }, "no effect"));
  const rollout = o.rollout || null;
  const halted = Boolean(rollout && rollout.state === "halted");

  const t = parseTime(o.expires_at);
  let expiry;
  if (t === null) expiry = h("span", {}, "no expiry");
  else if (expired) expiry = timeEl(o.expires_at, "expired ");
  else expiry = timeEl(o.expires_at, "expires ");

  return h(
    "li",
    { class: `override${expired ? " expired" : ""}${halted ? " override-halted" : ""}`,
      "data-cluster": o.cluster, "data-expired": String(expired),
      "data-rollout": rollout ? String(rollout.state ?? "") : null },
    h("div", { class: "override-head" },
      h("span", { class: `scope${o.cluster === "*" ? " scope-fleet" : ""}` },
        scopeText(o.cluster)),
      o.model ? h("span", { class: "muted small" }, "models ", h("code", {}, o.model)) : null,
      h("span", { class: "expiry" }, expiry)),
    h("div", { class: "effects" }, effects),
    rollout ? rolloutLine(rollout, now) : null,
    halted ? haltedBox(rollout) : null,
    o.note ? h("p", { class: "note" }, o.note) : null,
    h("p", { class: "meta" },
      `by ${o.created_by ?? "unknown"} · `, timeEl(o.created_at, "set "),
      o.revision !== undefined ? ` · rev ${o.revision}` : ""),
    overrideActions(o), // console.js: edit, remove, halt/resume/promote (admins in scope)
  );
}

// ---------------------------------------------------------------- rollouts

const ROLLOUT_STATES = ["active", "halted", "complete"];

function rolloutBadge(r) {
  const known = ROLLOUT_STATES.includes(r.state);
  return h("span", { class: `rollout-state rollout-${known ? r.state : "other"}` },
    known ? r.state : String(r.state ?? "unknown"));
}

/** "30m" -> milliseconds (the API's durations: a whole number and s, m, h or d). */
function durationMs(text) {
  const m = /^(\d+)\s*([smhd])$/.exec(String(text ?? "").trim());
  return m ? Number(m[1]) * { s: 1e3, m: 6e4, h: 36e5, d: 864e5 }[m[2]] : null;
}

/** When the service promotes this rollout by itself next, if it will. */
function nextStep(r, now) {
  if (r.state !== "active" || !Array.isArray(r.steps)) return null;
  const next = r.steps.find((pct) => pct > r.percent);
  const every = durationMs(r.step_every);
  const started = parseTime(r.stage_started_at);
  if (next === undefined || every === null || started === null) return null;
  const due = started + every;
  return due > now
    ? timeEl(new Date(due).toISOString(), `next ${next} % `)
    : `next ${next} % due now`;
}

/** A rollout's settings and state on one line: badge, share, steps, failures. */
function rolloutLine(r, now) {
  const parts = [h("span", { class: "rollout-pct" }, `${r.percent ?? "?"} % of pods`)];
  if (Array.isArray(r.steps) && r.steps.length) {
    parts.push(h("span", { class: "rollout-steps" },
      `steps ${r.steps.map((pct) => `${pct} %`).join(" → ")}`,
      r.step_every ? ` every ${r.step_every}` : ""));
  }
  const failures = r.failures ?? 0;
  const max = r.max_failures ?? 1;
  parts.push(h("span", { class: `rollout-failures${failures ? " has-failures" : ""}` },
    `failures ${failures}/${max}`));
  const ev = r.evidence;
  if (failures && ev) {
    // what the failure guard counted: distinct sources, and how many were verified pods
    parts.push(h("span", { class: "muted rollout-evidence",
      title: "Failure sources: a verified pod counts once per pod, a static token once " +
        "however many pods it names" },
    `${ev.verified_pods ?? 0} verified pod(s), ${ev.static_sources ?? 0} static source(s)`));
  }
  if (r.max_slowdown_pct !== undefined && r.max_slowdown_pct !== null) {
    parts.push(h("span", { class: "muted" }, `halts if ${r.max_slowdown_pct} % slower`));
  }
  parts.push(h("span", { class: "muted rollout-guard-clusters" }, guardClustersText(r)));
  if (r.state === "active" && r.stage_started_at) {
    parts.push(timeEl(r.stage_started_at, "stage started "));
  }
  const next = nextStep(r, now);
  if (next) parts.push(h("span", { class: "rollout-next" }, next));
  const sep = () => h("span", { class: "sep", "aria-hidden": "true" }, "·");
  return h("div", { class: "rollout-line", "data-state": r.state ?? "" },
    h("span", { class: "rollout-label" }, "Rollout"), rolloutBadge(r),
    parts.flatMap((part, i) => (i ? [sep(), part] : [part])));
}

/** Whose failures and speed the guards count: the guard clusters, or every cluster the
 *  override covers. */
function guardClustersText(r) {
  const globs = Array.isArray(r.guard_clusters) && r.guard_clusters.length
    ? r.guard_clusters : null;
  return globs ? `guard clusters ${globs.join(", ")}` : "guards every cluster it covers";
}

/** What halts the rollout, shown whether or not anything was measured yet: failures
 *  against max_failures, the slowdown limit, and the clusters the guards watch. */
function guardLine(p, r) {
  const failures = p.failures ?? r.failures ?? 0;
  const max = r.max_failures ?? 1;
  const limit = r.max_slowdown_pct ?? null;
  const sep = () => h("span", { class: "sep", "aria-hidden": "true" }, " · ");
  return h("p", { class: "rollout-guards small", "data-max-failures": max,
    "data-max-slowdown": limit ?? "", "data-guard-clusters": (r.guard_clusters || []).join(",") },
  h("span", { class: "muted" }, "Guards: "),
  h("span", { class: `rollout-failures${failures ? " has-failures" : ""}` },
    `failures ${failures}/${max}`),
  limit !== null ? [sep(), h("span", { class: "rollout-slowdown" },
    `halts beyond −${limit} % against the rest`)] : null,
  evidenceText(p, r) ? [sep(), h("span", { class: "rollout-evidence",
    title: "Failure sources the guard counted: a verified pod once per pod, a static " +
      "token once per pod name it asked for" }, evidenceText(p, r))] : null,
  sep(), h("span", { class: "rollout-guard-clusters" }, guardClustersText(r)));
}

/** "evidence 3 verified pods / 1 static source", from the override's rollout (the
 *  summary's copy may not carry it). */
function evidenceText(p, r) {
  const o = (state.overrides || []).find((x) => x.cluster === p.cluster && x.rollout) || null;
  const ev = r.evidence || (o && o.rollout.evidence);
  if (!ev) return "";
  return `evidence ${plural(ev.verified_pods ?? 0, "verified pod")} / ${
    plural(ev.static_sources ?? 0, "static source")}`;
}

/** A halted rollout: when, the service's reason, and the pods that tripped it. */
function haltedBox(r) {
  return h("div", { class: "halted", "data-halted-at": r.halted_at ?? "" },
    h("p", { class: "halted-head" },
      h("strong", {}, "Halted"),
      r.halted_at
        ? [" ", timeEl(r.halted_at)]
        : null,
      h("span", { class: "muted" },
        " · applies to no pod until an admin resumes it, writes it again or deletes it")),
    h("p", { class: "halted-reason" }, r.halted_reason || "No reason recorded."),
    failedPods(r));
}

/** The stage pods whose failure reports count against the guard ("cluster/pod"): each
 *  opens that pod's decision, where the reported error is. A token limited to some
 *  clusters gets only its own pods named, and how many others there were. */
function failedPods(r) {
  const pods = Array.isArray(r.failed_pods) ? r.failed_pods : [];
  const outside = Number(r.failed_pods_outside_scope) || 0;
  if (!pods.length && !outside) return null;
  const others = outside
    ? h("span", { class: "muted failed-pods-outside", "data-outside": outside },
      `${pods.length ? " and " : ""}${plural(outside, "pod")} in clusters outside your scope`)
    : null;
  return h("p", { class: "failed-pods small" }, "Tripped by ",
    pods.map((name, i) => {
      const [cluster, ...rest] = String(name).split("/");
      const pod = rest.join("/");
      return [i ? ", " : "", h("button", { type: "button", class: "linklike mono",
        "data-pod": name, title: "Show this pod's decision and its reported failure",
        onclick: () => lookupPod(cluster, pod) }, name)];
    }), others);
}

/** The step plan of a rollout: steps passed, the current one, those to come. */
function stepTrack(r) {
  const steps = Array.isArray(r.steps) && r.steps.length ? r.steps : null;
  if (!steps) return null;
  const current = Number(r.percent);
  return h("ol", { class: "steps", "aria-label": "Rollout steps" },
    steps.map((pct) => {
      const where = pct < current ? "done" : pct === current ? "current" : "todo";
      return h("li", { class: `step step-${where}`, "data-step": pct,
        "aria-current": where === "current" ? "step" : null }, `${pct} %`);
    }));
}

/** The summary's rollouts: halted first (they need someone), then active, then done. */
function renderRollouts() {
  const list = (state.summary && Array.isArray(state.summary.rollouts) && state.summary.rollouts)
    || [];
  const card = $("rollouts-card");
  card.hidden = !list.length;
  if (!list.length) {
    $("rollouts-count").textContent = "";
    $("rollouts").replaceChildren();
    return;
  }
  const rank = (p) => {
    const i = ["halted", "active", "complete"].indexOf(p.rollout && p.rollout.state);
    return i < 0 ? 3 : i;
  };
  const sorted = [...list].sort((a, b) =>
    rank(a) - rank(b) || (a.cluster < b.cluster ? -1 : a.cluster > b.cluster ? 1 : 0));
  const halted = list.filter((p) => p.rollout && p.rollout.state === "halted").length;
  $("rollouts-count").textContent = halted
    ? `${halted} halted of ${list.length}`
    : `${list.length} staged`;
  const now = Date.now();
  $("rollouts").replaceChildren(
    h("ul", { class: "rollout-list" }, sorted.map((p) => rolloutProgress(p, now))));
}

function rolloutProgress(p, now) {
  const r = p.rollout || {};
  const scope = Math.max(0, Number(p.pods_in_scope) || 0);
  const stage = Math.min(Math.max(0, Number(p.pods_in_stage) || 0), scope);
  const booted = Math.min(Math.max(0, Number(p.pods_booted_with_it) || 0), stage);
  const override = state.overrides.find((o) => o.cluster === p.cluster);
  const effects = override ? overrideEffects(override) : [];
  const share = scope ? ` (${Math.round((stage / scope) * 100)} %)` : "";
  const failures = p.failures ?? r.failures ?? 0;
  const next = nextStep(r, now);
  return h(
    "li",
    { class: `rollout rollout-item-${ROLLOUT_STATES.includes(r.state) ? r.state : "other"}`,
      "data-cluster": p.cluster, "data-state": r.state ?? "", "data-in-scope": scope,
      "data-in-stage": stage, "data-booted": booted, "data-failures": failures },
    h("div", { class: "override-head" },
      h("span", { class: `scope${p.cluster === "*" ? " scope-fleet" : ""}` },
        scopeText(p.cluster)),
      rolloutBadge(r),
      h("span", { class: "muted small" },
        `${r.percent ?? "?"} %`, p.revision !== undefined ? ` · rev ${p.revision}` : ""),
      effects.length ? h("span", { class: "effects inline" }, effects) : null),
    stepTrack(r),
    stageBar(scope, stage, booted),
    h("p", { class: "rollout-counts" },
      h("span", {},
        h("span", { class: "key key-stage", "aria-hidden": "true" }),
        `${fmtCount(stage)} of ${plural(scope, "pod")} in the stage${share}`,
        r.state === "halted" ? h("span", { class: "muted" }, " (halted: it applies to none)")
          : null),
      h("span", {},
        h("span", { class: "key key-booted", "aria-hidden": "true" }),
        `${fmtCount(booted)} booted with it`)),
    guardLine(p, r),
    speedLine(p, r),
    r.state === "halted"
      ? h("p", { class: "halted-reason small" },
        h("strong", {}, "Halted"),
        r.halted_at ? [" ", timeEl(r.halted_at)] : null,
        ": ", r.halted_reason || "no reason recorded")
      : next ? h("p", { class: "muted small rollout-next" }, next) : null,
    failedPods(r),
    rolloutActions(p.cluster, r), // console.js: halt, resume, promote (admins in scope)
  );
}

/** Pods in the stage out of the scope (the upper lane) and those booted with it (the
 *  lower lane), each over the whole scope, so both show whatever their share (booted
 *  ones are a part of the stage: drawn over it, they hid it); drawn in SVG (no inline
 *  styles under the CSP): the widths are attributes. */
function stageBar(scope, stage, booted) {
  const x = (n) => (scope ? (n / scope) * 100 : 0);
  const label = `${fmtCount(stage)} of ${plural(scope, "pod")} in the stage, ${
    fmtCount(booted)} booted with it`;
  return s("svg", { class: "stage-bar", viewBox: "0 0 100 13", preserveAspectRatio: "none",
    role: "img", "aria-label": label },
  s("title", {}, label),
  s("rect", { class: "track", x: 0, y: 0, width: 100, height: 6 }),
  s("rect", { class: "track", x: 0, y: 7, width: 100, height: 6 }),
  s("rect", { class: "in-stage", x: 0, y: 0, width: x(stage), height: 6 }),
  s("rect", { class: "booted", x: 0, y: 7, width: x(booted), height: 6 }));
}

function tflops(v) {
  return `${Number(v).toFixed(1)}`;
}

/** The stage's median TFLOP/s against the rest of the scope, once both are measured. */
function speedLine(p, r) {
  const stage = p.stage_median_tflops;
  const rest = p.rest_median_tflops;
  const known = (v) => v !== null && v !== undefined && Number.isFinite(Number(v));
  if (!known(stage) || !known(rest)) {
    const have = known(stage) ? `stage ${tflops(stage)} TFLOP/s, rest not measured`
      : known(rest) ? `rest ${tflops(rest)} TFLOP/s, stage not measured`
        : "neither side measured yet";
    return h("p", { class: "rollout-speed muted small", "data-compared": "false" },
      `Speed: ${have}`, r.max_slowdown_pct !== undefined && r.max_slowdown_pct !== null
        ? ` (the guard halts it beyond −${r.max_slowdown_pct} %).` : ".");
  }
  const diff = rest > 0 ? ((stage - rest) / rest) * 100 : 0;
  const limit = r.max_slowdown_pct ?? null;
  const cls = diff < 0 && limit !== null && -diff > limit ? "slower" : diff < 0 ? "behind" : "faster";
  const sign = diff > 0 ? "+" : diff < 0 ? "−" : "±";
  return h("p", { class: "rollout-speed small", "data-compared": "true" },
    "Speed: stage ", h("strong", {}, tflops(stage)), " vs rest ", h("strong", {}, tflops(rest)),
    " TFLOP/s median ",
    h("span", { class: `speed-diff ${cls}` }, `(${sign}${Math.abs(diff).toFixed(1)} %)`),
    limit !== null ? h("span", { class: "muted" }, ` · halts beyond −${limit} %`) : null);
}

// ---------------------------------------------------------------- excluded by evidence

/** Per cluster, the backends failure evidence rules out and the service's reason. */
function renderExcluded(excluded) {
  const clusters = Object.keys(excluded || {})
    .filter((c) => excluded[c] && Object.keys(excluded[c]).length)
    .sort();
  state.excludedClusters = clusters.length;
  showExcludedCard();
  if (!clusters.length) {
    $("excluded-count").textContent = "";
    $("excluded").replaceChildren();
    return;
  }
  const total = clusters.reduce((n, c) => n + Object.keys(excluded[c]).length, 0);
  $("excluded-count").textContent =
    `${plural(total, "backend")} in ${plural(clusters.length, "cluster")}`;
  $("excluded").replaceChildren(
    h("ul", { class: "excluded-list" }, clusters.map((c) =>
      h("li", { class: "excluded-cluster", "data-cluster": c },
        h("span", { class: `scope${c === "*" ? " scope-fleet" : ""}` }, scopeText(c)),
        h("ul", { class: "excluded-backends" },
          orderBackends(Object.keys(excluded[c])).map((b) =>
            h("li", { "data-backend": b },
              backendTag(b),
              h("p", { class: "excluded-reason" }, String(excluded[c][b] ?? "")))))))),
  );
}

/** The card shows while a cluster has an exclusion or a situation has failure reports
 *  (those are what an admin clears). */
function showExcludedCard() {
  $("excluded-card").hidden = !state.excludedClusters && !state.situations.length;
}

/** Situations (GPU, capability, dims, dtype, engine, kernel packages) whose backends
 *  have failure reports: what POST /v1/measurements/failures/clear takes, one each. */
async function loadSituations() {
  const data = await apiIfServed("/v1/measurements/summary");
  // each keeps the failure rows it was read up to: its Clear clears only those
  const seen = (data && data.seen_through) || null;
  state.situations = ((data && data.groups) || []).filter((g) => g.failures > 0)
    .map((g) => ({ ...g, seen_through: seen }));
  renderSituations();
}

function situationText(g) {
  const pkgs = Object.entries(g.packages || {}).map(([k, v]) => `${k} ${v}`).join(", ");
  const dims = Array.isArray(g.dims) ? `(${g.dims.join(", ")})` : "";
  return `${g.device} (sm ${g.capability}) · dims ${dims} · ${g.dtype} · engine ${g.engine}` +
    (pkgs ? ` · ${pkgs}` : "");
}

function renderSituations() {
  showExcludedCard();
  renderExcludedLead();
  const groups = state.situations;
  if (!groups.length) {
    $("situations").replaceChildren();
    return;
  }
  $("situations").replaceChildren(
    h("h3", {}, "Failure reports per situation"),
    h("ul", { class: "situation-list" }, groups.map((g) =>
      h("li", { class: "situation", "data-backend": g.backend, "data-device": g.device },
        h("div", { class: "situation-head" }, backendTag(g.backend),
          h("span", { class: "muted small" },
            ` ${plural(g.failures, "pod")} reported failures`),
          clearButton(g)), // console.js: unrestricted admins only
        h("p", { class: "situation-what small" }, situationText(g)),
        g.excluded ? h("p", { class: "excluded-reason" }, measuredCited(g.excluded)) : null,
        // fewer pods than the failure policy needs: said, and the backend stays valid
        g.not_excluded ? h("p", { class: "not-excluded-reason small" }, g.not_excluded) : null))),
  );
}

/** Whether some override (a cluster's or the fleet's) sets the measured policy: only
 *  there do failure reports rule a backend out. */
function measuredInUse() {
  return state.overrides.some((o) => o.policy === "measured" && !isExpired(o, Date.now()));
}

/** A situation's exclusion text, citing "(measured policy)" only while a cluster uses
 *  it; the card's lead says which of the two it is. */
function measuredCited(text) {
  return measuredInUse() ? text : String(text).replace(" (measured policy)", "");
}

function renderExcludedLead() {
  $("excluded-lead").textContent = measuredInUse()
    ? "Per cluster: backends that reported failures rule out under the measured policy, and why."
    : "Backends pods reported failures of, per situation. No cluster's policy rules them out now.";
}

// ---------------------------------------------------------------- refused selects

/** "7 refused selects from prod-east in the last hour: missing bearer token": pods whose
 *  agent token is wrong boot on their agent's local answer, so this is where they show. */
async function loadRefusals() {
  const data = await apiIfServed("/v1/refusals?hours=1");
  renderRefused((data && data.items) || []);
}

function renderRefused(items) {
  const sorted = [...items].sort((a, b) => b.count - a.count ||
    (a.cluster < b.cluster ? -1 : a.cluster > b.cluster ? 1 : 0));
  $("refused-card").hidden = !sorted.length;
  const total = sorted.reduce((n, i) => n + i.count, 0);
  $("refused-count").textContent = sorted.length ? plural(total, "select") : "";
  $("refused").replaceChildren(...sorted.map((i) =>
    h("li", { class: "refused-item", "data-cluster": i.cluster, "data-reason": i.reason,
      "data-count": i.count },
    h("p", { class: "refused-line" },
      h("strong", {}, `${i.count} refused select${i.count === 1 ? "" : "s"}`),
      " from ", h("span", { class: "mono" }, i.cluster), " in the last hour: ",
      h("span", { class: "refused-reason" }, i.reason)),
    h("p", { class: "meta" }, timeEl(i.last_at, "latest ")))));
}

// ---------------------------------------------------------------- audit

async function loadAudit() {
  const box = $("audit");
  const data = await apiIfServed("/v1/audit?limit=20");
  if (data === null) {
    $("audit-count").textContent = "";
    box.replaceChildren(notAvailable("The audit log is", "/v1/audit"));
    return;
  }
  const items = data.items || [];
  $("audit-count").textContent = items.length ? `last ${items.length}` : "";
  if (!items.length) {
    box.replaceChildren(h("p", { class: "empty-inline" }, "No changes recorded yet."));
    return;
  }
  box.replaceChildren(h("ol", { class: "audit-list" }, items.map(auditItem)));
}

function auditItem(e) {
  const action = String(e.action ?? "");
  const kind = action.split(".")[0];
  const preview = e.preview;
  const details = (e.before !== undefined && e.before !== null) ||
    (e.after !== undefined && e.after !== null)
    ? h("details", {},
      h("summary", {}, "before / after"),
      h("div", { class: "diff" },
        h("div", {}, h("span", { class: "muted small" }, "before"),
          h("pre", {}, prettyWithTimes(e.before))),
        h("div", {}, h("span", { class: "muted small" }, "after"),
          h("pre", {}, prettyWithTimes(e.after)))))
    : null;
  return h(
    "li",
    { class: "audit-entry", "data-action": action, "data-id": e.id ?? "" },
    h("div", { class: "audit-head" },
      h("span", { class: `action action-${
        ["override", "rules", "token", "rollout", "evidence"].includes(kind) ? kind : "other"}` },
      action),
      e.target ? h("span", { class: "mono target" }, scopeText(e.target)) : null,
      h("span", { class: "when" }, timeEl(e.at))),
    e.note ? h("p", { class: "note" }, e.note) : null,
    h("p", { class: "meta" }, `by ${e.actor ?? "unknown"}`,
      preview && preview.pods_total !== undefined
        ? ` · ${preview.pods_changed ?? 0} of ${plural(preview.pods_total, "pod")} changed`
        : ""),
    previewChanges(preview),
    details,
  );
}

/** The preview's "from -> to" moves, as the audit recorded them (first few). */
function previewChanges(preview) {
  const changes = (preview && Array.isArray(preview.changes) && preview.changes) || [];
  if (!changes.length) return null;
  const shown = changes.slice(0, 4).map((c) =>
    h("li", {},
      h("span", { class: "mono" }, scopeText(c.cluster)), " ",
      backendTag(c.from), h("span", { class: "arrow", "aria-label": "to" }, "→"),
      backendTag(c.to), h("span", { class: "muted" }, ` ${plural(c.pods, "pod")}`)));
  if (changes.length > 4) {
    shown.push(h("li", { class: "muted" }, `and ${changes.length - 4} more`));
  }
  return h("ul", { class: "changes" }, shown);
}

function pretty(value) {
  if (value === null || value === undefined) return "—";
  return JSON.stringify(value, null, 2);
}

const ISO_IN_JSON = /"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)"/g;

/** ``pretty`` with every timestamp in the page's one time format (relative, the UTC time
 *  on hover) instead of its ISO text. */
function prettyWithTimes(value) {
  const text = pretty(value);
  const out = [];
  let at = 0;
  for (const m of text.matchAll(ISO_IN_JSON)) {
    out.push(text.slice(at, m.index), timeEl(m[1]));
    at = m.index + m[0].length;
  }
  out.push(text.slice(at));
  return out;
}

// ---------------------------------------------------------------- wiring

function init() {
  $("signin-form").addEventListener("submit", signIn);
  $("lookup").addEventListener("submit", lookup);
  $("refresh").addEventListener("click", () => refreshAnew());
  $("fleet-filter").addEventListener("input", (ev) => {
    state.fleetFilter = ev.target.value;
    renderChart();
  });
  $("fleet-sort").addEventListener("change", (ev) => {
    state.fleetSort = ev.target.value === "pods" ? "pods" : "name";
    renderChart();
  });
  $("sign-out").addEventListener("click", (ev) => {
    ev.preventDefault();
    signOut("");
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && state.token) refreshAll();
  });
  initPods(); // pods.js
  initConsole(); // console.js
  setInterval(tickTimes, 5000);
  // Redraw the chart for the new width; the data stays.
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => state.summary && renderSummary(), 150);
  });

  state.token = sessionStorage.getItem(TOKEN_KEY);
  if (state.token) start(null);
  else startSession();
}

/** A person signed in through the identity provider (GET /auth/session) goes straight
 *  to the console; otherwise the sign-in card, with "Sign in with <provider>" when the
 *  service has one configured. */
async function startSession() {
  let session = null;
  try {
    const res = await fetch("/auth/session", { cache: "no-store", headers: { Accept: "application/json" } });
    if (res.ok) session = await res.json();
  } catch (err) {
    // an older service, or none reachable: the token form as before
  }
  const link = $("oidc-signin");
  if (session && session.provider) {
    link.textContent = `Sign in with ${session.provider.name}`;
    link.href = session.provider.login_url;
    link.hidden = false;
    // one primary action: the provider's; the token form is the way for scripts' tokens
    $("signin-form").querySelector("button[type=submit]").classList.remove("btn-primary");
  }
  if (session && session.person) {
    state.token = SESSION;
    state.csrf = { header: session.csrf_header, token: session.csrf_token };
    start(null);
  } else {
    showSignin("");
  }
}

// The other two files define what init() wires up: run it once every script is in.
document.addEventListener("DOMContentLoaded", init);
