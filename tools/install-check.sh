#!/bin/sh
# Installs the library into a scratch prefix and builds the C example against
# it through pkg-config, as a downstream project would; compiles the installed
# header alone as C99 and C++; checks the SONAME; then builds and runs the
# Rust and Go examples (FFI without generated bindings, and cgo) against the
# installed library and checks that both train the same model to the same
# losses. Without rustc or go those two are skipped with a line saying so,
# unless MT_REQUIRE_BINDINGS=1 (CI), which makes a missing toolchain an error.
# Run by `make check`.
set -eu
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
make -s install PREFIX="$prefix" >/dev/null
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cc -Wall -Wextra -Werror examples/c/plan.c $(pkg-config --cflags --libs megatrain) -Wl,-rpath,"$prefix/lib" -o "$prefix/plan"
"$prefix/plan" >/dev/null
# static: the archive plus the private libraries that pkg-config --static lists
cc examples/c/plan.c $(pkg-config --cflags megatrain) "$prefix/lib/libmegatrain.a" \
  $(pkg-config --libs --static megatrain | sed 's/-lmegatrain//') -o "$prefix/plan-static"
"$prefix/plan-static" >/dev/null
# the header defines the inline *_init functions: it must compile on its own
# as strict C99 and as C++, without warnings
cat > "$prefix/header.c" <<'EOF'
#include <megatrain.h>
int f(void);
int f(void) { mt_offload_policy p; mt_offload_policy_init(&p); return p.numa_node; }
EOF
cflags=$(pkg-config --cflags megatrain)
cc -std=c99 -pedantic -Wall -Wextra -Wconversion -Werror $cflags -c "$prefix/header.c" -o "$prefix/header.o"
c++ -x c++ -std=c++11 -pedantic -Wall -Wextra -Wconversion -Wold-style-cast -Werror $cflags \
  -c "$prefix/header.c" -o "$prefix/header-cxx.o"
soname=$(readelf -d "$prefix/lib/libmegatrain.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libmegatrain.so.$(sed -n 's/^#define MT_VERSION_MAJOR *//p' include/megatrain.h)" ] || { echo "bad SONAME $soname"; exit 1; }
echo "install-check: installed, built examples/c/plan.c with pkg-config (shared and static), the header as C99 and C++, SONAME $soname"

missing() { # toolchain
  if [ "${MT_REQUIRE_BINDINGS:-0}" = 1 ]; then echo "install-check: $1 is missing (MT_REQUIRE_BINDINGS=1)"; exit 1; fi
  echo "install-check: skipped the $1 example: no $1 on PATH"
}
libdir=$(pkg-config --variable=libdir megatrain)
langs=""
if command -v rustc >/dev/null 2>&1; then
  rustc --edition 2021 -O examples/rust/train.rs -L "$libdir" -C link-arg=-Wl,-rpath,"$libdir" \
    -o "$prefix/train-rs"
  "$prefix/train-rs" > "$prefix/rust.out" || { cat "$prefix/rust.out"; echo "install-check: the Rust example failed"; exit 1; }
  langs="$langs rust"
else
  missing rustc
fi
if command -v go >/dev/null 2>&1; then
  # a single-file build with no modules and no network, caches in the scratch prefix
  GO111MODULE=off GOPROXY=off GOCACHE="$prefix/gocache" GOPATH="$prefix/gopath" CGO_LDFLAGS="-Wl,-rpath,$libdir" \
    go build -o "$prefix/train-go" examples/go/train.go
  "$prefix/train-go" > "$prefix/go.out" || { cat "$prefix/go.out"; echo "install-check: the Go example failed"; exit 1; }
  langs="$langs go"
else
  missing go
fi
if [ "$langs" = " rust go" ]; then
  # the same calls with the same seed: every line after the greeting is the same
  tail -n +2 "$prefix/rust.out" > "$prefix/rust.tail"
  tail -n +2 "$prefix/go.out" > "$prefix/go.tail"
  diff "$prefix/rust.tail" "$prefix/go.tail" || { echo "install-check: the Rust and Go examples disagree (above)"; exit 1; }
fi
[ -n "$langs" ] && echo "install-check: examples in$langs trained through the installed library: $(tail -n 1 "$prefix/${langs##* }.out")"
exit 0
