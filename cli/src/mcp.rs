//! `evervm mcp`: the MCP server on stdin and stdout, for an assistant that starts it; and
//! `evervm mcp install`, which adds that command to an assistant's configuration.

pub mod install;

use anyhow::{Result, bail};
use clap::Subcommand;
use evervm::mcp::McpServer;
use evervm::{Client, LocalOptions};

#[derive(Subcommand)]
pub enum McpCommand {
    /// Add `evervm mcp` to an assistant's MCP configuration (a backup of any file it changes;
    /// running it again changes nothing).
    Install(install::InstallArgs),
}

/// Where the stdio server's tools act: the engine in this process unless a server is given.
#[derive(Clone, Debug, Default)]
pub struct StdioTarget {
    pub url: Option<String>,
    pub token: Option<String>,
    pub ca_file: Option<std::path::PathBuf>,
    pub home: Option<std::path::PathBuf>,
    pub backend: Option<String>,
}

/// Serves MCP on stdio until the assistant closes it. Logs go to stderr; stdout is the
/// protocol's.
pub async fn serve_stdio(target: StdioTarget) -> Result<()> {
    let server = match (&target.url, &target.token) {
        (Some(url), Some(token)) => McpServer::new(Client::remote_trusting(
            url,
            token,
            &evervm::Trust::from_option_or_env(target.ca_file.clone()),
        )?),
        (Some(_), None) => bail!(
            "--url (or EVERVM_URL) is given without a token: pass --token or set EVERVM_TOKEN"
        ),
        (None, _) => McpServer::local(LocalOptions {
            home: target.home.clone(),
            backend: target.backend.clone(),
            account: None,
            pool_size: None,
        }),
    };
    // An assistant closes stdin when it is done, or sends SIGTERM: either way the engine stops
    // cleanly (its machines saved, its sandboxes gone).
    let served = tokio::select! {
        served = server.clone().serve_stdio() => served,
        () = evervm::server::shutdown_signal() => Ok(()),
    };
    server.shutdown().await;
    Ok(served?)
}
