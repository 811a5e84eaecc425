// evervm's MCP server through the official TypeScript SDK (@modelcontextprotocol/sdk), over
// stdio (`evervm mcp`) and streamable HTTP (`/mcp` on `evervm serve`), on gVisor: the core flow
// an assistant goes through.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'

import { evervmBinary, startServer } from '../../../bindings-node/test/server.mjs'

// gVisor sandboxes need root; CI runs these tests always.
const skip = process.getuid?.() === 0 ? false : 'gVisor sandboxes need root'
if (skip && process.env.CI) throw new Error(`the MCP tests must run in CI, but ${skip}`)

const textOf = (result) => result.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n')

// The SDK's close() ends stdin and waits a while, but keeps the child to itself: its pid is all
// there is to wait on.
async function exited(pid) {
  for (let i = 0; pid && i < 600; i++) {
    try {
      process.kill(pid, 0)
    } catch {
      return
    }
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error(`evervm mcp (pid ${pid}) still runs 30 s after its stdin closed`)
}

async function coreFlow(client, label) {
  const { tools } = await client.listTools()
  const names = tools.map((t) => t.name)
  assert.ok(names.includes('create-python-repl') && names.includes('run-python-in-repl'), label)
  const runTool = tools.find((t) => t.name === 'run-python-in-repl')
  assert.deepEqual([...runTool.inputSchema.required].sort(), ['pythonCode', 'replId'])
  assert.ok(runTool.outputSchema, `${label}: run-python-in-repl has an output schema`)

  const created = await client.callTool({ name: 'create-python-repl', arguments: {} })
  const replId = created.content[0].text
  assert.deepEqual(created.structuredContent, { replId })

  const run = (pythonCode) => client.callTool({ name: 'run-python-in-repl', arguments: { pythonCode, replId } })
  assert.equal((await run('x = 6\nprint("ready")')).structuredContent.output, 'ready')
  const value = await run('x * 7')
  assert.equal(value.structuredContent.result, '42', label)
  assert.equal(JSON.parse(textOf(value)).result, '42')

  const failed = await run('undefined_name')
  assert.equal(failed.isError, true, label)
  assert.match(failed.structuredContent.error, /NameError/)

  const plot = await run('import matplotlib.pyplot as plt\nplt.bar(["a", "b"], [3, 5])\nprint("drawn")')
  const images = plot.content.filter((c) => c.type === 'image')
  assert.equal(images.length, 1, label)
  assert.equal(images[0].mimeType, 'image/png')
  assert.equal(Buffer.from(images[0].data, 'base64').subarray(0, 4).toString('latin1'), '\x89PNG')
  assert.equal(JSON.parse(textOf(plot)).output, 'drawn')

  const unknown = await client.callTool({ name: 'run-python-in-repl', arguments: { pythonCode: '1', replId: 'no-such-repl' } })
  assert.equal(unknown.isError, true)
  const missing = await client.callTool({ name: 'run-python-in-repl', arguments: { pythonCode: '1' } })
  assert.equal(missing.isError, true)
  assert.match(textOf(missing), /replId/)
  return { replId, run }
}

test('the core flow over stdio, and an aborted call interrupts its instruction', { skip }, async () => {
  const home = mkdtempSync(join(tmpdir(), 'evervm-mcp-ts-'))
  const transport = new StdioClientTransport({
    command: evervmBinary(),
    args: ['mcp', '--home', home, '--backend', 'gvisor'],
    env: { ...process.env, EVERVM_POOL_SIZE: '1' },
    stderr: 'ignore',
  })
  const client = new Client({ name: 'evervm-test', version: '1.0.0' })
  await client.connect(transport)
  const pid = transport.pid
  try {
    const { replId, run } = await coreFlow(client, 'stdio')
    // Aborted at its first progress notification, sent once the instruction is under way.
    const abort = new AbortController()
    await assert.rejects(
      client.callTool(
        { name: 'run-python-in-repl', arguments: { replId, pythonCode: 'import time\ntime.sleep(60)\nfinished = True' } },
        undefined,
        { signal: abort.signal, timeout: 120_000, onprogress: () => abort.abort('enough') },
      ),
    )
    const after = await run("('finished' in globals(), x)")
    assert.equal(after.structuredContent.result, '(False, 6)')
  } finally {
    await client.close()
    // The server stops its engine when stdin closes; its home goes once it has.
    await exited(pid)
    rmSync(home, { recursive: true, force: true, maxRetries: 20 })
  }
})

test('the core flow over streamable HTTP', { skip }, async () => {
  const server = await startServer('gvisor')
  const transport = new StreamableHTTPClientTransport(new URL(`${server.url.replace(/\/$/, '')}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${server.token}` } },
  })
  const client = new Client({ name: 'evervm-test', version: '1.0.0' })
  try {
    await client.connect(transport)
    assert.equal(transport.protocolVersion, '2025-11-25')
    await coreFlow(client, 'http')
  } finally {
    await client.close()
    await server.stop()
  }
})
