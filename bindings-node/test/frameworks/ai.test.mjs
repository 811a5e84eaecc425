// `evervm/ai` through the AI SDK's own loop: `generateText` with its mock language model.
import assert from 'node:assert/strict'
import { test } from 'node:test'

import { generateText, stepCountIs } from 'ai'
import { MockLanguageModelV4 } from 'ai/test'

import { pythonTool, PythonTool } from 'evervm/ai'
import { withGvisor, FIRST_CODE, SECOND_CODE, lastNumber } from './helpers.mjs'

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 10, text: 10, reasoning: undefined },
}

function toolCall(id, code) {
  return {
    content: [{ type: 'tool-call', toolCallId: id, toolName: 'python', input: JSON.stringify({ code }) }],
    finishReason: { unified: 'tool-calls', raw: undefined },
    usage,
    warnings: [],
  }
}

/** The tool results the model was shown, in order. */
function toolResults(prompt) {
  return prompt
    .filter((message) => message.role === 'tool')
    .flatMap((message) => message.content.filter((part) => part.type === 'tool-result'))
}

test('two tool calls share a machine; the model reads the value and sees the plot', async (t) => {
  await withGvisor(t, async (client) => {
    const python = new PythonTool({ client, tags: { agent: 'ai-sdk' } })
    const model = new MockLanguageModelV4({
      doGenerate: async ({ prompt }) => {
        const results = toolResults(prompt)
        if (results.length === 0) return toolCall('c1', FIRST_CODE)
        if (results.length === 1) return toolCall('c2', SECOND_CODE)
        // The answer is read off the last tool result, as a model would.
        const text = results[1].output.value.find((part) => part.type === 'text').text
        return {
          content: [{ type: 'text', text: `Twice the sum of squares is ${lastNumber(text)}.` }],
          finishReason: { unified: 'stop', raw: undefined },
          usage,
          warnings: [],
        }
      },
    })
    const result = await generateText({
      model,
      tools: { python: pythonTool(python) },
      stopWhen: stepCountIs(5),
      prompt: 'What is twice the sum of the squares below 10? Plot them.',
    })
    assert.equal(result.text, 'Twice the sum of squares is 570.')
    assert.equal(model.doGenerateCalls.length, 3)

    const shown = toolResults(model.doGenerateCalls[2].prompt)
    assert.deepEqual(shown[0].output, { type: 'content', value: [{ type: 'text', text: '285' }] })
    const [text, image] = shown[1].output.value
    assert.deepEqual(text, { type: 'text', text: 'doubled\n570\n[1 figure, attached as an image]' })
    assert.equal(image.type, 'file')
    assert.equal(image.mediaType, 'image/png')
    const png = Buffer.from(image.data.data, 'base64')
    assert.equal(png.subarray(1, 4).toString(), 'PNG')
    assert.ok(png.length > 5000, `a plot, not a dot: ${png.length} bytes`)

    // One machine for both calls, found by its tags.
    const machines = await client.listMachines({ tags: { agent: 'ai-sdk' } })
    assert.deepEqual(machines.map((m) => m.name), [(await python.machine()).name])
  })
})

test('a Python exception reaches the model as an error result', async (t) => {
  await withGvisor(t, async (client) => {
    let seen
    const model = new MockLanguageModelV4({
      doGenerate: async ({ prompt }) => {
        const results = toolResults(prompt)
        if (results.length === 0) return toolCall('e1', "{}['missing']")
        seen = results[0].output
        return { content: [{ type: 'text', text: 'It failed.' }], finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] }
      },
    })
    await generateText({ model, tools: { python: pythonTool({ client, image: 'minimal' }) }, stopWhen: stepCountIs(3), prompt: 'x' })
    assert.equal(seen.type, 'error-text')
    assert.match(seen.value, /KeyError: 'missing'/)
  })
})
