//! The ForeverVM CLI's commands (crate `forevervm` 0.1.35, used unchanged as a library), as a
//! program that the CLI compatibility tests run against an evervm server. Its configuration is
//! read from `$HOME/.config/forevervm/config.json`, as the real CLI does.
#![allow(clippy::print_stderr)]

use std::collections::HashMap;
use std::time::Duration;

use forevervm::commands::{auth, machine, repl};
use forevervm_sdk::api::id_types::MachineName;

fn tags(args: &[String]) -> Result<HashMap<String, String>, String> {
    let mut tags = HashMap::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if arg != "--tag" {
            return Err(format!("unexpected argument {arg:?}"));
        }
        let pair = rest.next().ok_or("--tag needs KEY=VALUE")?;
        let (key, value) = pair.split_once('=').ok_or("--tag needs KEY=VALUE")?;
        tags.insert(key.to_owned(), value.to_owned());
    }
    Ok(tags)
}

async fn run(args: &[String]) -> anyhow::Result<()> {
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["whoami"] => auth::whoami().await,
        ["machine", "new", ..] => {
            machine::machine_new(tags(&args[2..]).map_err(anyhow::Error::msg)?).await
        }
        ["machine", "list", ..] => {
            machine::machine_list(tags(&args[2..]).map_err(anyhow::Error::msg)?).await
        }
        ["repl"] => repl::machine_repl(None, Duration::from_secs(15)).await,
        ["repl", name] => {
            repl::machine_repl(
                Some(MachineName((*name).to_owned())),
                Duration::from_secs(15),
            )
            .await
        }
        _ => {
            anyhow::bail!("usage: forevervm whoami | machine new|list [--tag K=V]... | repl [NAME]")
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
