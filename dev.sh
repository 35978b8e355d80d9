#!/usr/bin/env bash
# ldpipe's two commands for a new machine (Python 3.11 + pip is all it needs):
#   ./dev.sh demo            set up .venv and run the main job
#   ./dev.sh test            set up .venv and run lint, type checks and the default test suite
#   ./dev.sh test --slow     the slow statistical sweeps (CI runs both)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${LDPIPE_VENV:-.venv}"
PY="${PYTHON:-python3}"

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        echo "== creating $VENV" >&2
        "$PY" -m venv "$VENV"
    fi
    local stamp="$VENV/.ldpipe-installed"
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "== installing ldpipe and its dependencies into $VENV" >&2
        "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
        # setuptools says "Editable installation. Please be careful with folders ... named as
        # your package" after every editable install, whatever the project (there is no folder
        # named ldpipe here): that one notice is silenced by its text, any other warning shows
        PYTHONWARNINGS="ignore:Editable installation.:UserWarning" \
            "$VENV/bin/python" -m pip install --quiet -e ".[broker,test]" >&2
        touch "$stamp"
    fi
    interop_setup
}

# the Node projects, installed from their package-lock.json: the interop tests' independent
# implementations (tests/interop/*/package.json), the TypeScript device SDK (producers/web,
# which is then built into producers/web/dist) and the browser test's driver (tests/browser:
# puppeteer-core, which downloads no browser; it drives Debian's /usr/bin/chromium, installed
# with `apt-get install chromium`); without Node.js their tests are skipped and say so
interop_setup() {
    if ! command -v npm >/dev/null 2>&1; then
        echo "== npm not found: the Node interop tests (tests/interop/) and the TypeScript SDK's tests (producers/web) will fail, naming Node" >&2
        return 0
    fi
    local project
    for project in tests/interop/*/package-lock.json producers/web/package-lock.json \
        tests/browser/package-lock.json; do
        [ -f "$project" ] || continue
        local dir
        dir="$(dirname "$project")"
        if [ ! -d "$dir/node_modules" ] || [ "$project" -nt "$dir/node_modules" ]; then
            echo "== npm ci in $dir" >&2
            (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
            touch "$dir/node_modules"
        fi
        if [ -f "$dir/build.mjs" ]; then
            (cd "$dir" && node build.mjs >&2)
        fi
    done
    if [ ! -x "${LDPIPE_CHROMIUM:-/usr/bin/chromium}" ]; then
        echo "== chromium not found: the slow browser test (tests/integration/test_web_browser.py) will fail; apt-get install chromium" >&2
    fi
}

# mypy cannot follow the editable install's import hook (the folders producers/ ... infra/ are
# installed as ldpipe.producers ... ldpipe.infra), so it reads them through links named as
# installed: build/typecheck/ldpipe/<folder> (pyproject.toml, [tool.mypy] mypy_path)
typecheck_tree() {
    local dir=build/typecheck/ldpipe
    mkdir -p "$dir"
    for package in producers shuffler aggregator discovery schemas infra; do
        ln -sfn "../../../$package" "$dir/$package"
    done
}

cmd="${1:-}"
shift || true
case "$cmd" in
    demo)
        setup
        exec "$VENV/bin/ldpipe" demo "$@"
        ;;
    test)
        setup
        if [ "${1:-}" = "--slow" ]; then
            shift
            exec "$VENV/bin/python" -m pytest -m slow -n 2 "$@"
        fi
        echo "== ruff" >&2
        "$VENV/bin/ruff" check .
        echo "== import layers (lint-imports)" >&2
        "$VENV/bin/lint-imports" --no-cache
        echo "== mypy" >&2
        typecheck_tree
        "$VENV/bin/mypy"
        echo "== pytest (default suite)" >&2
        exec "$VENV/bin/python" -m pytest -m "not slow" -n 2 "$@"
        ;;
    setup)
        setup
        typecheck_tree
        ;;
    *)
        echo "usage: ./dev.sh demo | test [--slow] | setup" >&2
        exit 2
        ;;
esac
