#!/bin/sh
# Builds and tests the Rust bindings (megatrain-sys, megatrain) offline
# against Debian's packaged crates and an installed libmegatrain, then runs
# the example:
#
#     PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig bindings/rust/check.sh OUTDIR
#
# Everything it writes goes under OUTDIR: a copy of this folder (cargo
# writes Cargo.lock beside Cargo.toml, and a lock from one cargo can refuse
# another's build), the target dir, and the example's stdout in
# OUTDIR/rust.out, whose lines after the first are those of
# examples/c/train.c. Uses cargo (and its rustc) from PATH. Warnings are
# errors. MT_CARGO_REGISTRY names another directory registry than Debian's.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: PKG_CONFIG_PATH=... $0 OUTDIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
registry=${MT_CARGO_REGISTRY:-/usr/share/cargo/registry}

command -v cargo >/dev/null 2>&1 || { echo "rust-check: no cargo on PATH" >&2; exit 1; }
[ -d "$registry" ] || {
  echo "rust-check: no crate registry at $registry (Debian: apt-get install librust-pkg-config-dev)" >&2
  exit 1
}
pkg-config --atleast-version=0.2 megatrain || {
  echo "rust-check: pkg-config finds no libmegatrain >= 0.2; point PKG_CONFIG_PATH at the folder holding megatrain.pc" >&2
  exit 1
}

src="$out/rust-src"
rm -rf "$src"
mkdir -p "$src"
cp -R "$here/Cargo.toml" "$here/megatrain-sys" "$here/megatrain" "$src/"

# crates.io replaced by the directory registry for these runs only: a normal
# build of the crates still resolves against crates.io.
mt_cargo() {
  sub=$1
  shift
  cargo "$sub" --offline \
    --config 'source.crates-io.replace-with="mt-directory"' \
    --config "source.mt-directory.directory=\"$registry\"" \
    --manifest-path "$src/Cargo.toml" --target-dir "$out/rust-target" "$@"
}

RUSTFLAGS="-D warnings"
RUSTDOCFLAGS="-D warnings"
export RUSTFLAGS RUSTDOCFLAGS
echo "rust-check: $(cargo --version), $(rustc --version), libmegatrain $(pkg-config --modversion megatrain)"
mt_cargo build --workspace --all-targets
# unit tests, the layout tests, the doc tests; the library is found through
# the rpath that the build scripts take from pkg-config's libdir
mt_cargo test --workspace
mt_cargo run -p megatrain --example train >"$out/rust.out" || {
  cat "$out/rust.out"
  echo "rust-check: the example failed" >&2
  exit 1
}
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --manifest-path "$src/Cargo.toml" --all -- --check
fi
echo "rust-check: built and tested megatrain-sys and megatrain; the example: $(tail -n 1 "$out/rust.out")"
