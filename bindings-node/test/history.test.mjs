// Undo points: a machine created with `history` on gVisor, taken back with `undo` and `rewind`,
// listed with `history`; a machine without them refuses (process backend, both transports).
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { ConflictError, InvalidInputError, UnsupportedError } from 'evervm'
import { bothTransports, withGvisor } from './helpers.mjs'

test('undo, rewind and history on a machine that keeps undo points (gVisor)', async (t) => {
  await withGvisor(t, async (client) => {
    let machine
    try {
      machine = await client.createMachine({ image: 'minimal', history: 3 })
    } catch (error) {
      if (!(error instanceof UnsupportedError)) throw error
      t.skip(`this engine cannot keep undo points here: ${error.message}`)
      return
    }
    const info = await machine.info()
    assert.equal(info.history, 3)
    assert.ok(info.parent == null && info.forkedAt == null, 'a created machine has no parent')
    await machine.exec('x = 1')
    await machine.exec('x = 2')

    assert.deepEqual(await machine.undo(), { to: 0, rewound: 1 })
    const history = await machine.history()
    assert.equal(history.keeps, 3)
    assert.equal(history.initialPoint, true)
    assert.deepEqual(
      history.instructions.map((i) => [i.seq, i.code, i.finished, i.rewound]),
      [[0, 'x = 1', true, false], [1, 'x = 2', true, true]],
    )
    assert.equal(history.instructions[0].undoPoint, true)
    assert.deepEqual((await machine.history(1)).instructions.map((i) => i.seq), [1])
    const looked = await machine.exec('x')
    assert.equal(looked.value, '1')

    assert.deepEqual(await machine.rewind(0), { to: 0, rewound: 1 })
    assert.equal((await machine.exec('x')).value, '1')
    assert.equal((await machine.history()).instructions[looked.seq].rewound, true)
    await assert.rejects(machine.rewind('0'), InvalidInputError)

    const fork = await machine.fork()
    const forked = await fork.info()
    assert.equal(forked.parent, machine.name)
    assert.equal(forked.forkedAt, looked.seq + 1)
    await fork.delete()

    await machine.exec('x = 5')
    const early = await machine.fork({ at: 0 }) // right after instruction 0; machine untouched
    const earlyInfo = await early.info()
    assert.deepEqual([earlyInfo.parent, earlyInfo.forkedAt], [machine.name, 0])
    assert.equal((await early.exec('x')).value, '1')
    assert.equal((await machine.exec('x')).value, '5')
    await assert.rejects(machine.fork({ at: 0.5 }), InvalidInputError)
    const lineage = await early.lineage()
    assert.equal(lineage.root, machine.name)
    assert.deepEqual(
      lineage.machines.map((m) => [m.name, m.parent ?? null, m.forkedAt ?? null]),
      [[machine.name, null, null], [early.name, machine.name, 0]],
    )
    // The undo and the rewind both went back to instruction 0: one run, 1 to 2.
    assert.deepEqual(lineage.machines[0].takenBack, [{ first: 1, last: 2, by: 'rewind to 0' }])
    assert.deepEqual(lineage.machines[0].checkpoints, [])
    assert.ok(!Number.isNaN(Date.parse(lineage.machines[1].createdAt)))
    await early.delete()
    await machine.delete()
  })
})

test('a machine without history refuses undo and rewind', async () => {
  await bothTransports(async (client, label) => {
    // The process backend cannot keep undo points at all.
    await assert.rejects(client.createMachine({ history: 3 }), UnsupportedError, label)
    const machine = await client.createMachine()
    await machine.exec('x = 1')
    assert.equal((await machine.info()).history, 0)
    await assert.rejects(machine.undo(), (error) => {
      assert.ok(error instanceof ConflictError, String(error))
      assert.equal(error.code, 'Conflict')
      assert.match(error.message, /history/)
      return true
    })
    await assert.rejects(machine.rewind(0), ConflictError)
    await machine.delete()
  })
})
