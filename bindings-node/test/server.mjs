// `evervm serve` for tests and benchmarks (EVERVM_BIN, else the workspace's debug build), with
// nothing from the Node package: the MCP tests (tests/mcp/ts) use it too.
import { spawn } from 'node:child_process'
import { mkdtempSync, rmSync, existsSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createInterface } from 'node:readline'

const repo = join(dirname(fileURLToPath(import.meta.url)), '..', '..')

export function evervmBinary() {
  const path = process.env.EVERVM_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(repo, 'target'), 'debug', 'evervm')
  if (!existsSync(path)) throw new Error(`${path} is missing: run \`cargo build -p evervm-cli\` or set EVERVM_BIN`)
  return path
}

/** `evervm serve` on a free loopback port and a fresh home; `args` are more of serve's flags. */
export async function startServer(backend = 'process', args = []) {
  const home = mkdtempSync(join(tmpdir(), 'evervm-node-'))
  const child = spawn(evervmBinary(), ['serve', '--listen', '127.0.0.1:0', '--backend', backend, '--home', home, ...args], {
    stdio: ['ignore', 'pipe', 'ignore'],
    env: { ...process.env, EVERVM_POOL_SIZE: '1' },
  })
  let url, token
  for await (const line of createInterface({ input: child.stdout })) {
    url ??= /listening on (\S+)/.exec(line)?.[1]
    token ??= /export EVERVM_TOKEN=(\S+)/.exec(line)?.[1]
    if (url && token) break
  }
  if (!url || !token) throw new Error('the server printed no URL and token')
  return {
    url,
    token,
    async stop() {
      const exited = new Promise((resolve) => child.once('exit', resolve))
      child.kill('SIGTERM')
      await exited
      rmSync(home, { recursive: true, force: true })
    },
  }
}
