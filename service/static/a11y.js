// MLA Switchboard dashboard, part 4: scrolling regions a keyboard can reach. A table
// wider (or taller) than its box (a pod's candidates or a dry run's changes on a phone)
// scrolls only for a mouse unless it can take focus: such a box with nothing focusable
// inside gets a Tab stop and a name, so arrow keys scroll it; a box that fits gets none
// (no empty Tab stop). Runs after every redraw of the page (a MutationObserver) and on
// resize.
"use strict";

const SCROLL_BOX = ".table-wrap";
const FOCUSABLE = "a[href], button, input, select, textarea, summary, [tabindex]";

/** The name a screen reader gives the box: its card's or dialog's heading. */
function scrollBoxName(el) {
  const holder = el.closest("section, dialog");
  const heading = holder && holder.querySelector("h2, h3");
  const what = heading ? heading.textContent.trim() : "Table";
  return `${what}: table, scrolls`;
}

function markScrollBoxes() {
  for (const el of document.querySelectorAll(SCROLL_BOX)) {
    const scrolls = el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
    const marked = el.dataset.scrollStop === "1";
    if (scrolls && !marked && !el.hasAttribute("tabindex") && !el.querySelector(FOCUSABLE)) {
      el.setAttribute("tabindex", "0");
      el.setAttribute("role", "region");
      el.setAttribute("aria-label", scrollBoxName(el));
      el.dataset.scrollStop = "1";
    } else if (!scrolls && marked) {
      for (const a of ["tabindex", "role", "aria-label", "data-scroll-stop"]) el.removeAttribute(a);
    }
  }
}

(function watchScrollBoxes() {
  let queued = false;
  const soon = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      markScrollBoxes();
    });
  };
  new MutationObserver(soon).observe(document.documentElement, { childList: true, subtree: true });
  window.addEventListener("resize", soon);
})();
