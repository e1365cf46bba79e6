// MLA Switchboard dashboard, part 3: the controls. An admin token gets them for the
// scopes it may write (GET /v1/whoami; the service checks again on every write):
//  - the override editor: create, change or remove a scope's override, always through a
//    dry run first, whose preview (pods that would change, per cluster, from -> to, and
//    the ones that would be refused, with the reason) is on screen before "Apply";
//  - halt, resume and promote of a staged override, each confirmed on its own dry run;
//  - clearing a situation's failure reports (unrestricted admins).
// Every write sends If-Match (the version the user looked at: a 412 means someone else
// changed it meanwhile, and the page says so) and an Idempotency-Key per user action
// (a double click or a retry applies once). Uses dashboard.js's helpers.
"use strict";

const DRY_RUN_NOTE = "dry run"; // a dry run needs a note too; it is never stored
const POLICIES = ["priority", "measured", "engine-default"];
const EXPIRY_CHOICES = [
  ["none", "no expiry"],
  ["1h", "in 1 hour"],
  ["8h", "in 8 hours"],
  ["1d", "in 1 day"],
  ["7d", "in 7 days"],
  ["at", "at a time (UTC)…"],
];
const EXPIRY_MS = { "1h": 36e5, "8h": 288e5, "1d": 864e5, "7d": 6048e5 };

const enc = (scope) => encodeURIComponent(scope);

// ---------------------------------------------------------------- the dialog

const dialog = { seq: 0, opener: null };

/** Show ``content`` in the page's one modal; returns a number that later answers check
 *  (dialogLive) so that a slow answer never lands in a dialog opened since. Parts that
 *  are null (a field only one kind of confirmation has) are left out: replaceChildren
 *  would write them as the text "null". */
function openDialog(title, kind, ...content) {
  dialog.seq += 1;
  const d = $("dialog");
  if (!d.open) dialog.opener = openerOf(document.activeElement);
  d.setAttribute("data-kind", kind);
  $("dialog-title").textContent = title;
  $("dialog-body").replaceChildren(...content.flat(Infinity).filter((c) => c != null));
  if (!d.open) d.showModal();
  return dialog.seq;
}

function closeDialog() {
  dialog.seq += 1;
  const d = $("dialog");
  if (d.open) d.close();
  $("dialog-body").replaceChildren();
  d.removeAttribute("data-kind");
  returnFocus();
}

function dialogLive(seq) {
  return seq === dialog.seq && $("dialog").open;
}

/** What opened a dialog, to give focus back to when it closes: the element, and how to
 *  find its like again, as the panels are redrawn on every refresh (the button that
 *  opened the editor is usually gone by the time it closes). */
function openerOf(el) {
  if (!el || el === document.body || !(el instanceof HTMLElement)) return null;
  const card = el.closest("section[id], section[aria-labelledby]");
  const within = card ? (card.id ? `#${CSS.escape(card.id)} `
    : `section[aria-labelledby="${CSS.escape(card.getAttribute("aria-labelledby"))}"] `) : "";
  let selector = null;
  if (el.id) selector = `#${CSS.escape(el.id)}`;
  else if (el.getAttribute("aria-label")) {
    selector = `${within}${el.tagName.toLowerCase()}[aria-label="${
      CSS.escape(el.getAttribute("aria-label"))}"]`;
  }
  return { el, selector, card };
}

/** Focus back on the control that opened the dialog, or its redrawn like, or (when it
 *  is gone: an override removed) the card it was in; never the page's body. */
function returnFocus() {
  const o = dialog.opener;
  if (!o || $("dialog").open) return;
  const again = o.el.isConnected ? o.el : o.selector ? document.querySelector(o.selector) : null;
  let target = again;
  if (!target && o.card && o.card.isConnected) {
    if (!o.card.hasAttribute("tabindex")) o.card.setAttribute("tabindex", "-1");
    target = o.card;
  }
  if (target) target.focus();
}

/** After a write the panels are redrawn: if that took focus away, put it back. */
function keepFocusAfterRefresh() {
  const active = document.activeElement;
  if (!active || active === document.body) returnFocus();
}

/** An Idempotency-Key per distinct request: the same request again (a double click, a
 *  retry after an error) reuses it, a changed one (another note, percent) gets a new
 *  one, as the service refuses a key reused for a different request. */
function keyFor(holder, request) {
  const text = JSON.stringify(request);
  if (holder.keyed !== text) {
    holder.keyed = text;
    holder.key = newKey();
  }
  return holder.key;
}

function field(label, id, control, hint) {
  return h("div", { class: "field" }, h("label", { for: id }, label), control,
    hint ? h("p", { class: "hint" }, hint) : null);
}

function button(label, attrs, onclick) {
  return h("button", { type: "button", ...attrs, onclick }, label);
}

/** A control of the console: only admins in scope get one (class ctl: a viewer's page
 *  has none, which the browser tests check). Its action is guarded: a failure to reach
 *  the service becomes a notice, never an unhandled rejection. */
function ctl(label, attrs, onclick) {
  return button(label, { ...attrs, class: `btn btn-small ctl ${attrs.class || ""}`.trim() },
    guarded(onclick));
}

function guarded(action) {
  return (...args) => Promise.resolve().then(() => action(...args)).catch((err) => {
    if (err instanceof StaleError) return; // signed out meanwhile: nothing to say
    notice(err instanceof ApiError ? describeFailure(err) : `Something went wrong: ${err}`,
      "error");
  });
}

function errorBox(id) {
  return h("p", { class: "form-error", id, role: "alert" });
}

function setError(id, text) {
  $(id).textContent = text || "";
}

// ---------------------------------------------------------------- controls on the panels

/** "New override" in the Overrides card, for admins. */
function renderOverrideTools() {
  // kept across refreshes (a live update redraws often): a new one would take the
  // keyboard's focus away from it
  if (isAdmin() && $("new-override")) return;
  $("overrides-tools").replaceChildren(...(isAdmin()
    ? [ctl("New override", { id: "new-override", class: "btn-primary" }, () => openEditor(null))]
    : []));
}

/** Edit and Remove (and the rollout's steering) on an override this token may write. */
function overrideActions(o) {
  if (!mayTouch(o.cluster)) return null;
  return h("div", { class: "override-actions" },
    ctl("Edit", { "data-act": "edit", "aria-label": `Edit override ${scopeText(o.cluster)}` },
      () => openEditor(o.cluster)),
    ctl("Remove", { "data-act": "remove", class: "btn-danger-quiet",
      "aria-label": `Remove override ${scopeText(o.cluster)}` }, () => openRemove(o.cluster)),
    rolloutActions(o.cluster, o.rollout));
}

/** What a rollout's state allows: halt or promote an active one, resume a halted one. */
function rolloutActions(scope, r) {
  if (!r || !mayTouch(scope)) return null;
  const buttons = [];
  if (r.state === "active") {
    buttons.push(ctl("Halt", { "data-act": "halt", class: "btn-danger-quiet",
      "aria-label": `Halt the rollout of ${scopeText(scope)}` },
    () => openRolloutAction(scope, "halt")));
    if (Number(r.percent) < 100) {
      buttons.push(ctl("Promote", { "data-act": "promote",
        "aria-label": `Promote the rollout of ${scopeText(scope)}` },
      () => openRolloutAction(scope, "promote")));
    }
  } else if (r.state === "halted") {
    buttons.push(ctl("Resume", { "data-act": "resume",
      "aria-label": `Resume the rollout of ${scopeText(scope)}` },
    () => openRolloutAction(scope, "resume")));
  }
  return buttons.length ? h("span", { class: "rollout-actions" }, buttons) : null;
}

/** Clear a situation's failure reports: evidence is fleet-wide per situation, so only
 *  an unrestricted admin may. */
function clearButton(g) {
  if (!mayEditFleet()) return null;
  return ctl("Clear", { "data-act": "clear", title: "Clear these failure reports",
    "aria-label": `Clear failures of ${g.backend} on ${situationText(g)}` },
    () => openClear(g));
}

// ---------------------------------------------------------------- the dry run's preview

/** What a dry run says: pods that would change, per cluster and from -> to, each with
 *  why they move (the service's decisions say it: what the change does against the
 *  backend they leave, the stage they enter, the reason for the new one); pods the
 *  change would refuse, with the reason; pods not counted and why. */
function previewView(p, { staged = false, verb = "change backend" } = {}) {
  const changes = [...(p.changes || [])].sort((a, b) =>
    a.cluster < b.cluster ? -1 : a.cluster > b.cluster ? 1 : b.pods - a.pods);
  const invalid = p.invalid || [];
  const parts = [
    h("p", { class: "preview-head" },
      h("strong", {}, `${p.pods_changed} of ${plural(p.pods_total, "pod")}`),
      ` would ${verb} at their next boot`,
      staged ? " (only pods in the stage are counted)" : "", "."),
  ];
  if (changes.length) {
    parts.push(h("div", { class: "table-wrap" }, h("table", { class: "table preview-table" },
      h("thead", {}, h("tr", {},
        h("th", { scope: "col" }, "Cluster"), h("th", { scope: "col" }, "From"),
        h("th", { scope: "col" }, h("span", { class: "sr-only" }, "to")),
        h("th", { scope: "col" }, "To"),
        h("th", { scope: "col", class: "num" }, "Pods"))),
      h("tbody", {}, changes.map((c) => [
        h("tr", { class: "change", "data-cluster": c.cluster, "data-from": c.from,
          "data-to": c.to, "data-pods": c.pods },
        h("td", { class: "mono" }, c.cluster), h("td", {}, backendTag(c.from)),
        h("td", { class: "arrow" }, "→"), h("td", {}, backendTag(c.to)),
        h("td", { class: "num" }, String(c.pods))),
        changeReasons(c),
      ])))));
  } else {
    parts.push(h("p", { class: "muted" }, "No pod would change."));
  }
  if (invalid.length) {
    parts.push(h("div", { class: "preview-invalid" },
      h("strong", {}, `${plural(p.pods_invalid, "pod")} would be refused a backend:`),
      h("ul", {}, invalid.map((i) =>
        h("li", { "data-cluster": i.cluster, "data-pods": i.pods },
          h("span", { class: "mono" }, i.cluster), `: ${plural(i.pods, "pod")} on `,
          backendTag(i.from), `: ${i.reason}`)))));
  }
  if (p.pods_pending) {
    parts.push(h("p", { class: "muted small" }, `${plural(p.pods_pending, "pod")} already ` +
      "run something other than what the configuration in force gives them (an earlier " +
      "change they have not rebooted into); they are counted from what they would get now."));
  }
  if (p.pods_unreadable) {
    parts.push(h("p", { class: "muted small" }, `${plural(p.pods_unreadable, "pod")} were ` +
      "recorded in a form this service cannot replay and are not counted."));
  }
  return h("div", { class: "preview", "data-changed": p.pods_changed, "data-total": p.pods_total,
    "data-invalid": p.pods_invalid }, parts);
}

/** The row under a change saying why its pods move: one line per group of alike
 *  decisions, with its pods when there is more than one. */
function changeReasons(c) {
  const groups = Array.isArray(c.reasons) ? c.reasons : [];
  if (!groups.length) return null;
  const many = groups.length > 1;
  // right under its change row (tr.change + tr.change-why), spanning the table
  return h("tr", { class: "change-why" }, h("td", { colspan: 5 },
    h("ul", { class: "why-list" }, groups.map((g) =>
      h("li", { "data-pods": g.pods },
        many ? h("span", { class: "why-pods" }, `${plural(g.pods, "pod")}: `) : null,
        (g.why || []).map((text, i) => [i ? h("span", { class: "sep", "aria-hidden": "true" },
          " · ") : null, h("span", { class: "why" }, text)]))))));
}

// ---------------------------------------------------------------- the override editor

const editor = {
  scope: null, // null: a new override (the scope is typed)
  etag: null, // If-Match: the ETag of the override as loaded, or "none" for a new one
  original: null,
  previewed: null, // the form as it was when previewed; Apply needs it unchanged
  spec: null, // what the preview was made of, sent as is by Apply
  keyed: null,
  key: null,
  applying: null, // the Apply in flight (a promise): its own change is not someone else's
  reads: 0, // showConflict's reads so far: only the latest one is shown
  refusing: null, // a refused Apply's read of their version, in flight (a promise)
  told: null, // the revision the change stream last told this editor of
};

/** Open the editor on ``scope``'s override (null: a new one), read fresh for its ETag. */
async function openEditor(scope) {
  let original = null;
  let etag = '"none"'; // what the store expects in If-Match for a scope without one
  if (scope !== null) {
    const r = await send("GET", `/v1/overrides/${enc(scope)}`);
    if (r.status === 404) {
      notice(`The override of ${scopeText(scope)} is gone: someone removed it.`, "warn");
      refreshAll();
      return;
    }
    if (!r.ok) {
      notice(`Could not read the override of ${scopeText(scope)}: ${r.message}`, "error");
      return;
    }
    original = r.body;
    etag = r.etag;
  }
  Object.assign(editor,
    { scope, etag, original, previewed: null, spec: null, applying: null, refusing: null,
      told: null });
  openDialog(scope === null ? "New override" : `Edit override: ${scopeText(scope)}`, "editor",
    editorForm(scope, original));
  (scope === null ? $("ed-scope") : $("ed-force")).focus();
}

/** Scopes a new override may name: the clusters this token may write that have none. */
function scopeChoices() {
  const clusters = Object.keys((state.summary && state.summary.clusters) || {}).sort();
  const taken = new Set(state.overrides.map((o) => o.cluster));
  const names = [...(mayEditFleet() ? ["*"] : []), ...clusters.filter((c) => mayTouch(c))];
  return names.filter((n) => !taken.has(n));
}

function editorForm(scope, o) {
  const spec = o || {};
  const r = spec.rollout || null;
  const backends = knownBackends();
  const scopeInput = scope === null
    ? h("input", { id: "ed-scope", list: "ed-scopes", required: true, spellcheck: "false",
      autocomplete: "off", placeholder: mayEditFleet() ? "cluster name, or * for the fleet"
        : "cluster name" })
    : h("input", { id: "ed-scope", value: scope, readonly: true });
  const form = h("form", { id: "editor", class: "editor", autocomplete: "off", novalidate: true },
    scope === null
      ? h("datalist", { id: "ed-scopes" }, scopeChoices().map((n) => h("option", { value: n })))
      : null,
    h("div", { class: "ed-grid" },
      field("Scope", "ed-scope", scopeInput,
        scope === null ? (mayEditFleet() ? "A cluster, or * for the whole fleet."
          : `Clusters this token may change: ${(state.me.clusters || []).join(", ")}.`)
          : null),
      field("Force", "ed-force", h("select", { id: "ed-force" },
        h("option", { value: "" }, "nothing forced"),
        backends.map((b) => h("option", { value: b, selected: spec.force === b }, b)))),
      field("Policy", "ed-policy", h("select", { id: "ed-policy" },
        h("option", { value: "" }, "as the rules say"),
        POLICIES.map((p) => h("option", { value: p, selected: spec.policy === p }, p)))),
      field("Models (glob)", "ed-model", h("input", { id: "ed-model", value: spec.model || "",
        placeholder: "every model", spellcheck: "false" }))),
    h("fieldset", { class: "ed-deny", id: "ed-deny" },
      h("legend", {}, "Deny"),
      backends.map((b) => h("label", { class: "check" },
        h("input", { type: "checkbox", value: b, checked: (spec.deny || []).includes(b) }),
        backendTag(b)))),
    h("div", { class: "ed-grid" },
      field("Trust evidence from (globs)", "ed-trust",
        h("input", { id: "ed-trust", value: (spec.trust_clusters || []).join(", "),
          placeholder: "the pod's own cluster", spellcheck: "false" }),
        "Under policy measured: whose benchmarks this scope's pods trust."),
      expiryField(spec)),
    field("Note (why: goes to the audit log)", "ed-note",
      h("textarea", { id: "ed-note", rows: 2, required: true, maxlength: 2000 }, spec.note || "")),
    rolloutFields(r),
    h("div", { class: "ed-result" },
      errorBox("ed-error"),
      h("div", { id: "ed-conflict", hidden: true }),
      h("div", { id: "ed-preview", class: "ed-preview" },
        h("p", { class: "muted" },
          "Preview the change to see the pods it moves before applying it."))),
    h("div", { class: "dialog-actions" },
      button("Cancel", { class: "btn btn-quiet", id: "ed-cancel" }, closeDialog),
      button("Preview", { class: "btn", id: "ed-preview-btn" }, guarded(previewEdit)),
      button(applyLabel(r, Boolean(r)), { class: "btn btn-primary", id: "ed-apply",
        disabled: true }, guarded(applyEdit))));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    guarded(previewEdit)();
  });
  // Any change after a preview makes it stale: Apply waits for a new one.
  form.addEventListener("input", editorChanged);
  form.addEventListener("change", editorChanged);
  return form;
}

/** The expiry: an override that has one keeps it unless the user picks another. One
 *  that already expired keeps it too (saving it as is is refused, with the reason), so an
 *  edit never turns an expired override back on, forever, without anyone choosing so. */
function expiryField(spec) {
  const keep = spec.expires_at || null;
  const expired = Boolean(keep) && (spec.expired || parseTime(keep) <= Date.now());
  const choices = [
    ...(keep ? [["keep", expired ? "keep: expired (choose another to apply it again)"
      : "keep the current expiry"]] : []),
    ...EXPIRY_CHOICES,
  ];
  const select = h("select", { id: "ed-expiry", "data-expired": String(expired) },
    choices.map(([v, label]) => h("option", { value: v, selected: v === (keep ? "keep" : "none") },
      label)));
  const at = h("input", { id: "ed-expiry-at", type: "datetime-local", hidden: true,
    "aria-label": "Expiry time, UTC" });
  const now = h("p", { class: "hint", id: "ed-expiry-now", "aria-live": "polite" });
  const show = () => expiryNow(now, select.value, keep, expired, at.value);
  select.addEventListener("change", () => {
    at.hidden = select.value !== "at";
    show();
  });
  at.addEventListener("input", show);
  show();
  return h("div", {}, field("Expires", "ed-expiry", h("div", { class: "inline-pair" }, select, at),
    "Times are UTC; an expired override is kept and shown, and ignored."), now);
}

/** The line under the expiry saying what the choice means now: the kept expiry, or the
 *  one a new choice gives (counted from the preview), never the old one once another is
 *  picked. */
function expiryNow(el, mode, keep, expired, atText) {
  el.classList.toggle("warn", mode === "keep" && expired);
  el.setAttribute("data-mode", mode);
  if (mode === "keep") {
    el.replaceChildren(expired ? timeEl(keep, "Expired ") : timeEl(keep, "Expires "),
      expired ? ": it applies to no pod." : ".");
  } else if (mode === "none") {
    el.replaceChildren(keep ? "No expiry: it applies until someone removes it." : "");
  } else if (mode === "at") {
    el.replaceChildren(atText
      ? timeEl(`${atText.length === 16 ? `${atText}:00` : atText}Z`, "Would expire ")
      : "Give the time (UTC).", atText ? "." : "");
  } else {
    el.replaceChildren(timeEl(new Date(Date.now() + EXPIRY_MS[mode]).toISOString(),
      "Would expire "), ", counted from the preview.");
  }
}

function rolloutFields(r) {
  const staged = h("input", { type: "checkbox", id: "ed-staged", checked: Boolean(r) });
  const num = (id, value, attrs) =>
    h("input", { id, type: "number", value: value ?? "", ...attrs });
  const box = h("div", { class: "ed-grid ed-rollout", id: "ed-rollout", hidden: !r },
    field("Stage: percent of pods", "ed-percent",
      num("ed-percent", r ? r.percent : 10, { min: 1, max: 100, step: 1 })),
    field("Halt after failures", "ed-max-failures",
      num("ed-max-failures", r ? r.max_failures : 1, { min: 1, step: 1 })),
    field("Halt when slower by (%)", "ed-max-slowdown",
      num("ed-max-slowdown", r ? r.max_slowdown_pct : 5, { min: 0.1, max: 100, step: "any" })),
    field("Steps (%)", "ed-steps", h("input", { id: "ed-steps",
      value: r && r.steps ? r.steps.join(", ") : "", placeholder: "e.g. 10, 50, 100" })),
    field("Promote every", "ed-step-every", h("input", { id: "ed-step-every",
      value: (r && r.step_every) || "", placeholder: "e.g. 30m, 2h, 1d" })),
    field("Guard clusters (globs)", "ed-guard", h("input", { id: "ed-guard",
      value: r && r.guard_clusters ? r.guard_clusters.join(", ") : "",
      placeholder: "every cluster it covers", spellcheck: "false" })));
  staged.addEventListener("change", () => {
    box.hidden = !staged.checked;
    $("ed-apply").textContent = applyLabel(r, staged.checked);
  });
  const halted = r && r.state === "halted";
  return h("div", { class: "ed-section" },
    h("label", { class: "check" }, staged,
      h("span", {}, "Stage it: apply to a share of the pods first, halted by guards")),
    halted ? h("p", { class: "hint warn" },
      "This rollout is halted: applying starts a new stage (failures and the stage " +
      "clock start again).")
      : null,
    box);
}

/** Apply's label says what applying does to a halted rollout: a PUT stores the rollout
 *  anew, active, so writing a halted override resumes it (staged: a new stage; not
 *  staged: on every pod of its scope). */
function applyLabel(r, staged) {
  if (!r || r.state !== "halted") return "Apply";
  return staged ? "Apply and resume the rollout" : "Apply and end the halt";
}

/** The warning above a halted override's preview: applying resumes it. */
function haltedWarning(spec) {
  const r = editor.original && editor.original.rollout;
  if (!r || r.state !== "halted") return null;
  return h("p", { class: "hint warn", id: "ed-resumes" }, spec.rollout
    ? `Applying resumes the halted rollout: a new ${spec.rollout.percent} % stage starts ` +
      "at once, with failures and the stage clock from zero."
    : "Applying ends the halt: the override applies to every pod of its scope, unstaged.");
}

/** The form's inputs as one string: a preview holds for exactly these. */
function editorState() {
  const form = $("editor");
  return JSON.stringify([...form.querySelectorAll("input, select, textarea")].map((el) =>
    (el.type === "checkbox" ? el.checked : el.value)));
}

function editorChanged() {
  if (editor.previewed === null) return;
  const stale = editorState() !== editor.previewed;
  $("ed-apply").disabled = stale;
  $("ed-preview").classList.toggle("stale", stale);
  const note = $("ed-stale");
  if (stale && !note) {
    $("ed-preview").prepend(h("p", { class: "stale-note", id: "ed-stale" },
      "The form changed since this preview: preview again before applying."));
  } else if (!stale && note) {
    note.remove();
  }
}

function splitList(text) {
  return text.split(/[\s,]+/).map((t) => t.trim()).filter(Boolean);
}

function numberOf(id, label, { integer = false } = {}) {
  const text = $(id).value.trim();
  const value = Number(text);
  if (text === "" || !Number.isFinite(value) || (integer && !Number.isInteger(value))) {
    throw new Error(`${label}: give ${integer ? "a whole number" : "a number"}.`);
  }
  return value;
}

/** The expiry as the API takes it (ISO, UTC), computed when the preview is made: the
 *  write then sends that same instant. */
function expiryValue() {
  const mode = $("ed-expiry").value;
  if (mode === "none") return null;
  if (mode === "keep") {
    const kept = editor.original.expires_at;
    if (parseTime(kept) <= Date.now()) {
      throw new Error("Expires: this override has expired; choose a new expiry, or no " +
        "expiry, to make it apply again.");
    }
    return kept;
  }
  if (mode === "at") {
    const text = $("ed-expiry-at").value;
    if (!text) throw new Error("Expires: give the time (UTC).");
    return `${text.length === 16 ? `${text}:00` : text}Z`;
  }
  return new Date(Date.now() + EXPIRY_MS[mode]).toISOString();
}

function readRollout() {
  const rollout = {
    percent: numberOf("ed-percent", "Stage percent", { integer: true }),
    max_failures: numberOf("ed-max-failures", "Halt after failures", { integer: true }),
    max_slowdown_pct: numberOf("ed-max-slowdown", "Halt when slower by"),
  };
  const steps = splitList($("ed-steps").value);
  if (steps.length) {
    rollout.steps = steps.map(Number);
    if (rollout.steps.some((n) => !Number.isInteger(n))) {
      throw new Error("Steps: whole percentages, e.g. 10, 50, 100.");
    }
  }
  const every = $("ed-step-every").value.trim();
  if (every) rollout.step_every = every;
  const guard = splitList($("ed-guard").value);
  if (guard.length) rollout.guard_clusters = guard;
  return rollout;
}

/** The override the form describes, as PUT /v1/overrides/{scope} takes it. */
function readSpec() {
  const v = (id) => $(id).value.trim();
  const note = v("ed-note");
  if (!note) throw new Error("Note: say why (it goes to the audit log).");
  const trust = splitList(v("ed-trust"));
  return {
    force: v("ed-force") || null,
    deny: [...$("ed-deny").querySelectorAll("input:checked")].map((el) => el.value),
    policy: v("ed-policy") || null,
    trust_clusters: trust.length ? trust : null,
    model: v("ed-model") || null,
    expires_at: expiryValue(),
    note,
    rollout: $("ed-staged").checked ? readRollout() : null,
  };
}

function editorScope() {
  const scope = editor.scope ?? $("ed-scope").value.trim();
  if (!scope) throw new Error("Scope: name a cluster.");
  if (!mayTouch(scope)) {
    throw new Error(scope === "*"
      ? "Only an admin token without a cluster limit may change the fleet override (*)."
      : `This token may not change ${scope}: it is limited to ` +
        `${(state.me.clusters || []).join(", ")}.`);
  }
  if (editor.scope === null && state.overrides.some((o) => o.cluster === scope)) {
    throw new Error(`${scopeText(scope)} already has an override: close this and edit it.`);
  }
  return scope;
}

async function previewEdit() {
  setError("ed-error", "");
  let scope;
  let spec;
  try {
    scope = editorScope();
    spec = readSpec();
  } catch (err) {
    setError("ed-error", err.message);
    return;
  }
  const seq = dialog.seq;
  const formState = editorState();
  $("ed-preview-btn").disabled = true;
  let r;
  try {
    r = await send("PUT", `/v1/overrides/${enc(scope)}?dry_run=true`, { body: spec });
  } catch (err) {
    if (dialogLive(seq)) actionFailed("ed-error", err);
    return;
  } finally {
    if (dialogLive(seq)) $("ed-preview-btn").disabled = false;
  }
  if (!dialogLive(seq)) return;
  if (!r.ok) {
    setError("ed-error", `Not previewed (${r.status}): ${r.message}`);
    return;
  }
  Object.assign(editor, { previewed: formState, spec, previewScope: scope });
  $("ed-preview").classList.remove("stale");
  $("ed-preview").replaceChildren(
    h("h3", {}, "Dry run: what applying does"),
    haltedWarning(spec) ?? "",
    previewView(r.body.preview, { staged: Boolean(spec.rollout) }));
  $("ed-apply").disabled = editorState() !== formState;
  $("ed-apply").focus();
}

async function applyEdit() {
  if (editor.spec === null || editorState() !== editor.previewed) return;
  setError("ed-error", "");
  const scope = editor.previewScope;
  const seq = dialog.seq;
  const apply = $("ed-apply");
  const key = keyFor(editor, [scope, editor.spec, editor.etag]);
  editor.applying = sendFromDialog(seq, "ed-error", apply, "PUT", `/v1/overrides/${enc(scope)}`,
    { body: editor.spec, ifMatch: editor.etag, key });
  const r = await editor.applying;
  editor.applying = null;
  if (r === null) return;
  if (r.status === 412) {
    editor.refusing = showConflict(scope, seq);
    await editor.refusing;
    editor.refusing = null;
    return;
  }
  if (!r.ok) {
    setError("ed-error", `Not applied (${r.status}): ${r.message}`);
    apply.disabled = false;
    return;
  }
  closeDialog();
  const p = r.body.preview;
  const rev = r.body.override && r.body.override.revision;
  notice(`Override ${scopeText(scope)} saved (rev ${rev}): ${p.pods_changed} of ` +
    `${plural(p.pods_total, "pod")} change backend at their next boot.`);
  await refreshAll();
  keepFocusAfterRefresh();
}

/** Someone changed (or removed) the override since the editor read it: told by the
 *  change stream while the person edits (``change``), or by a refused Apply (412, no
 *  ``change``). One box says it either way, with their version and one choice: load
 *  theirs, or keep the form as the change over theirs. Until the person chooses, the
 *  editor still sends the version it read, so an Apply is refused (412) and says so:
 *  the same outcome whichever came first, the stream's news or the Apply. Keeping the
 *  form asks for a new preview, since the fleet's answer may differ over theirs. */
async function showConflict(scope, seq, change = null) {
  if (!change) {
    $("ed-apply").disabled = true;
    editor.previewed = null;
  }
  const read = ++editor.reads;
  const r = await send("GET", `/v1/overrides/${enc(scope)}`);
  if (!dialogLive(seq) || read !== editor.reads) return; // a later read says it
  const box = $("ed-conflict");
  box.hidden = false;
  box.className = "conflict";
  if (change) box.setAttribute("data-underneath", change.action);
  else box.removeAttribute("data-underneath");
  const heading = change ? underneathLine(change)
    : h("p", {}, h("strong", {}, "Someone else changed it "), "since you opened it, and " +
      "nothing was applied.");
  const previewAgain = () => {
    editor.previewed = null;
    $("ed-apply").disabled = true;
    box.hidden = true;
  };
  if (r.status === 404) {
    box.setAttribute("data-current", "none");
    box.replaceChildren(heading,
      h("p", {}, `The override of ${scopeText(scope)} was removed since you opened it.`),
      h("div", { class: "dialog-actions" },
        button("Create it from my form", { class: "btn", id: "ed-conflict-mine" }, () => {
          editor.etag = '"none"';
          previewAgain();
          setError("ed-error", "Preview again: the fleet's answer may differ now.");
        })));
    return;
  }
  if (!r.ok) {
    box.replaceChildren(heading,
      h("p", {}, `Reading it again failed: ${r.message}`));
    return;
  }
  const theirs = r.body;
  box.setAttribute("data-current", theirs.revision);
  box.replaceChildren(heading,
    h("p", {}, `It is now rev ${theirs.revision}, set by ${theirs.created_by ?? "unknown"} `,
      timeEl(theirs.created_at), ":"),
    h("div", { class: "effects" }, overrideEffects(theirs)),
    theirs.rollout ? rolloutLine(theirs.rollout, Date.now()) : null,
    theirs.note ? h("p", { class: "note" }, theirs.note) : null,
    change ? h("p", { class: "hint" }, "Applying your form is refused until you choose: " +
      "load their version, or keep your changes and preview again.") : null,
    h("div", { class: "dialog-actions" },
      button("Keep my changes", { class: "btn", id: "ed-conflict-mine",
        title: "Apply your form over their version (after a new preview)" }, () => {
        editor.etag = r.etag;
        editor.original = theirs;
        previewAgain();
        setError("ed-error", "Preview again: your change now replaces their version.");
      }),
      button("Load their version", { class: "btn btn-primary", id: "ed-conflict-load" }, () => {
        Object.assign(editor, { etag: r.etag, original: theirs, previewed: null, spec: null });
        openDialog(`Edit override: ${scopeText(scope)}`, "editor", editorForm(scope, theirs));
        editor.scope = scope;
      })));
}

/** The stream's news of a change underneath: what, by whom, when. */
function underneathLine(change) {
  const who = change.by ? ` by ${change.by}` : "";
  const what = change.action === "delete" ? "Removed" : "Changed";
  return h("p", { class: "underneath" }, h("strong", {}, `${what}${who} `),
    timeEl(change.at || new Date().toISOString()), " while you were editing.");
}

/** A confirmation's 412 (or the override gone): say what it is now, and offer to look
 *  again, which reopens the same confirmation on the new version. */
async function staleAction(scope, errorId, seq, reopen) {
  const r = await send("GET", `/v1/overrides/${enc(scope)}`);
  if (!dialogLive(seq)) return;
  const o = r.ok ? r.body : null;
  const now = o && o.rollout ? `, its rollout ${o.rollout.state} at ${o.rollout.percent} %` : "";
  const text = r.status === 404
    ? "the override was removed since you opened this."
    : o ? `it is now rev ${o.revision}, set by ${o.created_by ?? "unknown"}${now}.`
      : "it changed since you opened this.";
  const old = $("action-conflict");
  if (old) old.remove();
  $(errorId).after(h("div", { class: "conflict", id: "action-conflict",
    "data-current": o ? o.revision : "none" },
  h("p", {}, h("strong", {}, "Someone else changed it: "), text, " Nothing was done."),
  o ? h("div", { class: "dialog-actions" },
    button("Look again", { class: "btn btn-primary", id: "action-reload" }, guarded(reopen)))
    : null));
}

/** The override a confirmation acts on was removed meanwhile: its dry run no longer
 *  holds, so it goes, the confirming button stays disabled, and the page offers to load
 *  the overrides again (the action's row is gone from them). */
function overrideGone(scope, prefix, seq) {
  if (!dialogLive(seq)) return;
  for (const id of [`${prefix}-preview`, `${prefix}-change`]) {
    if ($(id)) $(id).replaceChildren();
  }
  $(`${prefix}-confirm`).disabled = true;
  setError(`${prefix}-error`, "");
  const old = $("action-conflict");
  if (old) old.remove();
  $(`${prefix}-error`).after(h("div", { class: "conflict", id: "action-conflict",
    "data-current": "none", role: "alert" },
  h("p", {}, h("strong", {}, "The override was removed: "),
    `someone removed the override of ${scopeText(scope)} since you opened this. ` +
    "Nothing was done."),
  h("div", { class: "dialog-actions" },
    button("Reload the overrides", { class: "btn btn-primary", id: "action-reload" },
      guarded(async () => {
        closeDialog();
        await refreshAll();
        keepFocusAfterRefresh();
      })))));
}

function actionFailed(errorId, err) {
  if (err instanceof StaleError) return;
  setError(errorId, err.status === 0
    ? "The service cannot be reached: nothing is known to have changed. Try again " +
      "(it applies once)."
    : String(err.message || err));
}

/** The end of a dialog that confirms an audited write, its ids starting ``prefix``: the
 *  note (why, for the audit log), the error line, Cancel and the confirming button. */
function confirmEnd(prefix, label, attrs, confirm) {
  return [
    field("Note (why: goes to the audit log)", `${prefix}-note`,
      h("textarea", { id: `${prefix}-note`, rows: 2, maxlength: 2000 })),
    errorBox(`${prefix}-error`),
    h("div", { class: "dialog-actions" },
      button("Cancel", { class: "btn btn-quiet" }, closeDialog),
      button(label, { ...attrs, id: `${prefix}-confirm` }, guarded(confirm)))];
}

/** The note typed in such a dialog; null, said in its error line, when it is blank. */
function auditNote(prefix) {
  const note = $(`${prefix}-note`).value.trim();
  if (!note) setError(`${prefix}-error`, "Note: say why (it goes to the audit log).");
  return note || null;
}

/** Send the write a dialog confirms, its button disabled meanwhile. The answer, or null
 *  when there is none to show: the request failed (said in ``errorId``, the button
 *  enabled again: a retry with the same key applies once) or the dialog was closed or
 *  replaced while it was on its way. */
async function sendFromDialog(seq, errorId, confirm, method, path, options) {
  confirm.disabled = true;
  try {
    const r = await send(method, path, options);
    return dialogLive(seq) ? r : null;
  } catch (err) {
    if (dialogLive(seq)) {
      actionFailed(errorId, err);
      confirm.disabled = false;
    }
    return null;
  }
}

// ---------------------------------------------------------------- removing an override

async function openRemove(scope) {
  const got = await send("GET", `/v1/overrides/${enc(scope)}`);
  if (!got.ok) {
    notice(got.status === 404 ? `The override of ${scopeText(scope)} is already gone.`
      : `Could not read the override of ${scopeText(scope)}: ${got.message}`, "warn");
    refreshAll();
    return;
  }
  const holder = { keyed: null, key: null };
  const seq = openDialog(`Remove override: ${scopeText(scope)}`, "remove",
    h("p", {}, "Pods go back to what the rules give them, each at its next boot",
      got.body.rollout ? " (its rollout ends with it)" : "", "."),
    h("div", { id: "rm-preview", class: "ed-preview" }, h("p", { class: "muted" }, "Dry run…")),
    ...confirmEnd("rm", "Remove override", { class: "btn btn-danger", disabled: true },
      () => confirmRemove(scope, got.etag, holder, seq)));
  const dry = await send("DELETE", `/v1/overrides/${enc(scope)}?dry_run=true`);
  if (!dialogLive(seq)) return;
  if (!dry.ok) {
    setError("rm-error", `Dry run refused (${dry.status}): ${dry.message}`);
    return;
  }
  $("rm-preview").replaceChildren(h("h3", {}, "Dry run: what removing does"),
    previewView(dry.body.preview));
  $("rm-confirm").disabled = false;
}

async function confirmRemove(scope, etag, holder, seq) {
  const note = auditNote("rm");
  if (note === null) return;
  setError("rm-error", "");
  const r = await sendFromDialog(seq, "rm-error", $("rm-confirm"), "DELETE",
    `/v1/overrides/${enc(scope)}?note=${encodeURIComponent(note)}`,
    { ifMatch: etag, key: keyFor(holder, [scope, note, etag]) });
  if (r === null) return;
  if (r.status === 404) {
    overrideGone(scope, "rm", seq);
    return;
  }
  if (r.status === 412) {
    await staleAction(scope, "rm-error", seq, () => openRemove(scope));
    refreshAll();
    return;
  }
  if (!r.ok) {
    setError("rm-error", `Not removed (${r.status}): ${r.message}`);
    $("rm-confirm").disabled = false;
    return;
  }
  closeDialog();
  notice(`Override ${scopeText(scope)} removed: ${r.body.preview.pods_changed} of ` +
    `${plural(r.body.preview.pods_total, "pod")} change backend at their next boot.`);
  await refreshAll();
  keepFocusAfterRefresh();
}

// ---------------------------------------------------------------- halt, resume, promote

const ACTION_TEXT = {
  halt: ["Halt the rollout", "Halt rollout",
    "Every pod of the stage goes back to what it ran without the override, at its next " +
    "boot. The override stays, halted, until someone resumes it, writes it again or removes it."],
  resume: ["Resume the rollout", "Resume rollout",
    "A new stage starts: the stage's pods get the override again at their next boot, and " +
    "failures and the stage clock start from zero."],
  promote: ["Promote the rollout", "Promote",
    "The stage widens: every pod in it stays in, more join, each at its next boot; " +
    "failures and the stage clock start again (100 % completes it)."],
};

async function openRolloutAction(scope, action) {
  const got = await send("GET", `/v1/overrides/${enc(scope)}`);
  if (!got.ok || !got.body.rollout) {
    notice(`The rollout of ${scopeText(scope)} is gone or changed: look again.`, "warn");
    refreshAll();
    return;
  }
  const o = got.body;
  const r = o.rollout;
  const [title, verb, what] = ACTION_TEXT[action];
  const next = (r.steps || []).find((pct) => pct > r.percent);
  const ctx = { scope, action, etag: got.etag, rollout: r, keyed: null, key: null,
    verb, timer: null };
  const seq = openDialog(`${title}: ${scopeText(scope)}`, `rollout-${action}`,
    h("div", { class: "effects" }, overrideEffects(o)),
    rolloutLine(r, Date.now()),
    h("p", { class: "action-what" }, what),
    action === "promote"
      ? field("Promote to (%)", "ra-percent", h("input", { id: "ra-percent", type: "number",
        min: r.percent + 1, max: 100, step: 1, value: next ?? Math.min(100, r.percent * 2) }))
      : null,
    h("p", { id: "ra-change", class: "state-change" }),
    h("div", { id: "ra-preview", class: "ed-preview" }, h("p", { class: "muted" }, "Dry run…")),
    ...confirmEnd("ra", verb,
      { class: `btn ${action === "halt" ? "btn-danger" : "btn-primary"}`, disabled: true },
      () => confirmRolloutAction(ctx, seq)));
  ctx.seq = seq;
  if (action === "promote") {
    // a new target is a new dry run (after a pause in typing)
    $("ra-percent").addEventListener("input", () => {
      $("ra-confirm").disabled = true;
      clearTimeout(ctx.timer);
      ctx.timer = setTimeout(guarded(() => rolloutDryRun(ctx)), 300);
    });
  }
  await rolloutDryRun(ctx);
}

function rolloutBody(ctx, note) {
  const body = { action: ctx.action, note };
  if (ctx.action === "promote") body.percent = Number($("ra-percent").value);
  return body;
}

/** The confirmation's facts: the state the action would set and the pods it moves. */
async function rolloutDryRun(ctx) {
  const { seq } = ctx;
  setError("ra-error", "");
  const body = rolloutBody(ctx, DRY_RUN_NOTE);
  if (ctx.action === "promote" && !Number.isInteger(body.percent)) {
    setError("ra-error", "Promote to: a whole percentage.");
    return;
  }
  const r = await send("POST", `/v1/overrides/${enc(ctx.scope)}/rollout?dry_run=true`, { body });
  if (!dialogLive(seq)) return;
  if (r.status === 404) {
    overrideGone(ctx.scope, "ra", seq);
    return;
  }
  if (!r.ok) {
    $("ra-preview").replaceChildren();
    setError("ra-error", refusal(r));
    return;
  }
  const before = ctx.rollout;
  const after = r.body.rollout;
  ctx.percent = after.percent;
  $("ra-change").replaceChildren(
    "State ", rolloutBadge(before), h("span", { class: "arrow" }, " → "), rolloutBadge(after),
    ` · stage ${before.percent} % → ${after.percent} %`);
  $("ra-change").setAttribute("data-from", before.state);
  $("ra-change").setAttribute("data-to", after.state);
  $("ra-preview").replaceChildren(h("h3", {}, "Dry run: what it does"),
    previewView(r.body.preview));
  const confirm = $("ra-confirm");
  confirm.textContent = ctx.action === "promote" ? `Promote to ${after.percent} %` : ctx.verb;
  confirm.disabled = false;
}

/** A 409 is the state not allowing it ("only a halted rollout can be resumed"). */
function refusal(r) {
  return `${r.status === 409 ? "Not possible now" : `Refused (${r.status})`}: ${r.message}`;
}

async function confirmRolloutAction(ctx, seq) {
  const note = auditNote("ra");
  if (note === null) return;
  setError("ra-error", "");
  const body = rolloutBody(ctx, note);
  const confirm = $("ra-confirm");
  const r = await sendFromDialog(seq, "ra-error", confirm, "POST",
    `/v1/overrides/${enc(ctx.scope)}/rollout`,
    { body, ifMatch: ctx.etag, key: keyFor(ctx, [ctx.scope, body, ctx.etag]) });
  if (r === null) return;
  if (r.status === 404) {
    overrideGone(ctx.scope, "ra", seq);
    return;
  }
  if (r.status === 412) {
    await staleAction(ctx.scope, "ra-error", seq, () => openRolloutAction(ctx.scope, ctx.action));
    refreshAll();
    return;
  }
  if (r.status === 409) {
    // The dry run allowed it a moment ago: the rollout's state changed since (another
    // admin, or a guard halting it). Say why, and what it is now.
    setError("ra-error", refusal(r));
    await staleAction(ctx.scope, "ra-error", seq, () => openRolloutAction(ctx.scope, ctx.action));
    refreshAll();
    return;
  }
  if (!r.ok) {
    setError("ra-error", refusal(r));
    confirm.disabled = false;
    return;
  }
  closeDialog();
  const after = r.body.override.rollout;
  const p = r.body.preview;
  notice(`Rollout of ${scopeText(ctx.scope)}: ${after.state} at ${after.percent} % ` +
    `(rev ${r.body.override.revision}); ${p.pods_changed} of ${plural(p.pods_total, "pod")} ` +
    "change backend at their next boot.");
  await refreshAll();
  keepFocusAfterRefresh();
}

// ---------------------------------------------------------------- clearing failures

function openClear(g) {
  const holder = { keyed: null, key: null };
  const seq = openDialog(`Clear failure reports: ${g.backend}`, "clear",
    h("p", {}, `${plural(g.failures, "pod")} reported ${g.backend} failing in this situation:`),
    h("p", { class: "situation-what" }, situationText(g)),
    g.excluded ? h("p", { class: "excluded-reason" }, g.excluded) : null,
    g.not_excluded ? h("p", { class: "not-excluded-reason" }, g.not_excluded) : null,
    h("p", { class: "action-what" }, "Clearing them (after a fix: a new driver, a patched " +
      "kernel) lets measured selection pick the backend again, on every replica within the " +
      "poll interval. Every cleared report stays in the store."),
    ...confirmEnd("cf", "Clear failures", { class: "btn btn-danger" },
      () => confirmClear(g, holder, seq)));
  return seq;
}

async function confirmClear(g, holder, seq) {
  const note = auditNote("cf");
  if (note === null) return;
  const body = { device: g.device, capability: g.capability, dims: g.dims, dtype: g.dtype,
    packages: g.packages || {}, engine: g.engine, backend: g.backend, note };
  // only the failure reports this page showed: one reported since stays
  if (g.seen_through) body.seen_through = g.seen_through;
  const r = await sendFromDialog(seq, "cf-error", $("cf-confirm"), "POST",
    "/v1/measurements/failures/clear", { body, key: keyFor(holder, body) });
  if (r === null) return;
  if (!r.ok) {
    setError("cf-error", `Not cleared (${r.status}): ${r.message}`);
    $("cf-confirm").disabled = false;
    return;
  }
  closeDialog();
  notice(`Cleared ${plural(r.body.cleared ?? 0, "failure report")} of ${g.backend}.` +
    (r.body.message ? ` ${r.body.message}` : ""));
  await refreshAll();
  keepFocusAfterRefresh();
}

// ---------------------------------------------------------------- wiring

function initConsole() {
  $("dialog-close").addEventListener("click", closeDialog);
  // Escape closes a modal natively: forget what it held, like the close button does.
  $("dialog").addEventListener("close", () => {
    dialog.seq += 1;
    $("dialog-body").replaceChildren();
    returnFocus();
  });
}
