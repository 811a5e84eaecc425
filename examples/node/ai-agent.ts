// A Vercel AI SDK agent with a persistent Python tool:
//   cd examples/node && npm install && node ai-agent.ts
//
// With OPENAI_API_KEY set it asks an OpenAI model (EVERVM_EXAMPLE_MODEL, default gpt-4.1-mini);
// without it, a scripted model plays the part, so that the example runs offline. The loop and
// the tool are the same either way.
import { generateText, stepCountIs, type LanguageModel } from 'ai'
import { MockLanguageModelV4 } from 'ai/test'
import { openai } from '@ai-sdk/openai'
import { Client } from 'evervm'
import { PythonTool, pythonTool } from 'evervm/ai'

/** Plays the model: loads data, plots it, then reports the tool's answer. */
function scriptedModel(): LanguageModel {
  const script = [
    "prices = {'apple': 1.25, 'pear': 0.8, 'fig': 2.5}",
    "import matplotlib.pyplot as plt\nplt.bar(list(prices), list(prices.values()))\nround(sum(prices.values()) / len(prices), 2)",
  ]
  const usage = {
    inputTokens: { total: 0, noCache: 0, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 0, text: 0, reasoning: undefined },
  }
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const results = prompt.flatMap((m) => (m.role === 'tool' ? m.content : [])).filter((p) => p.type === 'tool-result')
      if (results.length < script.length) {
        const input = JSON.stringify({ code: script[results.length] })
        return {
          content: [{ type: 'tool-call', toolCallId: `call${results.length}`, toolName: 'python', input }],
          finishReason: { unified: 'tool-calls', raw: undefined },
          usage,
          warnings: [],
        }
      }
      const output = results[results.length - 1].output
      const parts = output.type === 'content' ? output.value : []
      const text = parts.flatMap((p) => (p.type === 'text' ? [p.text] : [])).join('\n')
      const images = parts.filter((p) => p.type === 'file').length
      const average = /([\d.]+)\n\[1 figure/.exec(text)?.[1]
      return {
        content: [{ type: 'text', text: `The average price is ${average} (I looked at ${images} chart).` }],
        finishReason: { unified: 'stop', raw: undefined },
        usage,
        warnings: [],
      }
    },
  })
}

const model: LanguageModel = process.env.OPENAI_API_KEY
  ? openai(process.env.EVERVM_EXAMPLE_MODEL ?? 'gpt-4.1-mini')
  : scriptedModel()

const client = await Client.local()
const python = new PythonTool({ client, tags: { example: 'ai-agent' } })
const { text, steps } = await generateText({
  model,
  tools: { python: pythonTool(python) },
  stopWhen: stepCountIs(6),
  prompt: 'Fruit prices: apple 1.25, pear 0.8, fig 2.5. Chart them and tell me the average price.',
})
console.log(`${steps.length} steps`)
console.log(text)
await (await python.machine()).delete()
await client.close()
