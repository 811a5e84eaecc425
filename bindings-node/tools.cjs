'use strict'
// `evervm/tools`: the Python tool without any framework, for OpenAI- or Anthropic-style function
// calling, and the one piece the AI SDK and Agents SDK helpers (`evervm/ai`,
// `evervm/openai-agents`) wrap. The tool's name, descriptions and result text come from the
// Rust client, the same as in the Python package and the MCP server.

const native = require('./binding.cjs')
const { Client, Machine, InvalidInputError } = require('./index.cjs')

const spec = native.toolSpec()

/** The media types of rich results that models take as images. */
const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp']

/** A stateful Python tool: one machine per instance, created at its first call (or the
 * `machine` given), reused by every call after, so variables, imports and files persist. */
class PythonTool {
  #client
  #options
  #machine

  /** Options: `client` (a `Client`; required unless `machine` is a `Machine`), `machine` (a
   * `Machine` or a machine's name to use instead of creating one), `tags`, `memoryMb`, `image`,
   * `env` for the machine it creates, `timeoutSeconds` per call (default 60), and `name` /
   * `description` to override what the model is told. */
  constructor(options = {}) {
    const { client, machine, timeoutSeconds = 60, name, description, ...create } = options ?? {}
    if (machine instanceof Machine) {
      this.#machine = Promise.resolve(machine)
    } else if (!(client instanceof Client)) {
      throw new InvalidInputError('PythonTool needs a `client` (an evervm Client) or a `machine`', 'InvalidInput')
    } else if (machine != null) {
      this.#machine = Promise.resolve(client.machine(String(machine)))
    }
    this.#client = client
    this.#options = create
    this.timeoutSeconds = timeoutSeconds
    this.name = name ?? spec.name
    this.description = description ?? spec.description
    this.codeDescription = spec.codeDescription
  }

  /** The tool's input as JSON Schema: `{ code: string }`. */
  get parameters() {
    return {
      type: 'object',
      properties: { code: { type: 'string', description: this.codeDescription } },
      required: ['code'],
      additionalProperties: false,
    }
  }

  /** The tool's machine, created at the first call (concurrent first calls share it). */
  machine() {
    if (!this.#machine) {
      this.#machine = this.#client.createMachine(this.#options)
      // A failed creation is tried again at the next call.
      this.#machine.catch(() => {
        this.#machine = undefined
      })
    }
    return this.#machine
  }

  /** Runs `code` on the tool's machine: `{ text, images, isError, machine, result }`, where
   * `text` is what the model should read, `images` the figures and images it showed (base64,
   * with their media type) and `result` the whole `ExecResult`. A Python exception or a timeout
   * is a result with `isError`; an `AbortSignal` interrupts the instruction (state kept) and
   * rejects with an `AbortError`. */
  async run(code, options = {}) {
    if (typeof code !== 'string') throw new InvalidInputError('code must be a string', 'InvalidInput')
    const machine = await this.machine()
    const result = await machine.exec(code, { timeoutSeconds: this.timeoutSeconds, signal: options?.signal })
    const images = []
    for (const rich of result.results) {
      const mediaType = IMAGE_TYPES.find((type) => typeof rich.data[type] === 'string')
      if (mediaType) images.push({ mediaType, data: rich.data[mediaType] })
    }
    return { text: native.toolText(result), images, isError: !result.ok, machine: machine.name, result }
  }

  /** Runs a tool call's arguments (an object, or its JSON text as models send it). */
  async call(args, options) {
    let input = args
    if (typeof input === 'string') {
      try {
        input = JSON.parse(input)
      } catch (error) {
        throw new InvalidInputError(`the tool's arguments are not JSON: ${error.message}`, 'InvalidInput')
      }
    }
    if (typeof input?.code !== 'string') {
      throw new InvalidInputError('the tool takes one argument, `code`, a string', 'InvalidInput')
    }
    return this.run(input.code, options)
  }

  /** The definition for OpenAI's Chat Completions `tools`. */
  openaiChatTool() {
    return { type: 'function', function: { name: this.name, description: this.description, parameters: this.parameters } }
  }

  /** The definition for OpenAI's Responses API `tools`. */
  openaiTool() {
    return { type: 'function', name: this.name, description: this.description, parameters: this.parameters, strict: true }
  }

  /** The definition for Anthropic's Messages API `tools`. */
  anthropicTool() {
    return { name: this.name, description: this.description, input_schema: this.parameters }
  }

  /** A run's output as a Responses API `function_call_output` `output`: text and images. */
  static openaiOutput(output) {
    return [
      { type: 'input_text', text: output.text },
      ...output.images.map((image) => ({ type: 'input_image', image_url: `data:${image.mediaType};base64,${image.data}` })),
    ]
  }

  /** A run's output as the `content` of an Anthropic `tool_result` block (with `is_error` set
   * from `output.isError`). */
  static anthropicContent(output) {
    return [
      { type: 'text', text: output.text },
      ...output.images.map((image) => ({ type: 'image', source: { type: 'base64', media_type: image.mediaType, data: image.data } })),
    ]
  }
}

module.exports = { PythonTool, toolSpec: spec }
