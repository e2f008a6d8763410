#!/bin/sh
# Checks the Go package against an installed libmegatrain: gofmt, go vet,
# go test, then builds and runs examples/train, whose output goes to
# OUTDIR/go.out for comparison with the other languages' examples.
#
#     PKG_CONFIG_PATH=PREFIX/lib/pkgconfig bindings/go/check.sh OUTDIR
#
# Offline: the module has no dependencies, GOPROXY is off and the caches are
# kept under OUTDIR. Binaries get an rpath to the library's directory, so
# they run without LD_LIBRARY_PATH. Exits non-zero on any failure.
set -eu

if [ $# -ne 1 ]; then
  echo "usage: PKG_CONFIG_PATH=... $0 OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd) # absolute: go runs in the module's directory
cd "$(dirname "$0")"

if ! pkg-config --exists megatrain; then
  echo "check.sh: pkg-config cannot find megatrain (set PKG_CONFIG_PATH)" >&2
  exit 1
fi
libdir=$(pkg-config --variable=libdir megatrain)

export GOCACHE="$out/gocache" GOPATH="$out/gopath" GOPROXY=off GOTOOLCHAIN=local GOWORK=off GO111MODULE=on
export GOFLAGS='' CGO_ENABLED=1
export CGO_LDFLAGS="${CGO_LDFLAGS:+$CGO_LDFLAGS }-Wl,-rpath,$libdir"

unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "check.sh: gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
go test -count=1 ./...
go build -o "$out/train-go" ./examples/train
if ! "$out/train-go" > "$out/go.out"; then
  cat "$out/go.out"
  echo "check.sh: the Go example failed" >&2
  exit 1
fi
echo "check.sh: gofmt, vet and tests passed; the example trained: $(tail -n 1 "$out/go.out")"
