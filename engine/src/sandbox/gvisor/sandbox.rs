//! One running gVisor sandbox.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use tokio::process::{Child, Command};

use super::bundle::{check_finished, remove_sandbox};
use super::precreated::Detached;
use super::runsc::{Runsc, global_args, keep_binary};
use crate::error::{Error, Result};
use crate::guest::connection::{ChannelReader, ChannelWriter};
use crate::sandbox::Sandbox;

/// The host processes a sandbox runs as.
pub(super) enum Processes {
    /// `runsc run` or `runsc restore` in the foreground: our child, which the sandbox's
    /// processes die with, and whose exit status is the sandbox's.
    Attached(Child),
    /// A sandbox created ahead of time and restored with `runsc restore --detach`.
    Detached(Detached),
}

pub(super) struct GvisorSandbox {
    pub(super) id: String,
    pub(super) processes: Processes,
    pub(super) memory_mb: u32,
    pub(super) channel: Option<(ChannelReader, ChannelWriter)>,
    pub(super) bundle: PathBuf,
    pub(super) runsc: Runsc,
    pub(super) kept_dir: PathBuf,
    pub(super) state_dir: PathBuf,
    pub(super) image_id: String,
    /// True once a checkpoint handed the sandbox's clean-up to a background task.
    pub(super) released: bool,
    /// The unpacked copy of the snapshot a plain `runsc restore` reads from; removed when the
    /// sandbox stops (or this is dropped).
    pub(super) unpacked: Option<super::pages::Unpacked>,
    /// Its network (namespaces, proxy, DNS), if it has one: it goes when the sandbox does.
    pub(super) network: Option<crate::network::MachineNetwork>,
}

#[async_trait]
impl Sandbox for GvisorSandbox {
    fn take_channel(&mut self) -> Option<(ChannelReader, ChannelWriter)> {
        self.channel.take()
    }

    async fn checkpoint(&mut self, dir: &Path) -> Result<()> {
        let started = std::time::Instant::now();
        self.run_checkpoint(dir, false).await?;
        // The snapshot is whole once `runsc checkpoint` returns, and the sandbox has stopped:
        // the `runsc run` process and runsc's state are cleaned up without making the caller
        // wait (`runsc run` can take 100 ms to notice).
        if let Processes::Attached(child) = &mut self.processes {
            let _ = child.start_kill();
        }
        let (runsc, state_dir, id, bundle) = (
            self.runsc.clone(),
            self.state_dir.clone(),
            self.id.clone(),
            self.bundle.clone(),
        );
        self.released = true;
        self.unpacked = None;
        tokio::spawn(async move {
            remove_sandbox(&runsc, &state_dir, &id, &bundle).await;
        });
        tracing::debug!(
            sandbox = %self.id,
            "runsc checkpoint took {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    fn can_checkpoint_in_place(&self) -> bool {
        self.runsc.leave_running
    }

    async fn checkpoint_in_place(&mut self, dir: &Path) -> Result<()> {
        if !self.runsc.leave_running {
            return Err(Error::unsupported(
                "this runsc cannot save a sandbox and leave it running",
            ));
        }
        let started = std::time::Instant::now();
        self.run_checkpoint(dir, true).await?;
        tracing::debug!(
            sandbox = %self.id,
            "runsc checkpoint --leave-running took {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    fn image_id(&self) -> Option<String> {
        Some(self.image_id.clone())
    }

    fn runtime(&self) -> Option<String> {
        Some(self.runsc.describe())
    }

    fn pid(&self) -> Option<u32> {
        match &self.processes {
            Processes::Attached(child) => child.id(),
            Processes::Detached(detached) => Some(detached.pid),
        }
    }

    fn memory_roots(&self) -> Vec<u32> {
        match &self.processes {
            Processes::Attached(child) => child.id().into_iter().collect(),
            Processes::Detached(detached) => std::iter::once(detached.pid)
                .chain(detached.gofer)
                .collect(),
        }
    }

    fn stop_now(&mut self) {
        match &mut self.processes {
            Processes::Attached(child) => {
                let _ = child.start_kill();
            }
            Processes::Detached(detached) => detached.kill(),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        match &mut self.processes {
            Processes::Attached(child) => {
                let _ = child.kill().await;
            }
            Processes::Detached(detached) => detached.kill(),
        }
        self.unpacked = None;
        if let Some(network) = self.network.take() {
            network.close().await;
        }
        if self.released {
            return Ok(());
        }
        remove_sandbox(&self.runsc, &self.state_dir, &self.id, &self.bundle).await;
        Ok(())
    }

    fn exit_reason(&mut self) -> Option<crate::sandbox::ExitReason> {
        use std::os::unix::process::ExitStatusExt;
        let child = match &mut self.processes {
            Processes::Attached(child) => child,
            Processes::Detached(detached) => return detached.exit_reason(self.memory_mb),
        };
        let status = child.try_wait().ok().flatten()?;
        let text = match (status.code(), status.signal()) {
            (Some(137), _) | (_, Some(9)) => {
                "the sandbox was killed (its memory went past the limit, or it was stopped)"
                    .to_owned()
            }
            (Some(code), None) => {
                let log =
                    std::fs::read_to_string(self.bundle.join("runsc.log")).unwrap_or_default();
                let tail = log.lines().last().unwrap_or("").trim().to_owned();
                if tail.is_empty() {
                    format!("the sandbox exited with status {code}")
                } else {
                    format!("the sandbox exited with status {code}: {tail}")
                }
            }
            (_, Some(signal)) => format!("the sandbox was killed by signal {signal}"),
            (None, None) => "the sandbox ended".to_owned(),
        };
        Some(crate::sandbox::ExitReason { text })
    }
}

impl GvisorSandbox {
    /// `runsc checkpoint` into `dir`, leaving the sandbox running or not, compressed or not
    /// (where this runsc lets us choose); the binary that writes a snapshot is kept for as long
    /// as the home lives.
    async fn run_checkpoint(&mut self, dir: &Path, leave_running: bool) -> Result<()> {
        let kept_dir = self.kept_dir.clone();
        let runsc = self.runsc.clone();
        tokio::task::spawn_blocking(move || keep_binary(&kept_dir, &runsc))
            .await
            .map_err(|e| Error::internal(format!("keeping runsc stopped: {e}")))??;
        let mut command = Command::new(&self.runsc.path);
        command
            .args(global_args(&self.runsc, &self.state_dir))
            .arg(super::bundle::network_flag(self.network.is_some()))
            .arg("checkpoint");
        if leave_running {
            command.arg("--leave-running");
        }
        // Where runsc lets us choose it writes memory uncompressed, and the engine compresses
        // it with zstd where disk matters (see `pages`); an older runsc always compresses
        // with flate.
        if self.runsc.compression_flag {
            command.arg("--compression=none");
        }
        command
            .arg(format!("--image-path={}", dir.display()))
            .arg(&self.id);
        // A plain `runsc restore` (Debian's runsc) records the container in runsc's state a
        // moment after the sandbox answers: a checkpoint that comes sooner finds no container
        // and is tried again, for at most about 2 s.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let output = command
                .output()
                .await
                .map_err(|e| Error::internal(format!("cannot run runsc checkpoint: {e}")))?;
            let not_yet_recorded = !output.status.success()
                && String::from_utf8_lossy(&output.stderr).contains("loading container")
                && attempt < 40
                && self.exit_reason().is_none();
            if !not_yet_recorded {
                return check_finished("runsc checkpoint", &output);
            }
            tracing::debug!(sandbox = %self.id, attempt, "runsc has not recorded the container yet");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
