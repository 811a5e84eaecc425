//! The MCP server: evervm as the Python tool of AI assistants (Claude, Cursor, VS Code, ...),
//! on `rmcp`, the official Rust MCP SDK. ForeverVM's two tools (`create-python-repl`,
//! `run-python-in-repl`) with their names, arguments and result, and ours for listing, forking,
//! checkpoints, swapping, interrupting and files. Each tool parses its arguments, makes one
//! [`Client`] call and maps the answer: the same client as every other door, so a tool behaves
//! alike over stdio (`evervm mcp`) and at `/mcp` on `evervm serve`.
//!
//! A machine travels in tool arguments (`replId`), never in a transport session: any server
//! behind a load balancer can take any call.
//!
//! Bad arguments, unknown machines and every engine refusal are tool errors (`isError` with a
//! text a model can act on), never protocol errors; only an unknown tool name is one, as the
//! protocol says.

mod calls;
mod catalog;

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

use crate::client::{Client, LocalOptions};

/// What the server tells a client about itself and how its tools fit together.
const INSTRUCTIONS: &str = "evervm gives you persistent Python REPLs in sandboxes. Create one \
with create-python-repl and run code in it with run-python-in-repl; its variables, imports and \
files stay between calls for as long as it exists (an idle REPL is saved to disk and comes back \
on its next call). numpy, pandas and matplotlib are installed; a figure left open comes back as \
an image. Hand it data with write-file-to-repl and take results out with read-file-from-repl; \
fork-python-repl or create-checkpoint before something risky.";

/// Where the server's [`Client`] comes from.
#[derive(Clone)]
enum Clients {
    /// One client for every call (stdio against a server, or tests).
    Fixed(Client),
    /// The engine in this process, opened on the first call that needs it: `tools/list` works
    /// even when the engine cannot open (its home in use by another engine, say), and each call
    /// then says why.
    Local {
        options: LocalOptions,
        client: Arc<tokio::sync::OnceCell<Client>>,
    },
    /// A client per HTTP request, for the account its bearer token names (set by the server's
    /// authentication on the request's extensions); failures' texts go through `redact`, which
    /// takes the server's own paths out of them.
    #[cfg(feature = "server")]
    PerRequest {
        client_for: ClientFor,
        redact: Arc<dyn Fn(&str) -> String + Send + Sync>,
        audit: AuditFor,
    },
}

/// A tool call that changed state (or tried to), for the audit log.
#[cfg(feature = "server")]
#[derive(Debug)]
pub(crate) struct AuditedCall {
    pub(crate) action: &'static str,
    pub(crate) machine: Option<String>,
    /// The code a `run-python-in-repl` ran.
    pub(crate) code: Option<String>,
    /// The file, checkpoint or instruction the call named.
    pub(crate) detail: Option<String>,
    pub(crate) ok: bool,
}

/// Records a tool call of an HTTP request in the audit log.
#[cfg(feature = "server")]
type AuditFor = Arc<
    dyn Fn(&axum::http::request::Parts, AuditedCall) -> futures::future::BoxFuture<'static, ()>
        + Send
        + Sync,
>;

/// The client for an HTTP request's account.
#[cfg(feature = "server")]
type ClientFor = Arc<dyn Fn(&axum::http::request::Parts) -> Option<Client> + Send + Sync>;

/// The MCP server over one source of clients.
#[derive(Clone)]
pub struct McpServer {
    clients: Clients,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer").finish_non_exhaustive()
    }
}

impl McpServer {
    /// A server whose tools act through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            clients: Clients::Fixed(client),
        }
    }

    /// A server whose tools act on an engine in this process, opened on the first call.
    pub fn local(options: LocalOptions) -> Self {
        Self {
            clients: Clients::Local {
                options,
                client: Arc::new(tokio::sync::OnceCell::new()),
            },
        }
    }

    /// A server whose tools act for the account of each HTTP request.
    #[cfg(feature = "server")]
    pub(crate) fn per_request(
        client_for: ClientFor,
        redact: Arc<dyn Fn(&str) -> String + Send + Sync>,
        audit: AuditFor,
    ) -> Self {
        Self {
            clients: Clients::PerRequest {
                client_for,
                redact,
                audit,
            },
        }
    }

    /// Serves MCP on this process's stdin and stdout until the client closes them.
    pub async fn serve_stdio(self) -> crate::Result<()> {
        let running = self.serve(rmcp::transport::stdio()).await.map_err(|e| {
            crate::Error::new(
                crate::ErrorKind::Transport,
                format!("MCP over stdio did not start: {e}"),
            )
        })?;
        running.waiting().await.map_err(|e| {
            crate::Error::new(
                crate::ErrorKind::Internal,
                format!("the MCP server stopped: {e}"),
            )
        })?;
        Ok(())
    }

    /// The engine in this process, for the local transport's clean stop.
    pub async fn shutdown(&self) {
        match &self.clients {
            Clients::Fixed(client) => client.shutdown().await,
            Clients::Local { client, .. } => {
                if let Some(client) = client.get() {
                    client.shutdown().await;
                }
            }
            #[cfg(feature = "server")]
            Clients::PerRequest { .. } => {}
        }
    }

    // Only the per-request source reads the context.
    #[cfg_attr(not(feature = "server"), allow(unused_variables))]
    async fn client(&self, context: &RequestContext<RoleServer>) -> Result<Client, String> {
        match &self.clients {
            Clients::Fixed(client) => Ok(client.clone()),
            Clients::Local { options, client } => client
                .get_or_try_init(|| Client::local(options.clone()))
                .await
                .cloned()
                .map_err(|e| {
                    format!(
                        "evervm's engine did not start: {}. To share one engine between several \
                         assistants, run `evervm serve` and start this server with --url and \
                         --token.",
                        e.message()
                    )
                }),
            #[cfg(feature = "server")]
            Clients::PerRequest { client_for, .. } => context
                .extensions
                .get::<axum::http::request::Parts>()
                .and_then(|parts| client_for(parts))
                .ok_or_else(|| "this request carries no account".to_owned()),
        }
    }
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("evervm", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        catalog::ToolName::parse(name).map(catalog::ToolName::definition)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            catalog::ToolName::ALL
                .iter()
                .map(|tool| tool.definition())
                .collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = catalog::ToolName::parse(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no tool {:?}: tools/list names the tools",
                    request.name
                ),
                None,
            ));
        };
        let arguments = request.arguments.unwrap_or_default();
        #[cfg(feature = "server")]
        let audited = audited_call(tool, &arguments);
        #[cfg_attr(not(feature = "server"), allow(unused_mut))]
        let mut result = match self.client(&context).await {
            Ok(client) => calls::call(tool, &client, arguments, &context).await,
            Err(message) => tool_error(message),
        };
        #[cfg(feature = "server")]
        if let Clients::PerRequest { redact, audit, .. } = &self.clients {
            if result.is_error == Some(true) {
                for content in &mut result.content {
                    if let ContentBlock::Text(text) = content {
                        text.text = redact(&text.text);
                    }
                }
            }
            if let (Some(mut call), Some(parts)) = (
                audited,
                context.extensions.get::<axum::http::request::Parts>(),
            ) {
                call.ok = result.is_error != Some(true);
                if call.machine.is_none() && call.ok {
                    // A new REPL's id is its result's text.
                    call.machine = result.content.iter().find_map(|c| match c {
                        ContentBlock::Text(text) => Some(text.text.clone()),
                        _ => None,
                    });
                }
                audit(parts, call).await;
            }
        }
        Ok(result.into())
    }
}

/// What the audit log keeps of a tool call, read from its arguments before it runs; `None` for
/// a tool that only reads.
#[cfg(feature = "server")]
fn audited_call(
    tool: catalog::ToolName,
    arguments: &rmcp::model::JsonObject,
) -> Option<AuditedCall> {
    let text = |key: &str| {
        arguments
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let detail = match tool {
        catalog::ToolName::WriteFile => text("path"),
        catalog::ToolName::CreateCheckpoint => text("name"),
        catalog::ToolName::Rollback => text("checkpoint"),
        catalog::ToolName::Rewind => arguments.get("instruction").map(|v| format!("to {v}")),
        catalog::ToolName::Undo => Some("to -1".to_owned()),
        _ => None,
    };
    Some(AuditedCall {
        action: tool.audit_action()?,
        machine: text("replId"),
        code: matches!(tool, catalog::ToolName::RunPython)
            .then(|| text("pythonCode"))
            .flatten(),
        detail,
        ok: false,
    })
}

/// A failure a model reads: `isError` with one text.
pub(crate) fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message.into())])
}
