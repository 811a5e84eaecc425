// The package as a user gets it: `npm pack`, `npm install ./evervm-x.y.z.tgz` in a fresh
// directory, then `require` and `import` from there; and the per-platform packages that
// scripts/prebuilt.sh makes, installed the way npm picks them.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, readdirSync, rmSync, writeFileSync, readFileSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const pkg = join(dirname(fileURLToPath(import.meta.url)), '..')
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

test('npm pack, then npm install of the tarball in a fresh directory', () => {
  const work = mkdtempSync(join(tmpdir(), 'evervm-pack-'))
  try {
    npm(pkg, 'pack', '--silent', '--pack-destination', work)
    const tarball = join(work, `evervm-${version}.tgz`)
    assert.ok(existsSync(tarball), readdirSync(work).join(', '))
    const listing = execFileSync('tar', ['-tzf', tarball], { encoding: 'utf8' }).split('\n')
    for (const file of ['package/index.cjs', 'package/index.mjs', 'package/index.d.ts', 'package/binding.cjs', 'package/ai.mjs', 'package/tools.cjs']) {
      assert.ok(listing.includes(file), `${file} is in the tarball`)
    }
    assert.ok(listing.some((f) => /^package\/evervm\.[\w-]+\.node$/.test(f)), 'the native module is in the tarball')
    assert.ok(!listing.some((f) => f.includes('node_modules') || f.startsWith('package/src/')), 'no sources or dependencies')

    const app = join(work, 'app')
    execFileSync('mkdir', [app])
    writeFileSync(join(app, 'package.json'), '{"name": "app", "private": true}')
    npm(app, 'install', '--offline', tarball)
    assert.deepEqual(useInstalled(app), { value: '2', tool: 'hi' })
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
})

test('per-platform packages: evervm finds its module in evervm-<platform>', () => {
  const built = readdirSync(pkg).filter((f) => /^evervm\.[\w-]+\.node$/.test(f))
  assert.equal(built.length, 1, 'one native module built here')
  const platform = built[0].split('.')[1]
  const work = mkdtempSync(join(tmpdir(), 'evervm-prebuilt-'))
  try {
    execFileSync(join(pkg, 'scripts', 'prebuilt.sh'), [work], { env: { ...process.env, EVERVM_NODE_BUILT: pkg }, encoding: 'utf8' })
    const platformTarball = join(work, `evervm-${platform}-${version}.tgz`)
    const mainTarball = join(work, `evervm-${version}.tgz`)
    assert.ok(existsSync(platformTarball) && existsSync(mainTarball), readdirSync(work).join(', '))
    const mainListing = execFileSync('tar', ['-tzf', mainTarball], { encoding: 'utf8' })
    assert.doesNotMatch(mainListing, /\.node$/m, 'the main package carries no native module')
    const manifest = JSON.parse(execFileSync('tar', ['-xzOf', mainTarball, 'package/package.json'], { encoding: 'utf8' }))
    const targets = ['linux-x64-gnu', 'linux-arm64-gnu', 'linux-x64-musl', 'linux-arm64-musl', 'darwin-x64', 'darwin-arm64']
    assert.deepEqual(Object.keys(manifest.optionalDependencies).sort(), targets.map((t) => `evervm-${t}`).sort())
    const platformManifest = JSON.parse(execFileSync('tar', ['-xzOf', platformTarball, 'package/package.json'], { encoding: 'utf8' }))
    assert.deepEqual([platformManifest.os, platformManifest.cpu], [[process.platform], [process.arch]])

    const app = join(work, 'app')
    execFileSync('mkdir', [app])
    writeFileSync(join(app, 'package.json'), '{"name": "app", "private": true}')
    // The platform package as npm would pick it from the registry (nothing is published).
    npm(app, 'install', '--offline', platformTarball, mainTarball)
    assert.ok(existsSync(join(app, 'node_modules', `evervm-${platform}`)))
    assert.equal(useInstalled(app).value, '2')
  } finally {
    rmSync(work, { recursive: true, force: true })
  }
})
