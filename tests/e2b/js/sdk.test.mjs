// evervm's E2B-compatible API (`evervm serve --e2b-listen`) driven by the unmodified E2B
// JavaScript SDK (`@e2b/code-interpreter` and the `e2b` package under it), on gVisor.
//
// Run it from a directory that installed the SDK, so that one file tests each pinned release:
//   cd tests/e2b/js-newest && npm ci && node --test ../js/sdk.test.mjs   (the newest releases)
//   cd tests/e2b/js-oldest && npm ci && node --test ../js/sdk.test.mjs   (the oldest that honour
//                                                                          E2B_SANDBOX_URL)
// The SDK is loaded from the working directory's node_modules, as `import '@e2b/code-interpreter'`
// in a file there would load it, and only once E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY name
// the server this file starts (EVERVM_BIN, else the workspace's debug build).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import http from 'node:http'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join, sep } from 'node:path'
import { createInterface } from 'node:readline'
import { fileURLToPath, pathToFileURL } from 'node:url'

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')

// gVisor sandboxes need root; CI runs these tests always.
const notRoot = process.getuid?.() === 0 ? false : 'gVisor sandboxes need root'
if (notRoot && process.env.CI) throw new Error(`the E2B JS SDK tests must run in CI, but ${notRoot}`)

// Every sandbox this file makes carries this metadata, so that lists find only them.
const suite = `e2b-js-${process.pid}-${Date.now()}`
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
const TEST_TIMEOUT = 300_000

function evervmBinary() {
  const path =
    process.env.EVERVM_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(repo, 'target'), 'debug', 'evervm')
  if (!existsSync(path)) throw new Error(`${path} is missing: run \`cargo build -p evervm-cli\` or set EVERVM_BIN`)
  return path
}

/** `evervm serve` with the E2B listener, on free loopback ports and a fresh home. */
async function startServer() {
  const binary = evervmBinary()
  const home = mkdtempSync(join(tmpdir(), 'evervm-e2b-js-'))
  const child = spawn(
    binary,
    ['serve', '--listen', '127.0.0.1:0', '--e2b-listen', '127.0.0.1:0', '--backend', 'gvisor', '--home', home],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        ...process.env,
        EVERVM_POOL_SIZE: '1',
        EVERVM_IMAGES: process.env.EVERVM_IMAGES ?? join(process.env.HOME ?? tmpdir(), '.cache', 'evervm', 'images'),
      },
    },
  )
  // The server's log, kept short, says why it did not start.
  let log = ''
  child.stderr.setEncoding('utf8').on('data', (chunk) => {
    log = (log + chunk).slice(-8000)
  })
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })))
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM')
    const status = await exited
    rmSync(home, { recursive: true, force: true, maxRetries: 20 })
    return status
  }
  let url, key
  for await (const line of createInterface({ input: child.stdout })) {
    key ??= /export E2B_API_URL=\S+ E2B_SANDBOX_URL=\S+ E2B_API_KEY=(e2b_[0-9a-f]+)/.exec(line)?.[1]
    url ??= /E2B-compatible API on (http:\/\/[^\s/]+?):? /.exec(line)?.[1]
    if (url && key) break
  }
  if (!url || !key) {
    const status = await stop()
    throw new Error(
      `evervm serve printed no E2B URL and key (it exited with ${JSON.stringify(status)}); its log:\n${log}`,
    )
  }
  // The banner is all the server writes to stdout: the rest is not waited for.
  child.stdout.resume()
  return { url, key, stop, log: () => log }
}

/** The SDK as the working directory installed it, and the versions of both its packages. */
async function loadSdk() {
  const cwd = process.cwd()
  const require = createRequire(join(cwd, 'package.json'))
  const entry = require.resolve('@e2b/code-interpreter')
  const modules = join(cwd, 'node_modules') + sep
  assert.ok(entry.startsWith(modules), `@e2b/code-interpreter resolves to ${entry}, not under ${modules}`)
  // The code interpreter's own `e2b` must be the one installed at the top level.
  const e2bEntry = require.resolve('e2b')
  const e2bOfInterpreter = createRequire(entry).resolve('e2b')
  assert.equal(e2bOfInterpreter, e2bEntry, 'the code interpreter uses the top-level e2b package')
  const version = (name) => JSON.parse(readFileSync(join(cwd, 'node_modules', name, 'package.json'), 'utf8')).version
  const versions = { '@e2b/code-interpreter': version('@e2b/code-interpreter'), e2b: version('e2b') }
  const sdk = await import(pathToFileURL(entry).href)
  assert.equal(typeof sdk.Sandbox?.create, 'function', `${entry} exports no Sandbox`)
  assert.equal(typeof sdk.CommandExitError, 'function', `${entry} exports no CommandExitError`)
  return { ...sdk, versions }
}

let server
let sdk
// Why the tests are skipped where the server cannot start (outside CI only).
let notStarted = false
// The sandbox most tests share, made by the first test that needs it, and every sandbox made.
let shared
const made = new Set()

before(async () => {
  if (notRoot) return
  try {
    server = await startServer()
  } catch (error) {
    if (process.env.CI) throw error
    console.log(`skipping: ${error.message}`)
    notStarted = `evervm serve did not start: ${error.message.split('\n')[0]}`
    return
  }
  // Set before the SDK is loaded: no trailing slash, or the code interpreter's URLs get `//`.
  process.env.E2B_API_URL = server.url
  process.env.E2B_SANDBOX_URL = server.url
  process.env.E2B_API_KEY = server.key
  delete process.env.E2B_DEBUG
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_ACCESS_TOKEN
  sdk = await loadSdk()
  console.log(
    `E2B JS SDK: @e2b/code-interpreter ${sdk.versions['@e2b/code-interpreter']}, e2b ${sdk.versions.e2b}` +
      ` (from ${process.cwd()}), against ${server.url}`,
  )
})

after(async () => {
  if (!server) return
  // Whatever a failed test left running goes with the server; kill is best effort.
  for (const id of made) await sdk?.Sandbox.kill(id).catch(() => {})
  const status = await server.stop()
  assert.ok(
    status.code === 0 || status.signal === 'SIGTERM',
    `evervm serve stopped with ${JSON.stringify(status)}; its log:\n${server.log()}`,
  )
})

async function create(opts) {
  const sandbox = await sdk.Sandbox.create(opts)
  made.add(sandbox.sandboxId)
  return sandbox
}

/** The shared sandbox: metadata `suite`, GREETING=hi in its environment. */
function sharedSandbox() {
  shared ??= create({ metadata: { suite }, envs: { GREETING: 'hi' }, timeoutMs: 120_000 })
  return shared
}

/** runCode that must not fail: an error in the code fails the test with its traceback. */
async function run(sandbox, code, opts) {
  const execution = await sandbox.runCode(code, opts)
  assert.equal(execution.error, undefined, `${code}: ${execution.error?.traceback}`)
  return execution
}

/** A test of the SDK against the server: skipped where the server could not start. */
function sdkTest(name, body) {
  test(name, { skip: notRoot, timeout: TEST_TIMEOUT }, async (t) => {
    if (notStarted) return t.skip(notStarted)
    await body(t)
  })
}

sdkTest('create with metadata and envs; runCode keeps state, streams output, sees envs', async () => {
  const sandbox = await sharedSandbox()
  assert.equal(typeof sandbox.sandboxId, 'string')
  assert.ok(sandbox.sandboxId.length > 0, 'the sandbox has an id')

  const assigned = await run(sandbox, 'x = 41')
  assert.equal(assigned.text, undefined, 'an assignment has no result')
  const value = await run(sandbox, 'x + 1')
  assert.equal(value.text, '42', 'state is kept between runCode calls')
  assert.equal(value.results.length, 1)
  assert.equal(value.results[0].isMainResult, true)

  const out = []
  const err = []
  const printed = await run(sandbox, "print('out')\nimport sys; print('err', file=sys.stderr)", {
    onStdout: (message) => out.push(message),
    onStderr: (message) => err.push(message),
  })
  assert.deepEqual(
    out.map((m) => [m.line, m.error]),
    [['out\n', false]],
    'onStdout gets the printed line',
  )
  assert.deepEqual(
    err.map((m) => [m.line, m.error]),
    [['err\n', true]],
    'onStderr gets the line printed to stderr',
  )
  assert.deepEqual(printed.logs, { stdout: ['out\n'], stderr: ['err\n'] })
  assert.equal(printed.text, undefined)

  assert.equal((await run(sandbox, "import os\nos.environ['GREETING']")).text, 'hi', 'envs given at create')

  const withEnv = await run(sandbox, "os.environ['PER_CALL']", { envs: { PER_CALL: 'only here' } })
  assert.equal(withEnv.text, 'only here', "runCode's envs are visible in that call")
  const next = await run(sandbox, "'PER_CALL' in os.environ")
  assert.equal(next.text, 'False', "runCode's envs are gone in the next call")
  assert.equal((await run(sandbox, "os.environ['GREETING']")).text, 'hi', 'the create envs stay')
})

sdkTest('code contexts: their own globals and cwd, restarted, removed', async () => {
  const sandbox = await sharedSandbox()
  // Names of its own: the shared sandbox's other tests keep theirs.
  await run(sandbox, "where = 'default'")
  const context = await sandbox.createCodeContext({ cwd: '/tmp' })
  assert.deepEqual([context.language, context.cwd], ['python', '/tmp'])
  const listed = await sandbox.listCodeContexts()
  assert.equal(listed[listed.length - 1].id, context.id, 'the newest context is listed last')
  const here = await run(sandbox, "import os\nwhere = 'ctx'\nos.getcwd()", { context })
  assert.equal(here.text, '/tmp', 'a context starts in its cwd')
  assert.equal((await run(sandbox, 'where')).text, 'default', "the default context's globals are its own")
  assert.equal((await run(sandbox, 'where', { context })).text, 'ctx')
  await sandbox.restartCodeContext(context)
  const gone = await sandbox.runCode('where', { context })
  assert.equal(gone.error?.name, 'NameError', 'a restarted context has lost its variables')
  await sandbox.removeCodeContext(context)
  const after = await sandbox.listCodeContexts()
  assert.ok(!after.some((c) => c.id === context.id), 'a removed context is not listed')
  await assert.rejects(sandbox.runCode('1', { context }), (e) => e.name === 'NotFoundError')
})

sdkTest('rich results: a DataFrame as HTML, a matplotlib figure as PNG', async () => {
  const sandbox = await sharedSandbox()
  const frame = await run(sandbox, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
  const main = frame.results.find((r) => r.isMainResult)
  assert.ok(main, `a main result among ${JSON.stringify(frame.results)}`)
  assert.equal(typeof main.html, 'string', `the DataFrame has HTML: ${JSON.stringify(main)}`)
  assert.match(main.html, /<table/)
  assert.match(main.text, /a\s+b/, 'and a text form')

  const plot = await run(sandbox, 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
  const figures = plot.results.filter((r) => r.png)
  assert.equal(figures.length, 1, `one PNG among ${JSON.stringify(plot.results.map((r) => r.formats()))}`)
  const png = Buffer.from(figures[0].png, 'base64')
  assert.deepEqual(png.subarray(0, 8), PNG_SIGNATURE, 'the figure is a PNG')
  assert.ok(png.length > 1000, `a PNG of ${png.length} bytes is too small for a plot`)
})

sdkTest('an exception is execution.error and onError is called', async () => {
  const sandbox = await sharedSandbox()
  const errors = []
  const execution = await sandbox.runCode('1 / 0', { onError: (error) => errors.push(error) })
  assert.ok(execution.error, 'the execution has an error')
  assert.equal(execution.error.name, 'ZeroDivisionError')
  assert.match(execution.error.value, /division by zero/)
  assert.match(execution.error.traceback, /ZeroDivisionError/)
  assert.equal(errors.length, 1, 'onError is called once')
  assert.equal(errors[0].name, 'ZeroDivisionError')
  assert.equal(execution.text, undefined, 'a failed run has no result')
  // The REPL goes on.
  assert.equal((await run(sandbox, 'x + 1')).text, '42')
})

sdkTest('files: write, read, list, exists, makeDir, rename, remove; runCode reads them', async () => {
  const sandbox = await sharedSandbox()
  const { files } = sandbox
  const written = await files.write('/home/user/a.txt', 'content')
  assert.equal(written.path, '/home/user/a.txt')
  assert.equal(written.name, 'a.txt')
  assert.equal(await files.read('/home/user/a.txt'), 'content')
  // The REPL starts in the machine's home, which E2B calls /home/user.
  assert.equal((await run(sandbox, "open('a.txt').read()")).text, 'content')

  const listed = await files.list('/home/user')
  const entry = listed.find((e) => e.name === 'a.txt')
  assert.ok(entry, `a.txt among ${JSON.stringify(listed.map((e) => e.name))}`)
  assert.equal(entry.type, sdk.FileType.FILE)
  assert.equal(entry.path, '/home/user/a.txt')

  assert.equal(await files.exists('/home/user/a.txt'), true)
  assert.equal(await files.exists('/home/user/missing.txt'), false)
  await assert.rejects(files.read('/home/user/missing.txt'), sdk.FileNotFoundError)

  assert.equal(await files.makeDir('/home/user/dir'), true, 'makeDir makes a new directory')
  assert.equal(await files.makeDir('/home/user/dir'), false, 'makeDir of an existing directory')
  const dir = (await files.list('/home/user')).find((e) => e.name === 'dir')
  assert.equal(dir?.type, sdk.FileType.DIR)

  const moved = await files.rename('/home/user/a.txt', '/home/user/dir/b.txt')
  assert.equal(moved.path, '/home/user/dir/b.txt')
  assert.equal(await files.exists('/home/user/a.txt'), false, 'renamed away')
  assert.equal(await files.read('/home/user/dir/b.txt'), 'content')
  assert.equal((await run(sandbox, "open('dir/b.txt').read()")).text, 'content')

  await files.remove('/home/user/dir/b.txt')
  assert.equal(await files.exists('/home/user/dir/b.txt'), false, 'removed')
  await files.remove('/home/user/dir')
  assert.equal(await files.exists('/home/user/dir'), false, 'the directory removed')
})

sdkTest('commands.run: output, callbacks, exit codes', async () => {
  const sandbox = await sharedSandbox()
  const result = await sandbox.commands.run('echo out; echo err >&2')
  assert.equal(result.stdout, 'out\n')
  assert.equal(result.stderr, 'err\n')
  assert.equal(result.exitCode, 0)

  const chunks = []
  const errChunks = []
  const streamed = await sandbox.commands.run('echo one; echo two; echo three >&2', {
    onStdout: (data) => chunks.push(data),
    onStderr: (data) => errChunks.push(data),
  })
  assert.equal(chunks.join(''), 'one\ntwo\n', 'onStdout gets the output')
  assert.equal(errChunks.join(''), 'three\n', 'onStderr gets the error output')
  assert.equal(streamed.stdout, 'one\ntwo\n')

  const withEnv = await sandbox.commands.run('echo "$GREETING $ONLY_HERE"', { envs: { ONLY_HERE: 'there' } })
  assert.equal(withEnv.stdout, 'hi there\n', "a command sees the sandbox's envs and its own")

  await assert.rejects(sandbox.commands.run('echo before; exit 3'), (error) => {
    assert.ok(error instanceof sdk.CommandExitError, `a CommandExitError, not ${error?.constructor?.name}: ${error}`)
    assert.equal(error.exitCode, 3)
    assert.equal(error.stdout, 'before\n')
    return true
  })
})

sdkTest('setTimeout, pause, getInfo, connect: state survives the swap-out', async () => {
  const sandbox = await sharedSandbox()
  await run(sandbox, 'x = 41')
  await sandbox.setTimeout(60_000)
  const running = await sandbox.getInfo()
  assert.equal(running.sandboxId, sandbox.sandboxId)
  assert.equal(running.state, 'running')
  assert.deepEqual(running.metadata, { suite })
  const left = running.endAt.getTime() - Date.now()
  assert.ok(left > 30_000 && left <= 65_000, `the sandbox ends in ${left} ms, not about 60 s after setTimeout`)

  // `pause` in the newest releases, `betaPause` before.
  const pause = (typeof sandbox.pause === 'function' ? sandbox.pause : sandbox.betaPause).bind(sandbox)
  assert.equal(await pause(), true, 'pause pauses a running sandbox')
  const paused = await sdk.Sandbox.getInfo(sandbox.sandboxId)
  assert.equal(paused.state, 'paused')
  assert.equal(await pause(), false, 'pausing a paused sandbox')

  const connected = await sdk.Sandbox.connect(sandbox.sandboxId)
  assert.equal(connected.sandboxId, sandbox.sandboxId)
  assert.equal((await connected.getInfo()).state, 'running', 'connect resumes it')
  assert.equal((await run(connected, 'x + 1')).text, '42', 'the REPL keeps its state across the pause')
  assert.equal((await connected.files.exists('/home/user')), true)
})

sdkTest('list by metadata, kill', async () => {
  const sandbox = await sharedSandbox()
  // Another sandbox, whose metadata needs all of E2B's encoding, is not listed with this one's.
  const otherMetadata = { suite: `${suite} other`, 'key/x.y': 'a b&c=d%e/f?' }
  const other = await create({ metadata: otherMetadata, timeoutMs: 60_000 })

  const listed = await sdk.Sandbox.list({ query: { metadata: { suite } } }).nextItems()
  assert.deepEqual(
    listed.map((s) => s.sandboxId),
    [sandbox.sandboxId],
    'the list by metadata has this sandbox alone',
  )
  assert.deepEqual(listed[0].metadata, { suite })
  assert.equal(listed[0].state, 'running')
  const others = await sdk.Sandbox.list({ query: { metadata: otherMetadata } }).nextItems()
  assert.deepEqual(others.map((s) => s.sandboxId), [other.sandboxId], 'metadata that needs encoding')
  assert.deepEqual(others[0].metadata, otherMetadata)

  // Sandbox.kill says whether there was a sandbox to kill in every release; the instance's kill
  // does in the newest (e2b 2.28.0's returns nothing).
  assert.equal(await sdk.Sandbox.kill(sandbox.sandboxId), true, 'kill kills a sandbox')
  assert.deepEqual(await sdk.Sandbox.list({ query: { metadata: { suite } } }).nextItems(), [], 'killed: not listed')
  assert.equal(await sdk.Sandbox.kill(sandbox.sandboxId), false, 'killing a killed sandbox')
  const again = await sandbox.kill()
  if (again !== undefined) assert.equal(again, false, "the instance's kill of a killed sandbox")
  await assert.rejects(sdk.Sandbox.getInfo(sandbox.sandboxId), sdk.SandboxNotFoundError)

  assert.equal(await sdk.Sandbox.kill(other.sandboxId), true)
  assert.equal(await sdk.Sandbox.kill(other.sandboxId), false)
  made.clear()
})

/** GET through Node's http (fetch refuses URLs with a user part such as get_host's). */
function httpGet(url, headers) {
  return new Promise((resolve, reject) => {
    const request = http.get(url, { headers }, (response) => {
      const chunks = []
      response.on('data', (chunk) => chunks.push(chunk))
      response.on('end', () => resolve({ status: response.statusCode, body: Buffer.concat(chunks).toString() }))
    })
    request.on('error', reject)
  })
}

sdkTest('getHost reaches a server in the sandbox, for its owner only', async () => {
  const sandbox = await create({ timeoutMs: 120_000 })
  await sandbox.commands.run('python3 -m http.server 8000', { background: true })
  const url = `http://${sandbox.getHost(8000)}/`
  const owner = { 'e2b-traffic-access-token': sandbox.trafficAccessToken }
  let answer
  for (let tries = 0; tries < 40; tries++) {
    answer = await httpGet(url, owner)
    if (answer.status === 200) break
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
  assert.equal(answer.status, 200, answer.body)
  assert.match(answer.body, /Directory listing/)
  const refused = await httpGet(url, {})
  assert.equal(refused.status, 403, refused.body)
  await assert.rejects(fetch(url), /credentials/, 'fetch refuses a URL with a user part')
  await sandbox.kill()
})
