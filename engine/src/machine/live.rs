//! An instruction while it is queued or running: its output so far and, once it ends, its
//! result, for every stream that reads it. What it keeps is capped (see
//! [`crate::Limits::max_output_bytes`]): past the cap the output is dropped, with one marker
//! line in the stream and a flag in the result.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::engine::LINE_OVERHEAD_BYTES;
use crate::error::Result;
use crate::store::OutputBatches;
use crate::sync::lock;
use crate::types::{ExecEvent, ExecResult, FailureCause, OutputChunk, OutputStream, RichResult};

/// A partial line longer than this is sent as a chunk of its own.
const MAX_LINE_BYTES: usize = 1024 * 1024;

/// An instruction that is queued, running, or finished but not yet only in the store.
pub(crate) struct LiveInstruction {
    data: Mutex<LiveData>,
    version: watch::Sender<u64>,
    /// Output kept at most, in bytes (see [`LINE_OVERHEAD_BYTES`]).
    cap: usize,
}

#[derive(Default)]
struct LiveData {
    chunks: Vec<OutputChunk>,
    result: Option<ExecResult>,
    /// What the kept chunks count against the cap.
    kept_bytes: usize,
    /// Set once the cap was reached: later output is dropped.
    truncated: bool,
    /// The rich results shown so far (each also a chunk), the first of the result's.
    shown: Vec<RichResult>,
    /// Chunks from here on are not in the store yet.
    unsaved_from: usize,
    unsaved_bytes: usize,
}

impl LiveInstruction {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            data: Mutex::new(LiveData::default()),
            version: watch::channel(0).0,
            cap,
        }
    }

    /// Appends lines (one lock and one wake-up for many). Past the cap, the first line that
    /// does not fit is replaced by a marker and the rest is dropped.
    pub(crate) fn push_chunks(&self, lines: impl IntoIterator<Item = (OutputStream, String)>) {
        self.push_lines(
            lines
                .into_iter()
                .map(|(stream, data)| (stream, data, false)),
        );
    }

    /// Adds lines of text, each with whether it did not end (see [`OutputChunk::partial`]).
    fn push_lines(&self, lines: impl IntoIterator<Item = (OutputStream, String, bool)>) {
        let mut live = lock(&self.data);
        let before = live.chunks.len();
        for (stream, data, partial) in lines {
            if live.truncated {
                break;
            }
            if !self.fits(&mut live, data.len()) {
                break;
            }
            push(&mut live, stream, data, partial);
        }
        let added = live.chunks.len() > before;
        drop(live);
        if added {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// Whether `bytes` more fit under the cap; when not, the output is marked truncated (once,
    /// with a marker line).
    fn fits(&self, live: &mut LiveData, bytes: usize) -> bool {
        if live.truncated {
            return false;
        }
        if live.kept_bytes + bytes + LINE_OVERHEAD_BYTES <= self.cap {
            return true;
        }
        live.truncated = true;
        let marker = format!(
            "[evervm] output truncated: this instruction's output and rich results passed the \
             {} kept per instruction, so the rest of them was dropped (the instruction went on \
             running)",
            human_bytes(self.cap)
        );
        push(live, OutputStream::Stderr, marker, false);
        false
    }

    /// Appends a rich result shown during the instruction: a chunk of the output (so that it
    /// streams in order with the text) and the first of the result's results. It counts
    /// against the cap like text.
    pub(crate) fn push_display(&self, result: RichResult) {
        let Ok(json) = serde_json::to_string(&result) else {
            return;
        };
        let mut live = lock(&self.data);
        let before = live.chunks.len();
        if self.fits(&mut live, json.len()) {
            push(&mut live, OutputStream::Display, json, false);
            live.shown.push(result);
        }
        let added = live.chunks.len() > before;
        drop(live);
        if added {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// Completes a result before it is stored: the results shown during the instruction, then
    /// its own (the value's, the figures left open) while they fit under the cap; ForeverVM's
    /// `data` from the last figure (as `{"png": ...}`) unless the agent sent it.
    pub(crate) fn complete(&self, result: &mut ExecResult) {
        let mut live = lock(&self.data);
        let before = live.chunks.len();
        let mut results = std::mem::take(&mut live.shown);
        for rich in std::mem::take(&mut result.results) {
            let size = rich.size();
            if self.fits(&mut live, size) {
                live.kept_bytes += size + LINE_OVERHEAD_BYTES;
                results.push(rich);
            }
        }
        if result.data.is_none() {
            result.data = results
                .iter()
                .rev()
                .find_map(RichResult::figure_png)
                .map(|png| serde_json::json!({ "png": png }));
        }
        result.results = results;
        result.output_truncated |= live.truncated;
        let added = live.chunks.len() > before;
        drop(live);
        if added {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// True once output was dropped at the cap.
    pub(crate) fn truncated(&self) -> bool {
        lock(&self.data).truncated
    }

    /// Bytes of output not yet handed to the store.
    pub(crate) fn unsaved_bytes(&self) -> usize {
        lock(&self.data).unsaved_bytes
    }

    /// The chunks not yet handed to the store, encoded as it keeps them, marked as handed over.
    pub(crate) fn take_unsaved(&self) -> Result<OutputBatches> {
        let mut live = lock(&self.data);
        let from = live.unsaved_from.min(live.chunks.len());
        let unsaved = OutputBatches::encode(&live.chunks[from..])?;
        live.unsaved_from = live.chunks.len();
        live.unsaved_bytes = 0;
        Ok(unsaved)
    }

    /// Sets the result once (with the output's truncation flag); later calls are ignored.
    pub(crate) fn finish(&self, mut result: ExecResult) -> bool {
        let mut live = lock(&self.data);
        if live.result.is_some() {
            return false;
        }
        result.output_truncated |= live.truncated;
        live.result = Some(result);
        drop(live);
        self.version.send_modify(|v| *v += 1);
        true
    }

    pub(crate) async fn wait_result(self: Arc<Self>) -> ExecResult {
        let mut changes = self.version.subscribe();
        loop {
            changes.borrow_and_update();
            if let Some(result) = lock(&self.data).result.clone() {
                return result;
            }
            if changes.changed().await.is_err() {
                return ExecResult::failure(FailureCause::MachineCrashed, "the machine stopped");
            }
        }
    }

    /// Output chunks from the first, then the result; ends after the result. Takes everything
    /// available under one lock and hands it out from a local buffer.
    pub(crate) fn events(self: Arc<Self>) -> impl futures::Stream<Item = ExecEvent> + Send {
        struct Cursor {
            live: Arc<LiveInstruction>,
            changes: watch::Receiver<u64>,
            next: usize,
            buffer: VecDeque<ExecEvent>,
            done: bool,
        }
        /// Most events taken out at once: a reader far behind catches up in steps.
        const STEP: usize = 4096;
        let changes = self.version.subscribe();
        let cursor = Cursor {
            live: self,
            changes,
            next: 0,
            buffer: VecDeque::new(),
            done: false,
        };
        futures::stream::unfold(cursor, |mut cursor| async move {
            loop {
                if let Some(event) = cursor.buffer.pop_front() {
                    return Some((event, cursor));
                }
                if cursor.done {
                    return None;
                }
                cursor.changes.borrow_and_update();
                let more = {
                    let data = lock(&cursor.live.data);
                    let available = data.chunks.get(cursor.next..).unwrap_or_default();
                    let taken = &available[..available.len().min(STEP)];
                    cursor.next += taken.len();
                    cursor
                        .buffer
                        .extend(taken.iter().cloned().map(ExecEvent::Output));
                    if taken.len() == available.len()
                        && let Some(result) = data.result.clone()
                    {
                        cursor.buffer.push_back(ExecEvent::Result(result));
                        cursor.done = true;
                    }
                    taken.len() < available.len()
                };
                if cursor.buffer.is_empty() && !more && cursor.changes.changed().await.is_err() {
                    return None;
                }
            }
        })
    }
}

fn push(live: &mut LiveData, stream: OutputStream, data: String, partial: bool) {
    let cost = data.len() + LINE_OVERHEAD_BYTES;
    live.kept_bytes += cost;
    live.unsaved_bytes += cost;
    let seq = live.chunks.len() as i64;
    live.chunks.push(OutputChunk {
        seq,
        stream,
        data,
        partial,
    });
}

/// `16 MiB`, `512 KiB`, `100 bytes`.
pub(crate) fn human_bytes(bytes: usize) -> String {
    if bytes >= 1024 * 1024 && bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} bytes")
    }
}

/// Splits output into lines, one chunk per line without its newline.
#[derive(Default)]
pub(crate) struct LineSplitter {
    partial: [String; 2],
}

impl LineSplitter {
    fn index(stream: OutputStream) -> Option<usize> {
        match stream {
            OutputStream::Stdout => Some(0),
            OutputStream::Stderr => Some(1),
            OutputStream::Display => None,
        }
    }

    /// Splits text of `stream` into lines (rich results don't come this way).
    pub(crate) fn push(&mut self, live: &LiveInstruction, stream: OutputStream, data: &str) {
        let Some(index) = Self::index(stream) else {
            return;
        };
        if live.truncated() {
            // Nothing more is kept: don't even split it.
            return;
        }
        let partial = &mut self.partial[index];
        let mut lines = Vec::new();
        let mut rest = data;
        while let Some(newline) = rest.find('\n') {
            if partial.is_empty() {
                lines.push((stream, rest[..newline].to_owned(), false));
            } else {
                partial.push_str(&rest[..newline]);
                lines.push((stream, std::mem::take(partial), false));
            }
            rest = &rest[newline + 1..];
        }
        partial.push_str(rest);
        if partial.len() > MAX_LINE_BYTES {
            lines.push((stream, std::mem::take(partial), true));
        }
        live.push_lines(lines);
    }

    pub(crate) fn flush(&mut self, live: &LiveInstruction) {
        let mut lines = Vec::new();
        for (stream, partial) in [OutputStream::Stdout, OutputStream::Stderr]
            .into_iter()
            .zip(&mut self.partial)
        {
            if !partial.is_empty() {
                lines.push((stream, std::mem::take(partial), true));
            }
        }
        live.push_lines(lines);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn lines(live: &LiveInstruction) -> Vec<String> {
        lock(&live.data)
            .chunks
            .iter()
            .map(|c| c.data.clone())
            .collect()
    }

    #[test]
    fn output_past_the_cap_is_dropped_after_one_marker() {
        let cap = 10 * (LINE_OVERHEAD_BYTES + 10);
        let live = LiveInstruction::new(cap);
        let mut splitter = LineSplitter::default();
        for _ in 0..1000 {
            splitter.push(&live, OutputStream::Stdout, "0123456789\n");
        }
        splitter.flush(&live);
        let kept = lines(&live);
        assert_eq!(kept.len(), 11, "{kept:?}");
        assert!(kept[..10].iter().all(|l| l == "0123456789"));
        assert!(kept[10].contains("output truncated"), "{}", kept[10]);
        assert!(live.truncated());
        let kept_bytes = lock(&live.data).kept_bytes;
        assert!(kept_bytes <= cap + 512, "{kept_bytes}");
        live.finish(ExecResult::failure(FailureCause::Exception, "x"));
        let result = lock(&live.data).result.clone().unwrap();
        assert!(result.output_truncated);
    }

    #[test]
    fn lines_remember_whether_they_ended() {
        let live = LiveInstruction::new(1 << 20);
        let mut splitter = LineSplitter::default();
        splitter.push(&live, OutputStream::Stdout, "a\nb");
        splitter.push(&live, OutputStream::Stderr, "e");
        splitter.push(&live, OutputStream::Stdout, "c\nd");
        splitter.flush(&live);
        let chunks = lock(&live.data).chunks.clone();
        let texts: Vec<(OutputStream, String)> =
            chunks.iter().map(|c| (c.stream, c.text())).collect();
        assert_eq!(
            texts,
            [
                (OutputStream::Stdout, "a\n".to_owned()),
                (OutputStream::Stdout, "bc\n".to_owned()),
                (OutputStream::Stdout, "d".to_owned()),
                (OutputStream::Stderr, "e".to_owned()),
            ]
        );
    }

    #[test]
    fn unsaved_chunks_are_handed_over_once() {
        let live = LiveInstruction::new(1 << 20);
        live.push_chunks([(OutputStream::Stdout, "a".to_owned())]);
        live.push_chunks([(OutputStream::Stderr, "b".to_owned())]);
        assert_eq!(live.unsaved_bytes(), 2 + 2 * LINE_OVERHEAD_BYTES);
        let first = live.take_unsaved().unwrap().decode();
        assert_eq!(first.iter().map(|c| c.seq).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(first[1].data, "b");
        live.push_chunks([(OutputStream::Stdout, "c".to_owned())]);
        let second = live.take_unsaved().unwrap().decode();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].seq, 2);
        assert_eq!(live.unsaved_bytes(), 0);
        assert!(live.take_unsaved().unwrap().decode().is_empty());
    }

    fn figure(png: &str) -> RichResult {
        let data = serde_json::json!({"image/png": png, "text/plain": "<Figure>"});
        RichResult {
            kind: crate::types::RichKind::Figure,
            data: data.as_object().unwrap().clone(),
        }
    }

    #[test]
    fn rich_results_are_kept_in_order_and_within_the_cap() {
        let live = LiveInstruction::new(1 << 20);
        live.push_chunks([(OutputStream::Stdout, "before".to_owned())]);
        live.push_display(figure("AAAA"));
        live.push_chunks([(OutputStream::Stdout, "after".to_owned())]);
        let chunks = lock(&live.data).chunks.clone();
        assert_eq!(chunks[1].stream, OutputStream::Display);
        assert_eq!(chunks[1].rich(), Some(figure("AAAA")));
        assert_eq!(chunks[2].seq, 2);
        // They survive the store's encoding.
        assert_eq!(live.take_unsaved().unwrap().decode(), chunks);

        // The result: those shown first, then its own; ForeverVM's `data` from the last figure.
        let mut result = ExecResult {
            results: vec![figure("BBBB")],
            ..ExecResult::default()
        };
        live.complete(&mut result);
        assert_eq!(result.results, [figure("AAAA"), figure("BBBB")]);
        assert_eq!(result.data, Some(serde_json::json!({"png": "BBBB"})));
        assert!(!result.output_truncated);

        // Past the cap: dropped, with the output's marker and the flag.
        let cap = 300;
        let live = LiveInstruction::new(cap);
        live.push_display(figure(&"A".repeat(100)));
        live.push_display(figure(&"B".repeat(400)));
        let mut result = ExecResult {
            results: vec![figure(&"C".repeat(400))],
            ..ExecResult::default()
        };
        live.complete(&mut result);
        assert_eq!(result.results, [figure(&"A".repeat(100))]);
        assert!(result.output_truncated);
        let last = lock(&live.data).chunks.last().cloned().unwrap();
        assert!(last.data.contains("output truncated"), "{last:?}");
    }

    #[tokio::test]
    async fn a_reader_far_behind_gets_everything_in_order() {
        let live = Arc::new(LiveInstruction::new(usize::MAX));
        live.push_chunks((0..10_000).map(|i| (OutputStream::Stdout, i.to_string())));
        live.finish(ExecResult::failure(FailureCause::Exception, "x"));
        let events: Vec<ExecEvent> = Arc::clone(&live).events().collect().await;
        assert_eq!(events.len(), 10_001);
        for (i, event) in events[..10_000].iter().enumerate() {
            assert!(matches!(event, ExecEvent::Output(c) if c.seq == i as i64));
        }
        assert!(matches!(events.last(), Some(ExecEvent::Result(_))));
    }
}
