# Shared by scripts/demo.sh and scripts/test.sh (sourced, not run): the .venv they use.
# Creates or refreshes .venv at the repository root with Python 3.11+ from PATH
# (python3, else python3.13/3.12/3.11; or $PYTHON) and installs the project into
# it with uv (installed from PyPI into the venv first: it installs and compiles the
# project's dependencies in about 20 s where pip takes well over a minute, and the
# test command's whole run is kept within 10 minutes), skipping the install while
# pyproject.toml is unchanged.

VENV=.venv
STAMP="$VENV/.timetravel-install"

die() { echo "error: $*" >&2; exit 1; }

find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

# ensure_venv EXTRA: EXTRA is "" (the package) or "dev" (with the test dependencies).
ensure_venv() {
    local extra=$1 python digest
    if ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        python=$(find_python) || die "Python 3.11 or newer is required; none was found as python3, python3.13, python3.12 or python3.11 (python3 is $(python3 --version 2>&1 || echo 'missing')). Install one, or set PYTHON=/path/to/python3.11."
        echo "Creating $VENV with $python ($("$python" --version 2>&1))"
        rm -rf "$VENV"
        "$python" -m venv "$VENV"
    fi
    digest=$("$VENV/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
    # A dev install also serves the demo; the demo's install does not serve the tests.
    if [[ -f "$STAMP" ]] && { grep -qx "$digest dev" "$STAMP" || { [[ -z $extra ]] && grep -qx "$digest base" "$STAMP"; }; }; then
        return 0
    fi
    echo "Installing timetravel-agent${extra:+ with its $extra extra} into $VENV"
    if [[ ! -x "$VENV/bin/uv" ]]; then
        # pip's output is shown only when it fails (a machine's own pip settings may warn about local indexes).
        local out
        out=$("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check uv 2>&1) ||
            die "installing uv into $VENV failed:"$'\n'"$out"
    fi
    # --compile-bytecode: pip compiles at install, uv does not; without the .pyc files, and with
    # PYTHONDONTWRITEBYTECODE set, every interpreter compiles MLflow and LangGraph again (about 2.8 s of
    # CPU more per process that imports them, and the test suite starts hundreds).
    "$VENV/bin/uv" pip install --quiet --compile-bytecode --python "$VENV/bin/python" -e ".${extra:+[$extra]}"
    echo "$digest ${extra:-base}" >"$STAMP"
}
