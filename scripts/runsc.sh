#!/usr/bin/env bash
# Builds the pinned current gVisor runsc from the Go module proxy, statically (CGO_ENABLED=0: a
# cgo build is linked dynamically and cannot re-execute itself inside runsc's empty chroot), and
# keeps it in ~/.cache/evervm/runsc/<version>/runsc. Prints the binary's path on stdout.
#
# Where no Go 1.26 or newer is installed, Go's own toolchain (golang.org/toolchain) is taken from
# the module proxy into ~/.cache/evervm/go first. Safe to run again: it does nothing when the
# binary is there.
set -euo pipefail

RUNSC_VERSION="${EVERVM_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}"
GO_VERSION="1.26.8"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/evervm"
target="$cache/runsc/$RUNSC_VERSION/runsc"

if [ -x "$target" ]; then
    echo "$target"
    exit 0
fi

# A Go of at least 1.26.
go_bin=""
if command -v go >/dev/null; then
    have=$(go env GOVERSION 2>/dev/null | sed -E 's/^go([0-9]+)\.([0-9]+).*/\1 \2/')
    if [ -n "$have" ] && [ "$(echo "$have" | awk '{print ($1 > 1 || ($1 == 1 && $2 >= 26))}')" = 1 ]; then
        go_bin=$(command -v go)
    fi
fi
if [ -z "$go_bin" ]; then
    arch=$(uname -m)
    case "$arch" in
        x86_64) arch=amd64 ;;
        aarch64) arch=arm64 ;;
        *) echo "error: no Go toolchain for $arch: install Go 1.26 or newer" >&2; exit 1 ;;
    esac
    go_root="$cache/go/go$GO_VERSION.linux-$arch"
    if [ ! -x "$go_root/bin/go" ]; then
        module="golang.org/toolchain/@v/v0.0.1-go$GO_VERSION.linux-$arch.zip"
        proxy="${GOPROXY:-https://proxy.golang.org}"
        proxy="${proxy%%,*}"
        echo "==> downloading Go $GO_VERSION from the module proxy ($proxy)" >&2
        mkdir -p "$cache/go"
        zip="$cache/go/go$GO_VERSION.zip.partial"
        curl --proto '=https' --tlsv1.2 -fsSL -o "$zip" "$proxy/$module"
        rm -rf "$go_root.partial"
        python3 - "$zip" "$go_root.partial" <<'PY'
import sys, zipfile, os
archive, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(archive) as z:
    for info in z.infolist():
        # Entries are golang.org/toolchain@<version>/<path>.
        parts = info.filename.split('/')
        at = next((i for i, part in enumerate(parts) if '@' in part), None)
        rel = '/'.join(parts[at + 1:]) if at is not None else ''
        if not rel or info.is_dir():
            continue
        path = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with z.open(info) as src, open(path, 'wb') as out:
            out.write(src.read())
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(path, mode or 0o644)
PY
        mv "$go_root.partial" "$go_root"
        rm -f "$zip"
    fi
    go_bin="$go_root/bin/go"
fi

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
