#!/bin/sh
# The library exports exactly the functions that the header declares, each
# under the version node of src/megatrain.map that lists it, and nothing else
# (docs/abi.md). Run by `make check-exports`.
#
#   tools/check-exports.sh LIB
set -eu
lib=$1
top=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the header: every MT_API declaration's function name
awk '/^MT_API / { p = "" } p != "-" { p = p " " $0 } /;/ && p != "-" { print p; p = "-" } BEGIN { p = "-" }' \
  "$top/include/megatrain.h" | sed -E 's/^.*[ *]([a-z_0-9]+)\(.*$/\1/' | sort > "$tmp/header"
# the version script: names listed under global:, with their node
awk '/^[A-Z_0-9.]+ *\{/ { node = $1 } /global:/ { g = 1; next } /local:|\}/ { g = 0 }
     g && /^ *mt_[a-z_0-9]+;/ { gsub(/[ ;]/, ""); print $0 "@@" node }' "$top/src/megatrain.map" | sort > "$tmp/map"
# the library: defined dynamic symbols
nm -D --defined-only "$lib" | awk '$2 != "A" { print $3 }' | sort > "$tmp/exports"
status=0
sed 's/@@.*//' "$tmp/map" > "$tmp/map-names"
if ! diff -u "$tmp/header" "$tmp/map-names" > "$tmp/d1"; then
  echo "check-exports: include/megatrain.h and src/megatrain.map list different functions"
  echo "  (+ only in the map, - only in the header; a new function goes into a new node):"
  sed -n 's/^\([-+]mt_\)/  \1/p' "$tmp/d1"
  status=1
fi
if ! diff -u "$tmp/map" "$tmp/exports" > "$tmp/d2"; then
  echo "check-exports: $lib does not export exactly what src/megatrain.map lists, at its node"
  echo "  (- listed but not exported so, + exported but not listed):"
  sed -n 's/^\([-+][^-+]\)/  \1/p' "$tmp/d2"
  status=1
fi
[ $status = 0 ] && echo "check-exports: $(wc -l < "$tmp/exports") functions, each declared in the header and" \
  "listed at its node ($(sed 's/.*@@//' "$tmp/exports" | sort -u | paste -sd' ')), nothing else"
exit $status
