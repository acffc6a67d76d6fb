#!/usr/bin/env bash
# Writes the option table the library prints (src/options.c) into
# docs/options.md, between its two markers: `make options-doc`.
set -euo pipefail
print_options=${1:-build/release/tests/print_options}
doc=${2:-docs/options.md}
table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$print_options" markdown >"$table"
awk -v table="$table" '
  /^<!-- options table: / { print; while ((getline line < table) > 0) print line; skipping = 1; next }
  /^<!-- end of the options table -->/ { skipping = 0 }
  !skipping' "$doc" >"$doc.new"
mv "$doc.new" "$doc"
