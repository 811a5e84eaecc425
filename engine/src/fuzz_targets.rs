//! Fuzz harnesses for the engine's decoders of untrusted bytes: the agent channel (frames and
//! events from a hostile guest) and a snapshot's `manifest.json` (read back from disk).
//!
//! Each harness takes arbitrary bytes and asserts the decoder's invariants; a panic is a bug.
//! The cargo-fuzz targets in `fuzz/` call these functions (built with `--cfg fuzzing`), and the
//! tests below replay the committed corpus in `fuzz/seeds/` through the same functions on stable,
//! so CI runs every seed and every past crash without nightly. `scripts/fuzz.sh` runs the real
//! thing.

// A harness reports a broken invariant by panicking: that is what the fuzzer looks for.
#![allow(clippy::panic, clippy::unwrap_used, clippy::expect_used)]

use crate::ErrorKind;
use crate::guest::channel::{
    AgentEvent, AgentOutcome, FrameDecoder, MAX_FRAME, ProtocolError, decode_event, encode_frame,
};
use crate::snapshot::{SnapshotManifest, parse_manifest};
use crate::types::{FailureCause, OutputStream};

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

/// What a decoder made of a byte stream: the frames, then the error that ended it, if any.
#[derive(Debug, PartialEq)]
struct Decoded {
    frames: Vec<Vec<u8>>,
    error: Option<ProtocolError>,
}

/// Takes every whole frame out of `decoder`, as the connection's reader does after each read.
/// Returns false once the decoder reported an error (the reader then stops).
fn drain(decoder: &mut FrameDecoder, decoded: &mut Decoded) -> bool {
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => decoded.frames.push(frame),
            Ok(None) => return true,
            Err(e) => {
                decoded.error = Some(e);
                return false;
            }
        }
    }
}

/// Checks what the decoder holds after a drain: exactly the bytes fed and not yet returned, and
/// never more than one header plus one frame's worth (`MAX_FRAME`) still to come.
fn check_pending(decoder: &FrameDecoder, stream: &[u8], fed: usize, frames: &[Vec<u8>]) {
    let consumed: usize = frames.iter().map(|f| 4 + f.len()).sum();
    let tail = &stream[consumed..fed];
    assert_eq!(decoder.pending(), tail.len(), "bytes lost or duplicated");
    if let Some(header) = tail.get(..4) {
        let declared = u32::from_be_bytes(header.try_into().unwrap()) as usize;
        assert!(
            declared <= MAX_FRAME && tail.len() < 4 + declared,
            "a whole frame was left behind, or an oversized one buffered"
        );
    }
}

/// The agent channel: `data` is a seed for the chunk sizes, then bytes as the guest writes them.
///
/// Invariants: the same frames and the same error however the stream is split; nothing lost,
/// duplicated or buffered beyond header + `MAX_FRAME`; each frame re-encodes to the bytes it came
/// from; every event that decodes re-encodes (JSON and binary) to one that decodes the same.
pub fn agent_channel(data: &[u8]) {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };

    let mut whole = FrameDecoder::new();
    whole.feed(stream);
    let mut expected = Decoded {
        frames: Vec::new(),
        error: None,
    };
    if drain(&mut whole, &mut expected) {
        check_pending(&whole, stream, stream.len(), &expected.frames);
    }

    let mut decoder = FrameDecoder::new();
    let mut decoded = Decoded {
        frames: Vec::new(),
        error: None,
    };
    let mut fed = 0;
    let mut sizes = chunk_sizes(seed);
    while fed < stream.len() {
        let size = sizes.next().unwrap_or(1).min(stream.len() - fed);
        decoder.feed(&stream[fed..fed + size]);
        fed += size;
        if !drain(&mut decoder, &mut decoded) {
            break;
        }
        check_pending(&decoder, stream, fed, &decoded.frames);
    }
    assert_eq!(decoded, expected, "the split changed what was decoded");

    let mut offset = 0;
    for frame in &expected.frames {
        let encoded = encode_frame(frame).unwrap();
        assert_eq!(encoded, stream[offset..offset + encoded.len()]);
        offset += encoded.len();
        agent_event(frame);
    }
    // The whole input as one payload too: the fuzzer need not learn the framing first.
    agent_event(stream);
}

/// One event payload: decodes or is refused, and what decodes survives re-encoding.
fn agent_event(payload: &[u8]) {
    let Ok(event) = decode_event(payload) else {
        return;
    };
    if matches!(
        event,
        AgentEvent::FileData(_)
            | AgentEvent::Process(crate::guest::processes::ProcessEvent::Output { .. })
            | AgentEvent::Tunnel(
                crate::guest::tunnels::TunnelEvent::Data { .. }
                    | crate::guest::tunnels::TunnelEvent::Credit { .. }
            )
    ) {
        event_json(&event);
        return;
    }
    let json = serde_json::to_vec(&event_json(&event)).unwrap();
    assert_eq!(
        decode_event(&json).as_ref(),
        Ok(&event),
        "{}",
        String::from_utf8_lossy(&json)
    );
    if let AgentEvent::Output { id, stream, data } = &event
        && id.is_none_or(|id| id >= 0)
    {
        // The agent's binary form; it has no negative ids (-1 is "none").
        let id = id.unwrap_or(-1);
        let mut binary = vec![
            b'O',
            match stream {
                OutputStream::Stdout => b'o',
                OutputStream::Stderr => b'e',
                OutputStream::Display => panic!("output events carry text only"),
            },
        ];
        binary.extend(id.to_be_bytes());
        binary.extend(data.as_bytes());
        assert_eq!(decode_event(&binary).as_ref(), Ok(&event));
    }
}

/// An event as the agent writes it in JSON.
fn event_json(event: &AgentEvent) -> serde_json::Value {
    use serde_json::json;
    match event {
        AgentEvent::Ready { python } => json!({"ev": "ready", "python": python}),
        AgentEvent::Output { id, stream, data } => {
            json!({"ev": "output", "id": id, "stream": stream.as_str(), "data": data})
        }
        AgentEvent::Display { id, result } => {
            json!({"ev": "display", "id": id, "kind": result.kind.as_str(), "data": result.data})
        }
        AgentEvent::Result {
            id,
            outcome,
            exception,
            data,
            results,
            runtime_ms,
            execution_count,
        } => {
            let mut event = json!({"ev": "result", "id": id, "runtime_ms": runtime_ms});
            if let Some(count) = execution_count {
                event["execution_count"] = json!(count);
            }
            if !results.is_empty() {
                event["results"] = json!(results);
            }
            match outcome {
                AgentOutcome::Value(value) => {
                    event["value"] = json!(value);
                    event["data"] = json!(data);
                }
                AgentOutcome::Error { text, cause } => {
                    event["error"] = json!(text);
                    if let Some(exception) = exception {
                        event["exception"] = json!(exception);
                    }
                    event["cause"] = json!(match cause {
                        FailureCause::Exception => "exception",
                        FailureCause::Timeout => "timeout",
                        FailureCause::Interrupted => "interrupted",
                        FailureCause::MachineCrashed
                        | FailureCause::LimitExceeded
                        | FailureCause::MachineDeleted => {
                            panic!("the agent never says this")
                        }
                    });
                }
            }
            event
        }
        AgentEvent::File {
            info,
            entries,
            truncated,
        } => {
            let file = |info: &crate::files::FileInfo| {
                json!({
                    "path": info.path,
                    "type": info.kind.as_str(),
                    "size": info.size,
                    "mode": info.mode,
                    "mtime": info.modified.map_or(-1.0, |m| m.timestamp_micros() as f64 / 1e6),
                })
            };
            json!({
                "ev": "file",
                "info": info.as_ref().map(file),
                "entries": entries.as_ref().map(|e| e.iter().map(file).collect::<Vec<_>>()),
                "truncated": truncated,
            })
        }
        AgentEvent::FileError { failure, message } => {
            use crate::guest::channel::FileFailure as F;
            let kind = match failure {
                F::NotFound => "not_found",
                F::Denied => "denied",
                F::Exists => "exists",
                F::NotEmpty => "not_empty",
                F::IsADirectory => "is_a_directory",
                F::NotADirectory => "not_a_directory",
                F::NoSpace => "no_space",
                F::TooLarge => "too_large",
                F::Aborted => "aborted",
                F::Invalid => "invalid",
                F::Io => "io",
            };
            json!({"ev": "file_error", "kind": kind, "error": message})
        }
        AgentEvent::FileData(data) => {
            // Binary only: the JSON form has none, so it is checked as itself.
            let mut frame = vec![b'D'];
            frame.extend(data);
            assert_eq!(decode_event(&frame).as_ref(), Ok(event));
            json!({"ev": "ready", "python": ""})
        }
        AgentEvent::FileEnd { size } => json!({"ev": "file_end", "size": size}),
        AgentEvent::Packages {
            environment,
            libc,
            installed,
        } => json!({
            "ev": "packages", "environment": environment, "libc": libc, "installed": installed,
        }),
        AgentEvent::Installed { site } => json!({"ev": "installed", "site": site}),
        AgentEvent::Contexts(contexts) => json!({"ev": "contexts", "contexts": contexts}),
        AgentEvent::Process(process) => process_event_json(event, process),
        AgentEvent::Tunnel(tunnel) => tunnel_event_json(event, tunnel),
    }
}

/// A tunnel event as the agent writes it (its binary frames are checked as themselves).
fn tunnel_event_json(
    event: &AgentEvent,
    tunnel: &crate::guest::tunnels::TunnelEvent,
) -> serde_json::Value {
    use crate::guest::tunnels::{TunnelEvent, TunnelFailure};
    use serde_json::json;
    match tunnel {
        TunnelEvent::Opened { id } => json!({"ev": "tun_opened", "id": id}),
        TunnelEvent::Eof { id } => json!({"ev": "tun_eof", "id": id}),
        TunnelEvent::Closed { id, error } => json!({"ev": "tun_closed", "id": id, "error": error}),
        TunnelEvent::Failed { id, failure } => {
            let (kind, error) = match failure {
                TunnelFailure::Refused(e) => ("refused", e),
                TunnelFailure::Limit(e) => ("limit", e),
                TunnelFailure::Invalid(e) => ("invalid", e),
            };
            json!({"ev": "tun_failed", "id": id, "kind": kind, "error": error})
        }
        TunnelEvent::Data { id, data } => {
            let mut frame = crate::guest::tunnels::data_frame_header(*id, data.len())[4..].to_vec();
            frame.extend(data.iter());
            assert_eq!(decode_event(&frame).as_ref(), Ok(event));
            json!({"ev": "ready", "python": ""})
        }
        TunnelEvent::Credit { id, bytes } => {
            let frame = crate::guest::tunnels::credit_frame(*id, *bytes);
            assert_eq!(decode_event(&frame[4..]).as_ref(), Ok(event));
            json!({"ev": "ready", "python": ""})
        }
    }
}

/// A process event as the agent writes it (its output, binary only, is checked as itself).
fn process_event_json(
    event: &AgentEvent,
    process: &crate::guest::processes::ProcessEvent,
) -> serde_json::Value {
    use crate::guest::processes::{ProcessEvent, ProcessStream};
    use serde_json::json;
    match process {
        ProcessEvent::Started { id, pid } => json!({"ev": "proc_started", "id": id, "pid": pid}),
        ProcessEvent::Failed { id, error, kind } => {
            json!({"ev": "proc_failed", "id": id, "error": error, "kind": kind})
        }
        ProcessEvent::Exited { id, end } => json!({
            "ev": "proc_exit", "id": id, "exit_code": end.exit_code, "signal": end.signal,
            "error": end.error,
        }),
        ProcessEvent::Output { id, stream, data } => {
            let mut frame = vec![
                b'P',
                match stream {
                    ProcessStream::Stdout => b'o',
                    ProcessStream::Stderr => b'e',
                },
            ];
            frame.extend(id.to_be_bytes());
            frame.extend(data.iter());
            assert_eq!(decode_event(&frame).as_ref(), Ok(event));
            json!({"ev": "ready", "python": ""})
        }
    }
}

/// The runtime the manifest harness accepts.
fn restorable(runtime: &str) -> bool {
    runtime.starts_with("runsc")
}

/// A snapshot's `manifest.json`, as read back from disk.
///
/// Invariants: a manifest is accepted only in this format and from a runtime `restorable`
/// accepts; a refusal is `MachineCrashed` (the machine is damaged, the engine is fine); what is
/// accepted, written as the engine writes it, is read back the same.
pub fn snapshot_manifest(data: &[u8]) {
    match parse_manifest(data, &restorable) {
        Ok(manifest) => {
            assert!(restorable(&manifest.runtime));
            let text = serde_json::to_vec_pretty(&manifest).unwrap();
            let back: SnapshotManifest = parse_manifest(&text, &restorable).unwrap();
            assert_eq!(back, manifest);
            assert!(parse_manifest(data, &|_| false).is_err());
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::MachineCrashed);
            assert!(!e.message().is_empty());
        }
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
    fn agent_channel_seeds_pass() {
        replay("agent_channel", super::agent_channel);
    }

    #[test]
    fn snapshot_manifest_seeds_pass() {
        replay("snapshot_manifest", super::snapshot_manifest);
    }
}
