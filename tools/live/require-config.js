/*
 * Loaded between require.js and embed-amd.js (_config.yml, nb_ipywidgets_js). embed-amd.js
 * finds its icon fonts next to the URL require.js gives its module
 * "@jupyter-widgets/html-manager/dist/libembed-amd": by default <page folder>/@jupyter-widgets/
 * html-manager/dist/, where nothing is served (six font 404s on every page). The fonts are in
 * _static/ (tools/fetch_widget_js.sh), two folders above this script.
 */
(function () {
  "use strict";
  const staticURL = new URL("..", document.currentScript.src).href.replace(/\/$/, "");
  const paths = { "@jupyter-widgets/html-manager/dist": staticURL };
  // The other modules embed-amd.js defines find their fonts the same way, next to their own
  // URL, which is <page folder>/@jupyter-widgets/ unless given here; the live calculators'
  // widget manager (shardlab-live.js) requires "@jupyter-widgets/html-manager" itself, and on a
  // fast (snapshot) start it does so before embed-amd has rendered the stored views: six font
  // 404s again. These names are only URLs for the fonts: embed-amd.js defines the modules.
  for (const name of ["base", "base7", "controls", "controls7", "html-manager"]) {
    paths["@jupyter-widgets/" + name] = staticURL + "/jupyter-widgets-" + name;
  }
  window.requirejs.config({ paths });
})();
