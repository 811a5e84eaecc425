//! Processes beside a machine's interpreter (E2B's commands): started with their own pid,
//! stdin fed and closed, signalled, followed again by pid; they run while instructions run.

use super::Engine;
use crate::error::Result;
use crate::machine::processes::{Process, ProcessSpec};
use crate::types::Account;

impl Engine {
    /// Starts a process in the machine (restoring it first if it is swapped out) and returns it
    /// once it runs: its pid, its output from the start, and how it ends. A process that
    /// cannot start (no such command) is an `InvalidInput` error saying why.
    pub async fn start_process(
        &self,
        account: &Account,
        name: &str,
        spec: ProcessSpec,
    ) -> Result<Process> {
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        handle.start_process(spec).await
    }

    /// Connects to `port` on the machine's own loopback (restoring the machine first if it is
    /// swapped out): a byte stream to the server listening there, which keeps the machine
    /// resident while open. Nothing listening is `NotFound` (resource `port`).
    pub async fn connect_port(
        &self,
        account: &Account,
        name: &str,
        port: u16,
    ) -> Result<crate::PortStream> {
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        handle.connect_port(port).await
    }

    /// The owner of machine `name` and its tags, whoever asks: for requests that come without
    /// the owner's credentials (to a port its owner made public, say), which the caller
    /// authorises. The account has its id only.
    pub async fn machine_owner(&self, name: &str) -> Result<(Account, crate::Tags)> {
        let parsed = crate::types::MachineName::parse(name)?;
        match self.inner.store.machine(parsed.as_str()).await? {
            Some(record) if !crate::sync::lock(&self.inner.deleting).contains(name) => Ok((
                Account {
                    id: record.account_id,
                    name: String::new(),
                },
                record.tags,
            )),
            _ => Err(crate::Error::machine_not_found(name)),
        }
    }

    /// Watches a directory in the machine (inotify; `recursive`: its subdirectories too): the
    /// returned process's output is its events, a JSON line each (`{"name": path relative to
    /// the directory, "type": "create" | "write" | "remove" | "rename" | "chmod"}`), and a
    /// signal to it ends the watch. A missing directory is `NotFound`.
    pub async fn watch_dir(
        &self,
        account: &Account,
        name: &str,
        path: &str,
        recursive: bool,
    ) -> Result<Process> {
        let handle = self.handle(account, name).await?;
        self.inner.take_instruction_token(account.id)?;
        handle.watch_dir(path.to_owned(), recursive).await
    }

    /// Ends a process or a watch started by this engine (SIGKILL to a process's group), if it
    /// still runs.
    pub async fn end_process(
        &self,
        account: &Account,
        name: &str,
        process: &Process,
    ) -> Result<()> {
        self.handle(account, name)
            .await?
            .end_process(process.id)
            .await
    }

    /// Follows a process that runs in the machine, from now on.
    pub async fn connect_process(
        &self,
        account: &Account,
        name: &str,
        pid: u32,
    ) -> Result<Process> {
        self.handle(account, name).await?.connect_process(pid)
    }

    /// The pids of the processes running in the machine (none when it is swapped out).
    pub async fn list_processes(&self, account: &Account, name: &str) -> Result<Vec<u32>> {
        Ok(self.handle(account, name).await?.process_pids())
    }

    /// Bytes for a process's stdin (it was started with `stdin`).
    pub async fn process_input(
        &self,
        account: &Account,
        name: &str,
        pid: u32,
        data: Vec<u8>,
    ) -> Result<()> {
        self.handle(account, name)
            .await?
            .process_input(pid, data)
            .await
    }

    /// Closes a process's stdin once what was sent before is written.
    pub async fn close_process_stdin(&self, account: &Account, name: &str, pid: u32) -> Result<()> {
        self.handle(account, name)
            .await?
            .close_process_stdin(pid)
            .await
    }

    /// Gives the terminal of a process started with `pty` a new size.
    pub async fn resize_terminal(
        &self,
        account: &Account,
        name: &str,
        pid: u32,
        size: crate::TerminalSize,
    ) -> Result<()> {
        self.handle(account, name)
            .await?
            .resize_terminal(pid, size)
            .await
    }

    /// Sends a signal to a process and every process of its group (SIGKILL: ends the tree).
    pub async fn signal_process(
        &self,
        account: &Account,
        name: &str,
        pid: u32,
        signal: i32,
    ) -> Result<()> {
        self.handle(account, name)
            .await?
            .signal_process(pid, signal)
            .await
    }
}
