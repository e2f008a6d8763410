#!/bin/sh
# The ABI check (docs/abi.md), with libabigail's abidw and abidiff.
#
#   tools/abi-check.sh LIB            compare LIB with every baseline in abi/;
#                                     fails with abidiff's report on a change
#                                     that is not an addition
#   tools/abi-check.sh --dump LIB libmegatrain-X.Y.Z
#                                     writes LIB's ABI and the header's
#                                     prototypes as the baseline of release
#                                     X.Y.Z: abi/libmegatrain-X.Y.Z.abi and .functions
#   tools/abi-check.sh --selftest     shows that the check tells the two apart:
#                                     in a scratch copy of the tree, a field
#                                     appended to an option struct and a new
#                                     function in a new version node pass, and
#                                     a program built against the 0.1.0 header
#                                     runs against that library; a field
#                                     inserted in the middle of a struct, a
#                                     field appended to the one struct without
#                                     struct_size, a retyped field, a changed
#                                     signature and a function dropped from
#                                     the version script each fail
#
# Each baseline abi/libmegatrain-X.Y.Z.abi is compared with its own
# abi/libmegatrain-X.Y.Z.suppr, where a later release changed something on
# purpose and says how old callers are served. A report that is empty once
# fields appended to structs with struct_size (abi/megatrain.suppr) and added
# functions (--no-added-syms) are set aside, and that shows nothing else,
# passes and is shown; any other report fails.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)

dump() { # LIB OUT [INCLUDE-DIR]
  abidw --headers-dir "${3:-$top/include}" --drop-private-types --no-corpus-path --no-comp-dir-path --short-locs \
    --out-file "$2" "$1"
}

# The exported functions' prototypes as the header writes them, one a line.
# abidiff 2.2 reads the baselines' XML without the parameters of functions
# (it reports neither an added parameter nor a changed one), so the released
# prototypes are kept beside each baseline and compared as text.
prototypes() { # HEADER
  awk '/^MT_API / { p = "" } p != "-" { p = p " " $0 } /;/ && p != "-" { print p; p = "-" } BEGIN { p = "-" }' "$1" |
    sed 's/^ *//; s/  */ /g; s/( /(/g' | sort
}

# What abidiff says of a change that is more than fields appended to a
# struct and functions added. abi/megatrain.suppr alone is not enough:
# libabigail 2.2 also lets it hide a field that changed type in such a struct,
# so the unsuppressed report is read for these as well.
NOT_ADDITIONS="data member (change|deletion)|offset changed|type of '|[1-9][0-9]* Removed|name changed"

check() { # LIB [INCLUDE-DIR]: 0 when compatible with every baseline
  lib=$1
  inc=${2:-$top/include}
  abidir=$top/abi
  tmp=$(mktemp -d)
  dump "$lib" "$tmp/current.abi" "$inc"
  status=0
  for base in "$abidir"/libmegatrain-*.abi; do
    name=$(basename "$base" .abi)
    set --
    [ -f "$abidir/$name.suppr" ] && set -- --suppressions "$abidir/$name.suppr"
    if abidiff "$@" "$base" "$tmp/current.abi" > "$tmp/report" 2>&1; then
      echo "abi-check: compatible with $name"
    elif abidiff "$@" --suppressions "$abidir/megatrain.suppr" --no-added-syms "$base" "$tmp/current.abi" \
        >/dev/null 2>&1 && ! grep -qE "$NOT_ADDITIONS" "$tmp/report"; then
      echo "abi-check: compatible with $name, with additions:"
      sed 's/^/  /' "$tmp/report"
    else
      echo "abi-check: INCOMPATIBLE with $name (abidiff's report follows; docs/abi.md says what may change)"
      sed 's/^/  /' "$tmp/report"
      status=1
    fi
    if [ -f "$abidir/$name.functions" ]; then
      prototypes "$inc/megatrain.h" > "$tmp/functions"
      if comm -23 "$abidir/$name.functions" "$tmp/functions" | grep . > "$tmp/lost"; then
        echo "abi-check: INCOMPATIBLE with $name: released functions changed or gone from include/megatrain.h:"
        sed 's/^/  /' "$tmp/lost"
        status=1
      fi
    else
      echo "abi-check: $name.functions is missing"
      status=1
    fi
  done
  rm -rf "$tmp"
  return $status
}

# --selftest ------------------------------------------------------------------
# A scratch copy of what the library's build reads, changed by a Python
# snippet, built for the CPU without optimisation, then checked.
variant() { # NAME PYTHON-SNIPPET -> builds $work/NAME/lib/libmegatrain.so.*
  v=$work/$1
  mkdir -p "$v"
  cp -R "$top/src" "$top/include" "$top/tools" "$top/Makefile" "$v/"
  (cd "$v" && python3 -c "$2" && tools/abi-layout.py > src/core/abi_layout.h &&
    make -s CUDA=0 OPT=-O0 CFLAGS=-g "lib/libmegatrain.so.$version" >"$v/build.log" 2>&1) ||
    { cat "$v/build.log"; echo "abi-check: the variant $1 did not build"; exit 1; }
}

expect() { # pass|fail NAME WHAT
  if check "$work/$2/lib/libmegatrain.so.$version" "$work/$2/include" > "$work/$2.out" 2>&1; then got=pass; else got=fail; fi
  if [ "$got" != "$1" ]; then
    cat "$work/$2.out"
    echo "abi-check: selftest: $3 should $1, and it did not"
    exit 1
  fi
  echo "abi-check: selftest: $3: $([ $got = pass ] && echo passes || echo fails), as it must"
  [ "$1" = fail ] && grep -m 3 -E "changed|Removed functions?:|offset|^  MT_API" "$work/$2.out" | sed 's/^/    /' || true
}

EDIT='
import re, sys
def sub(path, old, new):
    s = open(path).read()
    if old not in s: sys.exit("abi-check selftest: %r not in %s" % (old, path))
    open(path, "w").write(s.replace(old, new, 1))
'

selftest() {
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  version=$(sed -n 's/^#define MT_VERSION_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$top/include/megatrain.h" |
    paste -sd.)

  # allowed: a field appended to mt_optim_config, a function in a new node
  variant appended "$EDIT
sub('include/megatrain.h', '''    uint32_t reserved0;    /* zero */
} mt_optim_config;''', '''    uint32_t reserved0;    /* zero */
    float lookahead;
    uint32_t reserved1;
} mt_optim_config;''')
sub('include/megatrain.h', 'MT_API float mt_lr_at(', 'MT_API int32_t mt_new_function(void);\nMT_API float mt_lr_at(')
open('src/core/new_function.c', 'w').write('#include \"core/internal.h\"\nint32_t mt_new_function(void) { return 1; }\n')
open('src/megatrain.map', 'a').write('MEGATRAIN_9.9 {\n  global:\n    mt_new_function;\n} MEGATRAIN_0.1;\n')"
  expect pass appended "an appended field and a new function in a new node"

  # the program of 0.1.0 against that library: the issue this check exists for
  cc -std=c11 -I"$top/tests/abi" "$top/tests/abi/old_caller.c" -L"$work/appended/lib" -lmegatrain \
    -o "$work/old_caller"
  mkdir -p "$work/scratch"
  LD_LIBRARY_PATH="$work/appended/lib" "$work/old_caller" "$work/scratch" |
    sed 's/^/abi-check: selftest: against the grown library: /'

  # not allowed (a field inserted before the end of an option struct is
  # refused earlier, by src/core/abi.c's assertions, so these go where only
  # abidiff sees them)
  variant inserted "$EDIT
sub('include/megatrain.h', '''    double weights_end;
    double wait_seconds[MT_WAIT_CAPACITY];''', '''    double weights_end;
    double launched;
    double wait_seconds[MT_WAIT_CAPACITY];''')"
  expect fail inserted "a field inserted in the middle of mt_timeline_visit"

  variant visit_grown "$EDIT
sub('include/megatrain.h', '''    double wait_seconds[MT_WAIT_CAPACITY]; /* the compute stream's idle time just before it, by mt_wait */
} mt_timeline_visit;''', '''    double wait_seconds[MT_WAIT_CAPACITY]; /* the compute stream's idle time just before it, by mt_wait */
    double launched;
} mt_timeline_visit;''')"
  expect fail visit_grown "a field appended to mt_timeline_visit, an array element without struct_size"

  variant retyped "$EDIT
sub('include/megatrain.h', '    uint32_t warmup_steps;', '    float warmup_steps;')"
  expect fail retyped "mt_optim_config.warmup_steps retyped from uint32_t to float"

  variant signature "$EDIT
sub('include/megatrain.h', 'MT_API float mt_lr_at(const mt_optim_config *opt, uint64_t step);',
    'MT_API float mt_lr_at(const mt_optim_config *opt, uint32_t step);')
sub('src/core/options.c', 'float mt_lr_at(const mt_optim_config *src, uint64_t step)',
    'float mt_lr_at(const mt_optim_config *src, uint32_t step)')"
  expect fail signature "mt_lr_at's step narrowed to 32 bits"

  variant dropped "$EDIT
sub('src/megatrain.map', '    mt_lr_at;\n', '')"
  expect fail dropped "mt_lr_at dropped from the version script"
  echo "abi-check: selftest: 6 passed, 0 failed"
}

case "${1:-}" in
  --dump) [ $# = 3 ] || { echo "usage: $0 --dump LIB NAME (writes abi/NAME.abi and abi/NAME.functions)" >&2; exit 2; }
    dump "$2" "$top/abi/$3.abi"
    prototypes "$top/include/megatrain.h" > "$top/abi/$3.functions" ;;
  --selftest) selftest ;;
  ""|-*) echo "usage: $0 LIB | --dump LIB | --selftest" >&2; exit 2 ;;
  *) check "$1" ;;
esac
