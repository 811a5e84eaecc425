// Types of `evervm/openai-agents`.
import type { FunctionTool } from '@openai/agents'
import type { PythonTool, PythonToolOptions } from './tools'

export { PythonTool } from './tools'

/** The Python tool for the OpenAI Agents SDK: one machine per tool, created at its first call. */
export declare function pythonTool(options: PythonToolOptions | PythonTool): FunctionTool<unknown, any, unknown>
