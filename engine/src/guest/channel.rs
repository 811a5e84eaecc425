//! Framing of the agent channel: a 4-byte big-endian length, then that many bytes of UTF-8 JSON.
//!
//! Everything here treats the guest as hostile: lengths are checked before anything is buffered,
//! and a frame that does not decode is an error for that machine only.

use serde::{Deserialize, Serialize};

use crate::types::{FailureCause, OutputStream};

/// Largest frame either side accepts (a result can carry a large PNG).
pub const MAX_FRAME: usize = 64 * 1024 * 1024;

/// A violation of the channel protocol by the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("the agent sent a frame of {0} bytes, over the limit of {MAX_FRAME}")]
    Oversized(usize),
    #[error("the agent sent a frame that is not a valid event: {0}")]
    Malformed(String),
}

/// Incremental decoder: feed bytes as they arrive, take whole frames out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    start: usize,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the channel.
    pub fn feed(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        self.buffer.extend_from_slice(data);
    }

    /// Takes the next whole frame's payload, if one is complete.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, ProtocolError> {
        let available = &self.buffer[self.start..];
        let Some(header) = available.get(..4) else {
            return Ok(None);
        };
        let mut length_bytes = [0u8; 4];
        length_bytes.copy_from_slice(header);
        let length = u32::from_be_bytes(length_bytes) as usize;
        if length > MAX_FRAME {
            return Err(ProtocolError::Oversized(length));
        }
        let Some(payload) = available.get(4..4 + length) else {
            return Ok(None);
        };
        let payload = payload.to_vec();
        self.start += 4 + length;
        if self.start > 1024 * 1024 && self.start * 2 > self.buffer.len() {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(payload))
    }

    /// Bytes received but not yet returned as frames.
    pub fn pending(&self) -> usize {
        self.buffer.len() - self.start
    }
}

/// Encodes one frame.
pub fn encode_frame(payload: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    if payload.len() > MAX_FRAME {
        return Err(ProtocolError::Oversized(payload.len()));
    }
    let mut frame = Vec::with_capacity(4 + payload.len());
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(payload);
    Ok(frame)
}

/// A request from the host to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum AgentRequest {
    Exec {
        id: i64,
        code: String,
        timeout_ms: u64,
    },
    Interrupt {
        id: i64,
    },
    /// Reseed the interpreter's random generators (after a fork or a base snapshot's restore:
    /// every copy would draw the same numbers); the agent answers `ready`.
    Reseed,
}

impl AgentRequest {
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        let payload =
            serde_json::to_vec(self).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
        encode_frame(&payload)
    }
}

/// An event from the agent, validated.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEvent {
    Ready {
        python: String,
    },
    Output {
        /// The instruction running when the output was read, if any.
        id: Option<i64>,
        stream: OutputStream,
        data: String,
    },
    Result {
        id: i64,
        outcome: AgentOutcome,
        data: Option<serde_json::Value>,
        runtime_ms: u64,
    },
}

/// How the agent says an instruction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentOutcome {
    Value(Option<String>),
    Error { text: String, cause: FailureCause },
}

#[derive(Deserialize)]
struct RawEvent {
    ev: String,
    #[serde(default)]
    python: Option<String>,
    #[serde(default)]
    id: Option<i64>,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    data: Option<serde_json::Value>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    cause: Option<String>,
    #[serde(default)]
    runtime_ms: Option<u64>,
}

/// Decodes a binary output frame: `O`, `o` or `e`, a big-endian i64 id (-1: none), UTF-8 text.
fn decode_output(payload: &[u8]) -> Result<AgentEvent, ProtocolError> {
    let malformed = |what: &str| ProtocolError::Malformed(format!("output frame {what}"));
    let stream = match payload.get(1) {
        Some(b'o') => OutputStream::Stdout,
        Some(b'e') => OutputStream::Stderr,
        _ => return Err(malformed("names no stream")),
    };
    let id_bytes: [u8; 8] = payload
        .get(2..10)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| malformed("is too short"))?;
    let id = i64::from_be_bytes(id_bytes);
    let text = &payload[10..];
    let data = match std::str::from_utf8(text) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(text).into_owned(),
    };
    Ok(AgentEvent::Output {
        id: (id >= 0).then_some(id),
        stream,
        data,
    })
}

/// Decodes and validates one event payload: a binary output frame, or a JSON event.
pub fn decode_event(payload: &[u8]) -> Result<AgentEvent, ProtocolError> {
    if payload.first() == Some(&b'O') {
        return decode_output(payload);
    }
    let raw: RawEvent =
        serde_json::from_slice(payload).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    let malformed = |what: &str| ProtocolError::Malformed(format!("{} event {what}", raw.ev));
    match raw.ev.as_str() {
        "ready" => Ok(AgentEvent::Ready {
            python: raw.python.unwrap_or_default(),
        }),
        "output" => {
            let stream = raw
                .stream
                .as_deref()
                .and_then(OutputStream::from_str_opt)
                .ok_or_else(|| malformed("has no valid stream"))?;
            let Some(serde_json::Value::String(data)) = raw.data else {
                return Err(malformed("has no text data"));
            };
            Ok(AgentEvent::Output {
                id: raw.id,
                stream,
                data,
            })
        }
        "result" => {
            let id = raw.id.ok_or_else(|| malformed("has no id"))?;
            let outcome = match (raw.error, raw.value) {
                (Some(text), None) => {
                    let cause = match raw.cause.as_deref() {
                        Some("timeout") => FailureCause::Timeout,
                        Some("interrupted") => FailureCause::Interrupted,
                        Some("exception") | None => FailureCause::Exception,
                        Some(other) => {
                            return Err(malformed(&format!("has an unknown cause {other:?}")));
                        }
                    };
                    AgentOutcome::Error { text, cause }
                }
                (None, value) => AgentOutcome::Value(value),
                (Some(_), Some(_)) => return Err(malformed("has both a value and an error")),
            };
            let data = match raw.data {
                None | Some(serde_json::Value::Null) => None,
                Some(object @ serde_json::Value::Object(_)) => Some(object),
                Some(_) => return Err(malformed("has data that is not an object")),
            };
            Ok(AgentEvent::Result {
                id,
                outcome,
                data,
                runtime_ms: raw.runtime_ms.unwrap_or(0),
            })
        }
        other => Err(ProtocolError::Malformed(format!(
            "unknown event type {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(json: &str) -> Vec<u8> {
        encode_frame(json.as_bytes()).unwrap()
    }

    #[test]
    fn decodes_frames_split_anywhere() {
        let mut bytes = frame(r#"{"ev":"ready","python":"3.11.2"}"#);
        bytes.extend(frame(
            r#"{"ev":"output","id":0,"stream":"stdout","data":"hi\n"}"#,
        ));
        for split in 0..bytes.len() {
            let mut decoder = FrameDecoder::new();
            decoder.feed(&bytes[..split]);
            let mut frames = Vec::new();
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
            decoder.feed(&bytes[split..]);
            while let Some(f) = decoder.next_frame().unwrap() {
                frames.push(f);
            }
            assert_eq!(frames.len(), 2, "split at {split}");
            assert_eq!(decoder.pending(), 0);
        }
    }

    #[test]
    fn refuses_oversized_length_before_buffering() {
        let mut decoder = FrameDecoder::new();
        decoder.feed(&u32::MAX.to_be_bytes());
        assert_eq!(
            decoder.next_frame(),
            Err(ProtocolError::Oversized(u32::MAX as usize))
        );
    }

    #[test]
    fn validates_events() {
        assert!(decode_event(br#"{"ev":"result","id":1,"value":"2","error":"x"}"#).is_err());
        assert!(decode_event(br#"{"ev":"output","stream":"stdin","data":"x"}"#).is_err());
        assert!(decode_event(br#"{"ev":"result","value":"2"}"#).is_err());
        assert!(decode_event(b"not json").is_err());
        assert_eq!(
            decode_event(
                br#"{"ev":"result","id":3,"error":"boom","cause":"timeout","runtime_ms":5}"#
            )
            .unwrap(),
            AgentEvent::Result {
                id: 3,
                outcome: AgentOutcome::Error {
                    text: "boom".into(),
                    cause: FailureCause::Timeout
                },
                data: None,
                runtime_ms: 5
            }
        );
    }

    #[test]
    fn numbers_in_result_data_are_decoded_exactly() {
        // Without serde_json's `float_roundtrip` this came back one ULP off.
        let event =
            decode_event(br#"{"ev":"result","id":1,"data":{"x":9.158604021021239e-300}}"#).unwrap();
        let AgentEvent::Result {
            data: Some(data), ..
        } = event
        else {
            panic!("not a result with data: {event:?}");
        };
        assert_eq!(
            data["x"].as_f64().map(f64::to_bits),
            Some(9.158_604_021_021_239e-300_f64.to_bits())
        );
    }

    #[test]
    fn decodes_binary_output_frames() {
        let mut payload = b"Oe".to_vec();
        payload.extend(7i64.to_be_bytes());
        payload.extend("caf\u{e9}\n".as_bytes());
        assert_eq!(
            decode_event(&payload).unwrap(),
            AgentEvent::Output {
                id: Some(7),
                stream: OutputStream::Stderr,
                data: "caf\u{e9}\n".into()
            }
        );
        let mut none = b"Oo".to_vec();
        none.extend((-1i64).to_be_bytes());
        none.push(0xff);
        assert_eq!(
            decode_event(&none).unwrap(),
            AgentEvent::Output {
                id: None,
                stream: OutputStream::Stdout,
                data: "\u{fffd}".into()
            }
        );
        assert!(decode_event(b"Ox").is_err());
        assert!(decode_event(b"Oo123").is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let mut decoder = FrameDecoder::new();
            for chunk in &chunks {
                decoder.feed(chunk);
                while let Ok(Some(payload)) = decoder.next_frame() {
                    let _ = decode_event(&payload);
                }
            }
        }

        /// Streams of plausible events, however split, through the fuzz harness's checks.
        #[test]
        fn event_streams_hold_the_fuzz_invariants(
            seed in any::<u8>(),
            events in proptest::collection::vec((0u8..4, any::<i64>(), ".{0,12}"), 0..8),
        ) {
            let mut input = vec![seed];
            for (kind, id, text) in &events {
                let payload = match kind {
                    0 => serde_json::json!({"ev": "ready", "python": text}).to_string().into_bytes(),
                    1 => serde_json::json!({"ev": "output", "id": id, "stream": "stderr", "data": text})
                        .to_string()
                        .into_bytes(),
                    2 => serde_json::json!({"ev": "result", "id": id, "error": text, "cause": "timeout"})
                        .to_string()
                        .into_bytes(),
                    _ => {
                        let mut binary = b"Oo".to_vec();
                        binary.extend(id.to_be_bytes());
                        binary.extend(text.as_bytes());
                        binary
                    }
                };
                input.extend(encode_frame(&payload).unwrap());
            }
            crate::fuzz_targets::agent_channel(&input);
        }

        #[test]
        fn frames_round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..8), cut in 1usize..50) {
            let mut stream = Vec::new();
            for p in &payloads { stream.extend(encode_frame(p).unwrap()); }
            let mut decoder = FrameDecoder::new();
            let mut out = Vec::new();
            for piece in stream.chunks(cut) {
                decoder.feed(piece);
                while let Some(f) = decoder.next_frame().unwrap() { out.push(f); }
            }
            prop_assert_eq!(out, payloads);
        }
    }
}
