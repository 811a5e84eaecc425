#!/usr/bin/env bash
# Builds the pinned current gVisor runsc from the Go module proxy, statically (CGO_ENABLED=0: a
# cgo build is linked dynamically and cannot re-execute itself inside runsc's empty chroot), and
# keeps it in ~/.cache/evervm/runsc/<version>/runsc. Prints the binary's path on stdout.
#
# Go comes from scripts/go.sh (the installed one, or Go's own toolchain from the module proxy).
# Safe to run again: it does nothing when the binary is there. `--built` only prints its path, and
# fails when it has not been built yet.
set -euo pipefail

RUNSC_VERSION="${EVERVM_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/evervm"
target="$cache/runsc/$RUNSC_VERSION/runsc"

if [ -x "$target" ]; then
    echo "$target"
    exit 0
fi
[ "${1:-}" = --built ] && exit 1

go_bin="$("$(dirname "${BASH_SOURCE[0]}")/go.sh")"

echo "==> building gVisor runsc $RUNSC_VERSION statically (a few minutes, once)" >&2
work=$(mktemp -d)
# The module cache is read-only: make it writable to remove it.
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
GOPATH="$work/gopath" GOBIN="$work/bin" GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local \
    "$go_bin" install -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" \
    "gvisor.dev/gvisor/runsc@$RUNSC_VERSION" >&2
if ! file "$work/bin/runsc" | grep -q "statically linked"; then
    echo "error: the runsc built is not statically linked: $(file "$work/bin/runsc")" >&2
    exit 1
fi
mkdir -p "$(dirname "$target")"
cp "$work/bin/runsc" "$target.partial"
mv "$target.partial" "$target"
echo "$target"
