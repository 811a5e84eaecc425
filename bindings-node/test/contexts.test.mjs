// Code contexts: more interpreters in one machine, each with its own globals and working
// directory, named by `exec`'s `context` (process backend, both transports).
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { InvalidInputError, NotFoundError } from 'evervm'
import { bothTransports } from './helpers.mjs'

test('contexts: their own globals and cwd, restarted, removed', async () => {
  await bothTransports(async (client, label) => {
    const machine = await client.createMachine({ image: 'minimal' })
    const made = await machine.exec(
      'import os, tempfile\nprint(os.path.realpath(tempfile.mkdtemp(prefix="ctx-")))',
    )
    const cwd = made.stdout.trim()
    assert.ok(cwd.startsWith('/'), `${label}: ${made.stdout} ${made.error}`)
    const context = await machine.createContext({ cwd })
    assert.equal(context.cwd, cwd, label)
    assert.notEqual(context.id, 'default')
    assert.deepEqual(
      (await machine.contexts()).map((c) => c.id),
      ['default', context.id],
    )

    await machine.exec('x = 1')
    const missing = await machine.exec('x', { context: context.id })
    assert.equal(missing.ok, false, label)
    assert.equal(missing.exception?.name, 'NameError')
    assert.equal((await machine.exec('x')).value, '1', 'the default context keeps its own')

    const here = await machine.exec('import os\nos.getcwd()', { context: context.id })
    assert.equal(here.value, `'${cwd}'`, label)
    // Through the streamed path as well (an output callback makes `exec` stream).
    const lines = []
    const streamed = await machine.exec('y = 2\nprint(os.getcwd())', {
      context: context.id,
      onStdout: (line) => lines.push(line),
    })
    assert.equal(streamed.ok, true, streamed.error)
    assert.deepEqual(lines, [cwd])
    assert.equal((await machine.exec('y', { context: context.id })).value, '2')

    const restarted = await machine.restartContext(context.id)
    assert.equal(restarted.id, context.id)
    assert.equal(restarted.cwd, cwd)
    const forgotten = await machine.exec('y', { context: context.id })
    assert.equal(forgotten.exception?.name, 'NameError', 'a restart loses its variables')
    assert.equal((await machine.exec('x')).value, '1', 'and leaves the default context alone')

    await machine.removeContext(context.id)
    assert.deepEqual((await machine.contexts()).map((c) => c.id), ['default'])
    const gone = await machine.exec('1', { context: context.id })
    assert.equal(gone.ok, false, label)
    assert.equal(gone.exception?.name, 'ContextNotFound')
    await assert.rejects(machine.restartContext(context.id), NotFoundError)
    await assert.rejects(machine.removeContext(context.id), NotFoundError)
    await assert.rejects(machine.removeContext('default'), InvalidInputError)
    await assert.rejects(machine.restartContext('default'), InvalidInputError)

    const home = await machine.createContext()
    assert.equal((await machine.exec('1 + 1', { context: home.id })).value, '2')
    await machine.delete()
  })
})
