#!/bin/sh
# Installs the build and test dependencies from Debian's packages when they
# are missing. Needs root (or sudo) only when something must be installed.
set -eu
pkgs="build-essential pkg-config libnuma-dev libcriterion-dev libcjson-dev valgrind"
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
