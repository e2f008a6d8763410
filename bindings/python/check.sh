#!/bin/sh
# Checks the Python package against an installed libmegatrain, as a user
# gets it: installs bindings/python with pip into a fresh virtual
# environment (Debian's python3-venv, with the system's site packages for
# NumPy and pytest; offline, no build isolation), runs its pytest suite
# against the library that pkg-config finds, then examples/python/train.py,
# whose output goes to OUTDIR/python.out for comparison with the other
# languages' examples.
#
#     PKG_CONFIG_PATH=PREFIX/lib/pkgconfig bindings/python/check.sh OUTDIR
#
# PYTHON picks the interpreter (default python3). Exits non-zero on any failure.
set -eu
[ $# -eq 1 ] || { echo "usage: PKG_CONFIG_PATH=... $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
pkg-config --exists megatrain || { echo "check.sh: pkg-config finds no megatrain (set PKG_CONFIG_PATH)" >&2; exit 1; }
prefix=$(pkg-config --variable=prefix megatrain)

# pip builds in the source folder (build/, *.egg-info): build from a copy
rm -rf "$out/venv" "$out/src"
mkdir -p "$out/src"
cp -r "$here/pyproject.toml" "$here/setup.py" "$here/README.md" "$here/megatrain" "$out/src/"
"$python" -m venv --system-site-packages "$out/venv"
"$out/venv/bin/python" -m pip install -q --no-index --no-build-isolation --disable-pip-version-check \
  "$out/src" > "$out/pip.log" 2>&1 || { cat "$out/pip.log"; echo "check.sh: pip install failed" >&2; exit 1; }
# the installed package, not the source folder's, from a folder of its own
cd "$out"
export PYTHONDONTWRITEBYTECODE=1
unset MEGATRAIN_LIBRARY
"$out/venv/bin/python" -c 'import megatrain, sys; print("check.sh: megatrain", megatrain.__version__, "loads", megatrain.library_path)'
MEGATRAIN_CLI="$prefix/bin/megatrain" MEGATRAIN_CFLAGS="$(pkg-config --cflags megatrain) -I$prefix/include" \
  "$out/venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$out" "$here/tests"
"$out/venv/bin/python" "$root/examples/python/train.py" > "$out/python.out" ||
  { cat "$out/python.out"; echo "check.sh: the Python example failed" >&2; exit 1; }
echo "check.sh: pip installed the package, pytest passed; the example trained: $(tail -n 1 "$out/python.out")"
