//! Fuzz harnesses for the wire decoders: what the server decodes from clients (WebSocket
//! messages, request bodies, path names) and what the client decodes from a server (WebSocket
//! messages, NDJSON result streams, answers and error bodies), with the mapping to engine and
//! client types in `convert.rs`.
//!
//! Each harness takes arbitrary bytes and asserts the decoder's invariants; a panic is a bug.
//! The cargo-fuzz targets in `fuzz/` call these functions (built with `--cfg fuzzing`), and the
//! tests below replay the committed corpus in `fuzz/seeds/` through the same functions on stable.
//! `scripts/fuzz.sh` runs the real thing.

// A harness reports a broken invariant by panicking: that is what the fuzzer looks for.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Debug;

use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::remote::{LineBuffer, api_error, parse_stream_line};
use crate::error::ErrorKind;
use crate::protocol::{
    ApiError, ApiMachine, CreateMachineResponse, ExecResponse, ExecResultResponse,
    ListCheckpointsResponse, ListMachinesResponse, MessageFromServer, StandardOutput,
    WireExecResult,
};
use crate::types::{ExecEvent, ExecResult, MachineInfo, OutputChunk};

/// Decodes `bytes` as a `T`; what decodes must encode and decode back to the same value.
fn round_trip<T>(bytes: &[u8]) -> Option<T>
where
    T: Serialize + DeserializeOwned + PartialEq + Debug,
{
    let value: T = serde_json::from_slice(bytes).ok()?;
    let text = serde_json::to_string(&value).unwrap();
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(back, value, "{text}");
    Some(value)
}

/// Chunk sizes (0 to 36 bytes) drawn from `seed`, so that the fuzzer controls how a stream is
/// split without spending input bytes on every cut.
fn chunk_sizes(seed: u8) -> impl Iterator<Item = usize> {
    let mut state = u32::from(seed) | 0x100;
    std::iter::from_fn(move || {
        // xorshift32: cheap, and never stuck at zero.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        Some((state % 37) as usize)
    })
}

/// A result as the client shows it, and the same after a trip to the wire and back: the
/// client's guesses (a cause from the text) are made once and then kept.
fn check_result(wire: WireExecResult) {
    let result = ExecResult::from(wire);
    assert_eq!(result.error.is_some(), result.cause.is_some());
    assert!(result.error.is_none() || (result.value.is_none() && result.data.is_none()));
    let again = ExecResult::from(WireExecResult::from(result.clone()));
    assert_eq!(again, result);
}

/// Messages from a server, as the client decodes them: a WebSocket message (selector 0), an
/// NDJSON result-stream line (1), an error body with a status (2), and the answers to requests
/// (3 to 6). Everything that decodes round-trips; results and machines survive the mapping to
/// client types and back; an error body always gives an error kind a server can cause.
pub fn server_message(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    match selector % 7 {
        0 => {
            let Some(message) = round_trip::<MessageFromServer>(body) else {
                return;
            };
            match message {
                MessageFromServer::Output { chunk, .. } => {
                    let client = OutputChunk::from(chunk.clone());
                    assert_eq!(StandardOutput::from(client), chunk);
                }
                MessageFromServer::Result { result, .. } => check_result(result),
                _ => {}
            }
        }
        1 => {
            let message = serde_json::from_slice::<MessageFromServer>(body);
            match (parse_stream_line(body), message) {
                (
                    Ok(ExecEvent::Output(chunk)),
                    Ok(MessageFromServer::Output { chunk: wire, .. }),
                ) => {
                    assert_eq!(chunk, OutputChunk::from(wire));
                }
                (
                    Ok(ExecEvent::Result(result)),
                    Ok(MessageFromServer::Result { result: wire, .. }),
                ) => {
                    assert_eq!(result, ExecResult::from(wire));
                }
                (Err(e), Ok(MessageFromServer::Error { code, id })) => {
                    // The same as the error body `{"code": ...}` of an HTTP answer.
                    let body = ApiError {
                        code,
                        id,
                        message: None,
                    };
                    let body = serde_json::to_string(&body).unwrap();
                    let expected = api_error(StatusCode::INTERNAL_SERVER_ERROR, &body);
                    assert_eq!(e.kind(), expected.kind(), "{body}");
                }
                (Err(e), _) => assert_eq!(e.kind(), ErrorKind::Transport),
                (Ok(event), message) => panic!("{event:?} from {message:?}"),
            }
        }
        2 => {
            let Some((status, text)) = body.split_first_chunk::<2>() else {
                return;
            };
            let Ok(status) = StatusCode::from_u16(u16::from_be_bytes(*status)) else {
                return;
            };
            let error = api_error(status, &String::from_utf8_lossy(text));
            assert_ne!(error.kind(), ErrorKind::Transport);
            assert!(!error.message().is_empty());
        }
        3 => {
            let Some(list) = round_trip::<ListMachinesResponse>(body) else {
                return;
            };
            for machine in list.machines {
                let back = ApiMachine::from(MachineInfo::from(machine.clone()));
                assert_eq!(back, machine);
            }
        }
        4 => {
            if let Some(answer) = round_trip::<ExecResultResponse>(body) {
                check_result(answer.result);
            }
        }
        5 => {
            round_trip::<ExecResponse>(body);
            round_trip::<CreateMachineResponse>(body);
        }
        _ => {
            round_trip::<ListCheckpointsResponse>(body);
        }
    }
}

/// What a line buffer made of a byte stream: the lines, then the error that ended it, if any.
type Lines = (Vec<Vec<u8>>, Option<String>);

/// Takes every whole line out of `buffer`. Returns false once it reported an error.
fn drain_lines(buffer: &mut LineBuffer, lines: &mut Lines) -> bool {
    loop {
        match buffer.next_line() {
            Ok(Some(line)) => lines.0.push(line.to_vec()),
            Ok(None) => return true,
            Err(e) => {
                lines.1 = Some(e.message().to_owned());
                return false;
            }
        }
    }
}

/// An NDJSON result stream as the client reads it: `data` is a seed for the chunk sizes and the
/// line limit, then the bytes as the server sends them.
///
/// Invariants: the same lines, and the same error for a line over the limit, however the
/// stream is split, and they are the stream's lines; the events are those of the lines that are
/// not blank.
pub fn result_stream(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let limit = usize::from(seed >> 2) * 8;

    let mut whole = LineBuffer::with_limit(limit);
    whole.push(stream);
    let mut expected: Lines = (Vec::new(), None);
    drain_lines(&mut whole, &mut expected);

    let mut pieces: Vec<&[u8]> = stream.split(|b| *b == b'\n').collect();
    let unfinished = pieces.pop().unwrap_or_default();
    let over = pieces.iter().position(|line| line.len() > limit);
    let complete = &pieces[..over.unwrap_or(pieces.len())];
    assert_eq!(expected.0, complete, "lines are not the stream's lines");
    assert_eq!(
        expected.1.is_some(),
        over.is_some() || unfinished.len() > limit
    );

    let mut buffer = LineBuffer::with_limit(limit);
    let mut lines: Lines = (Vec::new(), None);
    let mut fed = 0;
    let mut sizes = chunk_sizes(seed);
    while fed < stream.len() {
        let size = sizes.next().unwrap_or(1).min(stream.len() - fed);
        buffer.push(&stream[fed..fed + size]);
        fed += size;
        if !drain_lines(&mut buffer, &mut lines) {
            break;
        }
    }
    assert_eq!(lines, expected, "the split changed the lines");

    let mut buffer = LineBuffer::with_limit(limit);
    buffer.push(stream);
    let mut events = Vec::new();
    while let Some(event) = buffer.next_event() {
        let failed = event.is_err();
        events.push(event.map_err(|e| e.message().to_owned()));
        if failed {
            break;
        }
    }
    let mut wanted: Vec<_> = complete
        .iter()
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .map(|line| parse_stream_line(line).map_err(|e| e.message().to_owned()))
        .collect();
    if let Some(error) = expected.1 {
        wanted.push(Err(error));
    }
    // Decoding stops at the first error, as the client's stream does.
    if let Some(first) = wanted.iter().position(Result::is_err) {
        wanted.truncate(first + 1);
    }
    assert_eq!(events, wanted);
}

/// A close frame's reason: at most 123 bytes, the longest whole-character prefix of `text`.
#[cfg(feature = "server")]
fn check_close_reason(text: &str) {
    let reason = crate::server::repl::close_reason(text);
    assert!(reason.len() <= 123);
    assert!(text.starts_with(&reason));
    assert!(reason.len() == text.len() || reason.len() > 123 - 4);
}

/// An engine error as the server reports it, and as a client reads that answer back: the kind
/// survives the trip.
#[cfg(feature = "server")]
fn check_wire_error(error: &evervm_engine::Error) {
    let failure = crate::server::error::ApiFailure::from(error);
    let body = serde_json::to_string(&failure.body()).unwrap();
    let read = api_error(failure.status, &body);
    let expected = crate::Error::from(error.clone());
    assert_eq!(read.kind(), expected.kind(), "{body}");
    assert_eq!(read.message(), expected.message());
    check_close_reason(&failure.message);
}

/// A WebSocket message from a client, as the server decodes it, then the instruction it carries
/// as the engine gets it. Invariants: what decodes round-trips; an instruction is refused only
/// for a timeout that is not positive, and the refusal reaches the client with its kind; error
/// texts fit a close frame.
#[cfg(feature = "server")]
pub fn client_message(data: &[u8]) {
    use crate::convert::server::exec_from_wire;
    use crate::protocol::MessageToServer;
    use crate::server::repl::decode_message;

    check_close_reason(&String::from_utf8_lossy(data));
    let message = match decode_message(data) {
        Ok(message) => message,
        Err(failure) => {
            assert_eq!(failure.code, "BadRequest");
            check_close_reason(&failure.message);
            return;
        }
    };
    let text = serde_json::to_string(&message).unwrap();
    assert_eq!(decode_message(text.as_bytes()).as_ref(), Ok(&message));
    let MessageToServer::Exec { instruction, .. } = message;
    let seconds = instruction.timeout_seconds;
    match exec_from_wire(instruction, false) {
        Ok(request) => {
            assert_eq!(request.timeout.as_secs(), u64::try_from(seconds).unwrap());
            assert!(request.timeout.as_secs() > 0);
        }
        Err(e) => {
            assert!(seconds <= 0);
            check_wire_error(&e);
        }
    }
}

/// A request body (selector: which endpoint's) or a path name, as the server decodes it, then
/// as the engine gets it (`convert.rs`) and checks it. Invariants: what decodes round-trips; an
/// empty body or `null` is "all defaults" where the body is optional; every refusal reaches the
/// client with its kind.
#[cfg(feature = "server")]
pub fn request_body(data: &[u8]) {
    use evervm_engine as engine;

    use crate::convert::server::{create_machine_from_wire, exec_from_wire, list_filter_from_wire};
    use crate::protocol::{
        CreateCheckpointRequest, CreateMachineRequest, ExecRequest, ForkMachineRequest,
        ListMachinesRequest,
    };
    use crate::server::extract::{parse_body, parse_optional_body};

    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let checked = |result: engine::Result<()>| {
        if let Err(e) = result {
            check_wire_error(&e);
        }
    };
    match selector % 6 {
        0 => {
            let Ok(request) = parse_body::<ExecRequest>(body) else {
                return;
            };
            let text = serde_json::to_vec(&request).unwrap();
            assert_eq!(
                parse_body::<ExecRequest>(&text).ok().as_ref(),
                Some(&request)
            );
            match exec_from_wire(request.instruction.clone(), request.interrupt) {
                Ok(accepted) => {
                    assert_eq!(accepted.code, request.instruction.code);
                    assert_eq!(accepted.interrupt, request.interrupt);
                    assert!(!accepted.timeout.is_zero());
                }
                Err(e) => check_wire_error(&e),
            }
        }
        1 => {
            let Ok(request) = optional::<CreateMachineRequest>(body) else {
                return;
            };
            match create_machine_from_wire(request) {
                Ok(create) => checked(engine::validate_tags(&create.tags)),
                Err(e) => check_wire_error(&e),
            }
        }
        2 => {
            if let Ok(request) = optional::<ListMachinesRequest>(body) {
                let filter = list_filter_from_wire(request.clone());
                assert_eq!(filter, request.and_then(|r| r.tags).unwrap_or_default());
            }
        }
        3 => {
            if let Ok(Some(ForkMachineRequest {
                tags: Some(tags), ..
            })) = optional(body)
            {
                checked(engine::validate_tags(&tags));
            }
        }
        4 => {
            if let Ok(Some(CreateCheckpointRequest { name: Some(name) })) = optional(body) {
                checked(engine::validate_checkpoint_name(&name));
            }
        }
        _ => {
            // A path segment, as axum hands it over (percent-decoded UTF-8).
            let Ok(name) = std::str::from_utf8(body) else {
                return;
            };
            match engine::MachineName::parse(name) {
                Ok(parsed) => assert_eq!(parsed.as_str(), name),
                Err(e) => {
                    assert_eq!(e.kind(), engine::ErrorKind::NotFound);
                    check_wire_error(&e);
                }
            }
            checked(engine::validate_checkpoint_name(name));
        }
    }

    /// An optional body, decoded; what decodes round-trips.
    fn optional<T>(body: &[u8]) -> Result<Option<T>, crate::server::error::ApiFailure>
    where
        T: Serialize + DeserializeOwned + PartialEq + Debug,
    {
        let request = parse_optional_body::<T>(body)?;
        let text = serde_json::to_vec(&request).unwrap();
        assert_eq!(parse_optional_body::<T>(&text).as_ref(), Ok(&request));
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Runs every file in `fuzz/seeds/<target>/` (realistic inputs and past crashes) through
    /// `harness`.
    fn replay(target: &str, harness: fn(&[u8])) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds")
            .join(target);
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let input = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| harness(&input));
            assert!(outcome.is_ok(), "{} fails", path.display());
            count += 1;
        }
        assert!(count >= 3, "only {count} seeds in {}", dir.display());
    }

    #[test]
    fn server_message_seeds_pass() {
        replay("server_message", super::server_message);
    }

    #[test]
    fn result_stream_seeds_pass() {
        replay("result_stream", super::result_stream);
    }

    #[cfg(feature = "server")]
    #[test]
    fn client_message_seeds_pass() {
        replay("client_message", super::client_message);
    }

    #[cfg(feature = "server")]
    #[test]
    fn request_body_seeds_pass() {
        replay("request_body", super::request_body);
    }
}
