//! `evervm context`: more interpreters in one machine, each with its own variables and working
//! directory, sharing the machine's files (`evervm exec --machine M --context ID` runs in one).

use anyhow::Result;
use clap::Subcommand;
use evervm::Client;

#[derive(Subcommand)]
pub(crate) enum ContextCommand {
    /// Start a new interpreter in a machine and print its id.
    Create {
        machine: String,
        /// Its working directory (default: the machine's home).
        #[arg(long)]
        cwd: Option<String>,
    },
    /// List a machine's contexts (`default` is its own interpreter).
    List {
        machine: String,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a context's interpreter again, its variables gone.
    Restart { machine: String, context: String },
    /// End a context's interpreter and forget the context.
    Remove { machine: String, context: String },
}

pub(crate) async fn run(client: &Client, command: ContextCommand) -> Result<()> {
    match command {
        ContextCommand::Create { machine, cwd } => {
            let made = client
                .machine(&machine)
                .create_context(cwd.as_deref())
                .await?;
            println!("{}", made.id);
        }
        ContextCommand::List { machine, json } => {
            let contexts = client.machine(&machine).contexts().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&contexts)?);
                return Ok(());
            }
            for context in contexts {
                let pid = context
                    .pid
                    .map_or_else(|| "not running".to_owned(), |pid| format!("pid {pid}"));
                println!("{}\t{}\t{pid}", context.id, context.cwd);
            }
        }
        ContextCommand::Restart { machine, context } => {
            client.machine(&machine).restart_context(&context).await?;
            eprintln!("restarted context {context} of {machine}");
        }
        ContextCommand::Remove { machine, context } => {
            client.machine(&machine).remove_context(&context).await?;
            eprintln!("removed context {context} of {machine}");
        }
    }
    Ok(())
}
