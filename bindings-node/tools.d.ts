// Types of `evervm/tools`.
import type { Client, ExecResult, Machine, CreateMachineOptions } from './index'

export interface ToolSpec {
  name: string
  description: string
  /** What the `code` argument is. */
  codeDescription: string
}

/** The tool's name and descriptions, written for a model (the same in every evervm helper). */
export declare const toolSpec: ToolSpec

export interface PythonToolOptions extends CreateMachineOptions {
  /** The client that creates the tool's machine (not needed when `machine` is a `Machine`). */
  client?: Client
  /** A machine (or a machine's name) to use instead of creating one. */
  machine?: Machine | string
  /** Per call (default 60). */
  timeoutSeconds?: number
  /** What the model is told (defaults: `toolSpec`). */
  name?: string
  description?: string
}

export interface ToolImage {
  /** `image/png`, ... */
  mediaType: string
  /** Base64. */
  data: string
}

export interface ToolOutput {
  /** What the model should read: output, then the error or value, then what was displayed. */
  text: string
  /** The figures and images shown, in order. */
  images: ToolImage[]
  /** A Python exception, a timeout or a crash. */
  isError: boolean
  /** The machine's name. */
  machine: string
  result: ExecResult
}

export interface JsonSchemaObject {
  type: 'object'
  properties: { code: { type: 'string'; description: string } }
  required: ['code']
  additionalProperties: false
}

/** A stateful Python tool: one machine per instance, created at its first call. */
export declare class PythonTool {
  constructor(options: PythonToolOptions)
  readonly name: string
  readonly description: string
  readonly codeDescription: string
  timeoutSeconds: number
  readonly parameters: JsonSchemaObject
  /** The tool's machine, created at the first call. */
  machine(): Promise<Machine>
  run(code: string, options?: { signal?: AbortSignal }): Promise<ToolOutput>
  /** A tool call's arguments, as an object or as JSON text. */
  call(args: string | { code: string }, options?: { signal?: AbortSignal }): Promise<ToolOutput>
  openaiChatTool(): { type: 'function'; function: { name: string; description: string; parameters: JsonSchemaObject } }
  openaiTool(): { type: 'function'; name: string; description: string; parameters: JsonSchemaObject; strict: true }
  anthropicTool(): { name: string; description: string; input_schema: JsonSchemaObject }
  static openaiOutput(
    output: ToolOutput,
  ): Array<{ type: 'input_text'; text: string } | { type: 'input_image'; image_url: string }>
  static anthropicContent(
    output: ToolOutput,
  ): Array<
    { type: 'text'; text: string } | { type: 'image'; source: { type: 'base64'; media_type: string; data: string } }
  >
}
