//! A machine's history: an undo point (its whole state, chunked into the home's store) after
//! each of its latest instructions, and before its first; and rewinding to one of them.
//!
//! A point is taken by the machine's task after the instruction's result is reported: the
//! machine is saved in place (the same save `durability = instruction` makes, which it reuses
//! when it has made it; a machine with a history has its saves chunked as they are made), and
//! the snapshot is copied, chunked, to `history/<seq>`. Points beyond
//! the machine's count are dropped, oldest first; their chunks are collected when no other
//! snapshot holds them.

use std::sync::Arc;

use super::swap::{Save, rollback, save};
use super::{MachineHandle, bucketed};
use crate::engine::EngineInner;
use crate::error::{Error, ErrorKind, Result};
use crate::pool::Resident;
use crate::snapshot;
use crate::store::InstructionRow;
use crate::types::Rewound;

/// At most this many instructions are read to find a rewind's target.
const MAX_ROWS: usize = 100_000;

/// Takes the undo point for the state after instruction `seq` (`-1`: before the first), saving
/// the machine first unless `saved` (its snapshot already holds that state), then drops the
/// points beyond its count. A failure is logged: the instruction's result stands.
pub(super) async fn take_point(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    seq: i64,
    saved: bool,
) {
    machine.taking_point.send_replace(true);
    take(engine, machine, resident, seq, saved).await;
    // Set by the caller before the result went out, or above.
    machine.taking_point.send_replace(false);
}

async fn take(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    seq: i64,
    saved: bool,
) {
    let started = std::time::Instant::now();
    if !saved && let Err(e) = save(engine, machine, resident, Save::InPlace).await {
        tracing::warn!(machine = %machine.name, seq, "no undo point: the save failed: {e}");
        return;
    }
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let chunks = Arc::clone(&engine.chunks);
    let in_place = engine.chunking().is_some();
    let restorable = engine.restorable();
    let written = tokio::task::spawn_blocking(move || -> Result<bool> {
        let from = snapshot::snapshot_dir(&home, &name);
        let to = snapshot::point_dir(&home, &name, seq);
        let mut pinned = None;
        let chunk = |dir: &std::path::Path| {
            let names = snapshot::unchunked_files(dir)?;
            pinned = Some(chunks.put_files(dir, &names, 3)?);
            Ok(())
        };
        // Where swapped snapshots are chunked, the machine's own is chunked in place and the
        // point is a copy of it (hard links to its recipes): its memory file, left whole
        // beside the point, would cost as much disk as all the other points together.
        let chunked_in_place = in_place && !snapshot::unchunked_files(&from)?.is_empty();
        if chunked_in_place {
            snapshot::rewrite(&home, &name, &*restorable, chunk)?;
            snapshot::copy(&from, &to, false)?;
        } else {
            snapshot::rewrite_to(&from, &to, &*restorable, chunk)?;
        }
        drop(pinned);
        Ok(chunked_in_place)
    })
    .await
    .map_err(|e| Error::internal(format!("taking an undo point stopped: {e}")))
    .and_then(|r| r);
    let name = machine.name.as_str();
    if matches!(written, Ok(true)) {
        machine.snapshot_chunked();
    }
    let written = written.map(|_| ());
    let taken = match written {
        // With a bucket, a point counts once it is there: any node may rewind to it.
        Ok(()) => bucketed::publish_point(engine, name, seq).await,
        Err(e) => Err(e),
    };
    if let Err(e) = taken {
        tracing::warn!(machine = name, seq, "no undo point: {e}");
        return;
    }
    match drop_excess(engine, machine).await {
        Ok(dropped) => {
            if dropped > 0 {
                engine.snapshots_changed();
            }
            engine.forget_disk_facts(name);
            tracing::debug!(
                machine = name,
                seq,
                "undo point taken in {:.1} ms",
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        Err(e) => tracing::warn!(machine = name, seq, "cannot drop old undo points: {e}"),
    }
}

/// Drops the machine's points beyond its count, oldest first; how many it dropped. The newest
/// `history` points stay, and the one before the first instruction while it is among the
/// newest `history + 1` (an undo of the first instruction needs it).
async fn drop_excess(engine: &Arc<EngineInner>, machine: &MachineHandle) -> Result<usize> {
    let name = machine.name.as_str();
    let points = bucketed::points(engine, name).await?;
    let excess = points
        .len()
        .saturating_sub(machine.history as usize + usize::from(points.first() == Some(&-1)));
    let kept = points.get(excess..).unwrap_or_default().to_vec();
    for old in points.iter().take(excess) {
        bucketed::drop_point(engine, name, *old).await;
    }
    let (home, owned) = (engine.config.home.clone(), name.to_owned());
    // This home's copies go too, and any it holds of points no longer kept (with a bucket,
    // another node may have dropped them).
    let count = tokio::task::spawn_blocking(move || {
        let mut count = 0;
        for old in snapshot::points(&home, &owned) {
            if !kept.contains(&old) {
                snapshot::remove_point(&home, &owned, old)?;
                count += 1;
            }
        }
        Ok::<_, Error>(count)
    })
    .await
    .map_err(|e| Error::internal(format!("dropping undo points stopped: {e}")))??;
    Ok(count)
}

/// Whether the machine has no undo point yet (so its first instruction takes the one before
/// it).
pub(super) async fn has_no_points(engine: &EngineInner, machine: &MachineHandle) -> bool {
    bucketed::points(engine, machine.name.as_str())
        .await
        .map_or(true, |points| points.is_empty())
}

/// Makes undo point `to` (`-1`: the one before the machine's last instruction) the machine's
/// state; the instructions after it that ran are marked rewound. Between instructions, in the
/// machine's task.
pub(super) async fn rewind(
    engine: &Arc<EngineInner>,
    machine: &MachineHandle,
    resident: &mut Option<Resident>,
    to: i64,
) -> Result<Rewound> {
    let home = engine.config.home.clone();
    let name = machine.name.to_string();
    let points = bucketed::points(engine, &name).await?;
    let first_unrun = machine.first_unrun_seq(engine).await?;
    let from_seq = points.first().copied().unwrap_or(0).max(0);
    let rows = engine
        .store
        .instructions_from(&name, from_seq, MAX_ROWS)
        .await?;
    let target = target_of(to, &points, &rows, first_unrun, &name, machine.history)?;
    // Taken on another node, maybe.
    bucketed::fetch_point(engine, &name, target).await?;
    let dir = snapshot::point_dir(&home, &name, target);
    // The old sandbox's state is not needed any more: what runs in it is killed at once (its
    // memory and its share of the cores freed for the restore), and the rest of its stop
    // (runsc's delete, its files) waits until the restored one runs, off the caller's path.
    let mut old = resident.take();
    let was_resident = old.is_some();
    if let Some(old) = &mut old {
        old.stop_now();
    }
    let going_back = async {
        let started = std::time::Instant::now();
        rollback(engine, machine, resident, dir).await?;
        let rolled_back = started.elapsed();
        let marked = engine
            .store
            .mark_rewound(&name, target, first_unrun, &format!("rewind to {target}"))
            .await?;
        let noted = started.elapsed();
        // Brought back at once where it was running: the caller's next instruction is likely.
        if was_resident {
            super::swap::become_resident(engine, machine, resident).await;
        }
        tracing::debug!(
            machine = name,
            target,
            "rewound: rolled back {:.1} ms, marked {:.1} ms, restored {:.1} ms",
            rolled_back.as_secs_f64() * 1e3,
            noted.saturating_sub(rolled_back).as_secs_f64() * 1e3,
            started.elapsed().saturating_sub(noted).as_secs_f64() * 1e3
        );
        Ok::<_, Error>(marked)
    };
    let marked = going_back.await;
    if let Some(old) = old {
        tokio::spawn(old.kill());
    }
    Ok(Rewound {
        to: target,
        rewound: i64::try_from(marked?).unwrap_or(i64::MAX),
    })
}

/// The undo point a rewind to `to` goes to (see [`rewind`]), given the points kept, the
/// instructions from the oldest point on and the first instruction that has not run.
fn target_of(
    to: i64,
    points: &[i64],
    rows: &[InstructionRow],
    first_unrun: i64,
    name: &str,
    keeps: u32,
) -> Result<i64> {
    let rewound = |seq: i64| {
        rows.iter()
            .find(|row| row.seq == seq)
            .is_some_and(|row| row.rolled_back_to.is_some())
    };
    let on_timeline = |seq: i64| seq == -1 || (seq < first_unrun && !rewound(seq));
    match to.cmp(&-1) {
        std::cmp::Ordering::Less => Err(Error::invalid(format!(
            "rewind to {to}: give an instruction's seq, or -1 for the state before the last \
             instruction"
        ))),
        std::cmp::Ordering::Equal => {
            let last = rows
                .iter()
                .rev()
                .find(|row| row.seq < first_unrun && row.rolled_back_to.is_none())
                .map(|row| row.seq)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "machine {name} has no instruction to undo (none has run since its \
                             oldest undo point, or all were rewound)"
                        ),
                    )
                })?;
            points
                .iter()
                .rev()
                .copied()
                .find(|p| *p < last && on_timeline(*p))
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "machine {name} keeps no undo point from before instruction {last} \
                             (it keeps the last {keeps}): rewind to a kept one (see its history)"
                        ),
                    )
                })
        }
        std::cmp::Ordering::Greater if !points.contains(&to) => Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "machine {name} keeps no undo point after instruction {to} (it keeps the last \
                 {keeps}; see its history)"
            ),
        )),
        std::cmp::Ordering::Greater if !on_timeline(to) => Err(Error::new(
            ErrorKind::Conflict,
            format!(
                "instruction {to} of machine {name} was rewound or has not run: its state is \
                 not the machine's past"
            ),
        )),
        std::cmp::Ordering::Greater => Ok(to),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, rewound: bool) -> InstructionRow {
        InstructionRow {
            seq,
            code: String::new(),
            result: None,
            rolled_back_to: rewound.then(|| "rewind to 1".to_owned()),
        }
    }

    #[test]
    fn an_undo_goes_to_the_point_before_the_last_instruction_on_the_timeline() {
        // 0..=5 ran; 3 and 4 were rewound (a rewind to 2), then 5 ran.
        let rows: Vec<_> = (0..=5).map(|s| row(s, s == 3 || s == 4)).collect();
        let points = [-1, 1, 2, 3, 4, 5];
        let target = |to| target_of(to, &points, &rows, 6, "m", 5);
        assert_eq!(target(-1).unwrap(), 2);
        assert_eq!(target(1).unwrap(), 1);
        assert_eq!(target(5).unwrap(), 5);
        assert_eq!(target(3).unwrap_err().kind(), ErrorKind::Conflict);
        assert_eq!(target(0).unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(target(-2).unwrap_err().kind(), ErrorKind::InvalidInput);
        // Only the first ran: undone to before it; nothing ran: nothing to undo.
        assert_eq!(
            target_of(-1, &[-1, 0], &[row(0, false)], 1, "m", 5).unwrap(),
            -1
        );
        let none = target_of(-1, &[-1], &[], 0, "m", 5).unwrap_err();
        assert_eq!(none.kind(), ErrorKind::Conflict);
        // A queued instruction (seq 6, not run) is not the one an undo takes back.
        let mut queued = rows.clone();
        queued.push(row(6, false));
        assert_eq!(target_of(-1, &points, &queued, 6, "m", 5).unwrap(), 2);
        // The point before the last instruction was dropped.
        let dropped = target_of(-1, &[5], &rows, 6, "m", 5).unwrap_err();
        assert_eq!(dropped.kind(), ErrorKind::NotFound);
    }
}
