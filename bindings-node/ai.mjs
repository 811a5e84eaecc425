// `evervm/ai`: the Python tool for the Vercel AI SDK (`ai` 7 with `zod`, peer dependencies).
//
//   import { generateText, stepCountIs } from 'ai'
//   import { Client } from 'evervm'
//   import { pythonTool } from 'evervm/ai'
//
//   const client = await Client.local()
//   const { text } = await generateText({ model, tools: { python: pythonTool({ client }) },
//     stopWhen: stepCountIs(5), prompt: 'Plot the first 20 squares' })
//
// One machine per tool, created at its first call. The model reads the text of each result,
// and each figure as an image part; a Python exception reaches it as an error result.
import { tool } from 'ai'
import { z } from 'zod'

import { PythonTool } from './tools.mjs'

/** An AI SDK tool on a `PythonTool` (given, or made from `PythonTool`'s options). Its output
 * is `{ text, images, isError, machine }`; `toModelOutput` turns it into a text part and one
 * image part per figure. */
export function pythonTool(options) {
  const python = options instanceof PythonTool ? options : new PythonTool(options)
  return tool({
    description: python.description,
    inputSchema: z.object({ code: z.string().describe(python.codeDescription) }),
    execute: async ({ code }, { abortSignal }) => {
      const { text, images, isError, machine } = await python.run(code, { signal: abortSignal })
      return { text, images, isError, machine }
    },
    toModelOutput: ({ output }) =>
      output.isError
        ? { type: 'error-text', value: output.text }
        : {
            type: 'content',
            value: [
              { type: 'text', text: output.text },
              ...output.images.map((image) => ({ type: 'file', mediaType: image.mediaType, data: { type: 'data', data: image.data } })),
            ],
          },
  })
}

export { PythonTool }
