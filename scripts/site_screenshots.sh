#!/usr/bin/env bash
# Build the docs site (strict) and screenshot two of its pages in headless Chromium (issue 42: the site
# checked in a real browser). Needs `chromium` (Debian: apt-get install chromium).
#   bash scripts/site_screenshots.sh [OUT_DIR]      # default benchmarks/results/site
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-benchmarks/results/site}"
site="$(mktemp -d)"
python -m mkdocs build --strict -q -f mkdocs.yml -d "$site"
mkdir -p "$out"
for page in index.html api/index.html agents/index.html; do
    name="$(echo "${page%/index.html}" | sed 's/index.html/home/')"
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000 \
        --screenshot="$out/$name.png" "file://$site/$page" 2>/dev/null
    echo "$out/$name.png <- $page"
done
rm -rf "$site"
