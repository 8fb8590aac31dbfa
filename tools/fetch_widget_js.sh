#!/usr/bin/env bash
# Fetch the JavaScript the built book needs from the npm registry, so that the
# HTML never loads a script from a CDN and works with no network:
#
#   @jupyter-widgets/html-manager  dist/embed-amd.js (+ its icon fonts): renders the
#                                  widget state stored in the notebooks
#   requirejs                      require.js: the AMD loader embed-amd.js expects
#   mathjax                        es5/tex-mml-chtml.js (+ fonts, extensions): math
#
# Usage: tools/fetch_widget_js.sh [DEST]   (default DEST: book/_widgets_js)
#
# DEST is listed in _config.yml as an html_static_path, so Sphinx copies it into
# _build/html/_static/. It must not be called _static: jupyter-book auto-includes
# every _static/*.js on every page, which would load the scripts twice.
# The versions are pinned; html-manager 1.0.x is the range ipywidgets 8.1 targets
# (ipywidgets/_version.py: __html_manager_version__ = "^1.0.1").
set -euo pipefail

HTML_MANAGER_VERSION="1.0.15"
REQUIREJS_VERSION="2.3.8"
MATHJAX_VERSION="3.2.2"

dest="${1:-book/_widgets_js}"
command -v npm >/dev/null || {
    echo "error: npm not found; install Node.js/npm (Debian: apt-get install -y npm)" >&2
    exit 1
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetching html-manager@$HTML_MANAGER_VERSION, requirejs@$REQUIREJS_VERSION, mathjax@$MATHJAX_VERSION from the npm registry"
(cd "$work" && npm pack --silent \
    "@jupyter-widgets/html-manager@$HTML_MANAGER_VERSION" \
    "requirejs@$REQUIREJS_VERSION" \
    "mathjax@$MATHJAX_VERSION" >/dev/null)

for name in html-manager requirejs mathjax; do
    mkdir -p "$work/$name"
    tar -xzf "$work"/*"$name"-*.tgz -C "$work/$name"
done

stage="$work/out"
mkdir -p "$stage/mathjax"
hm="$work/html-manager/package/dist"
cp "$hm/embed-amd.js" "$stage/"
# icon fonts referenced by embed-amd.js relative to its own location
find "$hm" -maxdepth 1 -type f \( -name '*.woff2' -o -name '*.woff' -o -name '*.ttf' \
    -o -name '*.eot' -o -name '*.svg' \) -exec cp {} "$stage/" \;
cp "$work/requirejs/package/require.js" "$stage/require.js"
mj="$work/mathjax/package/es5"
cp "$mj/tex-mml-chtml.js" "$stage/mathjax/"
# components MathJax loads on demand, relative to its own script (fonts, TeX
# extensions, the context menu and its accessibility helpers)
for sub in input output ui a11y sre adaptors; do
    cp -r "$mj/$sub" "$stage/mathjax/"
done
cat >"$stage/VERSIONS.txt" <<EOF
@jupyter-widgets/html-manager $HTML_MANAGER_VERSION
requirejs $REQUIREJS_VERSION
mathjax $MATHJAX_VERSION
EOF

for f in embed-amd.js require.js mathjax/tex-mml-chtml.js; do
    test -s "$stage/$f" || { echo "error: $f missing after fetch" >&2; exit 1; }
done

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$stage" "$dest"
touch "$dest/.fetched"
echo "widget and math JavaScript ready in $dest"
