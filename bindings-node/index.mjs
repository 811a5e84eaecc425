// The ES module entry: the same classes as `require('evervm')` (one copy, so `instanceof` holds
// across both).
import evervm from './index.cjs'

export const {
  Client,
  Machine,
  Files,
  EvervmError,
  AbortError,
  NotFoundError,
  InvalidInputError,
  UnauthorizedError,
  UnsupportedError,
  MachineCrashedError,
  ConflictError,
  LimitExceededError,
  TooLargeError,
  PermissionDeniedError,
  TransportError,
  InternalError,
  DEFAULT_TIMEOUT_SECONDS,
} = evervm
export default evervm
