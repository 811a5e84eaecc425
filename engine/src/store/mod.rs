//! Metadata store: accounts, tokens (hashed), machines, instructions, results and output. Two
//! databases behind one interface, [`Metadata`]: SQLite in the engine's home (the default: one
//! file, WAL, no server to run) and PostgreSQL (`--database postgres://...`, for nodes that share
//! one service). Both hold the same tables, made from one schema ([`schema`]), and pass the same
//! test-suite.
//!
//! Times are kept as RFC 3339 text in UTC with microseconds, fixed-width, in both databases, so
//! that they compare as text in the same order as in time and every row reads back the same
//! whichever database held it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::guest::image::Profile;
use crate::network::NetworkPolicy;
use crate::types::{
    Account, Durability, Env, ExecResult, MachineName, OutputChunk, Tags, TokenInfo,
};

mod audit;
mod output;
mod postgres;
mod schema;
mod sqlite;
#[cfg(test)]
mod suite;
#[cfg(test)]
mod suite_audit;
#[cfg(test)]
mod suite_leases;
#[cfg(test)]
mod suite_secrets;

pub(crate) use audit::PRUNE_BATCH;
pub use audit::{AUDIT_PAGE_MAX, AuditEntry, AuditQuery};
pub use output::OutputBatches;
pub use postgres::{PostgresSettings, PostgresStore};
pub(crate) use sqlite::StoreThread;
pub use sqlite::{BUSY_TIMEOUT, Store};

/// A machine's row.
#[derive(Debug, Clone)]
pub struct MachineRecord {
    pub name: MachineName,
    pub account_id: i64,
    pub created_at: DateTime<Utc>,
    pub tags: Tags,
    pub memory_mb: u32,
    pub image: Profile,
    pub backend: String,
    pub next_seq: i64,
    pub last_used_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub durability: Durability,
    /// Set while the machine may hold state that is not on disk (it ran an instruction since
    /// its last save): a machine found with it after a restart lost that state, and says so.
    pub unsaved_since: Option<DateTime<Utc>>,
    /// When its snapshot was last written (`None`: it never had one). A machine that had one
    /// and finds none on disk is damaged, not silently fresh.
    pub snapshot_at: Option<DateTime<Utc>>,
    /// Environment variables its interpreter starts with (secrets included).
    pub env: Env,
    /// When it is deleted (`None`: never).
    pub expires_at: Option<DateTime<Utc>>,
    /// What it may reach over the network.
    pub network: NetworkPolicy,
    /// Its place in the order machines were created (set by the store; 0 before it is stored).
    pub position: i64,
    /// The checksum of its snapshot in the bucket (with `--snapshots`): the one to restore.
    /// `None` when its snapshot is only on the local disk, or it has none.
    pub snapshot_sha256: Option<String>,
    /// How many undo points (snapshots after its latest instructions) it keeps; 0: none.
    pub history: u32,
    /// The machine it was forked from, and the seq of that machine's instruction it was forked
    /// after (`None`: before any); `None` for a machine that was created, not forked.
    pub parent: Option<String>,
    pub forked_at: Option<i64>,
    /// Why its sealed secret environment could not be opened (sealed with a key this server was
    /// not given, or altered); those values are then empty in `env`, and the machine cannot
    /// start a fresh interpreter or be forked until the key is given.
    pub env_error: Option<String>,
}

/// The context a secret environment variable's sealed value is bound to: its machine and name.
fn secret_context(machine: &str, variable: &str) -> String {
    format!("secret_env\0{machine}\0{variable}")
}
#[derive(Debug, Clone, PartialEq)]
pub struct InstructionRow {
    pub seq: i64,
    pub code: String,
    /// `None` while it has not finished.
    pub result: Option<ExecResult>,
    /// What took it back, when something did: a checkpoint's name, or `rewind to N`.
    pub rolled_back_to: Option<String>,
}

/// A checkpoint's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The machine's instruction count when the checkpoint was taken.
    pub instruction_count: i64,
    /// The checksum of its snapshot in the bucket, when snapshots are kept in one.
    pub sha256: Option<String>,
}

/// An evervm server sharing the database with others (a node of a cluster).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub id: String,
    /// Where the other nodes reach it (`http://HOST:PORT`), to forward requests for the
    /// machines it runs.
    pub address: String,
    pub started_at: DateTime<Utc>,
    /// When it last said it was alive.
    pub heartbeat_at: DateTime<Utc>,
}

/// A node's hold on a machine: only the owner runs it and writes its snapshot. `epoch` is one
/// more at every change of owner, and every write a node makes for a machine it runs carries the
/// lease it holds, so a node that lost its lease (it stalled past `until`, another node took the
/// machine) can no longer write anything for it: fencing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub machine: String,
    pub owner: String,
    pub epoch: i64,
    /// Until when it holds unless renewed, by the clock of the node that took or renewed it
    /// (nodes' clocks must agree to well within a lease's length: NTP does).
    pub until: DateTime<Utc>,
}

/// Which instructions left without a result [`Metadata::fail_unfinished`] gives an error result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfinished {
    /// Every one (one server on its store, at its start: nothing else runs them).
    All,
    /// Those of the machines whose lease this node holds (a node starting again under its id).
    OwnedBy(String),
    /// Those of one machine but the ones listed (a node taking over a machine from another,
    /// which stopped: the listed ones are this node's own, waiting to run).
    OfMachine { machine: String, except: Vec<i64> },
}

/// What asking for a machine's lease gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// The asking node holds it now (it was free, expired, or the node's already).
    Taken(Lease),
    /// Another node holds it.
    Held(Lease),
}

/// Everything the engine keeps about accounts, tokens, machines and their history. Every
/// operation is one transaction: what it changes is all there or none of it is.
#[async_trait]
pub trait Metadata: Send + Sync {
    /// The database's kind, for logs and `/metrics`: `sqlite` or `postgres`.
    fn kind(&self) -> &'static str;

    // --- accounts and tokens --------------------------------------------------------------

    /// The account with this name, created if it does not exist.
    async fn ensure_account(&self, name: &str) -> Result<Account>;
    /// A token for the named account (created if needed), valid until `expires_at` (for ever
    /// when `None`), as `id.secret`. Only its hash is stored.
    async fn create_token(
        &self,
        account: &str,
        expires_at: Option<DateTime<Utc>>,
    ) -> Result<String>;
    /// Every token (never its secret), oldest first.
    async fn tokens(&self) -> Result<Vec<TokenInfo>>;
    /// Revokes a token by its id (the part before the `.`): it stops working at once.
    async fn revoke_token(&self, id: &str) -> Result<()>;
    async fn count_tokens(&self) -> Result<i64>;
    /// The token with this id (the part before the `.`), as stored; `None` when there is none.
    async fn token_record(&self, id: &str) -> Result<Option<TokenRecord>>;
    /// The account a token belongs to.
    async fn authenticate(&self, token: &str) -> Result<Account> {
        let (id, secret) = split_token(token)?;
        let record = self
            .token_record(id)
            .await?
            .ok_or_else(|| Error::unauthorized("unknown token"))?;
        record.check(secret)?;
        Ok(record.account)
    }

    // --- machines -------------------------------------------------------------------------

    /// Stores a new machine's row, unless its account already has `limit` machines.
    async fn insert_machine(&self, record: &MachineRecord, limit: usize) -> Result<()>;
    async fn machine(&self, name: &str) -> Result<Option<MachineRecord>>;
    /// The account's machines, newest first.
    async fn machines(&self, account_id: i64) -> Result<Vec<MachineRecord>>;
    /// Every machine's name with its account's name.
    async fn machine_accounts(&self) -> Result<Vec<(String, String)>>;
    /// Machines whose expiry time has come (`(account id, name)`), at most `limit`.
    async fn expired_machines(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<(i64, String)>>;
    /// Notes that the machine may now hold state that is not saved (unless already noted).
    async fn mark_unsaved(&self, name: &str) -> Result<()>;
    /// Notes that the machine's whole state is in its snapshot, written now, and which one is
    /// in the bucket (`None` when snapshots are kept on the local disk only).
    async fn mark_saved(&self, name: &str, sha256: Option<&str>) -> Result<()>;
    /// Notes a snapshot found for each named machine that has none recorded (machines from
    /// before the store recorded them); how many were noted.
    async fn note_snapshots_on_disk(&self, names: &[String]) -> Result<usize>;
    async fn count_machines(&self, account_id: i64) -> Result<usize>;
    async fn set_last_error(&self, name: &str, error: Option<&str>) -> Result<()>;
    /// Deletes the machine's row with its instructions, output and checkpoints.
    async fn delete_machine(&self, name: &str) -> Result<()>;

    // --- checkpoints ----------------------------------------------------------------------

    /// Records a checkpoint; refused when the machine already has one by that name.
    async fn insert_checkpoint(&self, machine: &str, checkpoint: &CheckpointRecord) -> Result<()>;
    /// Records when a reserved checkpoint was taken and what it holds (its snapshot in the
    /// bucket too).
    async fn complete_checkpoint(&self, machine: &str, checkpoint: &CheckpointRecord)
    -> Result<()>;
    /// The machine's checkpoints, oldest first.
    async fn checkpoints(&self, machine: &str) -> Result<Vec<CheckpointRecord>>;
    /// Removes a checkpoint's row; false if there was none.
    async fn delete_checkpoint(&self, machine: &str, name: &str) -> Result<bool>;
    /// Marks the instructions run since a checkpoint as rolled back by it (they stay in the
    /// history); how many were marked.
    async fn mark_rolled_back(&self, machine: &str, checkpoint: &CheckpointRecord)
    -> Result<usize>;
    /// The checkpoint an instruction was rolled back by, if any.
    async fn rolled_back_to(&self, machine: &str, seq: i64) -> Result<Option<String>>;
    /// Marks the instructions with `after < seq < before` not yet taken back as taken back by
    /// `label` (a rewind); how many were marked.
    async fn mark_rewound(
        &self,
        machine: &str,
        after: i64,
        before: i64,
        label: &str,
    ) -> Result<usize>;
    /// The machine's instructions a rewind or rollback took back (seq and what took it
    /// back), oldest first, at most `limit`.
    async fn taken_back(&self, machine: &str, limit: usize) -> Result<Vec<(i64, String)>>;
    /// The machine's instructions from `from_seq` on, oldest first, at most `limit`.
    async fn instructions_from(
        &self,
        machine: &str,
        from_seq: i64,
        limit: usize,
    ) -> Result<Vec<InstructionRow>>;

    // --- instructions ---------------------------------------------------------------------

    /// Gives the next seq of the machine to a new instruction and stores it.
    async fn insert_instruction(&self, machine: &str, code: &str, timeout_ms: u64) -> Result<i64>;
    /// Stores output of a running instruction (consecutive chunks, continuing what was stored
    /// before), so that a long instruction's output is kept as it comes.
    async fn append_output(&self, machine: &str, seq: i64, output: OutputBatches) -> Result<()>;
    /// Stores the rest of an instruction's output and its result, together.
    async fn finish_instruction(
        &self,
        machine: &str,
        seq: i64,
        output: OutputBatches,
        result: ExecResult,
    ) -> Result<()>;
    /// Whether the instruction exists, and its result if it finished.
    async fn instruction_result(
        &self,
        machine: &str,
        seq: i64,
    ) -> Result<Option<Option<ExecResult>>>;
    async fn instruction_output(&self, machine: &str, seq: i64) -> Result<Vec<OutputChunk>>;
    /// Instructions left without a result by an engine that stopped get an error result: all of
    /// them, or those `scope` names; how many did.
    async fn fail_unfinished(&self, reason: &str, scope: Unfinished) -> Result<usize>;

    // --- nodes and leases -----------------------------------------------------------------

    /// Records this node (again, after a restart) as alive now, reachable at `address`.
    async fn register_node(&self, id: &str, address: &str) -> Result<()>;
    /// Says the node is alive and renews every lease it holds for `ttl` from now; how many it
    /// renewed. Refused (`Conflict`) when the node's row is gone: it was removed as dead, its
    /// leases may be others' now, and it must stop its machines and register again.
    async fn heartbeat(&self, id: &str, ttl: std::time::Duration) -> Result<usize>;
    /// Every node, by id.
    async fn nodes(&self) -> Result<Vec<NodeRecord>>;
    /// Removes a node's row and gives up every lease it holds; how many leases it held.
    async fn remove_node(&self, id: &str) -> Result<usize>;
    /// Asks for the machine's lease for `node`, for `ttl` from now: taken when it is free,
    /// expired or the node's already (the epoch grows only when the owner changes), else who
    /// holds it. `NotFound` when the machine is gone.
    async fn take_lease(
        &self,
        machine: &str,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<LeaseOutcome>;
    /// Gives up a lease; false when it was no longer held (expired and taken).
    async fn release_lease(&self, lease: &Lease) -> Result<bool>;
    /// The machine's lease, whoever holds it, expired or not; `None` when it never had one or
    /// it was given up.
    async fn lease(&self, machine: &str) -> Result<Option<Lease>>;
    /// [`Metadata::mark_saved`] by the holder of `lease` only: refused (`Conflict`) when the
    /// lease is no longer held, so a node that lost a machine never records a snapshot for it.
    async fn mark_saved_fenced(&self, lease: &Lease, sha256: Option<&str>) -> Result<()>;

    // --- the audit log ---------------------------------------------------------------------

    /// Stores entries, all or none.
    async fn record_audit(&self, entries: Vec<AuditEntry>) -> Result<()>;
    /// The entries `query` asks for, newest first.
    async fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>>;
    /// Removes up to a batch of the entries older than `before` or not among the newest `keep`;
    /// how many it removed (call again while it removes a whole batch).
    async fn prune_audit(&self, before: DateTime<Utc>, keep: u64) -> Result<usize>;

    /// Waits until everything asked of the store before has been done.
    async fn flush(&self) -> Result<()>;

    /// Gives up what this server holds in the database (its hold on a PostgreSQL database), so
    /// that the next server can open it: the engine's shutdown calls it last.
    async fn hand_over(&self) {}
}

/// The error for a write refused because the lease it carries is no longer held.
fn lease_lost(lease: &Lease) -> Error {
    Error::new(
        crate::ErrorKind::Conflict,
        format!(
            "node {} no longer holds machine {}'s lease (number {}): another node runs it now",
            lease.owner, lease.machine, lease.epoch
        ),
    )
}

fn node_gone(id: &str) -> Error {
    Error::new(
        crate::ErrorKind::Conflict,
        format!(
            "node {id} is no longer registered (it was taken for dead): its machines may run \
             elsewhere now; stop them and register again"
        ),
    )
}

/// A time `ttl` after now, as the database keeps it.
fn after(ttl: std::time::Duration) -> Result<String> {
    chrono::Duration::from_std(ttl)
        .ok()
        .and_then(|d| Utc::now().checked_add_signed(d))
        .map(stored)
        .ok_or_else(|| Error::invalid(format!("a lease of {ttl:?} is too long")))
}

/// Opens the store an engine runs on: PostgreSQL at `database` when given (with `alone`, refused
/// while another server uses that database; nodes of a cluster share it), else SQLite at
/// `evervm.db` in `home`.
pub(crate) async fn open(
    database: Option<&PostgresSettings>,
    home: &std::path::Path,
    alone: bool,
    keys: Option<std::sync::Arc<crate::secrets::SecretKeys>>,
) -> Result<std::sync::Arc<dyn Metadata>> {
    Ok(match database {
        Some(settings) => {
            let store = PostgresStore::connect(settings)
                .await?
                .with_secret_keys(keys);
            if alone {
                store.hold_for_this_server().await?;
            }
            std::sync::Arc::new(store)
        }
        None => {
            let path = home.join("evervm.db");
            let store = tokio::task::spawn_blocking(move || Store::open(&path))
                .await
                .map_err(|e| Error::internal(format!("opening the store stopped: {e}")))??
                .with_secret_keys(keys);
            std::sync::Arc::new(StoreThread::start(store)?)
        }
    })
}

/// A time as the database keeps it.
pub(super) fn stored(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

pub(super) fn now() -> String {
    stored(Utc::now())
}

pub(super) fn parse_time(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| Error::internal(format!("stored time {text:?} is invalid: {e}")))
}

fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn random_alnum(len: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// A new token: its id, its secret, and the hash of the secret that is stored.
fn new_token() -> (String, String, String) {
    let secret = random_alnum(40);
    let hash = hash_secret(&secret);
    (random_alnum(12), secret, hash)
}

/// A token as stored: the hash of its secret (never the secret), its account, its expiry.
#[derive(Debug, Clone)]
pub struct TokenRecord {
    pub secret_sha256: String,
    pub account: Account,
    pub expires_at: Option<String>,
}

impl TokenRecord {
    /// Whether `secret` is this token's, and the token has not expired.
    pub fn check(&self, secret: &str) -> Result<()> {
        check_token(&self.secret_sha256, secret, self.expires_at.as_deref())
    }

    /// The credential that stands for this token for `scope` alone: `<token id>.<MAC>`, the
    /// MAC being HMAC-SHA256 of the scope keyed by the token's stored hash, in hex. Anyone
    /// holding it can do what the scope allows and nothing else; it never reveals the token.
    pub fn scoped_credential(&self, id: &str, scope: &str) -> String {
        format!("{id}.{}", self.scoped_mac(scope))
    }

    /// Whether `mac` is this token's for `scope`, and the token has not expired.
    pub fn check_scoped(&self, scope: &str, mac: &str) -> Result<()> {
        if !same_digest(&self.scoped_mac(scope), mac) {
            return Err(Error::unauthorized(
                "the credential is not valid here (it belongs to another sandbox, or its token \
                 was replaced)",
            ));
        }
        check_expiry(self.expires_at.as_deref())
    }

    fn scoped_mac(&self, scope: &str) -> String {
        hex::encode(hmac_sha256(self.secret_sha256.as_bytes(), scope.as_bytes()))
    }
}

/// HMAC-SHA256 (RFC 2104).
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Whether two hex digests are equal, in time that does not depend on where they differ.
fn same_digest(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A token's id and secret, or why it is not one.
pub(crate) fn split_token(token: &str) -> Result<(&str, &str)> {
    token
        .split_once('.')
        .ok_or_else(|| Error::unauthorized("the token is malformed: expected <id>.<secret>"))
}

/// Whether `secret` matches the stored hash of a token that has not expired.
fn check_token(stored_hash: &str, secret: &str, expires_at: Option<&str>) -> Result<()> {
    if !same_digest(stored_hash, &hash_secret(secret)) {
        return Err(Error::unauthorized("unknown token"));
    }
    check_expiry(expires_at)
}

/// Refuses a token whose expiry has passed.
fn check_expiry(expires_at: Option<&str>) -> Result<()> {
    if let Some(expires_at) = expires_at.map(parse_time).transpose()?
        && expires_at <= Utc::now()
    {
        return Err(Error::unauthorized(format!(
            "the token expired at {}: create a new one (`evervm token create`)",
            expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )));
    }
    Ok(())
}

/// A token's expiry as stored.
fn token_expiry(expires_at: Option<DateTime<Utc>>) -> Option<String> {
    expires_at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn no_such_token(id: &str) -> Error {
    Error::new(
        crate::ErrorKind::NotFound,
        format!("no token with the id {id:?} (`evervm token list` shows them)"),
    )
}

fn too_many_machines(count: usize, limit: usize) -> Error {
    Error::limit_exceeded(format!(
        "this account has {count} machines, the limit per account is {limit} \
         (EVERVM_MAX_MACHINES on the server): delete machines first"
    ))
}

fn machine_exists(name: &MachineName) -> Error {
    Error::new(
        crate::ErrorKind::Conflict,
        format!("a machine named {name} exists already"),
    )
}

fn checkpoint_exists(machine: &str, name: &str) -> Error {
    Error::new(
        crate::ErrorKind::Conflict,
        format!("machine {machine} already has a checkpoint named {name:?}"),
    )
}

/// A machine's JSON columns as stored: tags, environment (secret values sealed with `keys` when
/// given), network policy.
fn machine_json(
    record: &MachineRecord,
    keys: Option<&crate::secrets::SecretKeys>,
) -> Result<(String, String, String)> {
    let tags = serde_json::to_string(&record.tags)
        .map_err(|e| Error::internal(format!("cannot encode tags: {e}")))?;
    let env = seal_env(&record.env, record.name.as_str(), keys)?;
    let env = serde_json::to_string(&env)
        .map_err(|e| Error::internal(format!("cannot encode the environment: {e}")))?;
    let network = serde_json::to_string(&record.network)
        .map_err(|e| Error::internal(format!("cannot encode the network policy: {e}")))?;
    Ok((tags, env, network))
}

/// `env` with its secret values sealed by `keys` (as it is without keys).
pub(crate) fn seal_env(
    env: &Env,
    machine: &str,
    keys: Option<&crate::secrets::SecretKeys>,
) -> Result<Env> {
    let Some(keys) = keys else {
        return Ok(env.clone());
    };
    env.iter()
        .map(|(name, var)| {
            let mut var = var.clone();
            if var.secret && !crate::secrets::is_sealed(&var.value) {
                var.value = keys.seal(&var.value, &secret_context(machine, name))?;
            }
            Ok((name.clone(), var))
        })
        .collect()
}

/// `env` as stored with its sealed values opened, or why one would not open (the values that
/// do not open are then empty: the machine starts no interpreter with them).
pub(crate) fn open_env(
    env: Env,
    machine: &str,
    keys: Option<&crate::secrets::SecretKeys>,
) -> (Env, Option<String>) {
    let mut error = None;
    let opened = env
        .into_iter()
        .map(|(name, mut var)| {
            if var.secret && crate::secrets::is_sealed(&var.value) {
                let what = format!("the secret environment variable {name} of machine {machine}");
                let context = secret_context(machine, &name);
                match crate::secrets::open(keys, &var.value, &context, &what) {
                    Ok(value) => var.value = value,
                    Err(e) => {
                        error.get_or_insert_with(|| e.message().to_owned());
                        var.value = String::new();
                    }
                }
            }
            (name, var)
        })
        .collect();
    (opened, error)
}

/// A machine's stored environment (`stored`, JSON) sealed anew with the current key of `keys`,
/// or `None` when every secret in it is sealed with that key already. Refused when a sealed value
/// does not open: rotating must never lose a secret.
pub(crate) fn reseal_stored_env(
    machine: &str,
    stored: &str,
    keys: &crate::secrets::SecretKeys,
) -> Result<Option<String>> {
    let env: Env = serde_json::from_str(stored).map_err(|_| {
        Error::internal(format!("the stored environment of {machine} is unreadable"))
    })?;
    if env
        .values()
        .all(|var| !var.secret || keys.sealed_with_current(&var.value))
    {
        return Ok(None);
    }
    let (opened, error) = open_env(env, machine, Some(keys));
    if let Some(why) = error {
        return Err(Error::new(crate::ErrorKind::PermissionDenied, why));
    }
    let sealed = seal_env(&opened, machine, Some(keys))?;
    serde_json::to_string(&sealed)
        .map(Some)
        .map_err(|e| Error::internal(format!("cannot encode the environment: {e}")))
}

/// A result as stored.
fn encode_result(result: &ExecResult) -> Result<String> {
    serde_json::to_string(result)
        .map_err(|e| Error::internal(format!("cannot encode a result: {e}")))
}

fn decode_result(machine: &str, seq: i64, text: &str) -> Result<ExecResult> {
    serde_json::from_str(text).map_err(|e| {
        Error::internal(format!(
            "stored result of {machine}/{seq} is unreadable: {e}"
        ))
    })
}

/// The machine columns every query reads, in [`RawMachine`]'s order.
const MACHINE_COLUMNS: &str = "name, account_id, created_at, tags, memory_mb, backend, \
    next_seq, last_used_at, last_error, image, durability, unsaved_since, snapshot_at, env, \
    expires_at, position, network, snapshot_sha256, history, parent, forked_at";

/// A machine's row as read, before its columns are checked.
pub(super) struct RawMachine {
    pub(super) name: String,
    pub(super) account_id: i64,
    pub(super) created_at: String,
    pub(super) tags: String,
    pub(super) memory_mb: u32,
    pub(super) backend: String,
    pub(super) next_seq: i64,
    pub(super) last_used_at: Option<String>,
    pub(super) last_error: Option<String>,
    pub(super) image: String,
    pub(super) durability: String,
    pub(super) unsaved_since: Option<String>,
    pub(super) snapshot_at: Option<String>,
    pub(super) env: String,
    pub(super) expires_at: Option<String>,
    pub(super) position: i64,
    pub(super) network: String,
    pub(super) snapshot_sha256: Option<String>,
    pub(super) history: i64,
    pub(super) parent: Option<String>,
    pub(super) forked_at: Option<i64>,
}

impl RawMachine {
    /// The record, its sealed secrets opened with `keys`.
    pub(super) fn into_record(
        self,
        keys: Option<&crate::secrets::SecretKeys>,
    ) -> Result<MachineRecord> {
        let tags: Tags = serde_json::from_str(&self.tags).map_err(|e| {
            Error::internal(format!("stored tags of {} are unreadable: {e}", self.name))
        })?;
        // The error names no part of the text: it may hold secrets.
        let env: Env = serde_json::from_str(&self.env).map_err(|_| {
            Error::internal(format!(
                "the stored environment of {} is unreadable",
                self.name
            ))
        })?;
        let (env, env_error) = open_env(env, &self.name, keys);
        let network: NetworkPolicy = serde_json::from_str(&self.network).map_err(|e| {
            Error::internal(format!(
                "the stored network policy of {} is unreadable: {e}",
                self.name
            ))
        })?;
        Ok(MachineRecord {
            name: MachineName::parse(&self.name)?,
            account_id: self.account_id,
            created_at: parse_time(&self.created_at)?,
            tags,
            memory_mb: self.memory_mb,
            image: Profile::parse(&self.image)?,
            backend: self.backend,
            next_seq: self.next_seq,
            last_used_at: self.last_used_at.as_deref().map(parse_time).transpose()?,
            last_error: self.last_error,
            durability: Durability::parse(&self.durability)?,
            unsaved_since: self.unsaved_since.as_deref().map(parse_time).transpose()?,
            snapshot_at: self.snapshot_at.as_deref().map(parse_time).transpose()?,
            env,
            expires_at: self.expires_at.as_deref().map(parse_time).transpose()?,
            position: self.position,
            network,
            snapshot_sha256: self.snapshot_sha256,
            history: u32::try_from(self.history).map_err(|_| {
                Error::internal(format!(
                    "the stored history of {} ({}) is out of range",
                    self.name, self.history
                ))
            })?,
            parent: self.parent,
            forked_at: self.forked_at,
            env_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test cases 1 and 6 (a key longer than a block).
        assert_eq!(
            hex::encode(hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn scoped_credentials_hold_for_their_scope_only() {
        let (id, secret, secret_sha256) = new_token();
        let record = TokenRecord {
            secret_sha256,
            account: Account {
                id: 1,
                name: "a".into(),
            },
            expires_at: None,
        };
        record.check(&secret).unwrap();
        let credential = record.scoped_credential(&id, "e2b-sandbox:one");
        assert!(!credential.contains(&secret));
        let (given_id, mac) = split_token(&credential).unwrap();
        assert_eq!(given_id, id);
        record.check_scoped("e2b-sandbox:one", mac).unwrap();
        assert!(record.check_scoped("e2b-sandbox:two", mac).is_err());
        assert!(
            record.check(mac).is_err(),
            "a scoped credential is not the token"
        );
        let expired = TokenRecord {
            expires_at: Some("2000-01-01T00:00:00Z".into()),
            ..record
        };
        assert!(expired.check_scoped("e2b-sandbox:one", mac).is_err());
    }
}
