// The packages as a user gets them: `evervm` and its per-platform package as scripts/dist.sh
// makes them (EVERVM_DIST: that directory; else bindings-node/scripts/prebuilt.sh makes them here
// from the module built in bindings-node), installed the way npm picks them in a fresh directory,
// then used through `require` and `import`.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync, readFileSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

// EVERVM_REPO: where the repository is when these tests run from an installed copy.
const repo = process.env.EVERVM_REPO ?? join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const pkg = join(repo, 'bindings-node')
const { version } = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8'))
const npm = (cwd, ...args) => execFileSync('npm', ['--no-audit', '--no-fund', '--loglevel=error', ...args], { cwd, encoding: 'utf8' })

/** A script run from `dir` that uses the installed package both ways, on the process backend. */
function useInstalled(dir) {
  writeFileSync(
    join(dir, 'use.mjs'),
    `import { Client } from 'evervm'
import { PythonTool } from 'evervm/tools'
import { createRequire } from 'node:module'
const required = createRequire(import.meta.url)('evervm')
if (required.Client !== Client) throw new Error('two copies of Client')
const client = await Client.local({ home: process.argv[2], backend: 'process', poolSize: 0 })
const machine = await client.createMachine()
const result = await machine.exec('1 + 1')
const tool = await new PythonTool({ machine }).run('print("hi")')
console.log(JSON.stringify({ value: result.value, tool: tool.text }))
await client.close()
`,
  )
  const home = mkdtempSync(join(tmpdir(), 'evervm-pack-home-'))
  try {
    return JSON.parse(execFileSync(process.execPath, ['use.mjs', home], { cwd: dir, encoding: 'utf8' }))
  } finally {
    rmSync(home, { recursive: true, force: true })
  }
}

test('evervm and evervm-<platform>: what each carries, and evervm finding its module when installed', () => {
  const work = mkdtempSync(join(tmpdir(), 'evervm-prebuilt-'))
  try {
    let tarballs = process.env.EVERVM_DIST
    if (!tarballs) {
      const built = readdirSync(pkg).filter((f) => /^evervm\.[\w-]+\.node$/.test(f))
      assert.equal(built.length, 1, 'one native module built in bindings-node (npm run build:debug)')
      tarballs = work
      execFileSync(join(pkg, 'scripts', 'prebuilt.sh'), [work], { env: { ...process.env, EVERVM_NODE_BUILT: pkg }, encoding: 'utf8' })
    }
    const platformTarballs = readdirSync(tarballs).filter((f) => new RegExp(`^evervm-[a-z0-9-]+-${version}\\.tgz$`).test(f))
    assert.equal(platformTarballs.length, 1, `one platform package in ${tarballs}: ${readdirSync(tarballs).join(', ')}`)
    const platformTarball = join(tarballs, platformTarballs[0])
    const platform = platformTarballs[0].slice('evervm-'.length, -`-${version}.tgz`.length)
    const mainTarball = join(tarballs, `evervm-${version}.tgz`)
    assert.ok(existsSync(mainTarball), readdirSync(tarballs).join(', '))

    const listing = execFileSync('tar', ['-tzf', mainTarball], { encoding: 'utf8' }).split('\n')
    for (const file of ['package/index.cjs', 'package/index.mjs', 'package/index.d.ts', 'package/binding.cjs', 'package/ai.mjs', 'package/tools.cjs', 'package/openai-agents.mjs']) {
      assert.ok(listing.includes(file), `${file} is in the tarball`)
    }
    assert.ok(!listing.some((f) => f.endsWith('.node')), 'the main package carries no native module')
    assert.ok(!listing.some((f) => f.includes('node_modules') || f.startsWith('package/src/') || f.startsWith('package/test/')), 'no sources, tests or dependencies')
    const manifest = JSON.parse(execFileSync('tar', ['-xzOf', mainTarball, 'package/package.json'], { encoding: 'utf8' }))
    const targets = ['linux-x64-gnu', 'linux-arm64-gnu', 'linux-x64-musl', 'linux-arm64-musl', 'darwin-x64', 'darwin-arm64']
    assert.deepEqual(Object.keys(manifest.optionalDependencies).sort(), targets.map((t) => `evervm-${t}`).sort())
    assert.ok(Object.values(manifest.optionalDependencies).every((v) => v === version), JSON.stringify(manifest.optionalDependencies))
    const platformListing = execFileSync('tar', ['-tzf', platformTarball], { encoding: 'utf8' })
    assert.match(platformListing, new RegExp(`^package/evervm\\.${platform}\\.node$`, 'm'))
    const platformManifest = JSON.parse(execFileSync('tar', ['-xzOf', platformTarball, 'package/package.json'], { encoding: 'utf8' }))
    assert.deepEqual([platformManifest.os, platformManifest.cpu], [[process.platform], [process.arch]])

    const app = join(work, 'app')
    execFileSync('mkdir', [app])
    writeFileSync(join(app, 'package.json'), '{"name": "app", "private": true}')
    // The platform package as npm would pick it from the registry (nothing is published).
    npm(app, 'install', '--offline', platformTarball, mainTarball)
    assert.ok(existsSync(join(app, 'node_modules', `evervm-${platform}`)))
    assert.deepEqual(useInstalled(app), { value: '2', tool: 'hi' })
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
})
