#!/usr/bin/env bash
# Prints the path of a Go toolchain of at least 1.26 for the scripts that build Go programs
# (runsc.sh, seaweedfs.sh): the one on PATH when it is new enough, else Go's own toolchain
# (golang.org/toolchain) taken from the module proxy into ~/.cache/evervm/go once.
set -euo pipefail

GO_VERSION="1.26.8"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/evervm"

if command -v go >/dev/null; then
    have=$(go env GOVERSION 2>/dev/null | sed -E 's/^go([0-9]+)\.([0-9]+).*/\1 \2/')
    if [ -n "$have" ] && [ "$(echo "$have" | awk '{print ($1 > 1 || ($1 == 1 && $2 >= 26))}')" = 1 ]; then
        command -v go
        exit 0
    fi
fi
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
echo "$go_root/bin/go"
