//! The SQLite store as [`Metadata`]: each operation runs on the store's thread.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::StoreThread;
use crate::error::Result;
use crate::store::InstructionRow;
use crate::store::{
    CheckpointRecord, Lease, LeaseOutcome, MachineRecord, Metadata, NodeRecord, OutputBatches,
    TokenRecord, Unfinished,
};
use crate::types::{Account, ExecResult, OutputChunk, TokenInfo};

#[async_trait]
impl Metadata for StoreThread {
    fn kind(&self) -> &'static str {
        "sqlite"
    }

    async fn ensure_account(&self, name: &str) -> Result<Account> {
        let name = name.to_owned();
        self.call(move |s| s.ensure_account(&name)).await
    }

    async fn create_token(
        &self,
        account: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<String> {
        let account = account.to_owned();
        self.call(move |s| {
            let account = s.ensure_account(&account)?;
            s.create_token(&account, expires_at)
        })
        .await
    }

    async fn tokens(&self) -> Result<Vec<TokenInfo>> {
        self.call(|s| s.tokens()).await
    }

    async fn revoke_token(&self, id: &str) -> Result<()> {
        let id = id.to_owned();
        self.call(move |s| s.revoke_token(&id)).await
    }

    async fn count_tokens(&self) -> Result<i64> {
        self.call(|s| s.count_tokens()).await
    }

    async fn token_record(&self, id: &str) -> Result<Option<TokenRecord>> {
        let id = id.to_owned();
        self.call(move |s| s.token_record(&id)).await
    }

    async fn insert_machine(&self, record: &MachineRecord, limit: usize) -> Result<()> {
        let record = record.clone();
        self.call(move |s| s.insert_machine_within(&record, limit))
            .await
    }

    async fn machine(&self, name: &str) -> Result<Option<MachineRecord>> {
        let name = name.to_owned();
        self.call(move |s| s.machine(&name)).await
    }

    async fn machines(&self, account_id: i64) -> Result<Vec<MachineRecord>> {
        self.call(move |s| s.machines(account_id)).await
    }

    async fn machine_accounts(&self) -> Result<Vec<(String, String)>> {
        self.call(|s| s.machine_accounts()).await
    }

    async fn expired_machines(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>> {
        self.call(move |s| s.expired_machines(now, limit)).await
    }

    async fn mark_unsaved(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        self.call(move |s| s.mark_unsaved(&name)).await
    }

    async fn mark_saved(&self, name: &str, sha256: Option<&str>) -> Result<()> {
        let name = name.to_owned();
        let sha256 = sha256.map(str::to_owned);
        self.call(move |s| s.mark_saved(&name, sha256.as_deref()))
            .await
    }

    async fn note_snapshots_on_disk(&self, names: &[String]) -> Result<usize> {
        let names = names.to_vec();
        self.call(move |s| s.note_snapshots_on_disk(&names)).await
    }

    async fn count_machines(&self, account_id: i64) -> Result<usize> {
        self.call(move |s| s.count_machines(account_id)).await
    }

    async fn set_last_error(&self, name: &str, error: Option<&str>) -> Result<()> {
        let (name, error) = (name.to_owned(), error.map(str::to_owned));
        self.call(move |s| s.set_last_error(&name, error.as_deref()))
            .await
    }

    async fn delete_machine(&self, name: &str) -> Result<()> {
        let name = name.to_owned();
        self.call(move |s| s.delete_machine(&name)).await
    }

    async fn insert_checkpoint(&self, machine: &str, checkpoint: &CheckpointRecord) -> Result<()> {
        let (machine, checkpoint) = (machine.to_owned(), checkpoint.clone());
        self.call(move |s| s.insert_checkpoint(&machine, &checkpoint))
            .await
    }

    async fn complete_checkpoint(
        &self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<()> {
        let (machine, checkpoint) = (machine.to_owned(), checkpoint.clone());
        self.call(move |s| s.complete_checkpoint(&machine, &checkpoint))
            .await
    }

    async fn checkpoints(&self, machine: &str) -> Result<Vec<CheckpointRecord>> {
        let machine = machine.to_owned();
        self.call(move |s| s.checkpoints(&machine)).await
    }

    async fn delete_checkpoint(&self, machine: &str, name: &str) -> Result<bool> {
        let (machine, name) = (machine.to_owned(), name.to_owned());
        self.call(move |s| s.delete_checkpoint(&machine, &name))
            .await
    }

    async fn mark_rolled_back(
        &self,
        machine: &str,
        checkpoint: &CheckpointRecord,
    ) -> Result<usize> {
        let (machine, checkpoint) = (machine.to_owned(), checkpoint.clone());
        self.call(move |s| s.mark_rolled_back(&machine, &checkpoint))
            .await
    }

    async fn rolled_back_to(&self, machine: &str, seq: i64) -> Result<Option<String>> {
        let machine = machine.to_owned();
        self.call(move |s| s.rolled_back_to(&machine, seq)).await
    }

    async fn mark_rewound(
        &self,
        machine: &str,
        after: i64,
        before: i64,
        label: &str,
    ) -> Result<usize> {
        let (machine, label) = (machine.to_owned(), label.to_owned());
        self.call(move |s| s.mark_rewound(&machine, after, before, &label))
            .await
    }

    async fn taken_back(&self, machine: &str, limit: usize) -> Result<Vec<(i64, String)>> {
        let machine = machine.to_owned();
        self.call(move |s| s.taken_back(&machine, limit)).await
    }

    async fn instructions_from(
        &self,
        machine: &str,
        from_seq: i64,
        limit: usize,
    ) -> Result<Vec<InstructionRow>> {
        let machine = machine.to_owned();
        self.call(move |s| s.instructions_from(&machine, from_seq, limit))
            .await
    }

    async fn insert_instruction(&self, machine: &str, code: &str, timeout_ms: u64) -> Result<i64> {
        let (machine, code) = (machine.to_owned(), code.to_owned());
        self.call(move |s| s.insert_instruction(&machine, &code, timeout_ms))
            .await
    }

    async fn append_output(&self, machine: &str, seq: i64, output: OutputBatches) -> Result<()> {
        let machine = machine.to_owned();
        self.call(move |s| s.append_output(&machine, seq, &output))
            .await
    }

    async fn finish_instruction(
        &self,
        machine: &str,
        seq: i64,
        output: OutputBatches,
        result: ExecResult,
    ) -> Result<()> {
        let machine = machine.to_owned();
        self.call(move |s| s.finish_instruction(&machine, seq, &output, &result))
            .await
    }

    async fn instruction_result(
        &self,
        machine: &str,
        seq: i64,
    ) -> Result<Option<Option<ExecResult>>> {
        let machine = machine.to_owned();
        self.call(move |s| s.instruction_result(&machine, seq))
            .await
    }

    async fn instruction_output(&self, machine: &str, seq: i64) -> Result<Vec<OutputChunk>> {
        let machine = machine.to_owned();
        self.call(move |s| s.instruction_output(&machine, seq))
            .await
    }

    async fn fail_unfinished(&self, reason: &str, scope: Unfinished) -> Result<usize> {
        let reason = reason.to_owned();
        self.call(move |s| s.fail_unfinished(&reason, &scope)).await
    }

    async fn register_node(&self, id: &str, address: &str) -> Result<()> {
        let (id, address) = (id.to_owned(), address.to_owned());
        self.call(move |s| s.register_node(&id, &address)).await
    }

    async fn heartbeat(&self, id: &str, ttl: std::time::Duration) -> Result<usize> {
        let id = id.to_owned();
        self.call(move |s| s.heartbeat(&id, ttl)).await
    }

    async fn nodes(&self) -> Result<Vec<NodeRecord>> {
        self.call(|s| s.nodes()).await
    }

    async fn remove_node(&self, id: &str) -> Result<usize> {
        let id = id.to_owned();
        self.call(move |s| s.remove_node(&id)).await
    }

    async fn take_lease(
        &self,
        machine: &str,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseOutcome> {
        let (machine, node) = (machine.to_owned(), node.to_owned());
        self.call(move |s| s.take_lease(&machine, &node, ttl)).await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<bool> {
        let lease = lease.clone();
        self.call(move |s| s.release_lease(&lease)).await
    }

    async fn lease(&self, machine: &str) -> Result<Option<Lease>> {
        let machine = machine.to_owned();
        self.call(move |s| s.lease(&machine)).await
    }

    async fn mark_saved_fenced(&self, lease: &Lease, sha256: Option<&str>) -> Result<()> {
        let lease = lease.clone();
        let sha256 = sha256.map(str::to_owned);
        self.call(move |s| s.mark_saved_fenced(&lease, sha256.as_deref()))
            .await
    }

    async fn record_audit(&self, entries: Vec<crate::store::AuditEntry>) -> Result<()> {
        self.call(move |s| s.record_audit(&entries)).await
    }

    async fn audit_entries(
        &self,
        query: &crate::store::AuditQuery,
    ) -> Result<Vec<crate::store::AuditEntry>> {
        let query = query.clone();
        self.call(move |s| s.audit_entries(&query)).await
    }

    async fn prune_audit(&self, before: DateTime<Utc>, keep: u64) -> Result<usize> {
        self.call(move |s| s.prune_audit(before, keep)).await
    }

    async fn flush(&self) -> Result<()> {
        self.call(|_| Ok(())).await
    }
}
