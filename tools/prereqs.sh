#!/usr/bin/env bash
# Checks the system prerequisites of one make target before anything runs.
#
#   bash tools/prereqs.sh test        python3 with venv, bubblewrap with working user namespaces
#   bash tools/prereqs.sh book        python3 with venv, npm
#   bash tools/prereqs.sh test-slow   all of the above and chromium
#
# For each missing tool it prints one sentence with the command that installs it, and exits 1
# after listing them all. Running as root on a machine with apt-get (CI, a fresh container),
# it installs the missing Debian packages itself, as .ci/run does. SHARDLAB_NO_INSTALL=1 turns
# the installing off (only report).
set -uo pipefail

target="${1:-test}"
missing=()
packages=()

need() {  # need <command> <debian package> <sentence>
    command -v "$1" >/dev/null 2>&1 && return 0
    missing+=("$3")
    packages+=("$2")
}

check_all() {
    missing=()
    packages=()
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 \
        || { missing+=("python3 with venv and ensurepip is needed to create .venv: apt-get install python3-venv (or use a python.org / pyenv Python 3.10+)."); packages+=(python3-venv); }
    case "$target" in
        test|test-slow)
            need bwrap bubblewrap "bubblewrap is needed by the grader's tests (every submission is graded inside it): apt-get install bubblewrap (macOS: not available; run the grading tests on Linux)."
            ;;
    esac
    case "$target" in
        book|test-slow)
            need npm npm "npm is needed to fetch the widget JavaScript, MathJax and Pyodide for the book: apt-get install npm (or install Node.js from nodejs.org)."
            ;;
    esac
    if [ "$target" = test-slow ]; then
        need chromium chromium "chromium is needed by the live-calculator browser test in make test-slow: apt-get install chromium."
    fi
}

check_all
if [ "${#packages[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
        && [ "${SHARDLAB_NO_INSTALL:-0}" != 1 ]; then
    echo "prereqs: installing ${packages[*]} (running as root with apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
    check_all
fi

# bubblewrap present but unusable: a machine (or container) without unprivileged user
# namespaces. One sentence instead of one traceback per grading test.
if [[ "$target" == test* ]] && command -v bwrap >/dev/null 2>&1; then
    if ! err=$(bwrap --unshare-all --die-with-parent --ro-bind / / true 2>&1); then
        missing+=("bubblewrap is installed but cannot create a sandbox here (${err:-no message}): the machine must allow user namespaces (sysctl kernel.unprivileged_userns_clone=1, or run the tests in a container started with --privileged or a seccomp profile that allows unshare).")
    fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
    echo "make $target cannot run on this machine yet:" >&2
    for line in "${missing[@]}"; do echo "  - $line" >&2; done
    exit 1
fi
