#!/bin/sh
# Checks the API reference against the public header:
# - every function the header declares with MT_API has exactly one
#   "### mt_name" section in the page, and each section names a function of
#   the header;
# - each section has an "**Errors**" line and shows the header's prototype
#   in a code block (whitespace and comments aside);
# - every status value of the header (MT_OK, MT_ERR_*) has a row in the
#   page's status table (the table that lists MT_OK).
# Prints "check-api-doc: N functions documented" and exits 0 when all
# holds; otherwise names each problem and exits 1 (2 for bad usage).
#
#   tools/check-api-doc.sh [HEADER [DOC]]
#
# HEADER and DOC default to include/megatrain.h and docs/api.md of the
# repository that holds this script.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 2 ]; then
  echo "usage: $0 [HEADER [DOC]]" >&2
  exit 2
fi
header=${1:-$top/include/megatrain.h}
doc=${2:-$top/docs/api.md}
for f in "$header" "$doc"; do
  if [ ! -r "$f" ]; then
    echo "check-api-doc: cannot read $f" >&2
    exit 2
  fi
done
# names for messages: relative to the repository when inside it
show() {
  case $1 in
    "$top"/*) printf '%s\n' "${1#"$top"/}" ;;
    *) printf '%s\n' "$1" ;;
  esac
}
header_name=$(show "$header")
doc_name=$(show "$doc")

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The header's MT_API declarations, one per line (a declaration may span
# lines), without comments and with whitespace normalised; then
# "name<TAB>declaration", the name being the word before the first "(".
awk '/^MT_API / { p = "" } p != "-" { p = p " " $0 } /;/ && p != "-" { print p; p = "-" } BEGIN { p = "-" }' \
  "$header" > "$tmp/decls"
awk '
function norm(s) {
  gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", s) # C comments
  gsub(/[ \t]+/, " ", s)
  gsub(/\( /, "(", s); gsub(/ \)/, ")", s); gsub(/ ,/, ",", s); gsub(/ ;/, ";", s)
  sub(/^ /, "", s); sub(/ $/, "", s)
  return s
}
{
  d = norm($0)
  name = d
  sub(/\(.*/, "", name)
  sub(/.*[ *]/, "", name)
  print name "\t" d
}' "$tmp/decls" > "$tmp/functions"

# The status values: enum members MT_OK and MT_ERR_* defined with a value.
awk '/^[ \t]*MT_(OK|ERR_[A-Z_0-9]+)[ \t]*=/ {
  s = $0; sub(/^[ \t]*/, "", s); sub(/[ \t=].*/, "", s); print s
}' "$header" > "$tmp/statuses"

n_functions=$(wc -l < "$tmp/functions" | tr -d ' ')
n_statuses=$(wc -l < "$tmp/statuses" | tr -d ' ')
if [ "$n_functions" -eq 0 ] || [ "$n_statuses" -eq 0 ]; then
  echo "check-api-doc: $header_name declares no MT_API function or no MT_OK/MT_ERR_* value" >&2
  exit 2
fi

# The page: sections start at "### mt_name" (outside code blocks) and end at
# the next heading of level 1 to 3.
awk -v doc="$doc_name" -v hdr="$header_name" '
function norm(s) {
  gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", s)
  gsub(/[ \t]+/, " ", s)
  gsub(/\( /, "(", s); gsub(/ \)/, ")", s); gsub(/ ,/, ",", s); gsub(/ ;/, ";", s)
  sub(/^ /, "", s); sub(/ $/, "", s)
  return s
}
function bad(msg) { print "check-api-doc: " msg; problems++ }
# text holds word w, not as part of a longer identifier
function has_word(text, w,    p, i, b, a) {
  p = 0
  while ((i = index(substr(text, p + 1), w)) > 0) {
    i += p
    b = i > 1 ? substr(text, i - 1, 1) : ""
    a = substr(text, i + length(w), 1)
    if (b !~ /[A-Za-z_0-9]/ && a !~ /[A-Za-z_0-9]/) return 1
    p = i
  }
  return 0
}
function end_section() {
  if (sec == "") return
  if (!errors) bad(doc ":" sec_line ": the section of " sec " has no **Errors** line")
  if ((sec in decl) && index(norm(code), decl[sec]) == 0)
    bad(doc ":" sec_line ": the section of " sec " does not show the prototype of " hdr ":\n    " decl[sec])
  sec = ""
}
function end_table() {
  if (table != "" && status_table == "" && has_word(table, "MT_OK")) status_table = table
  table = ""
}
FILENAME == ARGV[1] { split($0, f, "\t"); decl[f[1]] = f[2]; order[++n] = f[1]; next }
FILENAME == ARGV[2] { status[++ns] = $0; next }
/^[ \t]*```/ { fence = !fence; end_table(); next }
fence { if (sec != "") code = code " " $0; next }
/^[ \t]*\|/ { table = table "\n" $0 } !/^[ \t]*\|/ { end_table() }
/^##?#? / {
  end_section()
  if ($0 ~ /^### *`?mt_/) {
    name = $0
    sub(/^### *`?/, "", name)
    sub(/[^A-Za-z_0-9].*$/, "", name)
    if (!(name in decl)) bad(doc ":" FNR ": section " name " names no function of " hdr)
    else if (name in seen) bad(doc ":" FNR ": " name " has a second section (the first is at line " seen[name] ")")
    else seen[name] = FNR
    sec = name; sec_line = FNR; errors = 0; code = ""
  }
  next
}
sec != "" && /^[ \t]*\*\*Errors\*\*/ { errors = 1 }
END {
  end_section()
  end_table()
  for (i = 1; i <= n; i++)
    if (!(order[i] in seen)) bad(doc ": " order[i] " (declared in " hdr ") has no ### section")
  if (status_table == "") bad(doc ": no status table (a table that lists MT_OK)")
  else
    for (i = 1; i <= ns; i++)
      if (!has_word(status_table, status[i])) bad(doc ": the status table lacks " status[i])
  if (problems) { print "check-api-doc: " problems " problem(s)"; exit 1 }
}' "$tmp/functions" "$tmp/statuses" "$doc" || exit 1

echo "check-api-doc: $n_functions functions documented"
