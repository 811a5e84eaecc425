// What the Node package adds to a round trip: `exec('1+1')` through evervm for Node and through
// the Rust client, in the same run, in-process and against one `evervm serve`, on the process
// backend (the fastest, so the package's share shows most).
//
//   cargo build --release -p evervm-cli -p evervm-examples --bin exec_rtt
//   (cd bindings-node && npm run build)          # the release native module
//   node bindings-node/bench/overhead.mjs [--rounds 2000]
//
// EVERVM_RELEASE_DIR overrides where the release binaries are (default target/release).
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

import { Client } from '../index.mjs'
import { startServer } from '../test/helpers.mjs'

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..')
const release = process.env.EVERVM_RELEASE_DIR ?? join(process.env.CARGO_TARGET_DIR ?? join(repo, 'target'), 'release')
const rounds = Number(process.argv[process.argv.indexOf('--rounds') + 1] || 2000) || 2000
const rustBench = join(release, 'exec_rtt')
for (const binary of [rustBench, join(release, 'evervm')]) {
  if (!existsSync(binary)) throw new Error(`${binary} is missing: cargo build --release -p evervm-cli -p evervm-examples --bin exec_rtt`)
}
process.env.EVERVM_BIN ??= join(release, 'evervm')

function percentiles(micros) {
  const sorted = [...micros].sort((a, b) => a - b)
  const at = (p) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]
  return { p50: at(0.5), p90: at(0.9), p99: at(0.99) }
}

async function nodeRoundTrips(client) {
  const machine = await client.createMachine()
  await machine.exec('1+1')
  const micros = []
  for (let i = 0; i < rounds; i++) {
    const started = process.hrtime.bigint()
    const run = await machine.exec('1+1')
    micros.push(Number(process.hrtime.bigint() - started) / 1000)
    if (run.value !== '2') throw new Error(`1+1 gave ${JSON.stringify(run)}`)
  }
  await machine.delete()
  return micros
}

function rustRoundTrips(args) {
  return JSON.parse(execFileSync(rustBench, ['--rounds', String(rounds), ...args], { encoding: 'utf8' })).micros
}

const rows = []
function record(transport, client, micros) {
  rows.push({ transport, client, ...percentiles(micros) })
}

// Alternating the two clients, twice, so that neither gets the quieter half of the run.
for (let pass = 0; pass < 2; pass++) {
  const home = mkdtempSync(join(tmpdir(), 'evervm-bench-'))
  try {
    record('in-process', 'rust', rustRoundTrips(['--home', join(home, 'rust')]))
    const local = await Client.local({ home: join(home, 'node'), backend: 'process', poolSize: 0 })
    record('in-process', 'node', await nodeRoundTrips(local))
    await local.close()
  } finally {
    rmSync(home, { recursive: true, force: true })
  }
  const server = await startServer('process')
  try {
    record('remote', 'rust', rustRoundTrips(['--url', server.url, '--token', server.token]))
    record('remote', 'node', await nodeRoundTrips(new Client({ url: server.url, token: server.token })))
  } finally {
    await server.stop()
  }
}

const us = (v) => `${v.toFixed(1)} µs`
console.log(`exec('1+1') round trip, ${rounds} rounds per row, process backend, Node ${process.versions.node}`)
console.log('transport   client  p50         p90         p99')
for (const r of rows) console.log(`${r.transport.padEnd(11)} ${r.client.padEnd(7)} ${us(r.p50).padEnd(11)} ${us(r.p90).padEnd(11)} ${us(r.p99)}`)
for (const transport of ['in-process', 'remote']) {
  const of = (client) => rows.filter((r) => r.transport === transport && r.client === client).map((r) => r.p50)
  const added = of('node').map((node, i) => node - of('rust')[i])
  console.log(`${transport}: the Node package adds ${added.map(us).join(' and ')} at p50`)
}
