// `evervm/openai-agents`: the Python tool for the OpenAI Agents SDK (`@openai/agents` with
// `zod` 4, peer dependencies).
//
//   import { Agent, run } from '@openai/agents'
//   import { Client } from 'evervm'
//   import { pythonTool } from 'evervm/openai-agents'
//
//   const agent = new Agent({ name: 'analyst', tools: [pythonTool({ client: await Client.local() })] })
//   const result = await run(agent, 'What is the 30th Fibonacci number?')
//
// One machine per tool, created at its first call; the model reads the text of each result
// and each figure as an image.
import { tool } from '@openai/agents'
import { z } from 'zod'

import { PythonTool } from './tools.mjs'

/** An Agents SDK function tool on a `PythonTool` (given, or made from its options). */
export function pythonTool(options) {
  const python = options instanceof PythonTool ? options : new PythonTool(options)
  return tool({
    name: python.name,
    description: python.description,
    parameters: z.object({ code: z.string().describe(python.codeDescription) }),
    execute: async ({ code }, _context, details) => {
      const { text, images } = await python.run(code, { signal: details?.signal })
      return [
        { type: 'text', text },
        ...images.map((image) => ({ type: 'image', image: { data: image.data, mediaType: image.mediaType } })),
      ]
    },
  })
}

export { PythonTool }
