#!/usr/bin/env bash
# Run the time-travel demo: `scripts/demo.sh [tt-agent demo options]`.
#
# Creates or refreshes .venv at the repository root (Python 3.11+ from PATH:
# python3, else python3.13/3.12/3.11; or $PYTHON), installs the project into it
# (skipped while pyproject.toml is unchanged), then runs `tt-agent demo "$@"`
# in the directory it was started from. With nothing configured, the demo uses
# the embedded SQLite store .agent/checkpoints.sqlite under that directory and
# the offline model; set AGENT_DATABASE_URL / AGENT_MODEL / OPENAI_API_KEY to
# change that. Its last line is a command that shows the thread again, as it
# can be typed in the same shell.
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/_venv.sh

ensure_venv ""
tt_agent="$PWD/$VENV/bin/tt-agent"
cd "$caller_dir"
exec "$tt_agent" demo "$@"
