import assert from 'node:assert/strict'
import { test } from 'node:test'
import { createRequire } from 'node:module'
import { Readable } from 'node:stream'

import * as evervm from 'evervm'
import { Client, EvervmError, NotFoundError, InvalidInputError, AbortError } from 'evervm'
import { bothTransports } from './helpers.mjs'

test('the CommonJS and ES module entries are one package', () => {
  const required = createRequire(import.meta.url)('evervm')
  assert.equal(required.Client, Client)
  // Every error kind has its class in both entries.
  for (const name of Object.keys(required).filter((n) => n.endsWith('Error'))) {
    assert.equal(evervm[name], required[name], name)
  }
  assert.equal(evervm.DEFAULT_TIMEOUT_SECONDS, 15)
})

test('state, values, output, errors and rich results, in both transports', async () => {
  await bothTransports(async (client, label) => {
    const machine = await client.createMachine({ tags: { suite: 'node', transport: label }, memoryMb: 512 })
    assert.match(machine.name, /^[A-Za-z0-9]+$/)
    await machine.exec('x = 20')
    const run = await machine.exec("print('hi')\nimport sys; print('warn', file=sys.stderr)\nx + 1")
    assert.equal(run.value, '21', label)
    assert.equal(run.stdout, 'hi\n')
    assert.equal(run.stderr, 'warn\n')
    assert.deepEqual(run.output.map((c) => [c.stream, c.data]), [['stdout', 'hi'], ['stderr', 'warn']])
    assert.equal(run.ok, true)
    assert.equal(run.type, 'result')
    assert.equal(typeof run.runtimeMs, 'number')

    const failed = await machine.exec('1 / 0')
    assert.equal(failed.ok, false)
    assert.equal(failed.cause, 'exception')
    assert.match(failed.error, /ZeroDivisionError/)
    assert.deepEqual(failed.exception, {
      name: 'ZeroDivisionError',
      qualname: 'ZeroDivisionError',
      module: 'builtins',
      value: 'division by zero',
    })

    const cell = await machine.exec('\n    y = x + 1\n    y', { dialect: 'jupyter' })
    assert.deepEqual([cell.value, cell.ok], ['21', true], `${label}: an indented Jupyter cell runs`)
    await assert.rejects(machine.exec('1', { dialect: 'basic' }), InvalidInputError)

    const slow = await machine.exec('import time\ntime.sleep(5)', { timeoutSeconds: 1 })
    assert.equal(slow.timedOut, true, label)
    assert.equal((await machine.exec('x')).value, '20', 'state kept after a timeout')

    const rich = await machine.exec(
      "class T:\n    def _repr_html_(self): return '<b>t</b>'\ndisplay(T())\nT()",
    )
    assert.deepEqual(rich.results.map((r) => r.kind), ['display', 'value'])
    assert.equal(rich.results[1].html, '<b>t</b>')
    assert.equal(rich.results[1].data['text/html'], '<b>t</b>')

    const info = await machine.info()
    assert.equal(info.name, machine.name)
    assert.deepEqual(info.tags, { suite: 'node', transport: label })
    const listed = await client.listMachines({ tags: { suite: 'node' } })
    assert.deepEqual(listed.map((m) => m.name), [machine.name])
    await machine.delete()
    await assert.rejects(machine.info(), (error) => {
      assert.ok(error instanceof NotFoundError, String(error))
      assert.ok(error instanceof EvervmError)
      assert.equal(error.code, 'NotFound')
      return true
    })
  })
})

test('streaming, callbacks and AbortSignal', async () => {
  await bothTransports(async (client, label) => {
    const machine = await client.createMachine()
    const seen = []
    for await (const event of machine.stream("for i in range(3): print(i)\ndisplay(7)\n'done'")) {
      seen.push(event.type === 'output' ? event.data : event.type)
    }
    assert.deepEqual(seen, ['0', '1', '2', 'rich', 'result'], label)

    const lines = []
    const errs = []
    const run = await machine.exec("import sys\nprint('a'); print('b', file=sys.stderr)", {
      onStdout: (line) => lines.push(line),
      onStderr: (line) => errs.push(line),
    })
    assert.ok(run.ok)
    assert.deepEqual([lines, errs], [['a'], ['b']])

    // Aborting interrupts the instruction; the machine keeps its state.
    await machine.exec('kept = 1')
    const controller = new AbortController()
    const running = machine.exec("import time\nprint('started', flush=True)\ntime.sleep(30)", {
      signal: controller.signal,
      onStdout: () => controller.abort(),
    })
    await assert.rejects(running, (error) => {
      assert.ok(error instanceof AbortError, String(error))
      assert.equal(error.code, 'Aborted')
      assert.equal(error.result?.cause, 'interrupted')
      return true
    })
    assert.equal((await machine.exec('kept')).value, '1')
    await assert.rejects(machine.exec('1', { signal: AbortSignal.abort() }), AbortError)
    await machine.delete()
  })
})

test('files, as Buffers and strings', async () => {
  await bothTransports(async (client, label) => {
    const machine = await client.createMachine()
    const bytes = Buffer.from([0, 1, 2, 255])
    const written = await machine.files.write('data/blob.bin', bytes, { parents: true })
    assert.equal(written.size, 4)
    assert.deepEqual(await machine.files.read('data/blob.bin'), bytes)
    await machine.files.write('notes.txt', 'héllo')
    assert.equal(await machine.files.readText('notes.txt'), 'héllo')
    assert.equal((await machine.exec("open('notes.txt').read()")).value, "'héllo'")
    const listing = await machine.files.list()
    assert.deepEqual(listing.entries.map((e) => e.name).sort(), ['data', 'notes.txt'], label)
    assert.equal(await machine.files.exists('missing.txt'), false)
    await assert.rejects(machine.files.read('/etc/passwd'), (e) => e.code === 'PermissionDenied')
    await machine.files.remove('data', { recursive: true })
    assert.equal(await machine.files.exists('data'), false)
    await machine.delete()
  })
})

test('files as streams: a Readable in and out, in pieces; a failing stream leaves the old file', async () => {
  await bothTransports(async (client, label) => {
    const machine = await client.createMachine()
    // 3 MiB in 48 pieces of 64 KiB, each piece numbered so that order and loss both show.
    const piece = (i) => Buffer.alloc(64 * 1024, i)
    const expected = Buffer.concat(Array.from({ length: 48 }, (_, i) => piece(i)))
    const info = await machine.files.write('big.bin', Readable.from(Array.from({ length: 48 }, (_, i) => piece(i))))
    assert.equal(info.size, expected.length, label)
    const chunks = []
    for await (const chunk of machine.files.createReadStream('big.bin')) chunks.push(chunk)
    assert.ok(chunks.length > 1, 'read back in more than one piece')
    assert.ok(Buffer.concat(chunks).equals(expected))

    // A web ReadableStream of strings and Uint8Arrays, with its length given.
    const web = new ReadableStream({
      start(controller) {
        controller.enqueue('a,b\n')
        controller.enqueue(new Uint8Array([49, 44, 50, 10]))
        controller.close()
      },
    })
    await machine.files.write('small.csv', web, { length: 8 })
    assert.equal(await machine.files.readText('small.csv'), 'a,b\n1,2\n')

    async function* failing() {
      yield Buffer.from('partial')
      throw new Error('the source broke')
    }
    await assert.rejects(machine.files.write('small.csv', failing()), /the source broke/)
    assert.equal(await machine.files.readText('small.csv'), 'a,b\n1,2\n', 'the old file is untouched')
    await assert.rejects(machine.files.write('x.bin', (async function* () { yield 42 })()), InvalidInputError)
    await assert.rejects(async () => {
      for await (const _ of machine.files.createReadStream('missing.bin')) assert.fail('no data')
    }, NotFoundError)
    await machine.delete()
  })
})

test('bad input is an InvalidInputError before anything is sent', async () => {
  assert.throws(() => new Client({ url: 'ftp://nowhere', token: 'a.b' }), InvalidInputError)
  const client = new Client({ url: 'http://127.0.0.1:9', token: 'a.b' })
  await assert.rejects(client.machine('m').exec('1', { timeoutSeconds: -1 }), InvalidInputError)
  await assert.rejects(client.createMachine({ ttlSeconds: Number.NaN }), InvalidInputError)
})

test('several machines at once, and the event loop runs during a long instruction', async () => {
  await bothTransports(async (client, label) => {
    const machines = await Promise.all([1, 2, 3].map((n) => client.createMachine({ tags: { n: String(n) } })))
    const values = await Promise.all(machines.map((m, i) => m.exec(`sum(range(${i + 1} * 1000))`)))
    assert.deepEqual(values.map((r) => r.value), ['499500', '1999000', '4498500'], label)
    let ticks = 0
    const timer = setInterval(() => ticks++, 20)
    try {
      const run = await machines[0].exec('import time\ntime.sleep(1)\n"slept"')
      assert.equal(run.value, "'slept'")
    } finally {
      clearInterval(timer)
    }
    // The timer fired all along (a blocked loop would show none).
    assert.ok(ticks >= 20, `${label}: the timer fired ${ticks} times in one second`)
    await Promise.all(machines.map((m) => m.delete()))
  })
})

test('install puts a wheel from the package index into the machine; network is an option', async () => {
  const { execFileSync } = await import('node:child_process')
  const { createHash } = await import('node:crypto')
  const http = await import('node:http')
  const { mkdtempSync, readFileSync, rmSync } = await import('node:fs')
  const { tmpdir } = await import('node:os')
  const { join } = await import('node:path')
  const dir = mkdtempSync(join(tmpdir(), 'evervm-node-index-'))
  const filename = 'evervm_node_hello-0.1-py3-none-any.whl'
  // A wheel made with Python's zipfile (the machine's Python reads it the same way).
  execFileSync('python3', ['-c', `
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    z.writestr('evervm_node_hello.py', 'WORD = "hello from node"\\n')
    z.writestr('evervm_node_hello-0.1.dist-info/METADATA', 'Metadata-Version: 2.1\\nName: evervm-node-hello\\nVersion: 0.1\\n')
    z.writestr('evervm_node_hello-0.1.dist-info/WHEEL', 'Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')
    z.writestr('evervm_node_hello-0.1.dist-info/RECORD', '')
`, join(dir, filename)])
  const wheel = readFileSync(join(dir, filename))
  const page = JSON.stringify({
    meta: { 'api-version': '1.1' },
    files: [{ filename, url: `../../files/${filename}`, hashes: { sha256: createHash('sha256').update(wheel).digest('hex') } }],
  })
  const server = http.createServer((request, response) => {
    if (request.url === '/simple/evervm-node-hello/') {
      response.writeHead(200, { 'content-type': 'application/vnd.pypi.simple.v1+json' }).end(page)
    } else if (request.url === `/files/${filename}`) {
      response.writeHead(200).end(wheel)
    } else {
      response.writeHead(404).end()
    }
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  const previous = process.env.EVERVM_PACKAGE_INDEX
  process.env.EVERVM_PACKAGE_INDEX = `http://127.0.0.1:${server.address().port}/simple/`
  const home = mkdtempSync(join(tmpdir(), 'evervm-node-local-'))
  const client = await Client.local({ home, backend: 'process', poolSize: 0 })
  try {
    const machine = await client.createMachine()
    const report = await machine.install(['evervm-node-hello==0.1'])
    assert.deepEqual(report.installed.map((p) => [p.name, p.version]), [['evervm-node-hello', '0.1']])
    assert.equal(report.installed[0].sha256.length, 64)
    assert.equal((await machine.exec('import evervm_node_hello; evervm_node_hello.WORD')).value, "'hello from node'")
    await assert.rejects(machine.install(['not a requirement!']), InvalidInputError)

    // The process backend gives no network; the option still reaches the engine.
    assert.equal((await machine.info()).network, 'none')
    await assert.rejects(client.createMachine({ network: 'public' }), (e) => e.code === 'Unsupported')
    await assert.rejects(client.createMachine({ network: 'allow' }), InvalidInputError)
    await assert.rejects(client.createMachine({ network: ['bad name.com'] }), InvalidInputError)
  } finally {
    await client.close()
    if (previous === undefined) delete process.env.EVERVM_PACKAGE_INDEX
    else process.env.EVERVM_PACKAGE_INDEX = previous
    server.close()
    rmSync(home, { recursive: true, force: true })
    rmSync(dir, { recursive: true, force: true })
  }
})
