//! What makes machines live forever: swap-out, fork, checkpoints and rollback.

use chrono::Utc;

use super::Engine;
use crate::error::{Error, ErrorKind, Result};
use crate::machine::bucketed;
use crate::store::{CheckpointRecord, MachineRecord};
use crate::types::{
    Account, CheckpointInfo, ForkMachine, MachineInfo, MachineName, validate_checkpoint_name,
    validate_tags,
};

impl Engine {
    /// Saves a machine to disk (memory, files, everything) and releases its sandbox; its next
    /// instruction restores it. Waits for the running instruction to finish first.
    pub async fn swap_out(&self, account: &Account, name: &str) -> Result<()> {
        self.handle(account, name).await?.swap_out().await
    }

    /// An undo point of machine `name` (the state after instruction `at`) copied to `to`,
    /// checked first, marked to reseed its random generators.
    async fn copy_point(&self, name: &str, at: i64, to: &std::path::Path) -> Result<()> {
        // Taken on another node, maybe.
        crate::machine::bucketed::fetch_point(&self.inner, name, at).await?;
        let home = self.inner.config.home.clone();
        let dir = crate::snapshot::point_dir(&home, name, at);
        let restorable = self.inner.restorable();
        let chunks = std::sync::Arc::clone(&self.inner.chunks);
        let (machine, to) = (name.to_owned(), to.to_path_buf());
        tokio::task::spawn_blocking(move || {
            if crate::snapshot::verify_dir(&dir, &*restorable)?.is_none() {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "machine {machine} keeps no undo point after instruction {at} (see its \
                         history)"
                    ),
                ));
            }
            super::chunks::copy_snapshot(&chunks, &dir, &to, true)
        })
        .await
        .map_err(|e| Error::internal(format!("copying an undo point stopped: {e}")))?
    }

    /// A new machine from another's current state (memory, files, everything), with its own
    /// tags (the parent's when `None`); with `at`, from one of its undo points instead. The parent waits for its running instruction, is saved,
    /// and carries on where it was; the fork's random generators are reseeded, so the two never
    /// draw the same numbers.
    pub async fn fork_machine(
        &self,
        account: &Account,
        name: &str,
        request: ForkMachine,
    ) -> Result<MachineInfo> {
        let parent = self.record(account, name).await?;
        if let Some(why) = &parent.env_error {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                format!("machine {name} cannot be forked: {why}"),
            ));
        }
        let tags = request.tags.unwrap_or_else(|| parent.tags.clone());
        validate_tags(&tags)?;
        self.inner.check_disk_quota(account.id).await?;
        let handle = self.handle(account, name).await?;
        let child = MachineRecord {
            name: MachineName::generate(),
            created_at: Utc::now(),
            tags,
            next_seq: 0,
            last_used_at: None,
            last_error: None,
            unsaved_since: None,
            snapshot_at: Some(Utc::now()),
            parent: Some(parent.name.to_string()),
            forked_at: None,
            env_error: None,
            ..parent
        };
        let home = self.inner.config.home.clone();
        let target = crate::snapshot::snapshot_dir(&home, child.name.as_str());
        let mut child = child;
        let copied = match request.at {
            None => handle.copy_out(target.clone(), true).await,
            Some(at) => self.copy_point(name, at, &target).await.map(|()| at + 1),
        };
        let stored = match copied {
            Ok(first_unrun) => {
                // After the parent's last instruction that ran (-1: before any).
                child.forked_at = Some(first_unrun - 1);
                let area = bucketed::machine_area(child.name.as_str());
                match bucketed::publish(&self.inner, &area, &target).await {
                    Ok(sha256) => {
                        child.snapshot_sha256 = sha256;
                        self.insert_machine(&child).await
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            let child_name = child.name.to_string();
            bucketed::forget_machine(&self.inner, &child_name).await;
            let _ =
                tokio::task::spawn_blocking(move || crate::snapshot::remove(&home, &child_name))
                    .await;
            return Err(e);
        }
        let membership = self.inner.membership.lock().await;
        let handle = self.spawn_handle(&child, true);
        drop(membership);
        self.fresh_info(child, Some(handle)).await
    }

    /// Saves the machine's current state as a named checkpoint (a generated name when `None`);
    /// the machine carries on. Waits for its running instruction first.
    pub async fn create_checkpoint(
        &self,
        account: &Account,
        name: &str,
        checkpoint: Option<String>,
    ) -> Result<CheckpointInfo> {
        self.record(account, name).await?;
        let checkpoint =
            checkpoint.unwrap_or_else(|| Utc::now().format("cp-%Y%m%d-%H%M%S-%3f").to_string());
        validate_checkpoint_name(&checkpoint)?;
        self.inner.check_disk_quota(account.id).await?;
        let handle = self.handle(account, name).await?;
        let home = self.inner.config.home.clone();
        let dir = crate::snapshot::checkpoint_dir(&home, name, &checkpoint);
        // The row first: it reserves the name.
        let mut record = CheckpointRecord {
            name: checkpoint.clone(),
            created_at: Utc::now(),
            instruction_count: 0,
            sha256: None,
        };
        let (machine, reserved) = (name.to_owned(), record.clone());
        self.inner
            .store
            .insert_checkpoint(&machine, &reserved)
            .await?;
        let area = bucketed::checkpoint_area(name, &checkpoint);
        let copied = match handle.copy_out(dir.clone(), false).await {
            Ok(first_excluded) => bucketed::publish(&self.inner, &area, &dir)
                .await
                .map(|sha256| (first_excluded, sha256)),
            Err(e) => Err(e),
        };
        let stored = match copied {
            Ok((first_excluded, sha256)) => {
                record.instruction_count = first_excluded;
                record.sha256 = sha256;
                record.created_at = Utc::now();
                let (machine, completed) = (name.to_owned(), record.clone());
                self.inner
                    .store
                    .complete_checkpoint(&machine, &completed)
                    .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = stored {
            if let Some(bucket) = &self.inner.bucket {
                let _ = bucket.remove_area(&area).await;
            }
            let (machine, reserved) = (name.to_owned(), checkpoint.clone());
            let _ = self
                .inner
                .store
                .delete_checkpoint(&machine, &reserved)
                .await;
            let machine = name.to_owned();
            let _ = tokio::task::spawn_blocking(move || {
                crate::snapshot::remove_checkpoint(&home, &machine, &checkpoint)
            })
            .await;
            self.inner.forget_disk_facts(name);
            return Err(e);
        }
        self.inner.forget_disk_facts(name);
        self.checkpoint_info(name, record).await
    }

    async fn checkpoint_info(
        &self,
        machine: &str,
        record: CheckpointRecord,
    ) -> Result<CheckpointInfo> {
        Ok(self
            .checkpoint_infos(machine, vec![record])
            .await?
            .remove(0))
    }

    async fn checkpoint_infos(
        &self,
        machine: &str,
        records: Vec<CheckpointRecord>,
    ) -> Result<Vec<CheckpointInfo>> {
        let home = self.inner.config.home.clone();
        let machine = machine.to_owned();
        tokio::task::spawn_blocking(move || {
            records
                .into_iter()
                .map(|record| {
                    let dir = crate::snapshot::checkpoint_dir(&home, &machine, &record.name);
                    CheckpointInfo {
                        name: record.name,
                        created_at: record.created_at,
                        instruction_count: record.instruction_count,
                        disk_bytes: crate::snapshot::dir_bytes(&dir),
                    }
                })
                .collect()
        })
        .await
        .map_err(|e| Error::internal(format!("reading checkpoints stopped: {e}")))
    }

    /// The machine's checkpoints, oldest first.
    pub async fn list_checkpoints(
        &self,
        account: &Account,
        name: &str,
    ) -> Result<Vec<CheckpointInfo>> {
        self.record(account, name).await?;
        let machine = name.to_owned();
        let records = self.inner.store.checkpoints(&machine).await?;
        self.checkpoint_infos(name, records).await
    }

    async fn find_checkpoint(&self, machine: &str, checkpoint: &str) -> Result<CheckpointRecord> {
        let (name, wanted) = (machine.to_owned(), checkpoint.to_owned());
        self.inner
            .store
            .checkpoints(&name)
            .await?
            .into_iter()
            .find(|c| c.name == wanted)
            .ok_or_else(|| Error::checkpoint_not_found(&name, &wanted))
    }

    /// Returns the machine to a checkpoint's state (also a damaged machine). Waits for its
    /// running instruction first; instructions run since the checkpoint stay in the history,
    /// marked as rolled back.
    pub async fn rollback(
        &self,
        account: &Account,
        name: &str,
        checkpoint: &str,
    ) -> Result<MachineInfo> {
        self.record(account, name).await?;
        let found = self.find_checkpoint(name, checkpoint).await?;
        let dir = crate::snapshot::checkpoint_dir(&self.inner.config.home, name, checkpoint);
        if let Some(sha256) = &found.sha256 {
            let area = bucketed::checkpoint_area(name, checkpoint);
            bucketed::fetch(&self.inner, &area, sha256, &dir)
                .await
                .map_err(|e| {
                    e.context(format!(
                        "bringing checkpoint {checkpoint:?} from the bucket"
                    ))
                })?;
            self.inner.forget_disk_facts(name);
        }
        let restorable = self.inner.restorable();
        let checked = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || crate::snapshot::verify_dir(&dir, &*restorable))
                .await
                .map_err(|e| Error::internal(format!("checking the checkpoint stopped: {e}")))??
        };
        if checked.is_none() {
            return Err(Error::new(
                ErrorKind::MachineCrashed,
                format!("the files of checkpoint {checkpoint:?} of {name} are missing"),
            ));
        }
        let handle = self.handle(account, name).await?;
        handle.rollback(dir).await?;
        let machine = name.to_owned();
        self.inner.store.mark_rolled_back(&machine, &found).await?;
        let record = self.record(account, name).await?;
        self.fresh_info(record, Some(handle)).await
    }

    /// Deletes a checkpoint (the machine itself is untouched).
    pub async fn delete_checkpoint(
        &self,
        account: &Account,
        name: &str,
        checkpoint: &str,
    ) -> Result<()> {
        self.record(account, name).await?;
        self.find_checkpoint(name, checkpoint).await?;
        let home = self.inner.config.home.clone();
        let (machine, cp) = (name.to_owned(), checkpoint.to_owned());
        tokio::task::spawn_blocking(move || {
            crate::snapshot::remove_checkpoint(&home, &machine, &cp)
        })
        .await
        .map_err(|e| Error::internal(format!("removing the checkpoint stopped: {e}")))??;
        self.inner.snapshots_changed();
        self.inner.forget_disk_facts(name);
        let (machine, cp) = (name.to_owned(), checkpoint.to_owned());
        self.inner.store.delete_checkpoint(&machine, &cp).await?;
        if let Some(bucket) = &self.inner.bucket
            && let Err(e) = bucket
                .remove_area(&bucketed::checkpoint_area(name, checkpoint))
                .await
        {
            tracing::warn!(
                machine = name,
                "cannot remove a checkpoint from the bucket: {e}"
            );
        }
        Ok(())
    }
}
