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
  function fix() {
    for (const el of document.querySelectorAll("button[aria-label], a[aria-label], summary[aria-label]")) {
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
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", fix);
  else fix();
})();
