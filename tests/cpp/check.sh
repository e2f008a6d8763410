#!/bin/sh
# Builds the C++ wrapper against an installed libmegatrain, found through
# pkg-config (PKG_CONFIG_PATH): include/megatrain.hpp on its own (twice into
# one program, which catches a definition that is not inline), the wrapper's
# test and examples/cpp/train.cpp; runs the test, then the example with its
# output in OUTDIR/cpp.out, for a comparison with the C example's.
#
#     PKG_CONFIG_PATH=PREFIX/lib/pkgconfig tests/cpp/check.sh OUTDIR
#
# CXX picks the compiler (default c++). Exits non-zero on any failure.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
cxx=${CXX:-c++}
pkg-config --exists megatrain || { echo "check.sh: pkg-config finds no megatrain (set PKG_CONFIG_PATH)" >&2; exit 1; }
libdir=$(pkg-config --variable=libdir megatrain)
mkdir -p "$out/include"
# This tree's megatrain.hpp, alone in a directory searched before the
# installed headers: the wrapper under test, with the installed megatrain.h.
cp "$root/include/megatrain.hpp" "$out/include/megatrain.hpp"
cxxflags="-std=c++17 -Wall -Wextra -pedantic -Werror"
cflags=$(pkg-config --cflags megatrain)
libs=$(pkg-config --libs megatrain)

echo '#include <megatrain.hpp>' > "$out/hpp_alone.cpp"
printf '#include <megatrain.hpp>\nint main() { return mt::model().get() != nullptr; }\n' > "$out/hpp_main.cpp"
# the header itself keeps to stricter warnings than the programs must
$cxx $cxxflags -I"$out/include" $cflags -Wconversion -Wold-style-cast -Wshadow -c "$out/hpp_alone.cpp" -o "$out/hpp_alone.o"
$cxx $cxxflags -I"$out/include" $cflags -c "$out/hpp_main.cpp" -o "$out/hpp_main.o"
$cxx "$out/hpp_alone.o" "$out/hpp_main.o" $libs -Wl,-rpath,"$libdir" -o "$out/hpp_alone"
"$out/hpp_alone"

# the test defines mt_model_destroy and mt_dataset_close, and finds the
# library's own through dlsym
$cxx $cxxflags -I"$out/include" $cflags "$root/tests/cpp/test_hpp.cpp" $libs -Wl,-rpath,"$libdir" -ldl -o "$out/test_hpp"
$cxx $cxxflags -I"$out/include" $cflags "$root/examples/cpp/train.cpp" $libs -Wl,-rpath,"$libdir" -o "$out/train-cpp"
"$out/test_hpp"
"$out/train-cpp" > "$out/cpp.out" || { cat "$out/cpp.out"; echo "check.sh: the C++ example failed" >&2; exit 1; }
echo "check.sh: built megatrain.hpp, the test and the example with $cxx; $(tail -n 1 "$out/cpp.out")"
