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
}

# The token interop test (tests/interop/test_privacypass.py) runs Cloudflare's independent Privacy
# Pass implementation under Node: install its locked packages (npm ci) when the lock file changed.
# Without Node the setup goes on and that test fails, naming what to install.
node_interop() {
    local dir=tests/interop/privacypass
    local stamp="$dir/node_modules/.ldpipe-installed"
    if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
        echo "== node/npm not found: install Node 20 for tests/interop/test_privacypass.py" >&2
        return 0
    fi
    if [ ! -f "$stamp" ] || [ "$dir/package-lock.json" -nt "$stamp" ]; then
        echo "== installing the token interop test's Node packages (npm ci in $dir)" >&2
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
        touch "$stamp"
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
        node_interop
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
        node_interop
        typecheck_tree
        ;;
    *)
        echo "usage: ./dev.sh demo | test [--slow] | setup" >&2
        exit 2
        ;;
esac
