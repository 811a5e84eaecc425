//! An endless print loop leaves the engine's memory flat: output past the cap kept per
//! instruction is dropped, with a marker. Alone in its test binary, so that the memory this
//! process holds is the engine's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use evervm_engine::{
    Engine, ExecEvent, ExecRequest, FailureCause, LINE_OVERHEAD_BYTES, Outcome, OutputStream,
};
use futures::StreamExt;

mod common;
use common::new_machine;

/// This process's resident memory, from `/proc/self/status`.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn an_endless_print_loop_leaves_memory_flat() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::config(&dir);
    let cap = config.limits.max_output_bytes;
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = new_machine(&engine, &account).await;
    // Warm up (the agent, the store), then measure.
    let seq = engine
        .exec(&account, &name, ExecRequest::new("line = 'x' * 1000"))
        .await
        .unwrap()
        .seq;
    engine.result(&account, &name, seq).await.unwrap();
    let before = resident_bytes();

    // About a gigabyte of output (at tens of MB/s) before the timeout stops it.
    let mut flood = ExecRequest::new("while True:\n    print(line)");
    flood.timeout = Duration::from_secs(15);
    let seq = engine.exec(&account, &name, flood).await.unwrap().seq;
    let events: Vec<ExecEvent> = engine
        .events(&account, &name, seq)
        .await
        .unwrap()
        .collect()
        .await;
    let after = resident_bytes();

    let (mut kept, mut lines) = (0usize, 0usize);
    let mut last_line = String::new();
    let mut result = None;
    for event in events {
        match event {
            ExecEvent::Output(chunk) => {
                kept += chunk.data.len() + LINE_OVERHEAD_BYTES;
                lines += 1;
                last_line = chunk.data;
                if lines == 1 {
                    assert_eq!(chunk.stream, OutputStream::Stdout);
                }
            }
            ExecEvent::Result(r) => result = Some(r),
        }
    }
    let result = result.unwrap();
    assert!(
        matches!(
            result.outcome,
            Outcome::Error {
                cause: FailureCause::Timeout,
                ..
            }
        ),
        "{result:?}"
    );
    assert!(result.output_truncated, "{result:?}");
    assert!(last_line.contains("output truncated"), "{last_line}");
    assert!(kept <= cap + 1024, "kept {kept} bytes, the cap is {cap}");
    let grown = after.saturating_sub(before);
    println!(
        "kept {lines} lines ({kept} bytes); resident memory {} MiB -> {} MiB",
        before >> 20,
        after >> 20
    );
    // The cap itself, twice (the live copy and the stored one in flight), the events on their
    // way from the agent, and room for the allocator and the database's cache: far below the
    // gigabyte printed.
    assert!(
        grown < 3 * cap as u64 + (96 << 20),
        "the engine grew by {} MiB",
        grown >> 20
    );

    // The same output comes back from the store, marker included.
    let replay: Vec<ExecEvent> = engine
        .events(&account, &name, seq)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(replay.len(), lines + 1);
    match replay.last() {
        Some(ExecEvent::Result(stored)) => assert!(stored.output_truncated),
        other => panic!("{other:?}"),
    }
    // And the machine still works, with its state.
    let seq = engine
        .exec(&account, &name, ExecRequest::new("len(line)"))
        .await
        .unwrap()
        .seq;
    let result = engine.result(&account, &name, seq).await.unwrap();
    assert_eq!(result.outcome, Outcome::Value(Some("1000".to_owned())));
    engine.shutdown().await;
}
