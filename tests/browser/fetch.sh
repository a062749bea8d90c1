#!/usr/bin/env bash
# Fetches what the Control UI browser test needs into a cache folder that
# git ignores (never committed): playwright-core (the driver; it drives the
# system Chromium, it downloads no browser) and the built Control UI files
# of the openclaw npm package. Idempotent: what is there is kept.
#
#   tests/browser/fetch.sh <cache-dir>
set -euo pipefail
cache=${1:?usage: fetch.sh <cache-dir>}
here=$(cd "$(dirname "$0")" && pwd)
openclaw_version=2026.9.6
mkdir -p "$cache"

if [ ! -f "$cache/node_modules/playwright-core/package.json" ] \
    || ! cmp -s "$here/package.json" "$cache/package.json"; then
    cp "$here/package.json" "$cache/package.json"
    npm install --prefix "$cache" --no-audit --no-fund --ignore-scripts --loglevel=error
fi

ui="$cache/openclaw-$openclaw_version"
if [ ! -f "$ui/package/dist/control-ui/index.html" ]; then
    pack=$(mktemp -d "$cache/pack.XXXXXX")
    trap 'rm -rf "$pack"' EXIT
    (cd "$pack" && npm pack "openclaw@$openclaw_version" --silent >/dev/null)
    rm -rf "$ui" && mkdir -p "$ui"
    tar -xzf "$pack/openclaw-$openclaw_version.tgz" -C "$ui" package/dist/control-ui package/LICENSE
fi
echo "$ui/package/dist/control-ui"
