#!/usr/bin/env bash
# Render `grpokit report RUN_DIR` in headless Chromium: a screenshot, and a check that every image decoded.
#
#   scripts/screenshot_report.sh RUN_DIR [OUT_PNG] [WIDTHxHEIGHT]
#   scripts/screenshot_report.sh runs/demo docs/report_screenshot.png 1200x2400
#
# Needs Debian's chromium (apt-get install -y chromium). Prints "decoded N/N images" and the PNG size;
# exits 1 when an image did not decode. The screenshot is re-encoded with a 256-colour palette when it
# is over 500 KB (the docs limit).
set -euo pipefail

run_dir=${1:?usage: scripts/screenshot_report.sh RUN_DIR [OUT_PNG] [WIDTHxHEIGHT]}
out=${2:-report_screenshot.png}
size=${3:-1200x2400}
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z "$browser" ]]; then
  echo "error: chromium not found: apt-get update && apt-get install -y chromium" >&2
  exit 2
fi

python -m grpokit report "$run_dir" --out "$run_dir/report.html"
page=$(realpath "$run_dir/report.html")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update
       --disable-sync --no-first-run --hide-scrollbars "--user-data-dir=$tmp/profile")

# 1. Every <img> decoded? A copy of the page sets its title to "decoded K/N" once loaded.
sed 's#</body>#<script>window.onload=()=>{const im=[...document.images];document.title="decoded "+im.filter(i=>i.complete\&\&i.naturalWidth>0).length+"/"+im.length}</script></body>#' \
  "$page" > "$tmp/probe.html"
title=$(HOME=$tmp "$browser" "${flags[@]}" --dump-dom "file://$tmp/probe.html" 2>/dev/null \
        | grep -o '<title>decoded [0-9]*/[0-9]*</title>' | sed 's#<title>\(.*\)</title>#\1#')
echo "${title:-decoded ?/?} images"

# 2. The screenshot of the report itself.
HOME=$tmp "$browser" "${flags[@]}" "--screenshot=$tmp/shot.png" "--window-size=${size/x/,}" "file://$page" 2>/dev/null
mkdir -p "$(dirname "$out")"
python - "$tmp/shot.png" "$out" <<'EOF'
import os, sys
from PIL import Image
src, dst = sys.argv[1], sys.argv[2]
im = Image.open(src).convert("RGB")
im.save(dst, optimize=True)
if os.path.getsize(dst) > 500_000:  # the docs limit: a 256-colour palette keeps plots and text sharp
    im.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
print(f"screenshot {dst}: {im.size[0]}x{im.size[1]}, {os.path.getsize(dst) / 1024:.0f} KiB")
EOF

read -r ok total < <(echo "$title" | sed 's#decoded \([0-9]*\)/\([0-9]*\)#\1 \2#')
[[ -n "${total:-}" && "$ok" == "$total" && "$total" -gt 0 ]] || { echo "error: some images did not decode" >&2; exit 1; }
