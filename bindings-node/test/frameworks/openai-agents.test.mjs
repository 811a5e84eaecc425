// `evervm/openai-agents` through the Agents SDK's run loop with its scripted model.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { Agent, run, setTracingDisabled } from '@openai/agents'
import { ScriptedModel, modelResponder, functionCall, assistantMessage } from '@openai/agents/testing'

import { pythonTool, PythonTool } from 'evervm/openai-agents'
import { withGvisor, FIRST_CODE, SECOND_CODE, lastNumber } from './helpers.mjs'

setTracingDisabled(true)

/** The outputs of the function calls in a model request's input, in order. */
function outputs(request) {
  const input = Array.isArray(request.input) ? request.input : []
  return input.filter((item) => item.type === 'function_call_result').map((item) => item.output)
}

test('two tool calls share a machine; the model reads the value and sees the plot', async (t) => {
  await withGvisor(t, async (client) => {
    const python = new PythonTool({ client, tags: { agent: 'openai-agents' } })
    let lastOutputs
    const model = new ScriptedModel([
      [functionCall('python_repl', { code: FIRST_CODE }, { callId: 'c1' })],
      [functionCall('python_repl', { code: SECOND_CODE }, { callId: 'c2' })],
      modelResponder(({ request }) => {
        lastOutputs = outputs(request)
        const text = lastOutputs[1].find((part) => part.type === 'input_text').text
        return [assistantMessage(`Twice the sum of squares is ${lastNumber(text)}.`)]
      }),
    ])
    const agent = new Agent({ name: 'analyst', instructions: 'Use Python.', model, tools: [pythonTool(python)] })
    const result = await run(agent, 'What is twice the sum of the squares below 10? Plot them.')
    assert.equal(result.finalOutput, 'Twice the sum of squares is 570.')
    model.assertComplete()

    assert.equal(lastOutputs.length, 2)
    const [text, image] = lastOutputs[1]
    assert.equal(text.text, 'doubled\n570\n[1 figure, attached as an image]')
    assert.equal(image.type, 'input_image')
    const png = Buffer.from(image.image.replace(/^data:image\/png;base64,/, ''), 'base64')
    assert.equal(png.subarray(1, 4).toString(), 'PNG')
    assert.ok(png.length > 5000, `a plot, not a dot: ${png.length} bytes`)

    const machines = await client.listMachines({ tags: { agent: 'openai-agents' } })
    assert.deepEqual(machines.map((m) => m.name), [(await python.machine()).name])
  })
})
