//! The round trip of `exec("1+1")` through the Rust client, for comparing the other languages'
//! packages with it in one run (`bindings-node/bench/overhead.mjs` starts it):
//!
//!   exec_rtt --rounds 2000 --home DIR [--backend process]   the engine in this process
//!   exec_rtt --rounds 2000 --url URL --token TOKEN          a server
//!
//! Prints one JSON line: the transport and every round trip in microseconds.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use evervm::{Client, LocalOptions};
use evervm_examples::measure::ready_machine;

#[tokio::main]
async fn main() -> Result<()> {
    let mut rounds = 1000usize;
    let (mut url, mut token, mut home, mut backend) = (None, None, None, "process".to_owned());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--rounds" => rounds = value()?.parse().context("--rounds needs a number")?,
            "--url" => url = Some(value()?),
            "--token" => token = Some(value()?),
            "--home" => home = Some(PathBuf::from(value()?)),
            "--backend" => backend = value()?,
            other => bail!(
                "unknown argument {other:?}; use --rounds N and either --home DIR [--backend B] \
                 or --url URL --token TOKEN"
            ),
        }
    }
    let (client, transport) = match (url, token, home) {
        (Some(url), Some(token), None) => (Client::remote(&url, &token)?, "remote"),
        (None, None, Some(home)) => {
            let options = LocalOptions {
                home: Some(home),
                backend: Some(backend),
                account: None,
                pool_size: Some(0),
            };
            (Client::local(options).await?, "local")
        }
        _ => bail!("give either --home DIR or both --url and --token"),
    };
    let machine = ready_machine(&client).await?;
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let run = machine.exec("1+1").await?;
        samples.push(started.elapsed().as_secs_f64() * 1e6);
        if run.result.value.as_deref() != Some("2") {
            bail!("1+1 gave {:?}", run.result);
        }
    }
    machine.delete().await?;
    let line = serde_json::json!({ "transport": transport, "client": "rust", "micros": samples });
    println!("{line}");
    Ok(())
}
