//! The in-process transport: the engine runs in this process, no server.

use std::path::PathBuf;

use async_trait::async_trait;
use futures::StreamExt;

use super::{EventStream, SessionTransport, Transport};
use crate::convert::engine::event_from_engine;
use crate::error::Result;
use crate::types::{
    Accepted, ByteStream, CheckpointInfo, ContextInfo, CreateMachineOptions, ExecEvent,
    ExecOptions, ExecResult, FileInfo, FileList, FileRead, InstallReport, Lineage, MachineHistory,
    MachineInfo, MachinePage, Rewound, Tags, WriteFileOptions,
};
use evervm_engine::{self as engine, Account, Engine, EngineConfig};

/// Options of an in-process engine.
#[derive(Debug, Clone, Default)]
pub struct LocalOptions {
    /// The engine's home (default: `$EVERVM_HOME` or `~/.local/share/evervm`).
    pub home: Option<PathBuf>,
    /// The sandbox backend (`auto`, `process`).
    pub backend: Option<String>,
    /// The account machines belong to (default `local`).
    pub account: Option<String>,
    /// Ready sandboxes to keep (default: the engine's, `EVERVM_POOL_SIZE` or 2); 0 suits a
    /// short-lived process such as one CLI command.
    pub pool_size: Option<usize>,
}

pub(crate) struct LocalTransport {
    engine: Engine,
    account: Account,
}

impl LocalTransport {
    pub(crate) async fn open(options: LocalOptions) -> Result<Self> {
        let mut config = EngineConfig::new(options.home.unwrap_or_else(EngineConfig::default_home));
        if let Some(backend) = options.backend {
            config.backend = engine::BackendChoice::parse(&backend);
        }
        if let Some(pool_size) = options.pool_size {
            config.pool_size = pool_size;
        }
        let engine = Engine::open(config).await?;
        let account = engine
            .ensure_account(options.account.as_deref().unwrap_or("local"))
            .await?;
        Ok(Self::new(engine, account))
    }

    pub(crate) fn new(engine: Engine, account: Account) -> Self {
        Self { engine, account }
    }

    fn request(code: &str, options: &ExecOptions) -> engine::ExecRequest {
        engine::ExecRequest {
            code: code.to_owned(),
            timeout: options.timeout,
            interrupt: options.interrupt,
            dialect: options.dialect,
            context: options.context.clone(),
        }
    }
}

#[async_trait]
impl Transport for LocalTransport {
    fn describe(&self) -> String {
        format!("local:{}", self.engine.home().display())
    }

    async fn whoami(&self) -> Result<String> {
        Ok(self.account.name.clone())
    }

    async fn create_machine(&self, options: CreateMachineOptions) -> Result<String> {
        let request = crate::convert::engine::create_machine_to_engine(options)?;
        let info = self.engine.create_machine(&self.account, request).await?;
        Ok(info.name.to_string())
    }

    async fn list_machines(&self, tags: &Tags) -> Result<Vec<MachineInfo>> {
        Ok(self
            .engine
            .list_machines(&self.account, tags)
            .await?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    async fn list_machines_page(
        &self,
        tags: &Tags,
        limit: u32,
        cursor: Option<&str>,
    ) -> Result<MachinePage> {
        let cursor = cursor.map(engine::ListCursor::parse).transpose()?;
        let page = self
            .engine
            .list_machines_page(&self.account, tags, limit as usize, cursor)
            .await?;
        Ok(page.into())
    }

    async fn machine_info(&self, name: &str) -> Result<MachineInfo> {
        Ok(self.engine.machine_info(&self.account, name).await?.into())
    }

    async fn exec(&self, name: &str, code: &str, options: &ExecOptions) -> Result<Accepted> {
        let accepted = self
            .engine
            .exec(&self.account, name, Self::request(code, options))
            .await?;
        Ok(Accepted {
            seq: accepted.seq,
            interrupted: accepted.interrupted,
        })
    }

    async fn result(&self, name: &str, seq: i64) -> Result<ExecResult> {
        Ok(self.engine.result(&self.account, name, seq).await?.into())
    }

    async fn events(&self, name: &str, seq: i64) -> Result<EventStream> {
        let events = self.engine.events(&self.account, name, seq).await?;
        Ok(events
            .filter_map(|e| std::future::ready(event_from_engine(e).map(Ok)))
            .boxed())
    }

    async fn interrupt(&self, name: &str, seq: Option<i64>) -> Result<bool> {
        Ok(match seq {
            Some(seq) => {
                self.engine
                    .interrupt_instruction(&self.account, name, seq)
                    .await?
            }
            None => self.engine.interrupt(&self.account, name).await?,
        })
    }

    async fn delete_machine(&self, name: &str) -> Result<()> {
        Ok(self.engine.delete_machine(&self.account, name).await?)
    }

    async fn swap_out(&self, name: &str) -> Result<()> {
        Ok(self.engine.swap_out(&self.account, name).await?)
    }

    async fn fork(&self, name: &str, tags: Option<Tags>, at: Option<i64>) -> Result<String> {
        let info = self
            .engine
            .fork_machine(&self.account, name, engine::ForkMachine { tags, at })
            .await?;
        Ok(info.name.to_string())
    }

    async fn create_checkpoint(
        &self,
        name: &str,
        checkpoint: Option<&str>,
    ) -> Result<CheckpointInfo> {
        Ok(self
            .engine
            .create_checkpoint(&self.account, name, checkpoint.map(str::to_owned))
            .await?
            .into())
    }

    async fn list_checkpoints(&self, name: &str) -> Result<Vec<CheckpointInfo>> {
        Ok(self
            .engine
            .list_checkpoints(&self.account, name)
            .await?
            .into_iter()
            .map(Into::into)
            .collect())
    }

    async fn install(&self, name: &str, requirements: &[String]) -> Result<InstallReport> {
        Ok(self
            .engine
            .install_packages(&self.account, name, requirements)
            .await?)
    }

    async fn rollback(&self, name: &str, checkpoint: &str) -> Result<MachineInfo> {
        Ok(self
            .engine
            .rollback(&self.account, name, checkpoint)
            .await?
            .into())
    }

    async fn rewind(&self, name: &str, to: i64) -> Result<Rewound> {
        Ok(self.engine.rewind(&self.account, name, to).await?)
    }

    async fn lineage(&self, name: &str) -> Result<Lineage> {
        Ok(self.engine.lineage(&self.account, name).await?)
    }

    async fn history(&self, name: &str, limit: usize) -> Result<MachineHistory> {
        Ok(self.engine.history(&self.account, name, limit).await?)
    }

    async fn create_context(&self, name: &str, cwd: Option<&str>) -> Result<ContextInfo> {
        Ok(self.engine.create_context(&self.account, name, cwd).await?)
    }

    async fn list_contexts(&self, name: &str) -> Result<Vec<ContextInfo>> {
        Ok(self.engine.list_contexts(&self.account, name).await?)
    }

    async fn restart_context(&self, name: &str, context: &str) -> Result<ContextInfo> {
        Ok(self
            .engine
            .restart_context(&self.account, name, context)
            .await?)
    }

    async fn remove_context(&self, name: &str, context: &str) -> Result<()> {
        Ok(self
            .engine
            .remove_context(&self.account, name, context)
            .await?)
    }

    async fn delete_checkpoint(&self, name: &str, checkpoint: &str) -> Result<()> {
        Ok(self
            .engine
            .delete_checkpoint(&self.account, name, checkpoint)
            .await?)
    }

    async fn write_file(
        &self,
        name: &str,
        path: &str,
        data: ByteStream,
        _length: Option<u64>,
        options: WriteFileOptions,
    ) -> Result<FileInfo> {
        let data = crate::convert::engine::byte_stream_to_engine(data);
        let info = self
            .engine
            .write_file(&self.account, name, path, data, options.into())
            .await?;
        Ok(info.into())
    }

    async fn read_file(&self, name: &str, path: &str) -> Result<FileRead> {
        Ok(self
            .engine
            .read_file(&self.account, name, path)
            .await?
            .into())
    }

    async fn stat_file(&self, name: &str, path: &str) -> Result<FileInfo> {
        Ok(self
            .engine
            .stat_file(&self.account, name, path)
            .await?
            .into())
    }

    async fn list_files(&self, name: &str, path: &str) -> Result<FileList> {
        Ok(self
            .engine
            .list_files(&self.account, name, path)
            .await?
            .into())
    }

    async fn make_dir(&self, name: &str, path: &str, parents: bool) -> Result<FileInfo> {
        let info = self
            .engine
            .make_dir(&self.account, name, path, parents)
            .await?;
        Ok(info.into())
    }

    async fn remove_file(&self, name: &str, path: &str, recursive: bool) -> Result<FileInfo> {
        let info = self
            .engine
            .remove_file(&self.account, name, path, recursive)
            .await?;
        Ok(info.into())
    }

    async fn shutdown(&self) {
        self.engine.shutdown().await;
    }

    async fn connect(&self, name: Option<&str>) -> Result<Box<dyn SessionTransport>> {
        let name = match name {
            Some(name) => {
                self.engine.machine_info(&self.account, name).await?;
                name.to_owned()
            }
            None => self.create_machine(CreateMachineOptions::default()).await?,
        };
        Ok(Box::new(LocalSession {
            engine: self.engine.clone(),
            account: self.account.clone(),
            name,
            events: None,
        }))
    }
}

struct LocalSession {
    engine: Engine,
    account: Account,
    name: String,
    events: Option<futures::stream::BoxStream<'static, engine::ExecEvent>>,
}

#[async_trait]
impl SessionTransport for LocalSession {
    fn machine_name(&self) -> &str {
        &self.name
    }

    async fn send(&mut self, code: &str, options: &ExecOptions) -> Result<i64> {
        let accepted = self
            .engine
            .exec(
                &self.account,
                &self.name,
                LocalTransport::request(code, options),
            )
            .await?;
        self.events = Some(
            self.engine
                .events(&self.account, &self.name, accepted.seq)
                .await?,
        );
        Ok(accepted.seq)
    }

    async fn next_event(&mut self) -> Result<ExecEvent> {
        let Some(events) = self.events.as_mut() else {
            return Err(crate::Error::invalid(
                "no instruction was sent on this session",
            ));
        };
        loop {
            match events.next().await {
                Some(event) => {
                    if let Some(event) = event_from_engine(event) {
                        return Ok(event);
                    }
                }
                None => {
                    return Err(crate::Error::invalid(
                        "the instruction already finished: send another",
                    ));
                }
            }
        }
    }
}
