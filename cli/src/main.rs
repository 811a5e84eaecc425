//! `evervm`: run a server, manage machines, run Python in them.

mod audit;
mod contexts;
mod doctor;
mod files;
mod history;
mod mcp;
mod repl;

use std::fmt::Write as _;
use std::io::{IsTerminal, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use evervm::server::ServeOptions;
use evervm::{Client, CreateMachineOptions, ExecEvent, ExecOptions, LocalOptions, RichKind, Tags};
use futures::StreamExt;

#[derive(Parser)]
#[command(
    name = "evervm",
    version,
    about = "Python REPLs that never die: persistent machines in sandboxes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    target: Target,
}

/// Where machine commands go: a server, or an engine in this process.
#[derive(Args, Clone)]
struct Target {
    /// The server's URL.
    #[arg(long, env = "EVERVM_URL", global = true)]
    url: Option<String>,
    /// The token for the server (`evervm token create` makes one).
    #[arg(long, env = "EVERVM_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Trust only the certificates in this PEM file for an https server (a self-hosted
    /// server's own CA), instead of the default roots.
    #[arg(long, env = "EVERVM_CA_FILE", global = true)]
    ca_file: Option<std::path::PathBuf>,
    /// Run the engine in this process instead of talking to a server.
    #[arg(long, global = true)]
    local: bool,
    /// The engine's home, for `serve`, `mcp`, `token` and --local (default: $EVERVM_HOME or
    /// ~/.local/share/evervm).
    #[arg(long, env = "EVERVM_HOME", global = true)]
    home: Option<PathBuf>,
    /// The sandbox backend, for `serve`, `mcp` and --local: `auto` (gVisor; `mcp` and --local
    /// fall back to `process` with a warning, `serve` refuses to), `gvisor`, or `process` (no
    /// security boundary: for development).
    #[arg(long, env = "EVERVM_BACKEND", global = true)]
    backend: Option<String>,
    /// The PostgreSQL store, for `serve` and `token`: `postgres://USER:PASSWORD@HOST:PORT/DB`
    /// (default: the SQLite database in the home).
    #[arg(long, env = "EVERVM_DATABASE", global = true, hide_env_values = true)]
    database: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the HTTP + WebSocket server (ForeverVM-compatible).
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// The network of machines created without one: `none` (loopback only; the default) or
        /// `public` (public addresses).
        #[arg(long, env = "EVERVM_NETWORK_DEFAULT", value_name = "MODE")]
        network_default: Option<String>,
        /// Keep machines' snapshots and checkpoints in an S3-compatible bucket:
        /// `s3://BUCKET/PREFIX` (endpoint and credentials from AWS_ENDPOINT_URL,
        /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). The home keeps copies of recently used
        /// ones (EVERVM_SNAPSHOT_CACHE_MB). Default: the home's disk only.
        #[arg(long, env = "EVERVM_SNAPSHOTS", value_name = "URL")]
        snapshots: Option<String>,
        /// Run as a node of a cluster: where the other nodes reach this server
        /// (`http://HOST:PORT`). The nodes share --database and --snapshots; each machine runs
        /// on one node at a time, and requests reaching another node are forwarded to it.
        #[arg(long, env = "EVERVM_ADVERTISE", value_name = "URL")]
        advertise: Option<String>,
        /// This node's id, unique in the cluster and the same across its restarts (default:
        /// the host's name).
        #[arg(long, env = "EVERVM_NODE_ID", value_name = "ID")]
        node_id: Option<String>,
        /// The most network a machine may ask for: `none`, `allow` (its own list of names and
        /// blocks) or `public` (the default).
        #[arg(long, env = "EVERVM_NETWORK_MAX", value_name = "MODE")]
        network_max: Option<String>,
        /// Also serve E2B's API on this address, for E2B's SDKs (E2B_API_URL and
        /// E2B_SANDBOX_URL both http://ADDR, E2B_API_KEY from `evervm token create --e2b`).
        #[arg(long, env = "EVERVM_E2B_LISTEN", value_name = "ADDR")]
        e2b_listen: Option<SocketAddr>,
        /// The domain E2B sandboxes are answered under (with --e2b-listen), so that the SDKs'
        /// `get_host(port)` gives `<port>-<sandbox>.DOMAIN`, which any HTTP client reaches when
        /// wildcard DNS for DOMAIN leads to the E2B listener (docs/e2b.md#ports). Without it:
        /// `sdk-too-old@ADDR`, which httpx, curl and Node's http reach.
        #[arg(
            long,
            env = "EVERVM_E2B_DOMAIN",
            value_name = "DOMAIN",
            requires = "e2b_listen"
        )]
        e2b_domain: Option<String>,
        /// With --e2b-listen: a sandbox's ports (`get_host`) answer anyone unless it is created
        /// with `allow_public_traffic=False`, as E2B's do; without it, only its owner unless it
        /// is created with `True`.
        #[arg(long, env = "EVERVM_E2B_PUBLIC_PORTS", requires = "e2b_listen")]
        e2b_public_ports: bool,
        /// Serve over TLS (every listener: the API, /mcp and --e2b-listen) with this
        /// certificate chain (PEM, the server's own first); read again on SIGHUP.
        #[arg(
            long,
            env = "EVERVM_TLS_CERT",
            value_name = "FILE",
            requires = "tls_key"
        )]
        tls_cert: Option<PathBuf>,
        /// The certificate's private key (PEM).
        #[arg(
            long,
            env = "EVERVM_TLS_KEY",
            value_name = "FILE",
            requires = "tls_cert"
        )]
        tls_key: Option<PathBuf>,
        /// In a cluster whose nodes advertise https:// addresses: the CA (PEM) their
        /// certificates are verified against when one forwards to another (default: Mozilla's
        /// roots).
        #[arg(long, env = "EVERVM_CLUSTER_CA", value_name = "FILE")]
        cluster_ca: Option<PathBuf>,
    },
    /// Build and list root filesystem images (for the gVisor backend).
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Manage tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Make and rotate the key machines' secret environment values are sealed with in the store.
    SecretKey {
        #[command(subcommand)]
        command: SecretKeyCommand,
    },
    /// Read the audit log of the store (the home's, or --database): every state-changing call,
    /// newest first, with its account, token id, machine and outcome.
    Audit(audit::AuditArgs),
    /// Manage machines.
    Machine {
        #[command(subcommand)]
        command: MachineCommand,
    },
    /// Run code on a machine and print its output and value.
    Exec {
        /// The code; `-` or nothing reads it from standard input.
        code: Option<String>,
        /// The machine (default: a new one, whose name is printed on stderr).
        #[arg(long, short)]
        machine: Option<String>,
        /// Seconds before the code is interrupted.
        #[arg(long, default_value_t = evervm::DEFAULT_TIMEOUT.as_secs())]
        timeout: u64,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// How the code runs: `python` (a REPL line, ForeverVM's), `jupyter` (a Jupyter cell:
        /// magics, `!` commands, IPython's formatters; the image needs IPython, as `data` has)
        /// or `e2b` (a Jupyter cell with E2B's formatters).
        #[arg(long, default_value = "python")]
        dialect: String,
        /// The context that runs it (`evervm context create`; default: the machine's own
        /// interpreter).
        #[arg(long, requires = "machine")]
        context: Option<String>,
    },
    /// A machine's contexts: more interpreters in it, each with its own variables and working
    /// directory.
    Context {
        #[command(subcommand)]
        command: contexts::ContextCommand,
    },
    /// Copy a file into or out of a machine: `evervm cp data.csv MACHINE:` (into its home),
    /// `evervm cp MACHINE:/tmp/out.png .`; `-` is standard input or output.
    Cp(files::CopyArgs),
    /// List a directory in a machine: `evervm ls MACHINE` (its home) or `evervm ls MACHINE:PATH`.
    Ls(files::ListArgs),
    /// Remove a file or directory in a machine: `evervm rm MACHINE:PATH`.
    Rm(files::RemoveArgs),
    /// Make a directory in a machine: `evervm mkdir MACHINE:PATH`.
    Mkdir(files::MakeDirArgs),
    /// Take back a machine's last instruction: its state becomes what it was before it (a
    /// machine created with `machine new --history N`).
    Undo(history::UndoArgs),
    /// Make one of a machine's undo points its state: the state after instruction SEQ.
    Rewind(history::RewindArgs),
    /// A machine's latest instructions with their results, and which can be rewound to (`*`).
    History(history::HistoryArgs),
    /// The tree of forks a machine is in, with checkpoints and what rewinds took back.
    Lineage(history::LineageArgs),
    /// The MCP server on stdin and stdout, for an AI assistant that starts it: its tools act on
    /// the engine in this process, or on the server given by --url and --token (or
    /// EVERVM_URL and EVERVM_TOKEN). `evervm mcp install --claude-code` (or --claude-desktop,
    /// --cursor, --vscode, --windsurf, --goose) adds it to an assistant.
    Mcp {
        #[command(subcommand)]
        command: Option<mcp::McpCommand>,
    },
    /// Check that this host can serve machines (runsc, cgroups, namespaces, disk, the home,
    /// images; the database and bucket when given), naming the fix for each need that fails.
    /// Exits 0 only when the backend (--backend, default gVisor) can serve.
    Doctor {
        /// The bucket a server would keep snapshots in (`s3://BUCKET/PREFIX`), checked too.
        #[arg(long, env = "EVERVM_SNAPSHOTS", value_name = "URL")]
        snapshots: Option<String>,
    },
    /// An interactive REPL on a machine (a new one when no name is given).
    Repl {
        machine: Option<String>,
        /// Seconds before each instruction is interrupted.
        #[arg(long, default_value_t = evervm::DEFAULT_TIMEOUT.as_secs())]
        timeout: u64,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Build an image from Debian packages (nothing is rebuilt unless an input changed): a
    /// built-in profile, or a custom image from its profile file (a base, extra Debian
    /// packages, PyPI wheels; see "Custom images" in docs/images.md), which also writes FILE's lock
    /// file (FILE with `.lock`).
    Build {
        /// A custom image's profile file (TOML).
        file: Option<std::path::PathBuf>,
        /// `data` (CPython 3.11 with numpy, pandas, matplotlib, requests, ...) or `minimal`
        /// (CPython 3.11 alone), when no FILE is given.
        #[arg(long, default_value = "data", conflicts_with = "file")]
        profile: String,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a token and print only it on stdout.
    Create {
        /// The account the token acts for (created if new).
        #[arg(long, default_value = "default")]
        account: String,
        /// How long it works: a number and s, m, h or d (`30d`); for ever when not given.
        #[arg(long, value_name = "DURATION")]
        expires_in: Option<String>,
        /// Print it as an E2B API key (`e2b_<hex>`, for E2B_API_KEY against `--e2b-listen`).
        #[arg(long)]
        e2b: bool,
    },
    /// Print the E2B API key (`e2b_<hex>`) of a token, for E2B's SDKs against `--e2b-listen`.
    E2b { token: String },
    /// List the tokens of the store (the home's, or --database): id, account, when made, when
    /// they expire (never secrets).
    List {
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by its id (the part before the `.`); a server on the store refuses it
    /// from its next request on.
    Revoke { id: String },
}

#[derive(Subcommand)]
enum SecretKeyCommand {
    /// Print a new random key (64 hex digits) for EVERVM_SECRET_KEY.
    Generate,
    /// Seal every machine's secret environment values in the store (the home's, or --database)
    /// with the key EVERVM_SECRET_KEY gives, opening older ones with EVERVM_SECRET_KEY_PREVIOUS.
    Rotate,
}

#[derive(Subcommand)]
enum MachineCommand {
    /// Create a machine and print its name.
    New {
        /// A tag, KEY=VALUE (repeatable).
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Memory limit in MiB.
        #[arg(long)]
        memory_mb: Option<u32>,
        /// The image: `data` (numpy, pandas, matplotlib, requests, ...; the default unless the
        /// server's `EVERVM_DEFAULT_IMAGE` says otherwise) or `minimal`.
        #[arg(long)]
        image: Option<String>,
        /// When state is saved to disk: `idle` (default) or `instruction` (after every
        /// instruction, before its result is reported; slower).
        #[arg(long)]
        durability: Option<String>,
        /// Keep an undo point after each of the machine's latest N instructions (for `evervm
        /// undo`, `rewind` and `history`); the server's default (none) when absent.
        #[arg(long, value_name = "N")]
        history: Option<u32>,
        /// An environment variable of the machine, KEY=VALUE (repeatable).
        #[arg(long = "env", value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// A secret environment variable (repeatable): KEY takes the value of KEY in this
        /// command's own environment (so that it appears in no command line), KEY=VALUE gives
        /// it. `info` and lists show its name only.
        #[arg(long = "secret-env", value_name = "KEY[=VALUE]")]
        secret_env: Vec<String>,
        /// Delete the machine this long after its creation: a number and s, m, h or d (`2h`).
        #[arg(long)]
        ttl: Option<String>,
        /// What the machine may reach: `none` (loopback only), `public` (public addresses), or
        /// `allow` with --allow; the server's default (`none` unless set otherwise) when
        /// absent.
        #[arg(long, value_name = "MODE")]
        network: Option<String>,
        /// A name (`pypi.org`, `*.pythonhosted.org`), address or CIDR block the machine may
        /// reach (repeatable; implies `--network allow`).
        #[arg(long = "allow", value_name = "NAME|CIDR")]
        allow: Vec<String>,
    },
    /// List machines, newest first; with --tag only those carrying every tag.
    List {
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// At most this many (1 to 1000); the cursor of the next page goes to stderr.
        #[arg(long)]
        limit: Option<u32>,
        /// Start after an earlier page (the cursor it printed).
        #[arg(long, requires = "limit")]
        cursor: Option<String>,
    },
    /// Show everything about a machine.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a machine, its state and its history.
    Delete { name: String },
    /// Save a machine to disk and release its memory (gVisor); its next instruction restores it.
    Swap { name: String },
    /// Install packages from the server's package index into a machine (binary wheels only,
    /// hash-checked, dependencies included); the machine needs no network.
    Install {
        name: String,
        /// Requirements like requests==2.32.3 (PEP 508), optionally with --hash=sha256:HEX in
        /// the same argument.
        #[arg(required = true, value_name = "REQUIREMENT")]
        requirements: Vec<String>,
    },
    /// Create a new machine from a machine's current state and print its name (gVisor).
    Fork {
        name: String,
        /// The fork's tags, KEY=VALUE (repeatable); the parent's when none are given.
        #[arg(long = "tag", value_name = "KEY=VALUE")]
        tags: Vec<String>,
        /// Fork from the parent's undo point after instruction SEQ (`evervm history` lists
        /// them; -1: before its first) instead of its current state.
        #[arg(long, value_name = "SEQ", allow_negative_numbers = true)]
        at: Option<i64>,
    },
    /// Named, kept snapshots of a machine (gVisor).
    #[command(subcommand)]
    Checkpoint(CheckpointCommand),
}

#[derive(Subcommand, Debug)]
enum CheckpointCommand {
    /// Save a machine's current state under a name (generated when not given).
    Create {
        machine: String,
        #[arg(long)]
        name: Option<String>,
    },
    /// List a machine's checkpoints, oldest first.
    List {
        machine: String,
        #[arg(long)]
        json: bool,
    },
    /// Return a machine to a checkpoint's state.
    Rollback { machine: String, checkpoint: String },
    /// Delete a checkpoint.
    Delete { machine: String, checkpoint: String },
}

fn parse_tags(pairs: &[String]) -> Result<Tags> {
    let mut tags = Tags::new();
    for pair in pairs {
        let (key, value) = evervm::parse_tag(pair)?;
        tags.insert(key, value);
    }
    Ok(tags)
}

/// `KEY=VALUE` pairs; with `from_own_environment`, a bare `KEY` takes this command's `$KEY`.
fn parse_env(
    pairs: &[String],
    from_own_environment: bool,
) -> Result<std::collections::BTreeMap<String, String>> {
    let mut env = std::collections::BTreeMap::new();
    for pair in pairs {
        let (key, value) = match pair.split_once('=') {
            Some((key, value)) => (key.to_owned(), value.to_owned()),
            None if from_own_environment => {
                let value = std::env::var(pair).with_context(|| {
                    format!("--secret-env {pair}: ${pair} is not set in this command's environment")
                })?;
                (pair.clone(), value)
            }
            None => bail!("--env {pair:?} has no '=': write KEY=VALUE"),
        };
        env.insert(key, value);
    }
    Ok(env)
}

impl Target {
    async fn client(&self) -> Result<Client> {
        if self.local {
            // One command, one machine at most: no pool of ready sandboxes.
            return Ok(Client::local(LocalOptions {
                home: self.home.clone(),
                backend: self.backend.clone(),
                account: None,
                pool_size: Some(0),
            })
            .await?);
        }
        let Some(url) = &self.url else {
            bail!(
                "no server given: pass --url (or set EVERVM_URL) and --token, or use --local to \
                 run the engine in this process"
            );
        };
        let Some(token) = &self.token else {
            bail!(
                "no token given: pass --token or set EVERVM_TOKEN (`evervm token create` makes one)"
            );
        };
        Ok(self.remote(url, token)?)
    }

    /// A client of the server at `url`, trusting `--ca-file` when given.
    fn remote(&self, url: &str, token: &str) -> evervm::Result<Client> {
        let trust = evervm::Trust::from_option_or_env(self.ca_file.clone());
        Client::remote_trusting(url, token, &trust)
    }
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("EVERVM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Plain lines where the log goes to a file or a pipe (scripts, CI, systemd).
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let serving = matches!(cli.command, Command::Serve { .. });
    init_logging(if serving { "info" } else { "warn" });
    match run(cli.command, &cli.target).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, target: &Target) -> Result<ExitCode> {
    match command {
        Command::Serve {
            listen,
            network_default,
            network_max,
            snapshots,
            advertise,
            node_id,
            e2b_listen,
            e2b_domain,
            e2b_public_ports,
            tls_cert,
            tls_key,
            cluster_ca,
        } => {
            let tls = match (tls_cert, tls_key) {
                (Some(cert), Some(key)) => Some(evervm::server::tls::Tls::load(&cert, &key)?),
                _ => None,
            };
            if let Some(advertise) = &advertise {
                let https = advertise.starts_with("https://");
                if tls.is_some() && !https {
                    anyhow::bail!(
                        "--advertise {advertise} with --tls-cert: the other nodes reach this one \
                         on its TLS listener, so advertise an https:// address (one its \
                         certificate names)"
                    );
                }
                if tls.is_none() && https {
                    anyhow::bail!(
                        "--advertise {advertise}: an https:// address needs this node to serve \
                         TLS (--tls-cert and --tls-key)"
                    );
                }
                if https {
                    let trust = cluster_ca
                        .clone()
                        .map_or(evervm::Trust::DefaultRoots, evervm::Trust::CaFile);
                    evervm::server::trust_nodes(&trust)
                        .map_err(|e| anyhow::anyhow!("--cluster-ca: {e}"))?;
                }
            }
            let e2b_domain = e2b_domain
                .map(|d| evervm::server::e2b::check_domain(&d))
                .transpose()
                .map_err(|e| anyhow::anyhow!("--e2b-domain: {e}"))?;
            let options = ServeOptions {
                home: target.home.clone(),
                backend: target.backend.clone(),
                network_default,
                network_max,
                database: target.database.clone(),
                snapshots,
                advertise,
                node_id,
            };
            let e2b_options = evervm::server::e2b::E2bOptions {
                domain: e2b_domain,
                public_ports: e2b_public_ports,
            };
            serve(listen, e2b_listen, e2b_options, tls, options).await
        }
        Command::Token { command } => {
            let home = target
                .home
                .clone()
                .unwrap_or_else(evervm::admin::default_home);
            tokens(&home, target.database.as_deref(), command).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::SecretKey { command } => {
            match command {
                SecretKeyCommand::Generate => println!("{}", evervm::admin::generate_secret_key()?),
                SecretKeyCommand::Rotate => {
                    let home = target
                        .home
                        .clone()
                        .unwrap_or_else(evervm::admin::default_home);
                    let (changed, id) =
                        evervm::admin::rotate_secret_key(&home, target.database.as_deref()).await?;
                    eprintln!("sealed the secrets of {changed} machines with key {id}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit(args) => {
            let home = target
                .home
                .clone()
                .unwrap_or_else(evervm::admin::default_home);
            audit::audit(&home, target.database.as_deref(), args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Image {
            command: ImageCommand::Build { file, profile },
        } => {
            let home = target
                .home
                .clone()
                .unwrap_or_else(evervm::admin::default_home);
            if let Some(file) = file {
                let (id, lock) = evervm::admin::build_custom_image(&home, &file).await?;
                eprintln!("evervm image: wrote {}", lock.display());
                println!("{id}");
            } else {
                let root = evervm::admin::build_image(&home, &profile)?;
                println!("{}", root.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Machine { command } => {
            let client = target.client().await?;
            let done = machine(command, &client).await;
            client.shutdown().await;
            done
        }
        Command::Exec {
            code,
            machine,
            timeout,
            json,
            dialect,
            context,
        } => {
            let dialect = evervm::Dialect::named(&dialect)?;
            let client = target.client().await?;
            let options = ExecOptions {
                timeout: Duration::from_secs(timeout),
                interrupt: false,
                dialect,
                context,
            };
            let done = exec(&client, code, machine, json, options).await;
            client.shutdown().await;
            done
        }
        Command::Cp(args) => {
            with_client(target, |c| async move { files::copy(&c, args).await }).await
        }
        Command::Ls(args) => {
            with_client(target, |c| async move { files::list(&c, args).await }).await
        }
        Command::Rm(args) => {
            with_client(target, |c| async move { files::remove(&c, args).await }).await
        }
        Command::Context { command } => {
            with_client(target, |c| async move { contexts::run(&c, command).await }).await
        }
        Command::Undo(args) => {
            with_client(target, |c| async move { history::undo(&c, args).await }).await
        }
        Command::Rewind(args) => {
            with_client(target, |c| async move { history::rewind(&c, args).await }).await
        }
        Command::History(args) => {
            with_client(target, |c| async move { history::history(&c, args).await }).await
        }
        Command::Lineage(args) => {
            with_client(target, |c| async move { history::lineage(&c, args).await }).await
        }
        Command::Mkdir(args) => {
            with_client(target, |c| async move { files::make_dir(&c, args).await }).await
        }
        Command::Doctor { snapshots } => doctor::run(target, snapshots.as_deref()).await,
        Command::Mcp { command } => {
            let stdio = mcp::StdioTarget {
                url: target.url.clone(),
                token: target.token.clone(),
                ca_file: target.ca_file.clone(),
                home: target.home.clone(),
                backend: target.backend.clone(),
            };
            match command {
                None => mcp::serve_stdio(stdio).await?,
                Some(mcp::McpCommand::Install(args)) => mcp::install::install(&args, &stdio)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Repl { machine, timeout } => {
            let client = target.client().await?;
            let done = repl::run(client.clone(), machine, Duration::from_secs(timeout)).await;
            client.shutdown().await;
            done?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs a file command on a client of `target`, and stops the client (an in-process engine saves
/// its machines) whether it succeeded or not.
async fn with_client<F, Fut>(target: &Target, command: F) -> Result<ExitCode>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let client = target.client().await?;
    let done = command(client.clone()).await;
    client.shutdown().await;
    done.map(|()| ExitCode::SUCCESS)
}

/// `evervm token create|list|revoke`, on the home's database (also while a server runs there).
async fn tokens(
    home: &std::path::Path,
    database: Option<&str>,
    command: TokenCommand,
) -> Result<()> {
    match command {
        TokenCommand::E2b { token } => {
            println!("{}", evervm::server::e2b::api_key_for_token(token.trim()));
        }
        TokenCommand::Create {
            account,
            expires_in,
            e2b,
        } => {
            let valid_for = expires_in
                .as_deref()
                .map(evervm::admin::parse_duration)
                .transpose()?;
            let token = evervm::admin::create_token(home, database, &account, valid_for).await?;
            if e2b {
                println!("{}", evervm::server::e2b::api_key_for_token(&token));
            } else {
                println!("{token}");
            }
        }
        TokenCommand::List { json } => {
            let tokens = evervm::admin::list_tokens(home, database).await?;
            let time = |t: chrono::DateTime<chrono::Utc>| {
                t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            };
            if json {
                let list: Vec<serde_json::Value> = tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "id": t.id,
                            "account": t.account,
                            "created_at": time(t.created_at),
                            "expires_at": t.expires_at.map(time),
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<14} {:<20} {:<22} EXPIRES", "ID", "ACCOUNT", "CREATED");
                for t in tokens {
                    let expires = t.expires_at.map_or_else(|| "never".to_owned(), time);
                    println!(
                        "{:<14} {:<20} {:<22} {expires}",
                        t.id,
                        t.account,
                        time(t.created_at)
                    );
                }
            }
        }
        TokenCommand::Revoke { id } => {
            evervm::admin::revoke_token(home, database, &id).await?;
            eprintln!("revoked token {id}");
        }
    }
    Ok(())
}
async fn serve(
    listen: SocketAddr,
    e2b_listen: Option<SocketAddr>,
    e2b_options: evervm::server::e2b::E2bOptions,
    tls: Option<evervm::server::tls::Tls>,
    options: ServeOptions,
) -> Result<ExitCode> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let server = evervm::server::open(options).await?;
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(listener) => listener,
        Err(e) => {
            server.shutdown().await;
            return Err(e).with_context(|| format!("cannot listen on {listen}"));
        }
    };
    let e2b_listener = match e2b_listen {
        Some(address) => match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                server.shutdown().await;
                return Err(e)
                    .with_context(|| format!("cannot listen on {address} (--e2b-listen)"));
            }
        },
        None => None,
    };
    let address = listener.local_addr()?;
    let url = format!("{scheme}://{address}");
    // Listening for Ctrl-C and SIGTERM before the banner says the server is up.
    let stop = evervm::server::shutdown_signal();
    // The banner is best effort: a closed stdout must not stop the server.
    let mut banner = String::new();
    let _ = writeln!(
        banner,
        "evervm {} listening on {url} (home {}, backend {})",
        env!("CARGO_PKG_VERSION"),
        server.home().display(),
        server.backend_description()
    );
    let first_token = match server.first_token().await {
        Ok(token) => token,
        Err(e) => {
            server.shutdown().await;
            return Err(e.into());
        }
    };
    if let Some(token) = first_token {
        let _ = writeln!(
            banner,
            "first start: created a token for account `default`:"
        );
        let _ = writeln!(banner, "  export EVERVM_URL={url}");
        let _ = writeln!(banner, "  export EVERVM_TOKEN={token}");
        if let Some(e2b) = e2b_listener.as_ref().and_then(|l| l.local_addr().ok()) {
            let _ = writeln!(
                banner,
                "  export E2B_API_URL={scheme}://{e2b} E2B_SANDBOX_URL={scheme}://{e2b} \
                 E2B_API_KEY={} E2B_DOMAIN={}",
                evervm::server::e2b::api_key_for_token(&token),
                e2b_domain_for(e2b, e2b_options.domain.as_deref())
            );
        }
        let _ = writeln!(
            banner,
            "next: with those exports, `evervm exec 'print(1 + 1)'` or `evervm repl` (more \
             tokens: `evervm token create`)"
        );
    }
    if let Some(e2b) = e2b_listener.as_ref().and_then(|l| l.local_addr().ok()) {
        let _ = writeln!(
            banner,
            "E2B-compatible API on {scheme}://{e2b}: E2B_API_URL=E2B_SANDBOX_URL={scheme}://{e2b}, \
             E2B_API_KEY from `evervm token create --e2b`, E2B_DOMAIN={}",
            e2b_domain_for(e2b, e2b_options.domain.as_deref())
        );
    }
    let exposed = std::iter::once(address)
        .chain(e2b_listener.as_ref().and_then(|l| l.local_addr().ok()))
        .filter(|a| !a.ip().is_loopback())
        .map(|a| a.to_string())
        .collect::<Vec<_>>();
    if tls.is_none() && !exposed.is_empty() {
        let _ = writeln!(
            banner,
            "warning: serving plain HTTP on {}, beyond this host: tokens and code cross the \
             network unencrypted; give --tls-cert and --tls-key",
            exposed.join(" and ")
        );
    }
    if server.backend_name() == "process" {
        let _ = writeln!(
            banner,
            "warning: the process backend is not a security boundary: serve only trusted code"
        );
    }
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(banner.as_bytes());
    let _ = out.flush();
    drop(out);
    let e2b = e2b_listener.map(|listener| evervm::server::e2b::E2bListener {
        listener,
        options: e2b_options,
    });
    server.serve_listeners(listener, e2b, tls, stop).await?;
    Ok(ExitCode::SUCCESS)
}

/// The domain the E2B listener at `address` answers sandboxes under.
fn e2b_domain_for(address: SocketAddr, configured: Option<&str>) -> String {
    configured.map_or_else(
        || evervm::server::e2b::sink_domain_for(&address.to_string()),
        str::to_owned,
    )
}

fn print_machine(info: &evervm::MachineInfo) {
    println!("{}", info.name);
    println!("  created:      {}", info.created_at.to_rfc3339());
    if let Some(state) = &info.state {
        println!("  state:        {state}");
    }
    println!("  running:      {}", info.running);
    println!(
        "  status:       {}",
        if info.has_pending_instruction {
            "has_work"
        } else {
            "idle"
        }
    );
    if let Some(backend) = &info.backend {
        println!("  backend:      {backend}");
    }
    if let Some(image) = &info.image {
        println!("  image:        {image}");
    }
    if let Some(memory) = info.memory_mb {
        println!("  memory_mb:    {memory}");
    }
    if let Some(durability) = &info.durability {
        println!("  durability:   {durability}");
    }
    if let Some(history) = info.history.filter(|h| *h > 0) {
        println!("  history:      {history} undo points");
    }
    if let Some(parent) = &info.parent {
        let at = info.forked_at.unwrap_or(-1);
        println!("  forked from:  {parent} (after its instruction {at})");
    }
    if let Some(count) = info.instruction_count {
        println!("  instructions: {count}");
    }
    if let Some(bytes) = info.resident_bytes.filter(|b| *b > 0) {
        println!("  memory used:  {:.1} MB", bytes as f64 / 1e6);
    }
    if let Some(bytes) = info.disk_bytes.filter(|b| *b > 0) {
        println!("  on disk:      {:.2} MB", bytes as f64 / 1e6);
    }
    if let Some(last) = info.last_used_at {
        println!("  last used:    {}", last.to_rfc3339());
    }
    for (key, value) in &info.tags {
        println!("  tag:          {key}={value}");
    }
    println!(
        "  expires:      {}",
        info.expires_at
            .map_or_else(|| "never".to_owned(), |t| t.to_rfc3339())
    );
    if let Some(interpreter) = &info.interpreter {
        let from = interpreter
            .snapshot_at
            .map(|t| format!(" from its snapshot of {}", t.to_rfc3339()))
            .unwrap_or_default();
        println!(
            "  interpreter:  {}{from}, at {}",
            interpreter.began,
            interpreter.started_at.to_rfc3339()
        );
    }
    if let Some(network) = &info.network {
        let rules = network.allow_rules();
        if rules.is_empty() {
            println!("  network:      {}", network.mode());
        } else {
            println!("  network:      {} {}", network.mode(), rules.join(" "));
        }
    }
    for (key, value) in &info.env {
        println!("  env:          {key}={value}");
    }
    for key in &info.secret_env {
        println!("  secret env:   {key} (value not shown)");
    }
    if let Some(error) = &info.last_error {
        println!("  last error:   {error}");
    }
}

async fn machine(command: MachineCommand, client: &Client) -> Result<ExitCode> {
    match command {
        MachineCommand::New {
            tags,
            memory_mb,
            image,
            durability,
            history,
            env,
            secret_env,
            ttl,
            network,
            allow,
        } => {
            let network = match (network.as_deref(), allow.is_empty()) {
                (None, true) => None,
                (None, false) => Some(evervm::NetworkPolicy::new(
                    evervm::NetworkMode::Allow,
                    &allow,
                )?),
                (Some(mode), _) => Some(evervm::NetworkPolicy::new(
                    evervm::NetworkMode::parse(mode)?,
                    &allow,
                )?),
            };
            let machine = client
                .create_machine(CreateMachineOptions {
                    tags: parse_tags(&tags)?,
                    memory_mb,
                    image,
                    durability,
                    env: parse_env(&env, false)?,
                    secret_env: evervm::SecretEnv(parse_env(&secret_env, true)?),
                    ttl: ttl
                        .as_deref()
                        .map(evervm::admin::parse_duration)
                        .transpose()?,
                    expires_at: None,
                    network,
                    history,
                })
                .await?;
            println!("{}", machine.name());
        }
        MachineCommand::List {
            tags,
            json,
            limit,
            cursor,
        } => {
            let tags = parse_tags(&tags)?;
            let machines = match limit {
                None => client.list_machines(&tags).await?,
                Some(limit) => {
                    let page = client
                        .list_machines_page(&tags, limit, cursor.as_deref())
                        .await?;
                    if let Some(next) = &page.next_cursor {
                        eprintln!("next page: --cursor {next}");
                    }
                    page.machines
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&machines)?);
            } else if machines.is_empty() {
                eprintln!("no machines");
            } else {
                for info in &machines {
                    print_machine(info);
                }
            }
        }
        MachineCommand::Info { name, json } => {
            let info = client.machine(&name).info().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                print_machine(&info);
            }
        }
        MachineCommand::Delete { name } => {
            client.machine(&name).delete().await?;
            eprintln!("deleted {name}");
        }
        MachineCommand::Install { name, requirements } => {
            let requirements: Vec<&str> = requirements.iter().map(String::as_str).collect();
            let report = client.machine(&name).install(&requirements).await?;
            print!("{}", report.summary());
        }
        MachineCommand::Swap { name } => {
            client.machine(&name).swap_out().await?;
            eprintln!("swapped out {name}");
        }
        MachineCommand::Fork { name, tags, at } => {
            let tags = if tags.is_empty() {
                None
            } else {
                Some(parse_tags(&tags)?)
            };
            let machine = client.machine(&name);
            let fork = match at {
                Some(seq) => machine.fork_at(seq, tags).await?,
                None => machine.fork(tags).await?,
            };
            println!("{}", fork.name());
        }
        MachineCommand::Checkpoint(command) => checkpoint(command, client).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn checkpoint(command: CheckpointCommand, client: &Client) -> Result<()> {
    match command {
        CheckpointCommand::Create { machine, name } => {
            let checkpoint = client.machine(&machine).checkpoint(name.as_deref()).await?;
            println!("{}", checkpoint.name);
        }
        CheckpointCommand::List { machine, json } => {
            let checkpoints = client.machine(&machine).checkpoints().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&checkpoints)?);
            } else if checkpoints.is_empty() {
                eprintln!("no checkpoints");
            } else {
                for c in &checkpoints {
                    println!(
                        "{}  {}  after {} instructions  {} bytes",
                        c.name,
                        c.created_at.to_rfc3339(),
                        c.instruction_count,
                        c.disk_bytes
                    );
                }
            }
        }
        CheckpointCommand::Rollback {
            machine,
            checkpoint,
        } => {
            client.machine(&machine).rollback(&checkpoint).await?;
            eprintln!("rolled {machine} back to {checkpoint}");
        }
        CheckpointCommand::Delete {
            machine,
            checkpoint,
        } => {
            client
                .machine(&machine)
                .delete_checkpoint(&checkpoint)
                .await?;
            eprintln!("deleted checkpoint {checkpoint} of {machine}");
        }
    }
    Ok(())
}

async fn exec(
    client: &Client,
    code: Option<String>,
    machine: Option<String>,
    json: bool,
    options: ExecOptions,
) -> Result<ExitCode> {
    let code = match code.as_deref() {
        Some("-") | None => {
            let mut code = String::new();
            std::io::stdin()
                .read_to_string(&mut code)
                .context("cannot read code from standard input")?;
            code
        }
        Some(code) => code.to_owned(),
    };
    let machine = match machine {
        Some(name) => client.machine(&name),
        None => {
            let machine = client
                .create_machine(CreateMachineOptions::default())
                .await?;
            eprintln!("machine: {}", machine.name());
            machine
        }
    };
    let (seq, mut events) = machine.stream(&code, &options).await?;
    let mut output = Vec::new();
    let mut shown = 0;
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Output(chunk) => {
                if json {
                    output.push(chunk);
                } else {
                    print_chunk(&chunk);
                }
            }
            ExecEvent::Display(rich) => {
                shown += 1;
                if !json {
                    print_rich(&rich);
                }
            }
            ExecEvent::Result(result) => {
                if !json {
                    // The results start with those shown on the way, printed as they came; the
                    // value's text is printed below.
                    for rich in result.results.iter().skip(shown) {
                        if rich.kind != RichKind::Value {
                            print_rich(rich);
                        }
                    }
                }
                if json {
                    let execution = serde_json::json!({
                        "machine": machine.name(),
                        "seq": seq,
                        "output": output,
                        "result": result,
                    });
                    println!("{}", serde_json::to_string_pretty(&execution)?);
                } else if let Some(value) = &result.value {
                    println!("{value}");
                }
                if let Some(error) = &result.error {
                    if !json {
                        eprint!("{error}");
                        if !error.ends_with('\n') {
                            eprintln!();
                        }
                    }
                    return Ok(ExitCode::FAILURE);
                }
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    bail!("the output stream ended without a result")
}

/// A rich result in a terminal: its text, then (on standard error) what else it holds, since a
/// terminal cannot show it (`--json` gives every representation).
pub(crate) fn print_rich(rich: &evervm::RichResult) {
    if rich.kind != RichKind::Figure
        && let Some(text) = rich.text()
    {
        println!("{text}");
    }
    let others: Vec<String> = rich
        .data
        .iter()
        .filter(|(mime, _)| *mime != "text/plain")
        .map(|(mime, value)| {
            let size = value
                .as_str()
                .map_or_else(|| value.to_string().len(), str::len);
            format!("{mime} ({size} bytes)")
        })
        .collect();
    if !others.is_empty() {
        eprintln!(
            "[{}: {}; --json shows them]",
            rich.kind.as_str(),
            others.join(", ")
        );
    }
}

pub(crate) fn print_chunk(chunk: &evervm::OutputChunk) {
    match chunk.stream {
        evervm::OutputStream::Stdout => {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", chunk.data);
            if out.is_terminal() {
                let _ = out.flush();
            }
        }
        evervm::OutputStream::Stderr => eprintln!("{}", chunk.data),
    }
}
