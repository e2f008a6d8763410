#!/bin/sh
# Installs the library into a scratch prefix and builds the C example against
# it through pkg-config, as a downstream project would; then checks that the
# shared library exports only the API. Run by `make check`.
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
soname=$(readelf -d "$prefix/lib/libmegatrain.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libmegatrain.so.$(sed -n 's/^#define MT_VERSION_MAJOR *//p' include/megatrain.h)" ] || { echo "bad SONAME $soname"; exit 1; }
echo "install-check: installed, built examples/c/plan.c with pkg-config (shared and static), SONAME $soname"
