// Written by hand (Evervm.swift beside it is generated): what uniffi 0.32 cannot generate.
// Its async functions do not tell Rust when a Task is cancelled, so these start an instruction
// with a handle and cancel that handle from the Task's cancellation handler, which interrupts the
// instruction (the machine keeps its state).

import Foundation

extension Machine {
    /// Runs `code` and returns how it ended; in the context `context` (an id from
    /// `createContext`) when given, else in the machine's own interpreter. Cancelling the
    /// calling `Task` interrupts it (the machine keeps its state) and throws
    /// `EvervmError.Cancelled`.
    public func exec(
        code: String, timeoutSeconds: Double? = nil, context: String? = nil
    ) async throws -> ExecResult {
        let pending = try startExec(code: code, timeoutSeconds: timeoutSeconds, context: context)
        return try await withTaskCancellationHandler {
            try await pending.result()
        } onCancel: {
            pending.cancel()
        }
    }

    /// Runs `code` and gives its output and rich results as they come, then its result
    /// (`.finished`). Cancelling the iterating `Task` interrupts the instruction.
    public func events(
        code: String, timeoutSeconds: Double? = nil, context: String? = nil
    ) throws -> ExecEvents {
        ExecEvents(stream: try stream(code: code, timeoutSeconds: timeoutSeconds, context: context))
    }
}

/// An instruction's events as an `AsyncSequence`.
public struct ExecEvents: AsyncSequence, Sendable {
    public typealias Element = ExecEvent

    let stream: ExecStream

    public struct AsyncIterator: AsyncIteratorProtocol {
        let stream: ExecStream

        public mutating func next() async throws -> ExecEvent? {
            try await withTaskCancellationHandler {
                try await stream.next()
            } onCancel: { [stream] in
                stream.cancel()
            }
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(stream: stream)
    }
}

extension EvervmError {
    /// What went wrong, in words (every case carries one).
    public var message: String {
        switch self {
        case .NotFound(let message), .InvalidInput(let message), .Unauthorized(let message),
            .Unsupported(let message), .MachineCrashed(let message), .Conflict(let message),
            .LimitExceeded(let message), .TooLarge(let message), .PermissionDenied(let message),
            .Transport(let message), .Internal(let message), .Cancelled(let message):
            return message
        }
    }
}
