// A server over https with a CA of the test's own (`evervm serve --tls-cert --tls-key`): a
// client given `caFile` (or EVERVM_CA_FILE) reaches it; one that trusts only the default roots
// refuses it. The certificates are made with openssl: a CA and a certificate for 127.0.0.1.
import assert from 'node:assert/strict'
import { test, before, after } from 'node:test'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { Client, EvervmError } from 'evervm'
import { startServer } from './server.mjs'

const dir = mkdtempSync(join(tmpdir(), 'evervm-node-tls-'))
const file = (name) => join(dir, name)
const openssl = (...args) => execFileSync('openssl', args, { stdio: 'ignore' })
let server

before(async () => {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
  openssl('req', '-x509', ...ec, '-keyout', file('ca.key'), '-out', file('ca.pem'), '-days', '2', '-subj', '/CN=evervm test CA')
  openssl('req', '-new', ...ec, '-keyout', file('server.key'), '-out', file('server.csr'), '-subj', '/CN=server')
  writeFileSync(file('server.ext'), 'subjectAltName = IP:127.0.0.1\n')
  openssl('x509', '-req', '-in', file('server.csr'), '-CA', file('ca.pem'), '-CAkey', file('ca.key'),
    '-CAcreateserial', '-days', '2', '-extfile', file('server.ext'), '-out', file('server.pem'))
  server = await startServer('process', ['--tls-cert', file('server.pem'), '--tls-key', file('server.key')])
  assert.match(server.url, /^https:\/\//)
})

after(async () => {
  await server?.stop()
  rmSync(dir, { recursive: true, force: true })
})

test('a client given the CA file reaches the server over https', async () => {
  const client = new Client({ url: server.url, token: server.token, caFile: file('ca.pem') })
  const machine = await client.createMachine()
  try {
    assert.equal((await machine.exec('6 * 7')).value, '42')
  } finally {
    await machine.delete()
  }
})

test('without the CA the server is refused; a file that holds no certificate is named', async () => {
  const saved = process.env.EVERVM_CA_FILE
  delete process.env.EVERVM_CA_FILE
  try {
    const client = new Client({ url: server.url, token: server.token })
    await assert.rejects(client.listMachines(), (e) => e instanceof EvervmError && /certificate/i.test(e.message))
  } finally {
    if (saved !== undefined) process.env.EVERVM_CA_FILE = saved
  }
  assert.throws(() => new Client({ url: server.url, token: server.token, caFile: file('server.key') }),
    (e) => e instanceof EvervmError && e.message.includes('server.key'))
})
