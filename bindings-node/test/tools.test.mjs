// `evervm/tools`: the framework-free Python tool, on the process backend in both transports.
import assert from 'node:assert/strict'
import { test } from 'node:test'
import { createRequire } from 'node:module'

import { InvalidInputError, AbortError } from 'evervm'
import { PythonTool, toolSpec } from 'evervm/tools'
import { bothTransports } from './helpers.mjs'

// A 1x1 PNG made by Python (no matplotlib on the process backend), shown with display().
const SHOW_PNG = `
import struct, zlib
def _chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
class Dot:
    def _repr_png_(self):
        return (b'\\x89PNG\\r\\n\\x1a\\n' + _chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0))
                + _chunk(b'IDAT', zlib.compress(b'\\x00\\x00')) + _chunk(b'IEND', b''))
display(Dot())
print('shown')
`

test('the CommonJS and ES module entries of evervm/tools are one', () => {
  assert.equal(createRequire(import.meta.url)('evervm/tools').PythonTool, PythonTool)
  assert.equal(toolSpec.name, 'python_repl')
  assert.match(toolSpec.description, /persist/)
})

test('one machine per tool, state across calls, errors and images, definitions', async () => {
  await bothTransports(async (client, label) => {
    const tool = new PythonTool({ client, tags: { suite: 'node-tools', transport: label } })
    const [first, second] = await Promise.all([tool.run('x = 6 * 7'), tool.machine()])
    assert.equal(first.machine, second.name, 'concurrent first uses share one machine')
    const run = await tool.call(JSON.stringify({ code: "print('computing')\nx" }))
    assert.equal(run.text, 'computing\n42')
    assert.equal(run.isError, false)
    assert.equal(run.result.value, '42')
    const machines = await client.listMachines({ tags: { suite: 'node-tools', transport: label } })
    assert.deepEqual(machines.map((m) => m.name), [run.machine], label)

    const failed = await tool.call({ code: '1 / 0' })
    assert.equal(failed.isError, true)
    assert.match(failed.text, /ZeroDivisionError/)

    const shown = await tool.run(SHOW_PNG)
    assert.equal(shown.images.length, 1)
    assert.equal(shown.images[0].mediaType, 'image/png')
    assert.equal(Buffer.from(shown.images[0].data, 'base64').subarray(1, 4).toString(), 'PNG')
    // The model reads what was printed and the displayed object's text.
    assert.match(shown.text, /^shown\n<__main__\.Dot object at 0x[0-9a-f]+>$/)
    assert.deepEqual(PythonTool.anthropicContent(shown), [
      { type: 'text', text: shown.text },
      { type: 'image', source: { type: 'base64', media_type: 'image/png', data: shown.images[0].data } },
    ])
    assert.equal(PythonTool.openaiOutput(shown)[1].image_url, `data:image/png;base64,${shown.images[0].data}`)
    await (await tool.machine()).delete()
  })
})

test('definitions for OpenAI and Anthropic carry one JSON schema; bad arguments are refused', async () => {
  await bothTransports(async (client) => {
    const tool = new PythonTool({ client, name: 'py', timeoutSeconds: 5 })
    const schema = {
      type: 'object',
      properties: { code: { type: 'string', description: toolSpec.codeDescription } },
      required: ['code'],
      additionalProperties: false,
    }
    assert.deepEqual(tool.openaiChatTool(), { type: 'function', function: { name: 'py', description: toolSpec.description, parameters: schema } })
    assert.deepEqual(tool.openaiTool(), { type: 'function', name: 'py', description: toolSpec.description, parameters: schema, strict: true })
    assert.deepEqual(tool.anthropicTool(), { name: 'py', description: toolSpec.description, input_schema: schema })
    await assert.rejects(tool.call('{not json'), InvalidInputError)
    await assert.rejects(tool.call({ source: 'x' }), InvalidInputError)
    await assert.rejects(tool.run(42), InvalidInputError)

    const timedOut = await tool.run('import time\ntime.sleep(30)')
    assert.equal(timedOut.isError, true)
    assert.equal(timedOut.result.timedOut, true)
    const controller = new AbortController()
    setTimeout(() => controller.abort(), 300)
    await assert.rejects(tool.run('y = 1\nimport time\ntime.sleep(30)', { signal: controller.signal }), AbortError)
    assert.equal((await tool.run('y')).text, '1', 'an abort interrupts and keeps the state')
    await (await tool.machine()).delete()
  })
  assert.throws(() => new PythonTool({}), InvalidInputError)
})
