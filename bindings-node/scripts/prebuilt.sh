#!/usr/bin/env bash
# Produces the npm packages as they would be published: `evervm` (the JavaScript, with an
# `optionalDependencies` entry per platform) and one `evervm-<platform>` package per target, each
# holding that platform's native module and declaring its `os`, `cpu` and `libc`, so that npm
# installs only the one that fits. Nothing is published: the tarballs land in OUT_DIR.
#
#   bindings-node/scripts/prebuilt.sh OUT_DIR [TARGET...]
#
# TARGETs are Rust target triples among package.json's `napi.targets` (default: this host's).
# Building for another platform needs its toolchain: `--use-napi-cross` (napi's cross gcc) for
# aarch64-unknown-linux-gnu, `-x` (cargo-zigbuild) for the musl targets, a Mac for the apple-darwin
# ones (set NAPI_BUILD_FLAGS, e.g. NAPI_BUILD_FLAGS=-x). A CI matrix runs this once per target and
# a last job gathers the `evervm-<platform>` tarballs and publishes them, then `evervm` itself
# (`npm publish` of each tarball).
#
# EVERVM_NODE_BUILT=DIR takes the modules already built in DIR (evervm.<platform>.node, as
# `napi build --platform` leaves them) instead of building: the tests use it with their debug build.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:?usage: prebuilt.sh OUT_DIR [TARGET...]}"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("$(rustc -vV | sed -n 's/^host: //p')")
napi="$here/node_modules/.bin/napi"
[ -x "$napi" ] || { echo "run \`npm ci\` in bindings-node first (it installs @napi-rs/cli)" >&2; exit 1; }

# The package is staged in a scratch copy: pre-publish rewrites package.json.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
files=$(node -p "require('$here/package.json').files.filter((f) => !f.includes('*')).join('\n')")
for file in $files package.json; do cp "$here/$file" "$stage/"; done

echo "==> per-platform package directories (npm/<platform>/package.json)"
"$napi" create-npm-dirs --cwd "$stage" --npm-dir npm >/dev/null

for target in "${targets[@]}"; do
    if [ -n "${EVERVM_NODE_BUILT:-}" ]; then
        echo "==> $target: taking the module built in $EVERVM_NODE_BUILT"
        cp "$EVERVM_NODE_BUILT"/evervm.*.node "$stage/"
    else
        echo "==> $target: building the native module (release)"
        # shellcheck disable=SC2086
        (cd "$here" && "$napi" build --platform --release --target "$target" --output-dir "$stage" \
            --no-js --no-dts-header ${NAPI_BUILD_FLAGS:-})
    fi
done

echo "==> moving the modules into their packages"
# `napi artifacts` wants a module for every configured target (as a release gathers them): for a
# run over some targets, it is shown only those, and pre-publish below sees them all again.
cp "$stage/package.json" "$stage/package.json.all"
TARGETS="${targets[*]}" node -e '
const fs = require("fs"); const path = process.argv[1]; const p = JSON.parse(fs.readFileSync(path))
p.napi.targets = process.env.TARGETS.split(" "); fs.writeFileSync(path, JSON.stringify(p, null, 2))' "$stage/package.json"
"$napi" artifacts --cwd "$stage" --output-dir . --npm-dir npm
mv "$stage/package.json.all" "$stage/package.json"
echo "==> optionalDependencies of evervm, one per platform package"
# (What `napi pre-publish` writes too; it also insists on every platform's module, which only a
# release that gathered all of them has.)
node -e '
const fs = require("fs"); const path = require("path"); const stage = process.argv[1]
const main = JSON.parse(fs.readFileSync(path.join(stage, "package.json")))
main.optionalDependencies = {}
for (const dir of fs.readdirSync(path.join(stage, "npm")).sort()) {
  const p = JSON.parse(fs.readFileSync(path.join(stage, "npm", dir, "package.json")))
  if (p.version !== main.version) throw new Error(`${p.name} is at ${p.version}, evervm at ${main.version}`)
  main.optionalDependencies[p.name] = p.version
}
fs.writeFileSync(path.join(stage, "package.json"), JSON.stringify(main, null, 2) + "\n")' "$stage"

echo "==> packing"
for dir in "$stage"/npm/*/; do
    if compgen -G "$dir*.node" >/dev/null; then
        (cd "$dir" && npm pack --silent --pack-destination "$out" >/dev/null)
        echo "  $(node -p "const p = require('$dir/package.json'); p.name + ' (os ' + p.os + ', cpu ' + p.cpu + (p.libc ? ', libc ' + p.libc : '') + ')'")"
    fi
done
rm -f "$stage"/*.node
(cd "$stage" && npm pack --silent --pack-destination "$out" >/dev/null)
echo "  evervm, with optionalDependencies: $(node -p "Object.keys(require('$stage/package.json').optionalDependencies ?? {}).join(', ')")"
ls "$out"
