#!/usr/bin/env bash
# Rebuild the web page (web/: Vite, React, assistant-ui) from its lockfile and compare it with the built
# page the Python package ships (agent/serving/web_assets/): fails, listing the differences, when they
# differ, so the shipped page is always the build of the source beside it. The same for the documentation
# site's Mermaid (docs/javascripts/mermaid.min.js, the lockfile's `mermaid`: the site draws its diagrams
# without a network).
#   scripts/check_web_build.sh           check (CI runs it from .ci/run)
#   scripts/check_web_build.sh --update  build into agent/serving/web_assets/ (after changing web/)
# Needs Node.js (20.19+) and npm; the build runs in a temporary copy of web/ (`npm ci`: exactly the lockfile).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
shipped=agent/serving/web_assets
mermaid=docs/javascripts/mermaid.min.js
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C web --exclude=node_modules --exclude=dist -cf - . | (mkdir -p "$work/web" && tar -C "$work/web" -xf -)
(cd "$work/web" && npm ci --no-audit --no-fund --loglevel=error >/dev/null && WEB_OUT_DIR="$work/out" npm run --silent build >/dev/null)
if [[ ${1:-} == --update ]]; then
    rm -rf "$shipped" && cp -r "$work/out" "$shipped"
    cp "$work/web/node_modules/mermaid/dist/mermaid.min.js" "$mermaid"
    echo "web page built into $shipped; $mermaid copied"
    exit 0
fi
if ! diff -r "$work/out" "$shipped"; then
    echo "The shipped web page ($shipped) is not the build of web/: run scripts/check_web_build.sh --update and commit." >&2
    exit 1
fi
if ! cmp "$work/web/node_modules/mermaid/dist/mermaid.min.js" "$mermaid"; then
    echo "$mermaid is not the lockfile's mermaid: run scripts/check_web_build.sh --update and commit." >&2
    exit 1
fi
echo "web page: the shipped build matches web/ ($(find "$shipped" -type f | wc -l) files)"
