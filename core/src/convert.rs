//! The one place where engine types, wire types and client types are mapped onto each other.

use crate::protocol::{
    ApiMachine, StandardOutput, WireExecResult, WireOutcome, WireStream,
};
use crate::types::{ExecResult, FailureCause, MachineInfo, OutputChunk, OutputStream};

impl From<WireStream> for OutputStream {
    fn from(s: WireStream) -> Self {
        match s {
            WireStream::Stdout => OutputStream::Stdout,
            WireStream::Stderr => OutputStream::Stderr,
        }
    }
}

impl From<OutputStream> for WireStream {
    fn from(s: OutputStream) -> Self {
        match s {
            OutputStream::Stdout => WireStream::Stdout,
            OutputStream::Stderr => WireStream::Stderr,
        }
    }
}

impl From<StandardOutput> for OutputChunk {
    fn from(o: StandardOutput) -> Self {
        OutputChunk {
            seq: o.seq,
            stream: o.stream.into(),
            data: o.data,
        }
    }
}

impl From<OutputChunk> for StandardOutput {
    fn from(c: OutputChunk) -> Self {
        StandardOutput {
            stream: c.stream.into(),
            data: c.data,
            seq: c.seq,
        }
    }
}

impl From<WireExecResult> for ExecResult {
    fn from(r: WireExecResult) -> Self {
        match r.outcome {
            WireOutcome::Value { value, data } => ExecResult {
                value,
                error: None,
                cause: None,
                data,
                runtime_ms: r.runtime_ms,
            },
            WireOutcome::Error { error, cause } => {
                let cause = cause.as_deref().and_then(FailureCause::parse).or_else(|| {
                    Some(if error.contains("Timed out") {
                        FailureCause::Timeout
                    } else {
                        FailureCause::Exception
                    })
                });
                ExecResult {
                    value: None,
                    error: Some(error),
                    cause,
                    data: None,
                    runtime_ms: r.runtime_ms,
                }
            }
        }
    }
}

impl From<ExecResult> for WireExecResult {
    fn from(r: ExecResult) -> Self {
        let outcome = match r.error {
            Some(error) => WireOutcome::Error {
                error,
                cause: r.cause.map(|c| c.as_str().to_owned()),
            },
            None => WireOutcome::Value {
                value: r.value,
                data: r.data,
            },
        };
        WireExecResult {
            outcome,
            runtime_ms: r.runtime_ms,
        }
    }
}

impl From<ApiMachine> for MachineInfo {
    fn from(m: ApiMachine) -> Self {
        MachineInfo {
            name: m.name,
            created_at: m.created_at,
            tags: m.tags,
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            memory_mb: m.memory_mb,
            backend: m.backend,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at,
            last_error: m.last_error,
        }
    }
}

impl From<MachineInfo> for ApiMachine {
    fn from(m: MachineInfo) -> Self {
        ApiMachine {
            name: m.name,
            created_at: m.created_at,
            running: m.running,
            has_pending_instruction: m.has_pending_instruction,
            expires_at: None,
            tags: m.tags,
            memory_mb: m.memory_mb,
            backend: m.backend,
            state: m.state,
            instruction_count: m.instruction_count,
            last_used_at: m.last_used_at,
            last_error: m.last_error,
        }
    }
}

#[cfg(feature = "local")]
mod engine {
    use evervm_engine as engine;

    use crate::types::{ExecEvent, ExecResult, FailureCause, MachineInfo, OutputChunk, OutputStream};

    impl From<engine::FailureCause> for FailureCause {
        fn from(c: engine::FailureCause) -> Self {
            match c {
                engine::FailureCause::Exception => FailureCause::Exception,
                engine::FailureCause::Timeout => FailureCause::Timeout,
                engine::FailureCause::Interrupted => FailureCause::Interrupted,
                engine::FailureCause::MachineCrashed => FailureCause::MachineCrashed,
            }
        }
    }

    impl From<engine::ExecResult> for ExecResult {
        fn from(r: engine::ExecResult) -> Self {
            match r.outcome {
                engine::Outcome::Value(value) => ExecResult {
                    value,
                    error: None,
                    cause: None,
                    data: r.data,
                    runtime_ms: r.runtime_ms,
                },
                engine::Outcome::Error { text, cause } => ExecResult {
                    value: None,
                    error: Some(text),
                    cause: Some(cause.into()),
                    data: None,
                    runtime_ms: r.runtime_ms,
                },
            }
        }
    }

    impl From<engine::OutputChunk> for OutputChunk {
        fn from(c: engine::OutputChunk) -> Self {
            OutputChunk {
                seq: c.seq,
                stream: match c.stream {
                    engine::OutputStream::Stdout => OutputStream::Stdout,
                    engine::OutputStream::Stderr => OutputStream::Stderr,
                },
                data: c.data,
            }
        }
    }

    impl From<engine::ExecEvent> for ExecEvent {
        fn from(e: engine::ExecEvent) -> Self {
            match e {
                engine::ExecEvent::Output(c) => ExecEvent::Output(c.into()),
                engine::ExecEvent::Result(r) => ExecEvent::Result(r.into()),
            }
        }
    }

    impl From<engine::MachineInfo> for MachineInfo {
        fn from(m: engine::MachineInfo) -> Self {
            MachineInfo {
                name: m.name.to_string(),
                created_at: m.created_at,
                tags: m.tags,
                running: m.state == engine::MachineState::Resident,
                has_pending_instruction: m.has_pending_instruction,
                memory_mb: Some(m.memory_mb),
                backend: Some(m.backend),
                state: Some(m.state.as_str().to_owned()),
                instruction_count: Some(m.instruction_count),
                last_used_at: m.last_used_at,
                last_error: m.last_error,
            }
        }
    }
}
