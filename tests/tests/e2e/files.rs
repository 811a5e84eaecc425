//! Files in and out of gVisor machines: a 100 MB file byte for byte, a CSV through pandas and a
//! result file back, files kept across swap, engine restart, fork and rollback, and paths that
//! reach the sandbox's whole file system, never the host's (the process backend's own rules are
//! tested in the engine's `files.rs`).

use bytes::Bytes;
use evervm::{ErrorKind, FileKind, WriteFileOptions};
use evervm_tests::backends;

use crate::{new_machine, open_gvisor as open, value};
use futures::StreamExt;
use sha2::{Digest, Sha256};

fn gvisor_available() -> bool {
    let available = backends().iter().any(|b| b == "gvisor");
    if !available {
        eprintln!("skipping: the gVisor backend is not available here");
    }
    available
}

/// Piece `i` of the large file: 1 MiB of bytes that differ from every other piece's.
fn piece(i: u32) -> Vec<u8> {
    let mut data = vec![0u8; 1024 * 1024];
    for (j, byte) in data.iter_mut().enumerate() {
        *byte = ((j as u32).wrapping_mul(31) ^ i.wrapping_mul(2_654_435_761)) as u8;
    }
    data
}

#[tokio::test(flavor = "multi_thread")]
async fn a_100_mb_file_goes_in_and_out_byte_for_byte_and_a_csv_goes_through_pandas() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (engine, client) = open(home.path()).await;
    let m = new_machine(&client, Some("data")).await;

    const PIECES: u32 = 100;
    let mut sent = Sha256::new();
    for i in 0..PIECES {
        sent.update(piece(i));
    }
    let data = futures::stream::iter(0..PIECES)
        .map(|i| Ok(Bytes::from(piece(i))))
        .boxed();
    let size = u64::from(PIECES) * 1024 * 1024;
    let written = m
        .write_file_stream(
            "big/blob.bin",
            data,
            Some(size),
            WriteFileOptions {
                mode: None,
                make_parents: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (written.path.as_str(), written.size, written.kind),
        ("/home/user/big/blob.bin", size, FileKind::File)
    );
    let mut read = m.read_file_stream("/home/user/big/blob.bin").await.unwrap();
    let mut received = Sha256::new();
    let mut count = 0u64;
    while let Some(part) = read.data.next().await {
        let part = part.unwrap();
        count += part.len() as u64;
        received.update(&part);
    }
    assert_eq!(count, size);
    let digest = received.finalize();
    assert_eq!(digest, sent.finalize(), "the file came back different");
    let listed = m.list_files("big").await.unwrap();
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(
        (listed.entries[0].name.as_str(), listed.entries[0].size),
        ("blob.bin", size)
    );
    let in_machine = value(
        &m,
        "import hashlib\nh = hashlib.sha256()\nwith open('big/blob.bin', 'rb') as f:\n    \
         for b in iter(lambda: f.read(1 << 20), b''): h.update(b)\nh.hexdigest()",
    )
    .await;
    assert_eq!(in_machine, format!("'{}'", hex::encode(digest)));
    m.remove_file("big", true).await.unwrap();

    // A CSV in, pandas in the machine, a result file out.
    let csv: String = std::iter::once("city,temp\n".to_owned())
        .chain((0..1000).map(|i| format!("c{},{}\n", i % 7, i % 40)))
        .collect();
    m.write_file("data.csv", csv.clone()).await.unwrap();
    value(
        &m,
        "import pandas as pd\ndf = pd.read_csv('data.csv')\n\
         df.groupby('city').temp.mean().round(3).to_csv('/tmp/means.csv')",
    )
    .await;
    let means = String::from_utf8(m.read_file("/tmp/means.csv").await.unwrap()).unwrap();
    let mut lines = means.lines();
    assert_eq!(lines.next(), Some("city,temp"));
    assert_eq!(lines.count(), 7, "{means}");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn files_survive_swap_restart_fork_and_rollback() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (engine, client) = open(home.path()).await;
    let m = new_machine(&client, None).await;
    m.write_file("kept.txt", "v1").await.unwrap();
    m.write_file("/tmp/t.txt", "in tmp").await.unwrap();
    let checkpoint = m.checkpoint(Some("v1")).await.unwrap();

    // Swapped: a read restores the machine first.
    m.swap_out().await.unwrap();
    assert_eq!(m.info().await.unwrap().state.as_deref(), Some("swapped"));
    assert_eq!(m.read_file("kept.txt").await.unwrap(), b"v1");
    m.swap_out().await.unwrap();
    m.write_file("kept.txt", "v2").await.unwrap();

    // Fork: the fork has its own copy.
    let fork = m.fork(None).await.unwrap();
    fork.write_file("kept.txt", "fork's").await.unwrap();
    assert_eq!(m.read_file("kept.txt").await.unwrap(), b"v2");
    assert_eq!(fork.read_file("kept.txt").await.unwrap(), b"fork's");

    // Engine restart.
    let name = m.name().to_owned();
    engine.shutdown().await;
    drop((m, fork, client, engine));
    let (engine, client) = open(home.path()).await;
    let m = client.machine(&name);
    assert_eq!(m.read_file("kept.txt").await.unwrap(), b"v2");
    assert_eq!(m.read_file("/tmp/t.txt").await.unwrap(), b"in tmp");

    // Rollback: the file is as it was at the checkpoint.
    m.rollback(&checkpoint.name).await.unwrap();
    assert_eq!(m.read_file("kept.txt").await.unwrap(), b"v1");
    assert_eq!(value(&m, "open('kept.txt').read()").await, "'v1'");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn paths_reach_the_sandbox_file_system_never_the_host() {
    if !gvisor_available() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (engine, client) = open(home.path()).await;
    let m = new_machine(&client, None).await;
    // Symlinks the guest planted: at /etc, at host paths (where an engine run by root keeps its
    // home; the host's root through /proc), and up out of /tmp.
    let host_path = "/root/.local/share/evervm";
    value(
        &m,
        &format!(
            "import os\nos.symlink('/etc', 'etc')\nos.symlink({host_path:?}, 'host')\n\
             os.symlink('/proc/1/root', 'proc-root')\n\
             os.symlink('..', '/tmp/up')\nos.symlink('/tmp', 'tmp')\nos.mkfifo('/tmp/fifo')"
        ),
    )
    .await;
    // Every way to the sandbox's /etc/passwd reads the sandbox's, never the host's.
    let passwd = m.read_file("/etc/passwd").await.unwrap();
    let text = String::from_utf8_lossy(&passwd);
    assert!(text.contains("user:x:1000:1000::/home/user:"), "{text}");
    assert_ne!(Some(&passwd), std::fs::read("/etc/passwd").ok().as_ref());
    for path in ["etc/passwd", "proc-root/etc/passwd", "/tmp/up/etc/passwd"] {
        assert_eq!(m.read_file(path).await.unwrap(), passwd, "{path}");
    }
    // The sandbox's /root is root's alone (and holds no evervm home).
    let missing = m.read_file("host/evervm.db").await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::PermissionDenied, "{missing}");
    // Files that say they are empty and are not (E2B's tests read this one).
    let boot_id = m
        .read_file("/proc/sys/kernel/random/boot_id")
        .await
        .unwrap();
    assert_eq!(boot_id.len(), 37, "{boot_id:?}");
    let root = m.list_files("/").await.unwrap();
    let names: Vec<&str> = root.entries.iter().map(|e| e.name.as_str()).collect();
    assert!(
        names.contains(&"home") && names.contains(&"usr"),
        "{names:?}"
    );
    assert_eq!(m.stat_file("/").await.unwrap().kind, FileKind::Directory);
    // A FIFO is refused at once, not waited on.
    let fifo = m.read_file("/tmp/fifo").await.unwrap_err();
    assert_eq!(fifo.kind(), ErrorKind::InvalidInput, "{fifo}");
    // The image is root's: the files API works as the machine's user and may not change it.
    for path in [
        "/etc/passwd",
        "etc/hostname",
        "/usr/lib/x",
        "/opt/evervm/agent.py",
        "/",
    ] {
        let write = m.write_file(path, "x").await.unwrap_err();
        assert!(
            matches!(
                write.kind(),
                ErrorKind::PermissionDenied | ErrorKind::Conflict
            ),
            "write {path}: {write}"
        );
    }
    let removed = m.remove_file("/", true).await.unwrap_err();
    assert_eq!(removed.kind(), ErrorKind::PermissionDenied, "{removed}");
    assert_eq!(
        value(&m, "open('/etc/hostname').read()").await,
        "'machine\\n'",
        "the refused writes changed nothing"
    );
    // A symlink that stays inside is followed.
    m.write_file("tmp/through-link.txt", "ok").await.unwrap();
    assert_eq!(m.read_file("/tmp/through-link.txt").await.unwrap(), b"ok");
    let listing = m.list_files("/tmp").await.unwrap();
    let up = listing.entries.iter().find(|e| e.name == "up");
    assert!(
        up.is_some_and(|e| e.kind == FileKind::Symlink && e.symlink_target.as_deref() == Some("/")),
        "{listing:?}"
    );
    // Where a symlink leads: a stat through one names its target, a listing each link's.
    let through = m.stat_file("tmp").await.unwrap();
    assert_eq!(
        (
            through.path.as_str(),
            through.kind,
            through.symlink_target.as_deref()
        ),
        ("/tmp", FileKind::Directory, Some("/tmp"))
    );
    let inside = m.stat_file("tmp/through-link.txt").await.unwrap();
    assert_eq!(
        (inside.path.as_str(), inside.symlink_target),
        ("/tmp/through-link.txt", None)
    );
    let home_listing = m.list_files("~").await.unwrap();
    let etc = home_listing.entries.iter().find(|e| e.name == "etc");
    assert!(
        etc.is_some_and(|e| e.symlink_target.as_deref() == Some("/etc")),
        "{home_listing:?}"
    );
    engine.shutdown().await;
}
