// The console's link to the service: live changes, and honesty when it does not answer.
//
//  - the change stream (GET /v1/events, server-sent events) read with fetch() and a
//    stream reader, so that a token goes as a header (EventSource cannot send one); a
//    signed-in person's cookie goes by itself. Every change (an override put, removed
//    or expired, a rollout's step, halt or resume, the rules, the fleet's counts, the
//    evidence) refreshes the page within a second; ``Last-Event-ID`` resumes after a
//    drop, and "resync" (what was missed is no longer kept) reads everything again;
//  - the stream refused (503: the replica's limit), broken or silent for two
//    heartbeats: the page polls every REFRESH_MS as before and tries the stream again;
//  - every request has a time limit (timedFetch): a service that does not answer says
//    so in a banner within SLOW_MS, with a Retry button, and "last updated" says it is
//    not answering instead of passing for fresh;
//  - an open override editor is told when the override it edits changed underneath,
//    with the same "keep mine / load theirs" choice as a refused apply (console.js).
// dashboard.js calls timedFetch, startLive, stopLive, liveSaysFresh, freshnessNote and
// slowFailure; everything else here is this file's own.

const SLOW_MS = 4_000; // no answer by then: say so
const READ_LIMIT_MS = 5_000; // a read is given up after this (the next poll asks again)
const WRITE_LIMIT_MS = 15_000; // a write waits longer: its outcome matters more
const SAFETY_POLL_MS = 60_000; // while live, a full read this often anyway
const DEBOUNCE_MS = 150; // changes arriving together refresh once
const COUNTS_MS = 1_000; // the summary at most this often for the fleet's counts

const live = {
  mode: "off", // "off", "connecting", "live", "polling" (refused or broken), "stalled"
  controller: null,
  lastEventId: null,
  lastByteAt: 0,
  heartbeatMs: 5_000,
  retryTimer: null,
  retryMs: 1_000,
  watchdog: null,
  debounce: null,
  again: false,
  notAnswering: false,
  silentSince: null, // when the request the service has left unanswered was sent
  silenceTimer: null, // counts the banner's "has not answered for N s" up
  lastFullRead: 0,
  countsAt: 0,
  parts: {}, // pending reads of one panel, by name
};

// ---------------------------------------------------------------- time limits

/** fetch() with a time limit: past SLOW_MS the page says the service is not answering,
 *  past ``limitMs`` the request is given up (an ApiError with ``timeout`` set). */
async function timedFetch(path, init, limitMs = READ_LIMIT_MS, session = null) {
  // ``session``: aborted when the credentials the request carries end (dashboard.js's
  // sessionSignal); the request is then dropped, as stale, not reported as a failure
  if (session && session.aborted) throw new StaleError();
  const ctl = new AbortController();
  const ended = () => ctl.abort();
  if (session) session.addEventListener("abort", ended);
  const slow = setTimeout(() => setAnswering(false), SLOW_MS);
  const stop = setTimeout(() => ctl.abort(), limitMs);
  try {
    const res = await fetch(path, { ...init, signal: ctl.signal });
    setAnswering(true);
    return res;
  } catch (err) {
    if (session && session.aborted) throw new StaleError();
    if (!ctl.signal.aborted) throw err;
    const write = init.method && init.method !== "GET";
    const e = new ApiError(0, `the service did not answer in ${limitMs / 1000} s` + (write
      ? ": the change may or may not have been made (Refresh to see; the same action " +
        "again applies once)" : ""), path);
    e.timeout = true;
    throw e;
  } finally {
    clearTimeout(slow);
    clearTimeout(stop);
    if (session) session.removeEventListener("abort", ended);
  }
}

/** The banner's text for a request that timed out, with a Retry button. How long the
 *  service has been silent counts up each second (``tickSilence``); a screen reader,
 *  to which the banner is a live region, hears "for a while" once instead of a number
 *  every second. */
function slowFailure(since) {
  const retry = h("button", { type: "button", class: "btn", id: "banner-retry" }, "Retry");
  retry.addEventListener("click", () => refreshAll());
  return ["The service has not answered for ",
    h("span", { id: "banner-silent", "aria-hidden": "true" }, `${silentSeconds()} s`),
    h("span", { class: "sr-only" }, "a while"),
    ` \u2014 retrying every ${REFRESH_MS / 1000} s.`, ...since, " ", retry];
}

/** Whole seconds since the request the service left unanswered was sent. */
function silentSeconds() {
  const since = live.silentSince ?? Date.now() - SLOW_MS;
  return Math.max(SLOW_MS, Date.now() - since) / 1000 | 0;
}

function tickSilence() {
  const el = document.getElementById("banner-silent");
  if (el) el.textContent = `${silentSeconds()} s`;
}

function setAnswering(yes) {
  if (live.notAnswering === !yes) return;
  live.notAnswering = !yes;
  clearInterval(live.silenceTimer);
  live.silentSince = yes ? null : Date.now() - SLOW_MS;
  if (!yes) live.silenceTimer = setInterval(tickSilence, 1000);
  if (!yes && state.token) showBanner(slowFailure(state.lastUpdated
    ? [" Showing data loaded ", timeEl(state.lastUpdated.toISOString()), "."] : []));
  renderUpdated();
}

/** What follows "Last updated <time>": whether the page is live, or the service is
 *  not answering (so the time shown stops passing for fresh). */
function freshnessNote() {
  const el = $("last-updated");
  const mode = live.notAnswering ? "not-answering" : live.mode;
  el.setAttribute("data-live", mode);
  if (live.notAnswering) return [" \u2014 not answering"];
  if (live.mode === "live") return [" \u00b7 live"];
  return [];
}

/** Whether the periodic poll may skip its turn: the stream tells every change. */
function liveSaysFresh() {
  if (live.mode !== "live" || live.notAnswering) return false;
  if (Date.now() - live.lastFullRead < SAFETY_POLL_MS) return true;
  live.lastFullRead = Date.now(); // this turn polls: the next ones may skip again
  return false;
}

// ---------------------------------------------------------------- the stream

function startLive() {
  stopLive();
  live.lastFullRead = Date.now();
  connect();
  live.watchdog = setInterval(checkStalled, 1_000);
}

function stopLive() {
  clearTimeout(live.retryTimer);
  clearInterval(live.watchdog);
  clearTimeout(live.debounce);
  for (const t of Object.values(live.parts)) clearTimeout(t);
  live.parts = {};
  if (live.controller) live.controller.abort();
  Object.assign(live, { mode: "off", controller: null, lastEventId: null, retryMs: 1_000,
    notAnswering: false, again: false });
}

function setMode(mode) {
  if (live.mode === mode) return;
  live.mode = mode;
  renderUpdated();
}

/** Try the stream again later; meanwhile the page polls (dashboard.js's timer). */
function retryLater(ms) {
  clearTimeout(live.retryTimer);
  live.retryTimer = setTimeout(connect, ms);
  live.retryMs = Math.min(live.retryMs * 2, 30_000);
}

async function connect() {
  const token = state.token;
  if (!token) return;
  if (live.controller) live.controller.abort();
  const ctl = new AbortController();
  live.controller = ctl;
  if (live.mode === "off") setMode("connecting");
  const headers = { ...authHeaders(token, false), Accept: "text/event-stream" };
  if (live.lastEventId) headers["Last-Event-ID"] = live.lastEventId;
  let res;
  try {
    res = await fetch("/v1/events", { headers, cache: "no-store", signal: ctl.signal });
  } catch (err) {
    if (live.controller === ctl) { setMode("polling"); retryLater(live.retryMs); }
    return;
  }
  if (live.controller !== ctl || state.token !== token) return;
  if (!res.ok || !res.body) {
    // 503: this replica holds its fill of streams; 404: a service without the stream
    setMode("polling");
    const after = Number(res.headers.get("Retry-After"));
    if (res.status !== 404) retryLater(after > 0 ? after * 1000 : live.retryMs);
    return;
  }
  const opened = Date.now();
  live.lastByteAt = opened;
  await read(res.body.getReader(), ctl);
  if (live.controller !== ctl || state.token !== token) return;
  if (Date.now() - opened > 30_000) {
    connect(); // the service ends a stream after a while: resume at once, still live
    return;
  }
  setMode("polling"); // broken early: poll until it is back
  retryLater(live.retryMs);
}

async function read(reader, ctl) {
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done || live.controller !== ctl) return;
      live.lastByteAt = Date.now();
      if (live.mode === "stalled") setMode("live");
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        dispatch(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
      }
    }
  } catch (err) {
    // aborted or broken: the caller decides what next
  }
}

/** One event block of the stream ("event:", "id:", "data:" lines; ":" a heartbeat). */
function dispatch(block) {
  let type = "message";
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("id:")) live.lastEventId = line.slice(3).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  if (!data) return; // a heartbeat
  let body = {};
  try {
    body = JSON.parse(data);
  } catch (err) {
    return;
  }
  if (type === "hello") {
    if (body.heartbeat_s) live.heartbeatMs = body.heartbeat_s * 1000;
    live.retryMs = 1_000;
    setMode("live");
    // what changed before the page was listening (since its first read, or a drop)
    refreshSoon();
    return;
  }
  // signed out elsewhere, or the session or token was revoked: the next read's 401
  // takes the page back to sign-in
  if (type === "ended") { refreshSoon(); return; }
  if (type === "counts") { countsSoon(); return; } // pods booting: the summary only
  if (type === "evidence") { partSoon("evidence", loadSituations); return; }
  if (type === "override" || type === "rollout") editorTold(body);
  refreshSoon(); // an admin's change, or "resync": everything
}

/** Silent for two heartbeats: the service (or the way to it) is stuck. */
function checkStalled() {
  if (live.mode !== "live") return;
  if (Date.now() - live.lastByteAt > 2 * live.heartbeatMs + 1_000) {
    setMode("stalled");
    setAnswering(false);
    refreshAll(); // the requests' time limits say the rest
    connect();
  }
}

/** The fleet's counts move with every pod that boots: the summary is read again at
 *  most once a COUNTS_MS, however busy the fleet. */
function countsSoon() {
  const wait = Math.max(DEBOUNCE_MS, live.countsAt + COUNTS_MS - Date.now());
  if (live.parts.counts) return;
  live.parts.counts = setTimeout(() => {
    live.parts.counts = null;
    live.countsAt = Date.now();
    loadSummary().then(renderUpdated, () => null); // a failure shows on the next poll
  }, wait);
}

/** One panel read again for changes arriving together. */
function partSoon(name, load) {
  if (live.parts[name]) return;
  live.parts[name] = setTimeout(() => {
    live.parts[name] = null;
    load().catch(() => null);
  }, DEBOUNCE_MS);
}

/** Refresh once for changes arriving together; again after one already running. */
function refreshSoon() {
  clearTimeout(live.debounce);
  live.debounce = setTimeout(async () => {
    if (state.inflight) {
      live.again = true;
      await state.inflight;
      if (!live.again) return;
    }
    live.again = false;
    live.lastFullRead = Date.now();
    await refreshAll();
  }, DEBOUNCE_MS);
}

// ---------------------------------------------------------------- the open editor

/** The override the open editor edits changed underneath (another admin, a rollout
 *  step, a guard's halt): show what it is now and the choice a refused apply gives
 *  (console.js, showConflict). Its expiry needs no choice: say it. */
async function editorTold(change) {
  if (!$("editor") || !$("dialog").open || editor.scope === null) return;
  if (change.cluster !== editor.scope) return;
  if (change.action === "expire") {
    setError("ed-error", `The override you are editing expired ${relative(change.at)}.`);
    return;
  }
  const seq = dialog.seq;
  // this page's own Apply is told too, often before its answer closes the editor
  if (editor.applying) await editor.applying;
  if (editor.refusing) await editor.refusing; // a refused Apply shows their version itself
  if (!dialogLive(seq) || !$("editor")) return;
  const mine = editor.original && editor.original.revision;
  if (change.action !== "delete" && change.revision === mine) return;
  // one change comes as several events (a put, its rollout's new stage): told once; and
  // a version already shown (a refused Apply read it) needs no news
  const rev = String(change.revision ?? "none");
  const box = $("ed-conflict");
  if (editor.told === rev || (!box.hidden && box.getAttribute("data-current") === rev)) return;
  editor.told = rev;
  await showConflict(editor.scope, seq, change);
}
