// Runs an E2B JS code-interpreter release (the package named by the first argument, from
// js-leaks/) set up as docs/e2b.md tells users (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY,
// and E2B_DOMAIN set to evervm's sink domain): creates a sandbox and runs a cell, recording the
// host of every connection the process opens. Prints one JSON object, as leak_probe.py does;
// test_sdk_leaks.py judges it.

import net from 'node:net'
import tls from 'node:tls'
import { createRequire } from 'node:module'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const seen = []
const hostOf = (args) => {
  const first = args[0]
  if (Array.isArray(first)) return hostOf(first)
  if (first && typeof first === 'object') return String(first.host ?? first.path ?? 'localhost')
  return String(args[1] ?? 'localhost')
}
const realConnect = net.Socket.prototype.connect
net.Socket.prototype.connect = function (...args) {
  seen.push(['connect', hostOf(args)])
  return realConnect.apply(this, args)
}
const realTlsConnect = tls.connect
tls.connect = function (...args) {
  seen.push(['connect', hostOf(args)])
  return realTlsConnect.apply(this, args)
}

const name = process.argv[2]
const here = path.dirname(fileURLToPath(import.meta.url))
const require = createRequire(path.join(here, 'js-leaks', 'package.json'))
const outcome = {
  'e2b-code-interpreter': require(`${name}/package.json`).version,
}
const describe = (error) => `${error?.name}: ${error?.message}`.slice(0, 500)
try {
  const module = await import(require.resolve(name))
  outcome.e2b = require(require.resolve('e2b/package.json', { paths: [path.dirname(require.resolve(name))] })).version
  if (module.Sandbox) {
    const sandbox = await module.Sandbox.create({ timeoutMs: 60_000 })
    outcome.created = sandbox.sandboxId
    try {
      const execution = await sandbox.runCode("print('reached')")
      outcome.ran = execution.logs.stdout.join('')
    } catch (error) {
      outcome.run_error = describe(error)
    }
    await sandbox.kill().catch((error) => { outcome.kill_error = describe(error) })
  } else {
    // The 0.x API.
    const sandbox = await module.CodeInterpreter.create({ timeout: 60_000 })
    outcome.created = sandbox.id
    try {
      const execution = await sandbox.notebook.execCell("print('reached')")
      outcome.ran = execution.logs.stdout.join('')
    } catch (error) {
      outcome.run_error = describe(error)
    }
    await sandbox.close().catch(() => {})
  }
} catch (error) {
  outcome.create_error = describe(error)
}
process.stdout.write(JSON.stringify({ seen, outcome }))
process.exit(0)
