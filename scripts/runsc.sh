#!/usr/bin/env bash
# Builds the pinned current gVisor runsc from the Go module proxy, statically (CGO_ENABLED=0: a
# cgo build is linked dynamically and cannot re-execute itself inside runsc's empty chroot), and
# keeps it in ~/.cache/evervm/runsc/<version>-<recipe>/runsc. Prints the binary's path on stdout.
#
# The module's source is copied and given what gVisor's own build generates and the module
# leaves empty: the precompiled seccomp filters of the sandbox and the gofer for the platforms
# evervm uses (scripts/runsc-filters/main.go writes them), so that a sandbox does not compile its
# filter each time it starts. `<recipe>` names this way of building: a change to it builds anew.
#
# Go comes from scripts/go.sh (the installed one, or Go's own toolchain from the module proxy).
# Safe to run again: it does nothing when the binary is there. `--built` only prints its path, and
# fails when it has not been built yet.
set -euo pipefail

RUNSC_VERSION="${EVERVM_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
RECIPE=filters1
cache="${XDG_CACHE_HOME:-$HOME/.cache}/evervm"
target="$cache/runsc/$RUNSC_VERSION-$RECIPE/runsc"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [ -x "$target" ]; then
    echo "$target"
    exit 0
fi
[ "${1:-}" = --built ] && exit 1

go_bin="$("$here/go.sh")"

echo "==> building gVisor runsc $RUNSC_VERSION statically, its seccomp filters precompiled (a few minutes, once)" >&2
work=$(mktemp -d)
# The module cache is read-only: make it writable to remove it.
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GOPATH="$work/gopath" GOFLAGS=-buildvcs=false CGO_ENABLED=0 GOTOOLCHAIN=local
module=$(cd "$work" && "$go_bin" mod download -json "gvisor.dev/gvisor@$RUNSC_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ ! -f "$module/go.mod" ]; then
    echo "error: the Go proxy gave no source for gvisor.dev/gvisor@$RUNSC_VERSION" >&2
    exit 1
fi
cp -r "$module" "$work/src"
chmod -R u+w "$work/src"
mkdir -p "$work/src/tools/runsc-filters"
cp "$here/runsc-filters/main.go" "$work/src/tools/runsc-filters/main.go"
(
    cd "$work/src"
    "$go_bin" run ./tools/runsc-filters >&2
    "$go_bin" build -o "$work/bin/runsc" \
        -ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" ./runsc >&2
)
if ! file "$work/bin/runsc" | grep -q "statically linked"; then
    echo "error: the runsc built is not statically linked: $(file "$work/bin/runsc")" >&2
    exit 1
fi
mkdir -p "$(dirname "$target")"
cp "$work/bin/runsc" "$target.partial"
mv "$target.partial" "$target"
echo "$target"
