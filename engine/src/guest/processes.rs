//! Processes the agent runs beside the interpreter (`processes.py`): their events on the
//! channel, and the router that takes them off the channel as they come, so that a process's
//! output flows whether or not an instruction runs.
//!
//! The guest is hostile here as everywhere: ids it names that the host never started are
//! dropped, a pid is a positive 32-bit number, texts are bounded, and nothing it sends waits in
//! the engine without a bound (a subscriber too slow for a process's output loses pieces and is
//! told how many).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{broadcast, watch};

use super::channel::ProtocolError;
use crate::sync::lock;

/// Pieces of output kept for a subscriber that has not read them yet (each at most
/// [`MAX_PIECE_BYTES`]: at most 2 MiB per process, 128 MiB for a machine's 64).
const OUTPUT_BACKLOG: usize = 32;
/// The largest piece of a process's output a frame may carry (the agent sends at most this; a
/// larger one is a protocol violation, so that the backlog above stays bounded).
pub const MAX_PIECE_BYTES: usize = 64 * 1024;
/// The longest error text kept from the agent about a process.
const MAX_PROCESS_ERROR_BYTES: usize = 4096;

/// What the agent says about a process.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcessEvent {
    Started {
        id: u64,
        pid: u32,
    },
    Failed {
        id: u64,
        error: String,
        /// What kind of failure (a file error's kind, `not_found` say), when the agent says.
        kind: Option<String>,
    },
    Output {
        id: u64,
        stream: ProcessStream,
        data: Bytes,
    },
    Exited {
        id: u64,
        end: ProcessEnd,
    },
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEnd {
    /// Its exit status, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did.
    pub signal: Option<i32>,
    /// Something the agent could not do for it (its stdin overflowed, say).
    pub error: Option<String>,
}

/// Where a process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessState {
    /// Asked for; the agent has not answered yet.
    Starting,
    Running {
        pid: u32,
    },
    /// It never ran (the command or the directory was not found, say).
    Failed {
        error: String,
        kind: Option<String>,
    },
    Ended {
        pid: u32,
        end: ProcessEnd,
    },
    /// The sandbox it ran in stopped, or the machine went back to another state.
    Lost(String),
}

impl ProcessState {
    pub fn is_over(&self) -> bool {
        !matches!(self, ProcessState::Starting | ProcessState::Running { .. })
    }
}

/// Which of a process's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessStream {
    Stdout,
    Stderr,
}

/// A piece of a process's output.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessOutput {
    pub stream: ProcessStream,
    pub data: Bytes,
}

/// Decodes a binary process output frame: `P`, `o` or `e`, a big-endian u64 id, the bytes.
pub(super) fn decode_output(payload: &[u8]) -> Result<ProcessEvent, ProtocolError> {
    let (stdout, id_bytes, data) = super::channel::split_output_frame(payload, "process output")?;
    if data.len() > MAX_PIECE_BYTES {
        return Err(ProtocolError::Malformed(format!(
            "process output frame of {} bytes, over the limit of {MAX_PIECE_BYTES}",
            data.len()
        )));
    }
    Ok(ProcessEvent::Output {
        id: u64::from_be_bytes(id_bytes),
        stream: if stdout {
            ProcessStream::Stdout
        } else {
            ProcessStream::Stderr
        },
        data: Bytes::copy_from_slice(data),
    })
}

/// The fields of a JSON `proc_*` event.
#[derive(serde::Deserialize)]
pub(super) struct RawProcessEvent {
    ev: String,
    id: u64,
    #[serde(default)]
    pid: Option<i64>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    signal: Option<i64>,
}

impl RawProcessEvent {
    pub(super) fn check(self) -> Result<ProcessEvent, ProtocolError> {
        let malformed = |what: &str| ProtocolError::Malformed(format!("{} event {what}", self.ev));
        let error = self.error.clone().map(|mut text| {
            if text.len() > MAX_PROCESS_ERROR_BYTES {
                let mut end = MAX_PROCESS_ERROR_BYTES;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
            text
        });
        let small = |n: Option<i64>, what: &str| {
            n.map(|n| i32::try_from(n).map_err(|_| malformed(what)))
                .transpose()
        };
        match self.ev.as_str() {
            "proc_started" => {
                let pid = self
                    .pid
                    .and_then(|p| u32::try_from(p).ok())
                    .filter(|p| *p > 0)
                    .ok_or_else(|| malformed("has no valid pid"))?;
                Ok(ProcessEvent::Started { id: self.id, pid })
            }
            "proc_failed" => Ok(ProcessEvent::Failed {
                id: self.id,
                error: error.unwrap_or_else(|| "the process did not start".to_owned()),
                kind: self.kind.clone().filter(|k| {
                    k.len() <= 32 && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                }),
            }),
            "proc_exit" => Ok(ProcessEvent::Exited {
                id: self.id,
                end: ProcessEnd {
                    exit_code: small(self.exit_code, "has an exit code out of range")?,
                    signal: small(self.signal, "has a signal out of range")?,
                    error,
                },
            }),
            other => Err(ProtocolError::Malformed(format!(
                "unknown process event {other:?}"
            ))),
        }
    }
}

/// One process, as the host follows it.
pub struct ProcessEntry {
    pub id: u64,
    output: broadcast::Sender<ProcessOutput>,
    state: watch::Sender<ProcessState>,
}

impl ProcessEntry {
    /// Its output from now on (a receiver that falls more than [`OUTPUT_BACKLOG`] pieces
    /// behind loses the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<ProcessOutput> {
        self.output.subscribe()
    }

    pub fn state(&self) -> watch::Receiver<ProcessState> {
        self.state.subscribe()
    }

    pub fn pid(&self) -> Option<u32> {
        match &*self.state.borrow() {
            ProcessState::Running { pid } | ProcessState::Ended { pid, .. } => Some(*pid),
            _ => None,
        }
    }
}

/// The processes of one sandbox's agent, by id: events go straight from the channel's reader to
/// them. When the connection ends, every process still running is lost.
#[derive(Default)]
pub struct ProcessRouter {
    running: Mutex<HashMap<u64, Arc<ProcessEntry>>>,
    /// Set once the channel has ended: nothing more will come.
    closed: std::sync::atomic::AtomicBool,
}

impl ProcessRouter {
    /// Registers a process about to be started (before the request goes out, so that none of
    /// its output is missed).
    pub fn register(&self, id: u64) -> Arc<ProcessEntry> {
        let entry = Arc::new(ProcessEntry {
            id,
            output: broadcast::channel(OUTPUT_BACKLOG).0,
            state: watch::channel(ProcessState::Starting).0,
        });
        let mut running = lock(&self.running);
        if self.is_closed() {
            entry.state.send_replace(ProcessState::Lost(
                "the machine's sandbox had stopped".to_owned(),
            ));
        } else {
            running.insert(id, Arc::clone(&entry));
        }
        entry
    }

    /// The processes not over yet.
    pub fn running(&self) -> Vec<Arc<ProcessEntry>> {
        lock(&self.running).values().cloned().collect()
    }

    pub fn get(&self, id: u64) -> Option<Arc<ProcessEntry>> {
        lock(&self.running).get(&id).cloned()
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.running).is_empty()
    }

    /// Takes an event off the channel; never waits.
    pub fn deliver(&self, event: ProcessEvent) {
        let mut running = lock(&self.running);
        match event {
            ProcessEvent::Output { id, stream, data } => {
                if let Some(entry) = running.get(&id) {
                    // No subscriber: the output goes nowhere, as a pipe nobody reads would not.
                    let _ = entry.output.send(ProcessOutput { stream, data });
                }
            }
            ProcessEvent::Started { id, pid } => {
                if let Some(entry) = running.get(&id) {
                    entry.state.send_replace(ProcessState::Running { pid });
                }
            }
            ProcessEvent::Failed { id, error, kind } => {
                if let Some(entry) = running.remove(&id) {
                    entry
                        .state
                        .send_replace(ProcessState::Failed { error, kind });
                }
            }
            ProcessEvent::Exited { id, end } => {
                if let Some(entry) = running.remove(&id) {
                    let pid = entry.pid().unwrap_or(0);
                    entry.state.send_replace(ProcessState::Ended { pid, end });
                }
            }
        }
    }

    /// Whether the channel has ended (the sandbox stopped).
    pub fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every process still followed is lost, for `why`, and so is any registered later.
    pub fn lose_all(&self, why: &str) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        for (_, entry) in lock(&self.running).drain() {
            entry.state.send_replace(ProcessState::Lost(why.to_owned()));
        }
    }

    /// A process that is no longer wanted (it never started: the request could not be sent).
    pub fn forget(&self, id: u64, why: &str) {
        if let Some(entry) = lock(&self.running).remove(&id) {
            entry.state.send_replace(ProcessState::Lost(why.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::channel::{AgentEvent, decode_event};
    use super::*;

    fn process_event(payload: &[u8]) -> Result<ProcessEvent, ProtocolError> {
        match decode_event(payload)? {
            AgentEvent::Process(event) => Ok(event),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_the_agent_says_of_processes_is_checked() {
        let mut frame = b"Pe".to_vec();
        frame.extend(7u64.to_be_bytes());
        frame.extend(b"\xffraw");
        assert_eq!(
            process_event(&frame),
            Ok(ProcessEvent::Output {
                id: 7,
                stream: ProcessStream::Stderr,
                data: Bytes::from_static(b"\xffraw"),
            })
        );
        assert!(decode_event(b"Px").is_err());
        let mut big = b"Po".to_vec();
        big.extend(7u64.to_be_bytes());
        big.extend(vec![b'x'; MAX_PIECE_BYTES + 1]);
        assert!(decode_event(&big).is_err());
        assert!(decode_event(br#"{"ev": "proc_started", "id": 1, "pid": 0}"#).is_err());
        assert!(decode_event(br#"{"ev": "proc_exit", "id": 1, "exit_code": 4294967296}"#).is_err());
        let failed =
            process_event(br#"{"ev": "proc_failed", "id": 2, "error": "x", "kind": "Not-A-Kind"}"#);
        assert_eq!(
            failed,
            Ok(ProcessEvent::Failed {
                id: 2,
                error: "x".into(),
                kind: None
            })
        );
        let long = format!(
            r#"{{"ev": "proc_failed", "id": 3, "error": "{}"}}"#,
            "e".repeat(9000)
        );
        let Ok(ProcessEvent::Failed { error, .. }) = process_event(long.as_bytes()) else {
            panic!("not decoded");
        };
        assert_eq!(error.len(), MAX_PROCESS_ERROR_BYTES);
    }

    #[test]
    fn a_router_forgets_what_ended_and_loses_the_rest_when_the_channel_ends() {
        let router = ProcessRouter::default();
        let first = router.register(1);
        let second = router.register(2);
        router.deliver(ProcessEvent::Started { id: 1, pid: 10 });
        // An id the host never started is dropped.
        router.deliver(ProcessEvent::Started { id: 9, pid: 90 });
        assert_eq!(first.pid(), Some(10));
        router.deliver(ProcessEvent::Exited {
            id: 1,
            end: ProcessEnd {
                exit_code: Some(0),
                signal: None,
                error: None,
            },
        });
        assert!(router.get(1).is_none() && router.get(9).is_none());
        router.lose_all("gone");
        assert_eq!(*second.state().borrow(), ProcessState::Lost("gone".into()));
        let late = router.register(3);
        assert!(late.state().borrow().is_over());
        assert!(router.is_empty());
    }
}
