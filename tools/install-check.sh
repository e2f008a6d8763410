#!/bin/sh
# Installs the library into a scratch prefix and builds the C example against
# it through pkg-config, as a downstream project would; compiles the installed
# header alone as C99 and C++; then checks the SONAME. Run by `make check`.
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
