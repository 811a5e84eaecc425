// examples/node run as a user runs them (`node quickstart.ts` on Node 22, which strips the types)
// and print what they promise. `npm ci` in examples/node comes first (scripts/test.sh).
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { execFileSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

// EVERVM_REPO: where the repository is when these tests run from an installed copy.
const repo = process.env.EVERVM_REPO ?? join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..')
const examples = join(repo, 'examples', 'node')

function run(script) {
  const home = mkdtempSync(join(tmpdir(), 'evervm-example-'))
  try {
    const env = { ...process.env, EVERVM_HOME: home, EVERVM_POOL_SIZE: '0' }
    delete env.OPENAI_API_KEY
    return execFileSync(process.execPath, [script], { cwd: examples, env, encoding: 'utf8', timeout: 300_000 })
  } finally {
    rmSync(home, { recursive: true, force: true })
  }
}

test('the TypeScript quick start', () => {
  const out = run('quickstart.ts')
  assert.match(out, /^mean computed\nmean: 79\.25\n/)
  assert.match(out, /  line: 65\n  line: 71\n  line: 88\n  line: 93\n  last value: 93\n/)
  assert.match(out, /mean from the file: 79\.25\n/)
  assert.match(out, /aborted: AbortError\nstill there: 4\n/)
  assert.match(out, /as expected: NotFound\n$/)
})

test('the AI SDK agent, offline with its scripted model', () => {
  const out = run('ai-agent.ts')
  assert.equal(out, '3 steps\nThe average price is 1.52 (I looked at 1 chart).\n')
})
