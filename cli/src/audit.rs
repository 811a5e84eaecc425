//! `evervm audit`: the audit log of the store (the home's, or `--database`), newest first, read
//! directly (also while a server runs on it), as a table or JSON.

use anyhow::{Result, bail};
use evervm::admin::{AuditEntry, AuditQuery};

/// What to read.
#[derive(clap::Args)]
pub(crate) struct AuditArgs {
    /// Only this account's entries.
    #[arg(long)]
    account: Option<String>,
    /// Only entries about this machine.
    #[arg(long)]
    machine: Option<String>,
    /// Only this action (`machine.create`, `exec`, `file.write`, `token.create`, ...).
    #[arg(long)]
    action: Option<String>,
    /// Only entries of the last DURATION (a number and s, m, h or d: `24h`).
    #[arg(long, value_name = "DURATION")]
    since: Option<String>,
    /// Only entries before this id (the smallest id printed before: the next page back).
    #[arg(long, value_name = "ID")]
    before: Option<i64>,
    /// At most this many entries (at most 1000).
    #[arg(long, default_value_t = 100)]
    limit: usize,
    /// Print them as JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn audit(
    home: &std::path::Path,
    database: Option<&str>,
    args: AuditArgs,
) -> Result<()> {
    let since = args
        .since
        .as_deref()
        .map(evervm::admin::parse_duration)
        .transpose()?
        .and_then(|age| chrono::Duration::from_std(age).ok())
        .and_then(|age| chrono::Utc::now().checked_sub_signed(age));
    if args.limit == 0 || args.limit > evervm::admin::AUDIT_PAGE_MAX {
        bail!(
            "--limit {} is out of range: 1 to {}",
            args.limit,
            evervm::admin::AUDIT_PAGE_MAX
        );
    }
    let query = AuditQuery {
        account: args.account,
        machine: args.machine,
        action: args.action,
        since,
        before_id: args.before,
        limit: args.limit,
    };
    let entries = evervm::admin::read_audit(home, database, query).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
    } else {
        print_table(&entries);
    }
    Ok(())
}

fn print_table(entries: &[AuditEntry]) {
    println!(
        "{:<8} {:<20} {:<9} {:<12} {:<12} {:<19} {:<24} {:<16} DETAIL",
        "ID", "TIME", "DOOR", "ACCOUNT", "TOKEN", "ACTION", "MACHINE", "OUTCOME"
    );
    for e in entries {
        let mut detail = e.detail.clone().unwrap_or_default();
        // One line per entry: kept code can be long and span lines.
        if let Some(first) = detail.lines().next()
            && (first.len() < detail.len() || first.chars().count() > 60)
        {
            detail = format!("{}…", first.chars().take(60).collect::<String>());
        }
        println!(
            "{:<8} {:<20} {:<9} {:<12} {:<12} {:<19} {:<24} {:<16} {detail}",
            e.id,
            e.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            e.door,
            e.account.as_deref().unwrap_or("-"),
            e.token_id.as_deref().unwrap_or("-"),
            e.action,
            e.machine.as_deref().unwrap_or("-"),
            e.outcome,
        );
    }
}
