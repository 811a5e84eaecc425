//! `evervm doctor` end to end: it passes where gVisor serves (in CI, always) and, where runsc is
//! missing, fails naming the fix.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output, Stdio};

const EVERVM: &str = env!("CARGO_BIN_EXE_evervm");

fn doctor(home: &std::path::Path, extra: &[&str], runsc: Option<&str>) -> (Output, String) {
    let mut command = Command::new(EVERVM);
    command
        .arg("--home")
        .arg(home)
        .args(extra)
        .arg("doctor")
        .env_remove("EVERVM_BACKEND")
        .env_remove("EVERVM_DATABASE")
        .env_remove("EVERVM_SNAPSHOTS")
        .stdin(Stdio::null());
    if let Some(runsc) = runsc {
        command.env("EVERVM_RUNSC", runsc);
    }
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    (output, text)
}

fn line<'a>(report: &'a str, check: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no {check} line in:\n{report}"))
}

#[test]
fn doctor_passes_where_gvisor_serves() {
    let home = tempfile::tempdir().unwrap();
    let (output, report) = doctor(home.path(), &[], None);
    if !output.status.success() && std::env::var_os("CI").is_none() {
        // Outside CI a host without gVisor is allowed; then runsc is what failed.
        assert!(line(&report, "runsc").starts_with("FAIL"), "{report}");
        eprintln!("skipping: gVisor does not run here:\n{report}");
        return;
    }
    assert!(
        output.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let runsc = line(&report, "runsc");
    assert!(
        runsc.starts_with("ok") && runsc.contains("a sandbox ran"),
        "{runsc}"
    );
    assert!(line(&report, "home").starts_with("ok"), "{report}");
    assert!(report.contains("this host can serve machines"), "{report}");
}

#[test]
fn doctor_fails_naming_the_fix_when_runsc_is_missing() {
    let home = tempfile::tempdir().unwrap();
    let (output, report) = doctor(home.path(), &[], Some("/nonexistent/runsc"));
    assert!(!output.status.success(), "{report}");
    assert!(line(&report, "runsc").starts_with("FAIL"), "{report}");
    assert!(report.contains("fix: scripts/runsc.sh"), "{report}");
    assert!(report.contains("problem(s) stop this host"), "{report}");

    // The process backend does not need runsc: then it is a warning, and what decides is
    // whether its namespaces can be made.
    let (output, report) = doctor(
        home.path(),
        &["--backend", "process"],
        Some("/nonexistent/runsc"),
    );
    assert!(line(&report, "runsc").starts_with("warn"), "{report}");
    let namespaces_ok = line(&report, "namespaces").starts_with("ok");
    assert_eq!(output.status.success(), namespaces_ok, "{report}");
}

/// The secret key is checked: a key that is not one fails naming the fix (never the text
/// given), a good one is named by its id.
#[test]
fn doctor_checks_the_secret_key() {
    let home = tempfile::tempdir().unwrap();
    let run = |key: &str| {
        let output = Command::new(EVERVM)
            .arg("--home")
            .arg(home.path())
            .args(["--backend", "process", "doctor"])
            .env("EVERVM_SECRET_KEY", key)
            .env_remove("EVERVM_SECRET_KEY_FILE")
            .env_remove("EVERVM_SECRET_KEY_PREVIOUS")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    let (passed, report) = run("hunter2-is-no-key");
    assert!(!passed, "{report}");
    assert!(line(&report, "secrets").starts_with("FAIL"), "{report}");
    assert!(report.contains("secret-key generate"), "{report}");
    assert!(!report.contains("hunter2"), "{report}");
    let (_, report) = run(&"ab".repeat(32));
    let secrets = line(&report, "secrets");
    assert!(
        secrets.starts_with("ok") && secrets.contains("sealed in the store with key"),
        "{report}"
    );
}
