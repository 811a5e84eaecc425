//! `evervm doctor`: whether this host can serve machines, as the engine checks it.

use std::process::ExitCode;

use anyhow::Result;

use crate::Target;

/// `evervm doctor`: one line per check, the fix under each that is not right.
pub(crate) async fn run(target: &Target, snapshots: Option<&str>) -> Result<ExitCode> {
    let backend = target.backend.as_deref().unwrap_or("auto");
    eprintln!("evervm doctor: can this host serve machines (backend {backend})?");
    let checks = evervm::admin::doctor(
        target.home.clone(),
        Some(backend),
        target.database.as_deref(),
        snapshots,
    )
    .await?;
    let mut failed = 0;
    for check in &checks {
        let label = match check.status {
            evervm::admin::CheckStatus::Ok => "ok",
            evervm::admin::CheckStatus::Warn => "warn",
            evervm::admin::CheckStatus::Fail => {
                failed += 1;
                "FAIL"
            }
        };
        println!("{label:<5} {:<11} {}", check.name, check.detail);
        if let Some(fix) = &check.fix {
            println!("{:<17} fix: {fix}", "");
        }
    }
    if failed == 0 {
        println!("this host can serve machines");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{failed} problem(s) stop this host from serving machines: fix them as shown");
        Ok(ExitCode::FAILURE)
    }
}
