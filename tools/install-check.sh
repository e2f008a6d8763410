#!/bin/sh
# The library as a downstream project consumes it (run by `make check`):
# - installs into a scratch prefix and checks what was installed: the SONAME,
#   a .pc whose paths follow ${prefix} and that names no CUDA directory, the
#   man page (every option of `megatrain CMD --help` described in it);
# - builds examples/c against it through pkg-config, shared and static, and
#   the installed header alone as strict C99 and C++;
# - relocates the install (copies it elsewhere, sets only PKG_CONFIG_PATH) and
#   builds there again;
# - runs the same training run in C, C++ (include/megatrain.hpp), Rust (the
#   megatrain crate, offline against Debian's crates), Go (the megatrain
#   package) and Python (the megatrain package, pip-installed into a virtual
#   environment, with its pytest suite) and requires the same lines from each.
# Without cargo, go, or a python3 (PYTHON) with NumPy, pytest and venv those
# are skipped with a line saying so, unless MT_REQUIRE_BINDINGS=1 (CI), which
# makes a missing toolchain an error.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix" "$prefix.moved"' EXIT
make -s install PREFIX="$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
fail() { echo "install-check: $*"; exit 1; }

# what was installed
soname=$(readelf -d "$prefix/lib/libmegatrain.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libmegatrain.so.$(sed -n 's/^#define MT_VERSION_MAJOR *//p' include/megatrain.h)" ] || fail "bad SONAME $soname"
pc="$prefix/lib/pkgconfig/megatrain.pc"
grep -q '^libdir=${prefix}/lib$' "$pc" && grep -q '^includedir=${prefix}/include$' "$pc" ||
  fail "megatrain.pc does not write its paths relative to \${prefix}: $(grep dir= "$pc" | tr '\n' ' ')"
grep -q '^Requires.private: libcjson numa libpcre2-8 libutf8proc$' "$pc" ||
  fail "megatrain.pc lacks Requires.private: libcjson numa libpcre2-8 libutf8proc"
! grep -q cuda/ "$pc" || fail "megatrain.pc names a CUDA directory: $(grep cuda/ "$pc")"
man=$prefix/share/man/man1/megatrain.1
[ -f "$man" ] || fail "no man page at share/man/man1/megatrain.1"
if command -v groff >/dev/null 2>&1; then
  warnings=$(groff -man -ww -z "$man" 2>&1) && [ -z "$warnings" ] || fail "the man page has roff warnings: $warnings"
fi
for cmd in prepare train eval sample plan plot sft-data; do
  for opt in $("$prefix/bin/megatrain" "$cmd" --help 2>&1 | grep -o -- '--[a-z][a-z0-9-]*' | sort -u); do
    grep -q -- "$(printf '%s' "$opt" | sed 's/-/\\\\-/g')" "$man" || fail "the man page does not describe megatrain $cmd $opt"
  done
done
echo "install-check: installed: SONAME $soname, megatrain.pc relative to \${prefix}, the man page covers every option"

# a downstream C program: shared, static, and the header on its own
cc -Wall -Wextra -Werror examples/c/plan.c $(pkg-config --cflags --libs megatrain) -Wl,-rpath,"$prefix/lib" \
  -o "$prefix/plan"
"$prefix/plan" >/dev/null
# static: the archive and what `pkg-config --static` lists; the CUDA runtime's
# folder is the caller's to give (here through LIBRARY_PATH, from CUDA_HOME,
# which `make check` passes for a CUDA build), as the .pc does not hard-code it
LIBRARY_PATH="${CUDA_HOME:+$CUDA_HOME/lib64:}${LIBRARY_PATH:-}" \
  cc examples/c/plan.c $(pkg-config --cflags megatrain) "$prefix/lib/libmegatrain.a" \
  $(pkg-config --libs --static megatrain | sed 's/-lmegatrain//') -o "$prefix/plan-static"
"$prefix/plan-static" >/dev/null
cat > "$prefix/header.c" <<'EOF'
#include <megatrain.h>
int f(void);
int f(void) { mt_offload_policy p; mt_offload_policy_init(&p); return p.numa_node; }
EOF
cflags=$(pkg-config --cflags megatrain)
cc -std=c99 -pedantic -Wall -Wextra -Wconversion -Werror $cflags -c "$prefix/header.c" -o "$prefix/header.o"
c++ -x c++ -std=c++11 -pedantic -Wall -Wextra -Wconversion -Wold-style-cast -Werror $cflags \
  -c "$prefix/header.c" -o "$prefix/header-cxx.o"
echo "install-check: examples/c/plan.c built with pkg-config (shared and static), the header as C99 and C++"

# a relocated install: the new prefix is all pkg-config needs to be told
mv "$prefix" "$prefix.moved"
mkdir "$prefix"
PKG_CONFIG_PATH="$prefix.moved/lib/pkgconfig" sh -c '
  pc="pkg-config --define-variable=prefix=$1"
  cc examples/c/plan.c $($pc --cflags --libs megatrain) -Wl,-rpath,"$($pc --variable=libdir megatrain)" \
    -o "$1/plan-moved" && "$1/plan-moved" >/dev/null' sh "$prefix.moved" ||
  fail "the install does not work once moved with pkg-config --define-variable=prefix (megatrain.pc paths)"
rmdir "$prefix"
mv "$prefix.moved" "$prefix"
echo "install-check: the install works when moved, with pkg-config --define-variable=prefix=NEW"

# the same run in every language
missing() { # toolchain [what is missing]
  if [ "${MT_REQUIRE_BINDINGS:-0}" = 1 ]; then fail "${2:-$1} is missing (MT_REQUIRE_BINDINGS=1)"; fi
  echo "install-check: skipped the $1 bindings: ${2:-no $1 on PATH}"
}
out="$prefix/out"
mkdir -p "$out"
cc -Wall -Wextra -Werror examples/c/train.c $(pkg-config --cflags --libs megatrain) -Wl,-rpath,"$prefix/lib" \
  -o "$prefix/train-c"
"$prefix/train-c" > "$out/c.out" || { cat "$out/c.out"; fail "the C example failed"; }
langs="c"
binding() { # NAME SCRIPT: runs the bindings' own check, shows its summary (all of it on a failure)
  if "$2" "$out" > "$out/$1.log" 2>&1; then
    grep -E '^(hpp:|rust-check:|check.sh:|ok |test result:|[0-9]+ passed)' "$out/$1.log" | sed 's/^/  /'
    langs="$langs $1"
  else
    sed 's/^/  /' "$out/$1.log"
    fail "the $1 bindings failed (above)"
  fi
}
binding cpp tests/cpp/check.sh
if command -v cargo >/dev/null 2>&1; then binding rust bindings/rust/check.sh; else missing cargo; fi
if command -v go >/dev/null 2>&1; then binding go bindings/go/check.sh; else missing go; fi
if "${PYTHON:-python3}" -c 'import numpy, pytest, venv, ensurepip' >/dev/null 2>&1; then
  binding python bindings/python/check.sh
else
  missing python "${PYTHON:-python3} lacks NumPy, pytest or venv (python3-numpy, python3-pytest, python3-venv)"
fi
tail -n +2 "$out/c.out" > "$out/c.tail"
for l in $langs; do
  tail -n +2 "$out/$l.out" > "$out/$l.tail"
  diff "$out/c.tail" "$out/$l.tail" || fail "the $l example's run differs from C's (above)"
done
echo "install-check: the same run in $(echo "$langs" | sed 's/^c/C/; s/cpp/C++/; s/rust/Rust/; s/go/Go/; s/python/Python/') through the installed library, line for line: $(tail -n 1 "$out/c.out")"
