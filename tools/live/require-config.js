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
  window.requirejs.config({ paths: { "@jupyter-widgets/html-manager/dist": staticURL } });
})();
