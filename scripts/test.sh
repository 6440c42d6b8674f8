#!/usr/bin/env bash
# Run the test suite: `scripts/test.sh [pytest options and paths]`.
#
# Creates or refreshes .venv at the repository root (Python 3.11+ from PATH:
# python3, else python3.13/3.12/3.11; or $PYTHON), installs the project with
# its dev extra (skipped while pyproject.toml is unchanged), makes sure Postgres
# answers at AGENT_TEST_DATABASE_URL (default
# postgresql://postgres@127.0.0.1:5432/postgres; a local cluster that is down is
# started with pg_ctlcluster), installs PgBouncer when it is missing and this is
# a Debian/Ubuntu machine where we are root (its tests are skipped otherwise),
# then runs `python -m pytest "$@"` on $TEST_WORKERS pytest-xdist workers (default 4:
# most of the suite's time is servers, subprocesses and databases waiting, so more
# workers than the 2 CPUs of CI still shorten it; `-n 0` or `TEST_WORKERS=0` runs in
# one process, and a `-n` among the arguments wins), with `--dist loadgroup` (a `--dist` among the
# arguments wins).
# Exit code: pytest's, except that "no tests ran" (5) is a failure too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/_venv.sh
DEFAULT_TEST_DATABASE_URL="postgresql://postgres@127.0.0.1:5432/postgres"

masked() { sed -E 's#(://[^:/@]*):[^@/]*@#\1:***@#' <<<"$1"; }

# url_part URL FIELD: host or port of a libpq URL (defaults 127.0.0.1 / 5432).
url_part() {
    "$VENV/bin/python" - "$1" "$2" <<'PY'
import sys
from psycopg.conninfo import conninfo_to_dict
info = conninfo_to_dict(sys.argv[1])
print(info.get(sys.argv[2]) or {"host": "127.0.0.1", "port": "5432"}[sys.argv[2]])
PY
}

postgres_answers() {
    "$VENV/bin/python" - "$1" <<'PY' 2>/dev/null
import sys
import psycopg
psycopg.connect(sys.argv[1], connect_timeout=3).close()
PY
}

# Start the local cluster that serves the URL's port, if there is one and it is down.
start_local_cluster() {
    local url=$1 host port version cluster cport status
    host=$(url_part "$url" host)
    port=$(url_part "$url" port)
    case "$host" in 127.0.0.1 | localhost | ::1 | /*) ;; *) return 1 ;; esac
    command -v pg_lsclusters >/dev/null 2>&1 || return 1
    while read -r version cluster cport status _; do
        [[ $cport == "$port" && $status == down* ]] || continue
        echo "Starting the local Postgres cluster $version/$cluster on port $port"
        pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start || return 1
        for _ in $(seq 1 30); do
            if pg_isready -q -h "$host" -p "$port"; then
                return 0
            fi
            sleep 1
        done
        echo "The cluster $version/$cluster did not answer within 30 s" >&2
        return 1
    done < <(pg_lsclusters --no-header 2>/dev/null)
    return 1
}

ensure_postgres() {
    local url=$AGENT_TEST_DATABASE_URL
    postgres_answers "$url" && return 0
    if start_local_cluster "$url" && postgres_answers "$url"; then
        return 0
    fi
    cat >&2 <<MSG
error: Postgres is not reachable at AGENT_TEST_DATABASE_URL=$(masked "$url").
The tests need a Postgres server where they may create and drop databases. Either
  - start a local server on 127.0.0.1:5432 with a user postgres that may log in
    without a password (trust auth), e.g. sudo pg_ctlcluster <version> main start, or
  - point the tests at another server:
      export AGENT_TEST_DATABASE_URL=postgresql://USER:PASSWORD@HOST:PORT/postgres
and run scripts/test.sh again.
MSG
    exit 1
}

# PgBouncer for the transaction-mode pooler tests (tests/helpers/pgbouncer.py starts
# its own instance per test). Never fails the run: without it those tests skip.
have_pgbouncer() { command -v pgbouncer >/dev/null 2>&1 || [[ -x /usr/sbin/pgbouncer ]]; }

# Runs in a subshell so its trap removes a policy-rc.d it created, even on Ctrl-C.
install_pgbouncer() (
    local log=$1 own_policy=0
    # The package's maintainer scripts start a system pgbouncer (port 6432, /etc/pgbouncer)
    # through invoke-rc.d / deb-systemd-invoke. Tests never use it (each runs its own
    # instance on a free port), so it would only be a stray daemon outliving the run:
    # a policy-rc.d that exits 101 tells those tools not to start services during the install.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
    fi
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300)
    # Stale package lists make the install fail; refresh them once and retry.
    "${apt[@]}" install --no-install-recommends pgbouncer >"$log" 2>&1 ||
        { "${apt[@]}" update >>"$log" 2>&1 && "${apt[@]}" install --no-install-recommends pgbouncer >>"$log" 2>&1; } ||
        return 1
    # A pre-existing policy-rc.d may allow starts; then stop the service it started and keep it from
    # starting at boot.
    if [[ $own_policy -eq 0 ]]; then
        if [[ -d /run/systemd/system ]]; then
            systemctl disable --now pgbouncer >>"$log" 2>&1 || true
        elif [[ -x /etc/init.d/pgbouncer ]]; then
            /etc/init.d/pgbouncer stop >>"$log" 2>&1 || true
            update-rc.d pgbouncer disable >>"$log" 2>&1 || true
        fi
    fi
)

ensure_pgbouncer() {
    have_pgbouncer && return 0
    local why="" log
    log=$(mktemp)
    if ! command -v apt-get >/dev/null 2>&1; then
        why="it is not installed and apt-get is not available"
    elif [[ $(id -u) -ne 0 ]]; then
        why="it is not installed and installing it needs root (sudo apt-get install pgbouncer)"
    else
        echo "Installing PgBouncer (Debian package pgbouncer) for the transaction-mode pooler tests"
        if ! install_pgbouncer "$log" || ! have_pgbouncer; then
            why="apt-get install pgbouncer failed ($(grep -E '^(E|W):' "$log" | tail -n 1 || echo 'no error message'))"
        fi
    fi
    rm -f "$log"
    [[ -z $why ]] || echo "PgBouncer tests will be skipped: $why"
}

# Debian's chromium for the web page's browser tests (tests/web/ drive it with Playwright's Python package;
# they fail, not skip, without it). Installed when missing on a Debian/Ubuntu machine where we are root;
# elsewhere the message says what to install.
ensure_chromium() {
    [[ -x /usr/bin/chromium ]] && return 0
    if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) -eq 0 ]]; then
        echo "Installing Chromium (Debian package chromium) for the web page's browser tests"
        local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300)
        "${apt[@]}" install --no-install-recommends chromium >/dev/null 2>&1 ||
            { "${apt[@]}" update >/dev/null 2>&1 && "${apt[@]}" install --no-install-recommends chromium >/dev/null 2>&1; } ||
            echo "warning: apt-get install chromium failed; the browser tests (tests/web/) will fail" >&2
    else
        echo "warning: /usr/bin/chromium is missing (sudo apt-get install chromium); the browser tests (tests/web/) will fail" >&2
    fi
}

ensure_venv dev
export PATH="$PWD/$VENV/bin:$PATH"
# The suite starts hundreds of interpreters: let them cache the compiled project modules (an environment
# that sets PYTHONDONTWRITEBYTECODE would make each compile them again).
unset PYTHONDONTWRITEBYTECODE
export AGENT_TEST_DATABASE_URL="${AGENT_TEST_DATABASE_URL:-$DEFAULT_TEST_DATABASE_URL}"
ensure_postgres
ensure_pgbouncer
ensure_chromium

workers=(-n "${TEST_WORKERS:-4}")
# loadgroup: a module that starts a server for its tests runs on one worker and starts it once
# (tests/helpers/scheduling.py groups them, and puts the long units first); every other test goes
# to whichever worker is idle.
dist=(--dist loadgroup --no-loadscope-reorder)
for arg in "$@"; do
    case "$arg" in
        -n | -n* | --numprocesses*) workers=() ;;
        -d | --dist* | *no:xdist) dist=() ;;
    esac
done
# A short temporary root of this run's own: xdist adds popen-gwN/ to every tmp_path, and the CLI
# tests read paths in output that is wrapped at a fixed width when it is not a terminal.
basetemp=$(mktemp -d "${TMPDIR:-/tmp}/tt-XXXXXX")
# Tests marked `serial` restart shared services (the Postgres server), which would cut every other
# worker's connections: with workers, they run first, alone; then the rest in parallel. A run that
# selects its own markers (-m) runs as asked.
chooses_markers=0
for arg in "$@"; do
    case "$arg" in -m | -m*) chooses_markers=1 ;; esac
done
status=0
if [[ ${#workers[@]} -gt 0 && $chooses_markers -eq 0 ]]; then
    serial=0
    "$VENV/bin/python" -m pytest -p no:xdist -m serial --basetemp="$basetemp/serial" "$@" || serial=$?
    "$VENV/bin/python" -m pytest "${workers[@]}" "${dist[@]}" -m "not serial" --basetemp="$basetemp/t" "$@" || status=$?
    # Exit 5 (nothing selected) of one phase is fine when the other ran tests.
    if [[ $status -eq 5 && $serial -ne 5 ]]; then status=$serial; fi
    if [[ $status -eq 0 && $serial -ne 5 ]]; then status=$serial; fi
else
    "$VENV/bin/python" -m pytest "${workers[@]}" "${dist[@]}" --basetemp="$basetemp/t" "$@" || status=$?
fi
[[ $status -ne 0 ]] || rm -rf "$basetemp"
if [[ $status -eq 5 ]]; then
    echo "error: no tests ran (pytest exit code 5); check the paths and -k/-m filters" >&2
    exit 1
fi
exit "$status"
