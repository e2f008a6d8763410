#!/bin/sh
# Installs the build and test dependencies from Debian's packages when they
# are missing. Needs root (or sudo) only when something must be installed.
#   build: a C compiler, pkg-config, libnuma, cJSON
#   tests: Criterion, valgrind (make memcheck), libabigail's abidw/abidiff and
#          python3 (the ABI check), groff (the man page's check)
#   bindings: golang-go, and cargo with the Rust crates Debian packages
#          (offline builds against /usr/share/cargo/registry); a cargo already
#          on PATH is used as it is, with the packaged crates
set -eu
pkgs="build-essential pkg-config libnuma-dev libcriterion-dev libcjson-dev valgrind abigail-tools python3 groff-base
golang-go librust-pkg-config-dev"
command -v cargo >/dev/null 2>&1 || pkgs="$pkgs cargo"
missing=""
for p in $pkgs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "setup: installing$missing"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends $missing
