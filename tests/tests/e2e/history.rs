//! History on gVisor: a machine created with `history` keeps an undo point after each of its
//! latest instructions; `undo` takes the last one back, `rewind` goes to any kept point, across
//! swap and an engine restart; the oldest points are dropped and their chunks collected.

use std::path::Path;

use evervm::{Client, CreateMachineOptions, Machine};

use crate::value;

/// An engine on `home` that saves machines in place (history needs it).
pub(crate) async fn history_engine(home: &Path) -> Option<(evervm::engine::Engine, Client)> {
    crate::engine_saving_in_place(crate::gvisor_config(home)).await
}

/// The seqs of the instructions in `history` that `which` picks.
pub(crate) fn seqs_where(
    history: &evervm::MachineHistory,
    which: impl Fn(&evervm::HistoryEntry) -> bool,
) -> Vec<i64> {
    history
        .instructions
        .iter()
        .filter(|i| which(i))
        .map(|i| i.seq)
        .collect()
}

pub(crate) async fn machine_with_history(client: &Client, history: u32) -> Machine {
    client
        .create_machine(CreateMachineOptions {
            history: Some(history),
            image: Some("minimal".into()),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn undo_and_rewind_go_back_to_kept_points_across_swap_and_restart() {
    let home = tempfile::tempdir().unwrap();
    let Some((engine, client)) = history_engine(home.path()).await else {
        return;
    };
    let m = machine_with_history(&client, 5).await;
    assert_eq!(m.info().await.unwrap().history, Some(5));
    // seq 0 sets up, seqs 1 to 9 count.
    value(&m, "frame = {'a': list(range(1000))}\nn = 0").await;
    for _ in 1..=9 {
        value(&m, "n += 1").await;
    }
    // The newest five points are kept; the state before the first instruction was dropped.
    let history = m.history(None).await.unwrap();
    assert_eq!(history.keeps, 5);
    assert!(!history.initial_point);
    let kept = seqs_where(&history, |i| i.undo_point);
    assert_eq!(kept, [5, 6, 7, 8, 9]);
    // The machine's own snapshot (the newest point's state) is chunked too, not whole beside
    // the point.
    let own = home.path().join("machines").join(m.name()).join("snapshot");
    assert!(own.join("pages.img.chunks").exists() && !own.join("pages.img").exists());
    assert_eq!(
        history.instructions[0].code,
        "frame = {'a': list(range(1000))}\nn = 0"
    );

    // A broken state, undone: the frame comes back.
    value(&m, "frame = None").await;
    let undone = m.undo().await.unwrap();
    assert_eq!((undone.to, undone.rewound), (9, 1));
    assert_eq!(value(&m, "len(frame['a']), n").await, "(1000, 9)");

    // Kept now: the points after 7 to 11 (the rewound 10 too). Rewind to 8; a dropped point
    // is refused.
    let err = m.rewind(2).await.unwrap_err();
    assert_eq!(err.kind(), evervm::ErrorKind::NotFound, "{err}");
    let rewound = m.rewind(8).await.unwrap();
    assert_eq!(rewound.to, 8);
    assert_eq!(value(&m, "n").await, "8");
    let history = m.history(None).await.unwrap();
    let marked = seqs_where(&history, |i| i.rewound);
    // 10 (`frame = None`) by the undo; 9 and 11 (`len(frame['a']), n`) by the rewind.
    assert_eq!(marked, [9, 10, 11]);
    // A rewound instruction's state is not the machine's past any more.
    assert!(m.rewind(9).await.is_err());

    // Across a swap and an engine restart.
    value(&m, "n = 100").await;
    m.swap_out().await.unwrap();
    assert_eq!(m.undo().await.unwrap().to, 12);
    assert_eq!(value(&m, "n").await, "8");
    let name = m.name().to_owned();
    drop(m);
    engine.shutdown().await;
    drop((client, engine));
    let Some((engine, client)) = history_engine(home.path()).await else {
        return;
    };
    let m = client.machine(&name);
    assert_eq!(m.rewind(12).await.unwrap().to, 12);
    assert_eq!(value(&m, "n, len(frame['a'])").await, "(8, 1000)");

    // A fork from a kept point: that point's state, its own seqs, the parent untouched.
    let fork = m.fork_at(12, None).await.unwrap();
    let info = fork.info().await.unwrap();
    assert_eq!(
        (info.parent.as_deref(), info.forked_at),
        (Some(name.as_str()), Some(12))
    );
    assert_eq!(value(&fork, "n").await, "8");
    value(&fork, "n = -1").await;
    assert_eq!(value(&m, "n").await, "8");
    assert!(m.fork_at(2, None).await.is_err());

    // The lineage of the parent, two forks (one from its current state, one from a point),
    // a checkpoint and the rewinds.
    m.checkpoint(Some("kept")).await.unwrap();
    let second = m.fork(None).await.unwrap();
    let grandchild = second.fork(None).await.unwrap();
    let lineage = fork.lineage().await.unwrap();
    assert_eq!(lineage.root, name);
    let names: Vec<&str> = lineage.machines.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(
        names,
        [name.as_str(), fork.name(), second.name(), grandchild.name()]
    );
    let parent = &lineage.machines[0];
    assert_eq!(parent.parent, None);
    assert_eq!(parent.checkpoints.len(), 1);
    assert_eq!(parent.checkpoints[0].name, "kept");
    let rewinds: Vec<(i64, i64, &str)> = parent
        .taken_back
        .iter()
        .map(|r| (r.first, r.last, r.by.as_str()))
        .collect();
    assert!(rewinds.contains(&(9, 9, "rewind to 8")), "{rewinds:?}");
    // 13 by the undo to 12, 14 by the rewind to 12 after the restart: one run.
    assert!(rewinds.contains(&(13, 14, "rewind to 12")), "{rewinds:?}");
    assert_eq!(lineage.machines[3].parent.as_deref(), Some(second.name()));
    for machine in [grandchild, second, fork] {
        machine.delete().await.unwrap();
    }

    // Deleting the machine gives its chunks back.
    let before = engine.snapshot_chunk_stats();
    assert!(before.chunks > 0);
    m.delete().await.unwrap();
    engine.collect_snapshot_chunks().await.unwrap();
    assert_eq!(engine.snapshot_chunk_stats().chunks, 0);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn undoing_the_first_instruction_gives_the_fresh_interpreter_and_machines_without_history_refuse()
 {
    let home = tempfile::tempdir().unwrap();
    let Some((engine, client)) = history_engine(home.path()).await else {
        return;
    };
    let m = machine_with_history(&client, 3).await;
    value(&m, "x = 1").await;
    assert!(m.history(None).await.unwrap().initial_point);
    assert_eq!(m.undo().await.unwrap().to, -1);
    assert_eq!(value(&m, "'x' in globals()").await, "False");
    // That look was an instruction too: undone, the machine is fresh again.
    assert_eq!(m.undo().await.unwrap().to, -1);
    // A machine that ran nothing has nothing to undo.
    let idle = machine_with_history(&client, 3).await;
    let err = idle.undo().await.unwrap_err();
    assert_eq!(err.kind(), evervm::ErrorKind::Conflict, "{err}");

    let plain = client
        .create_machine(CreateMachineOptions {
            image: Some("minimal".into()),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap();
    value(&plain, "y = 2").await;
    let err = plain.undo().await.unwrap_err();
    assert_eq!(err.kind(), evervm::ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("history"), "{err}");
    engine.shutdown().await;
}
