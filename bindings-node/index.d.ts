// Types of the `evervm` package (the wrapper in index.cjs over the generated binding.d.cts).

import type {
  Checkpoint,
  Context,
  CreateMachineOptions,
  ExceptionInfo,
  ExecOptions as NativeExecOptions,
  ExecResult,
  FileInfo,
  FileList,
  HistoryEntry,
  InstalledPackage,
  InstallReport,
  Lineage,
  LineageCheckpoint,
  LineageNode,
  LocalOptions,
  MachineHistory,
  MachineInfo,
  OutputChunk,
  Rewound,
  RichResult,
  SatisfiedPackage,
  TakenBack,
  WriteOptions,
} from './binding.cjs'

export type {
  Checkpoint,
  Context,
  CreateMachineOptions,
  ExceptionInfo,
  ExecResult,
  FileInfo,
  FileList,
  HistoryEntry,
  InstalledPackage,
  InstallReport,
  Lineage,
  LineageCheckpoint,
  LineageNode,
  LocalOptions,
  MachineHistory,
  MachineInfo,
  OutputChunk,
  Rewound,
  RichResult,
  SatisfiedPackage,
  TakenBack,
  WriteOptions,
}

/** The default instruction timeout, in seconds (15). */
export declare const DEFAULT_TIMEOUT_SECONDS: number

export interface ExecOptions extends NativeExecOptions {
  /** Aborting interrupts the instruction (the machine keeps its state) and rejects with an
   * `AbortError` carrying its result. */
  signal?: AbortSignal
  /** Each line printed to stdout (without its newline), as it comes. */
  onStdout?: (line: string) => void
  /** Each line printed to stderr, as it comes. */
  onStderr?: (line: string) => void
  /** Each rich result shown while it runs (`display(obj)`, `plt.show()`). */
  onResult?: (result: RichResult) => void
}

export interface RemoteOptions {
  /** The server's URL (default `EVERVM_URL`). */
  url?: string
  /** A token of the server (default `EVERVM_TOKEN`). */
  token?: string
  /** Over https, trust only the certificates in this PEM file (default `EVERVM_CA_FILE`; when
   * neither is given, the default roots). */
  caFile?: string
}

export declare class Client {
  /** A client of a server. */
  constructor(options?: RemoteOptions)
  /** A client of the engine run in this process. */
  static local(options?: LocalOptions): Promise<Client>
  describe(): string
  createMachine(options?: CreateMachineOptions): Promise<Machine>
  /** Machines carrying every one of `tags`, newest first. */
  listMachines(options?: { tags?: Record<string, string> }): Promise<MachineInfo[]>
  machine(name: string): Machine
  /** Stops the engine of a local client; nothing for a server's client. */
  close(): Promise<void>
}

export declare class Machine {
  readonly name: string
  readonly files: Files
  exec(code: string, options?: ExecOptions): Promise<ExecResult>
  /** Output chunks and rich results as they come, then the result. */
  stream(code: string, options?: NativeExecOptions): AsyncGenerator<OutputChunk | RichResult | ExecResult, void, undefined>
  interrupt(): Promise<boolean>
  info(): Promise<MachineInfo>
  /** Installs packages from the server's package index (binary wheels, hash-checked). */
  install(requirements: string[]): Promise<InstallReport>
  swapOut(): Promise<void>
  /** With `at`, from the undo point after instruction `at` (this machine is not touched). */
  fork(options?: { tags?: Record<string, string>; at?: number }): Promise<Machine>
  checkpoint(name?: string): Promise<Checkpoint>
  checkpoints(): Promise<Checkpoint[]>
  rollback(checkpoint: string): Promise<MachineInfo>
  /** Takes back the last instruction (the machine must keep a history). */
  undo(): Promise<Rewound>
  /** Makes the state right after instruction `seq` the machine's state. */
  rewind(seq: number): Promise<Rewound>
  /** The latest instructions (at most `limit`, 100 by default), oldest first. */
  history(limit?: number): Promise<MachineHistory>
  /** The tree of forks this machine is in, parents first. */
  lineage(): Promise<Lineage>
  deleteCheckpoint(checkpoint: string): Promise<void>
  /** Another Python interpreter in the machine, with globals of its own, started in `cwd`
   * (default: the machine's home); run code in it with `exec(code, { context: id })`. */
  createContext(options?: { cwd?: string }): Promise<Context>
  /** The machine's contexts, `default` (its own interpreter) first. */
  contexts(): Promise<Context[]>
  /** Starts a context's interpreter again: its variables are gone. */
  restartContext(context: string): Promise<Context>
  /** Removes a context, its interpreter stopped. */
  removeContext(context: string): Promise<void>
  delete(): Promise<void>
}

export declare class Files {
  /** Whole or not at all, from bytes or from a stream of them (sent as it is read). */
  write(
    path: string,
    data: Buffer | Uint8Array | ArrayBuffer | string | AsyncIterable<Buffer | Uint8Array | string>,
    options?: WriteOptions & { length?: number },
  ): Promise<FileInfo>
  read(path: string): Promise<Buffer>
  /** A `Readable` of the file's bytes, read from the machine as it is consumed. */
  createReadStream(path: string): import('node:stream').Readable
  readText(path: string): Promise<string>
  stat(path: string): Promise<FileInfo>
  exists(path: string): Promise<boolean>
  list(dir?: string): Promise<FileList>
  mkdir(path: string, options?: { parents?: boolean }): Promise<FileInfo>
  remove(path: string, options?: { recursive?: boolean }): Promise<FileInfo>
  upload(localPath: string, path: string, options?: WriteOptions): Promise<FileInfo>
  download(path: string, localPath: string): Promise<FileInfo>
}

/** Base class of every evervm error. */
export declare class EvervmError extends Error {
  /** The error kind: `NotFound`, `InvalidInput`, ..., or `Aborted`. */
  readonly code: string
}
export declare class AbortError extends EvervmError {
  readonly result?: ExecResult
}
export declare class NotFoundError extends EvervmError {}
export declare class InvalidInputError extends EvervmError {}
export declare class UnauthorizedError extends EvervmError {}
export declare class UnsupportedError extends EvervmError {}
export declare class MachineCrashedError extends EvervmError {}
export declare class ConflictError extends EvervmError {}
export declare class LimitExceededError extends EvervmError {}
export declare class TooLargeError extends EvervmError {}
export declare class PermissionDeniedError extends EvervmError {}
export declare class TransportError extends EvervmError {}
export declare class InternalError extends EvervmError {}
