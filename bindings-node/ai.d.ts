// Types of `evervm/ai`.
import type { Tool } from 'ai'
import type { PythonTool, PythonToolOptions, ToolImage } from './tools'

export { PythonTool } from './tools'

export interface AiToolOutput {
  text: string
  images: ToolImage[]
  isError: boolean
  machine: string
}

/** The Python tool for the Vercel AI SDK: one machine per tool, created at its first call. */
export declare function pythonTool(options: PythonToolOptions | PythonTool): Tool<{ code: string }, AiToolOutput>
