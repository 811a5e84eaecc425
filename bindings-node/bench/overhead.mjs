// What the Node package adds to a round trip: `exec('1+1')` through evervm for Node and through
// the Rust client, in the same run, in-process and against one `evervm serve`, on the process
// backend (the fastest, so the package's share shows most).
//
//   cargo build --release -p evervm-cli -p evervm-examples --bin exec_rtt
//   (cd bindings-node && npm run build)          # the release native module
//   node bindings-node/bench/overhead.mjs [--rounds 1000] [--passes 6]
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
function option(name, fallback) {
  const at = process.argv.indexOf(name)
  return at >= 0 && Number(process.argv[at + 1]) > 0 ? Number(process.argv[at + 1]) : fallback
}
const rounds = option('--rounds', 1000)
const passes = option('--passes', 6)
const rustBench = join(release, 'exec_rtt')
for (const binary of [rustBench, join(release, 'evervm')]) {
  if (!existsSync(binary)) throw new Error(`${binary} is missing: cargo build --release -p evervm-cli -p evervm-examples --bin exec_rtt`)
}
process.env.EVERVM_BIN ??= join(release, 'evervm')
// The server's per-account instruction rate (500 a second by default) would otherwise be what
// this measures: a round trip here takes well under 2 ms.
process.env.EVERVM_INSTRUCTION_RATE ??= '1000000'
process.env.EVERVM_INSTRUCTION_BURST ??= '1000000'

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

// Several passes, each running both clients back to back, the first of them alternating, so that
// neither gets the quieter part of a noisy machine; the figure is the median of the passes'
// differences.
for (let pass = 0; pass < passes; pass++) {
  const order = pass % 2 === 0 ? ['rust', 'node'] : ['node', 'rust']
  const home = mkdtempSync(join(tmpdir(), 'evervm-bench-'))
  try {
    for (const client of order) {
      if (client === 'rust') {
        record('in-process', 'rust', rustRoundTrips(['--home', join(home, 'rust')]))
      } else {
        const local = await Client.local({ home: join(home, 'node'), backend: 'process', poolSize: 0 })
        record('in-process', 'node', await nodeRoundTrips(local))
        await local.close()
      }
    }
  } finally {
    rmSync(home, { recursive: true, force: true })
  }
  const server = await startServer('process')
  try {
    for (const client of order) {
      if (client === 'rust') record('remote', 'rust', rustRoundTrips(['--url', server.url, '--token', server.token]))
      else record('remote', 'node', await nodeRoundTrips(new Client({ url: server.url, token: server.token })))
    }
  } finally {
    await server.stop()
  }
}

const us = (v) => `${v.toFixed(1)} µs`
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]
console.log(`exec('1+1') round trip, ${passes} passes of ${rounds} rounds per client, process backend, Node ${process.versions.node}`)
console.log('transport   client  p50         p90         p99')
for (const r of rows) console.log(`${r.transport.padEnd(11)} ${r.client.padEnd(7)} ${us(r.p50).padEnd(11)} ${us(r.p90).padEnd(11)} ${us(r.p99)}`)
for (const transport of ['in-process', 'remote']) {
  const of = (client) => rows.filter((r) => r.transport === transport && r.client === client).map((r) => r.p50)
  const added = of('node').map((node, i) => node - of('rust')[i])
  console.log(`${transport}: rust ${us(median(of('rust')))}, node ${us(median(of('node')))}; the Node package adds ${us(median(added))} at p50 (median of the passes; each: ${added.map((v) => v.toFixed(0)).join(', ')})`)
}
