/*
 * Every book page: accessible names for the theme's buttons (axe-core rule
 * label-content-name-mismatch, serious): a button whose aria-label differs from the text it
 * shows is announced under a name a speech-input user cannot say. The search buttons show
 * "Search" and a keyboard shortcut: their name becomes their text. Buttons that show only an
 * icon keep their aria-label and hide the icon's tooltip text from assistive technology. Other
 * labelled buttons, links and <summary> toggles are named by the text they show.
 */
(function () {
  "use strict";
  const LABELLED = "button[aria-label], a[aria-label], summary[aria-label]";
  function fix() {
    for (const el of document.querySelectorAll(LABELLED)) {
      // an icon font script turns an <i title="Light"> into <svg><title>Light</title>: text
      // the button does not show, which would become part of its name
      for (const t of el.querySelectorAll("svg > title")) {
        t.parentElement.dataset.title = t.textContent;
        t.remove();
      }
      const label = el.getAttribute("aria-label").trim();
      const text = el.textContent.replace(/\s+/g, " ").trim();
      if (!text) {
        for (const icon of el.querySelectorAll("i, svg, span")) {
          if (!icon.textContent.trim()) icon.setAttribute("aria-hidden", "true");
        }
        for (const t of el.querySelectorAll("[title]")) {
          t.dataset.title = t.getAttribute("title");
          t.removeAttribute("title");
        }
        continue;
      }
      const [l, t] = [label.toLowerCase(), text.toLowerCase()];
      if (l.includes(t)) continue; // the name already holds the visible text
      // otherwise the name is the visible text (a <summary> shows "Show code cell source")
      el.removeAttribute("aria-label");
    }
  }
  // Font Awesome replaces the icons after DOMContentLoaded, at a moment that varies from run
  // to run (axe once found the theme button's name changed): fix again when the inside of a
  // labelled element changes (only those are watched, not the calculators' updates), at most
  // once a frame.
  let queued = false;
  function later() {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      fix();
    });
  }
  function start() {
    fix();
    const watch = new MutationObserver(later);
    for (const el of document.querySelectorAll(LABELLED)) {
      watch.observe(el, { childList: true, subtree: true });
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
