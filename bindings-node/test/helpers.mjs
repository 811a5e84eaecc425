// Clients of both transports on the process backend: the engine in this process, and a spawned
// `evervm serve` (EVERVM_BIN, else the workspace's debug build); and an in-process engine on
// gVisor.
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { Client } from 'evervm'
import { startServer } from './server.mjs'

export { evervmBinary, startServer } from './server.mjs'

/** Runs `test(client, label)` with a local and a remote client, each cleaned up after. */
export async function bothTransports(test) {
  const home = mkdtempSync(join(tmpdir(), 'evervm-node-local-'))
  const local = await Client.local({ home, backend: 'process', poolSize: 0 })
  try {
    await test(local, 'local')
  } finally {
    await local.close()
    rmSync(home, { recursive: true, force: true })
  }
  const server = await startServer()
  try {
    await test(new Client({ url: server.url, token: server.token }), 'remote')
  } finally {
    await server.stop()
  }
}

/** Runs `test(client)` with an in-process engine on gVisor, cleaned up after; skipped, saying
 * why, when EVERVM_TEST_BACKENDS leaves gVisor out. */
export async function withGvisor(t, test) {
  const backends = process.env.EVERVM_TEST_BACKENDS
  if (backends && !backends.split(',').includes('gvisor')) {
    t.skip(`gVisor is not among EVERVM_TEST_BACKENDS (${backends})`)
    return
  }
  const home = mkdtempSync(join(tmpdir(), 'evervm-node-gvisor-'))
  const client = await Client.local({ home, backend: 'gvisor', poolSize: 0 })
  try {
    await test(client)
  } finally {
    await client.close()
    rmSync(home, { recursive: true, force: true })
  }
}
