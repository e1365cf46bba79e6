// MLA Switchboard dashboard, part 4: layout helpers shared by the read panels. One way
// to write a count (3,199 everywhere, not 3199 here and 3,199 there), the pod detail as
// a drawer beside the table (a jump of a page and a half down lost the reader's row),
// and a cue on tables that scroll sideways (on a phone nothing else says there is more).
"use strict";

const countFormat = new Intl.NumberFormat("en-US");

/** A count as every panel writes it: "3,199". */
function fmtCount(n) {
  const v = Number(n);
  return Number.isFinite(v) ? countFormat.format(v) : String(n ?? "–");
}

const drawer = { opener: null };

/** Open the decision detail as a drawer on the right, keeping the table in place. The
 *  detail card is the drawer (so lookups and row clicks share one view); ``opener`` gets
 *  focus back when it closes. */
function openPodDrawer(opener) {
  const card = $("detail-card");
  drawer.opener = opener || null;
  if (!card.classList.contains("drawer-open")) {
    card.classList.add("drawer-open");
    card.setAttribute("role", "dialog");
    card.setAttribute("aria-modal", "false");
    document.body.classList.add("has-drawer");
    $("detail-close").hidden = false;
  }
  placeDrawer();
  $("detail-close").focus({ preventScroll: true });
}

/** The drawer starts below the top bar while the bar is on screen (Sign out and Refresh
 *  stay in reach), at the top once it scrolled away. A CSSOM value: the CSP allows it. */
function placeDrawer() {
  const card = $("detail-card");
  if (!card.classList.contains("drawer-open")) return;
  const bar = document.querySelector(".topbar");
  card.style.top = `${Math.max(0, bar ? bar.getBoundingClientRect().bottom : 0)}px`;
}

function closePodDrawer() {
  const card = $("detail-card");
  if (!card.classList.contains("drawer-open")) return;
  card.classList.remove("drawer-open");
  card.removeAttribute("role");
  card.removeAttribute("aria-modal");
  card.style.top = "";
  document.body.classList.remove("has-drawer");
  $("detail-close").hidden = true;
  const back = drawer.opener;
  drawer.opener = null;
  // the row's button again, if the table still shows it (a refresh redraws rows)
  const target = back && back.isConnected ? back
    : back && back.dataset.pod ? document.querySelector(
      `#pods tr.pod-row[data-pod="${CSS.escape(back.dataset.pod)}"] button`) : null;
  if (target) target.focus({ preventScroll: true });
}

/** A horizontally scrolling table box gets ``scrolls-x`` (a fade and a hint on its right
 *  edge) while more of it lies to the right. */
function markSideScroll(box) {
  const more = box.scrollWidth - box.clientWidth - box.scrollLeft > 2;
  box.classList.toggle("scrolls-x", more);
}

function watchSideScroll() {
  let queued = false; // one check per frame, however many nodes changed
  const check = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      document.querySelectorAll(".table-wrap").forEach(markSideScroll);
    });
  };
  document.addEventListener("scroll", (ev) => {
    if (ev.target instanceof Element && ev.target.classList.contains("table-wrap")) {
      markSideScroll(ev.target);
    }
  }, true);
  new MutationObserver(check).observe(document.body, { childList: true, subtree: true });
  window.addEventListener("resize", check);
}

function initLayout() {
  $("detail-close").addEventListener("click", closePodDrawer);
  document.addEventListener("keydown", (ev) => {
    // a modal dialog (console.js) handles its own Escape first
    if (ev.key === "Escape" && !$("dialog").open) closePodDrawer();
  });
  watchSideScroll();
  window.addEventListener("scroll", placeDrawer, { passive: true });
  window.addEventListener("resize", placeDrawer);
}

initLayout();
