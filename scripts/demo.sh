#!/usr/bin/env bash
# Run the time-travel demo: `scripts/demo.sh [tt-agent demo options]`.
#
# Creates or refreshes .venv at the repository root (Python 3.11+ from PATH:
# python3, else python3.13/3.12/3.11; or $PYTHON), installs the project into it
# (skipped while pyproject.toml is unchanged), then runs `tt-agent demo "$@"`.
# With nothing configured, the demo uses the embedded SQLite store under
# ./.agent/ and the offline model; set AGENT_DATABASE_URL / AGENT_MODEL /
# OPENAI_API_KEY to change that.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

source scripts/_venv.sh

ensure_venv ""
export PATH="$PWD/$VENV/bin:$PATH"
exec "$VENV/bin/tt-agent" demo "$@"
