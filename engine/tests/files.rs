//! Files in and out of machines, on the process backend (the gVisor end-to-end tests cover the
//! sandboxed roots, swap, fork and rollback).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use evervm_engine::{
    Account, ByteStream, CreateMachine, Engine, EngineConfig, ErrorKind, ExecRequest, FileKind,
    Outcome, WriteFileOptions,
};
use futures::StreamExt;

async fn engine(dir: &tempfile::TempDir, max_file_bytes: Option<u64>) -> (Engine, Account, String) {
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    config.pool_size = 0;
    if let Some(limit) = max_file_bytes {
        config.limits.max_file_bytes = limit;
    }
    let engine = Engine::open(config).await.unwrap();
    let account = engine.ensure_account("test").await.unwrap();
    let name = engine
        .create_machine(&account, CreateMachine::default())
        .await
        .unwrap()
        .name
        .to_string();
    (engine, account, name)
}

fn pieces(parts: Vec<Vec<u8>>) -> ByteStream {
    futures::stream::iter(parts.into_iter().map(|p| Ok(Bytes::from(p)))).boxed()
}

async fn read_all(engine: &Engine, account: &Account, name: &str, path: &str) -> Vec<u8> {
    let read = engine.read_file(account, name, path).await.unwrap();
    let mut data = Vec::new();
    let mut stream = read.data;
    while let Some(piece) = stream.next().await {
        data.extend_from_slice(&piece.unwrap());
    }
    assert_eq!(data.len() as u64, read.info.size);
    data
}

async fn run(engine: &Engine, account: &Account, name: &str, code: &str) -> Option<String> {
    let seq = engine
        .exec(account, name, ExecRequest::new(code))
        .await
        .unwrap()
        .seq;
    match engine.result(account, name, seq).await.unwrap().outcome {
        Outcome::Value(value) => value,
        Outcome::Error { text, .. } => panic!("{code}: {text}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn files_go_in_and_out_and_are_seen_by_the_machine() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir, None).await;
    let name = name.as_str();

    // 3 MiB in odd pieces, into a directory that does not exist yet.
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let parts: Vec<Vec<u8>> = data.chunks(100_003).map(<[u8]>::to_vec).collect();
    let metadata: std::collections::BTreeMap<String, String> =
        [("author".to_owned(), "mish".to_owned())].into();
    let options = WriteFileOptions {
        mode: Some(0o600),
        make_parents: true,
        metadata: metadata.clone(),
    };
    let info = engine
        .write_file(&account, name, "out/data.bin", pieces(parts), options)
        .await
        .unwrap();
    assert_eq!(
        (info.kind, info.size, info.mode, info.name()),
        (FileKind::File, data.len() as u64, 0o600, "data.bin")
    );
    assert!(info.path.ends_with("/out/data.bin"), "{}", info.path);
    assert!(info.modified.is_some());
    // Metadata is the file's (extended attributes), seen as the machine's code sets it too, and
    // goes with the file a write replaces.
    assert_eq!(info.metadata, metadata);
    let set = "import os; os.setxattr('out/data.bin', 'user.e2b.stage', b'two'); 1";
    run(&engine, &account, name, set).await;
    let stat = engine
        .stat_file(&account, name, "out/data.bin")
        .await
        .unwrap();
    assert_eq!(stat.metadata.get("stage").map(String::as_str), Some("two"));
    let bad: std::collections::BTreeMap<String, String> = [("bad key".into(), "v".into())].into();
    let refused = engine
        .write_file(
            &account,
            name,
            "out/bad.bin",
            pieces(vec![b"x".to_vec()]),
            WriteFileOptions {
                metadata: bad,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
    assert_eq!(
        read_all(&engine, &account, name, "~/out/data.bin").await,
        data
    );
    let seen = run(
        &engine,
        &account,
        name,
        "import hashlib; hashlib.sha256(open('out/data.bin', 'rb').read()).hexdigest()",
    )
    .await;
    let expected = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&data))
    };
    assert_eq!(seen, Some(format!("'{expected}'")));

    // Written by the machine, read by the caller; listed with sizes, by name.
    run(
        &engine,
        &account,
        name,
        "open('out/result.txt', 'w').write('done\\n')",
    )
    .await;
    assert_eq!(
        read_all(&engine, &account, name, "out/result.txt").await,
        b"done\n"
    );
    let list = engine.list_files(&account, name, "out").await.unwrap();
    let entries: Vec<_> = list
        .entries
        .iter()
        .map(|e| (e.name().to_owned(), e.kind, e.size))
        .collect();
    assert_eq!(
        entries,
        [
            ("data.bin".to_owned(), FileKind::File, data.len() as u64),
            ("result.txt".to_owned(), FileKind::File, 5)
        ]
    );
    assert_eq!(list.directory.kind, FileKind::Directory);
    assert!(!list.truncated);

    // Directories, stat, remove.
    let made = engine
        .make_dir(&account, name, "a/b/c", true)
        .await
        .unwrap();
    assert_eq!(made.kind, FileKind::Directory);
    let again = engine
        .make_dir(&account, name, "a", false)
        .await
        .unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Conflict, "{again}");
    let not_empty = engine
        .remove_file(&account, name, "a", false)
        .await
        .unwrap_err();
    assert_eq!(not_empty.kind(), ErrorKind::Conflict, "{not_empty}");
    engine.remove_file(&account, name, "a", true).await.unwrap();
    let gone = engine.stat_file(&account, name, "a").await.unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    let directory = engine
        .read_file(&account, name, "out")
        .await
        .map(|r| r.info)
        .unwrap_err();
    assert_eq!(directory.kind(), ErrorKind::Conflict, "{directory}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_that_leave_the_home_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir, None).await;
    let name = name.as_str();
    // A symlink the machine's code planted, pointing out of its home.
    run(
        &engine,
        &account,
        name,
        "import os; os.symlink('/etc', 'etc'); os.symlink('..', 'up')",
    )
    .await;
    for path in ["../x", "/etc/passwd", "etc/passwd", "up/x", "~/../x", "/"] {
        let refused = engine.stat_file(&account, name, path).await.unwrap_err();
        assert_eq!(
            refused.kind(),
            ErrorKind::PermissionDenied,
            "{path}: {refused}"
        );
        let write = engine
            .write_file(
                &account,
                name,
                path,
                pieces(vec![b"x".to_vec()]),
                WriteFileOptions::default(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                write.kind(),
                ErrorKind::PermissionDenied | ErrorKind::InvalidInput
            ),
            "{path}: {write}"
        );
    }
    // The link itself may be looked at and removed (not what it points at).
    let removed = engine
        .remove_file(&account, name, "etc", false)
        .await
        .unwrap();
    assert_eq!(removed.kind, FileKind::Symlink);
    let home = engine.stat_file(&account, name, "~").await.unwrap();
    let root = engine
        .remove_file(&account, name, "~", true)
        .await
        .unwrap_err();
    assert_eq!(root.kind(), ErrorKind::PermissionDenied, "{root}");
    assert_eq!(home.kind, FileKind::Directory);
    let empty = engine.stat_file(&account, name, "").await.unwrap_err();
    assert_eq!(empty.kind(), ErrorKind::InvalidInput);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_that_fails_leaves_nothing_and_limits_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir, Some(1024 * 1024)).await;
    let name = name.as_str();
    engine
        .write_file(
            &account,
            name,
            "keep.txt",
            pieces(vec![b"old".to_vec()]),
            WriteFileOptions::default(),
        )
        .await
        .unwrap();

    // Over the limit: refused, and the file it would have replaced is intact.
    let big = pieces(vec![vec![1u8; 600 * 1024], vec![2u8; 600 * 1024]]);
    let too_large = engine
        .write_file(&account, name, "keep.txt", big, WriteFileOptions::default())
        .await
        .unwrap_err();
    assert_eq!(too_large.kind(), ErrorKind::TooLarge, "{too_large}");
    assert_eq!(read_all(&engine, &account, name, "keep.txt").await, b"old");

    // The caller's data breaks off: nothing is written.
    let broken: ByteStream = futures::stream::iter(vec![
        Ok(Bytes::from_static(b"partial")),
        Err(evervm_engine::Error::invalid("the client went away")),
    ])
    .boxed();
    engine
        .write_file(
            &account,
            name,
            "keep.txt",
            broken,
            WriteFileOptions::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(read_all(&engine, &account, name, "keep.txt").await, b"old");
    let names = run(
        &engine,
        &account,
        name,
        "import os; sorted(os.listdir('.'))",
    )
    .await;
    assert_eq!(
        names,
        Some("['keep.txt']".to_owned()),
        "no temporary file left"
    );

    // A file the machine made larger than the limit cannot be read.
    run(
        &engine,
        &account,
        name,
        "open('big', 'wb').write(b'x' * (2 << 20))",
    )
    .await;
    let unreadable = engine
        .read_file(&account, name, "big")
        .await
        .map(|r| r.info)
        .unwrap_err();
    assert_eq!(unreadable.kind(), ErrorKind::TooLarge, "{unreadable}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_operations_take_their_turn_among_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, account, name) = engine(&dir, None).await;
    let name = name.as_str();
    // The instruction accepted first writes the file; the read accepted after it sees it; the
    // instruction accepted after the overwrite sees the overwrite.
    let first = engine
        .exec(
            &account,
            name,
            ExecRequest::new("import time; time.sleep(0.3); open('f', 'w').write('first')"),
        )
        .await
        .unwrap();
    assert_eq!(read_all(&engine, &account, name, "f").await, b"first");
    engine
        .write_file(
            &account,
            name,
            "f",
            pieces(vec![b"second".to_vec()]),
            WriteFileOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        run(&engine, &account, name, "open('f').read()").await,
        Some("'second'".to_owned())
    );
    let done = engine.result(&account, name, first.seq).await.unwrap();
    assert!(matches!(done.outcome, Outcome::Value(_)));
    engine.shutdown().await;
}
