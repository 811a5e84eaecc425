//! The `evervm` command end to end, against a spawned `evervm serve` and in-process (`--local`),
//! and the ForeverVM CLI (crate `forevervm` 0.1.35) against the same server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const EVERVM: &str = env!("CARGO_BIN_EXE_evervm");

/// Backends to run on: `EVERVM_TEST_BACKENDS`, else every backend that runs an instruction here
/// through the `evervm` command (in CI, gVisor must).
fn backends() -> Vec<String> {
    static FOUND: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            evervm_tests::backends_from_env().unwrap_or_else(|| {
                evervm_tests::available_backends(|backend| {
                    let home = tempfile::tempdir().map_err(|e| e.to_string())?;
                    let probe = run_with_input(
                        Command::new(EVERVM)
                            .args(["--local", "--backend", backend, "--home"])
                            .arg(home.path())
                            .args(["exec", "1 + 1"]),
                        "",
                    );
                    if probe.status.success() && stdout(&probe) == "2\n" {
                        Ok(())
                    } else {
                        Err(stderr(&probe))
                    }
                })
            })
        })
        .clone()
}

struct Server {
    child: Child,
    url: String,
    token: String,
    home: tempfile::TempDir,
    /// What the server logged (at debug level), on its stderr.
    log: tempfile::NamedTempFile,
}

impl Server {
    fn start(backend: &str) -> Self {
        Self::start_in(backend, tempfile::tempdir().unwrap(), None)
    }

    /// Starts a server on `home`; `token` is known when the home was used before (the server
    /// prints a token on its first start only).
    fn start_in(backend: &str, home: tempfile::TempDir, token: Option<String>) -> Self {
        Self::start_with(backend, home, token, &[])
    }

    /// The same, with more environment for the server.
    fn start_with(
        backend: &str,
        home: tempfile::TempDir,
        token: Option<String>,
        env: &[(&str, &str)],
    ) -> Self {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(EVERVM)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                backend,
                "--home",
            ])
            .arg(home.path())
            .env_remove("EVERVM_URL")
            .env_remove("EVERVM_TOKEN")
            .env("EVERVM_LOG", "debug")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut url = None;
        let mut token = token;
        while url.is_none() || token.is_none() {
            let line = lines
                .next()
                .expect("the server prints its URL and first token")
                .unwrap();
            if let Some(rest) = line.split("listening on ").nth(1) {
                url = rest.split_whitespace().next().map(str::to_owned);
            }
            if let Some(rest) = line.trim().strip_prefix("export EVERVM_TOKEN=") {
                token = Some(rest.to_owned());
            }
        }
        // Keep reading, so that the server never writes to a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self {
            child,
            url: url.unwrap(),
            token: token.unwrap(),
            home,
            log,
        }
    }

    fn evervm(&self, args: &[&str]) -> Output {
        self.evervm_with_input(args, "")
    }

    fn evervm_with_input(&self, args: &[&str], input: &str) -> Output {
        run_with_input(
            Command::new(EVERVM)
                .args(args)
                .env("EVERVM_URL", &self.url)
                .env("EVERVM_TOKEN", &self.token)
                .env_remove("EVERVM_HOME"),
            input,
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_with_input(command: &mut Command, input: &str) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "failed: {}\n{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Removes terminal colour codes.
fn plain(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn machines_exec_and_errors_through_the_cli() {
    for backend in backends() {
        let server = Server::start(&backend);
        let token = ok(run_with_input(
            Command::new(EVERVM)
                .args(["token", "create", "--account", "second", "--home"])
                .arg(server.home.path()),
            "",
        ));
        let token = token.trim();
        assert_eq!(token.lines().count(), 1, "only the token is printed");
        assert!(token.contains('.'), "{token}");

        let name =
            ok(server.evervm(&["machine", "new", "--tag", "team=data", "--memory-mb", "256"]));
        let name = name.trim();
        ok(server.evervm(&["machine", "new", "--tag", "team=web"]));
        let listed: serde_json::Value = serde_json::from_str(&ok(server.evervm(&[
            "machine",
            "list",
            "--tag",
            "team=data",
            "--json",
        ])))
        .unwrap();
        assert_eq!(listed.as_array().unwrap().len(), 1);
        assert_eq!(listed[0]["name"], name);
        assert_eq!(listed[0]["memory_mb"], 256);

        ok(server.evervm(&["exec", "--machine", name, "x = 2"]));
        let out = ok(server.evervm(&["exec", "--machine", name, "print('hello')\nx * 3"]));
        assert_eq!(out, "hello\n6\n");
        let out = ok(server.evervm_with_input(&["exec", "--machine", name, "-"], "x + 1\n"));
        assert_eq!(out, "3\n");

        let failed = server.evervm(&["exec", "--machine", name, "1 / 0"]);
        assert!(!failed.status.success());
        assert!(
            stderr(&failed).contains("ZeroDivisionError"),
            "{}",
            stderr(&failed)
        );
        let slow = server.evervm(&[
            "exec",
            "--machine",
            name,
            "--timeout",
            "1",
            "import time\ntime.sleep(20)",
        ]);
        assert!(!slow.status.success());
        assert!(stderr(&slow).contains("Timed out"), "{}", stderr(&slow));
        assert_eq!(ok(server.evervm(&["exec", "--machine", name, "x"])), "2\n");

        // A context: an interpreter of its own in the machine, its own `x` and directory.
        let context = ok(server.evervm(&["context", "create", name, "--cwd", "/tmp"]));
        let context = context.trim();
        let in_context = |code: &str| {
            ok(server.evervm(&["exec", "--machine", name, "--context", context, code]))
        };
        assert_eq!(in_context("x = 'own'; import os; os.getcwd()"), "'/tmp'\n");
        assert_eq!(in_context("x"), "'own'\n");
        let listed: serde_json::Value =
            serde_json::from_str(&ok(server.evervm(&["context", "list", name, "--json"]))).unwrap();
        assert_eq!(listed[1]["id"], context, "{listed}");
        ok(server.evervm(&["context", "restart", name, context]));
        let forgotten = server.evervm(&["exec", "--machine", name, "--context", context, "x"]);
        assert!(
            stderr(&forgotten).contains("NameError"),
            "{}",
            stderr(&forgotten)
        );
        ok(server.evervm(&["context", "remove", name, context]));
        let gone = server.evervm(&["exec", "--machine", name, "--context", context, "1"]);
        assert!(!gone.status.success());
        assert!(stderr(&gone).contains("context"), "{}", stderr(&gone));

        let info: serde_json::Value =
            serde_json::from_str(&ok(server.evervm(&["machine", "info", name, "--json"]))).unwrap();
        assert_eq!(info["instruction_count"], 10);
        assert_eq!(info["tags"]["team"], "data");
        if backend == "gvisor" {
            // The data image has IPython: a Jupyter cell (every line indented, a `!` command)
            // on the same namespace.
            let cell = ok(server.evervm(&[
                "exec",
                "--machine",
                name,
                "--dialect",
                "jupyter",
                "    !echo hi\n    x * 5",
            ]));
            // A `!` command runs on a terminal, as in IPython's kernel: its lines end in \r\n.
            assert_eq!(cell, "hi\r\n10\n");
        }

        let repl = ok(server.evervm_with_input(
            &["repl", name],
            "y = 5\ndef f(n):\n    return n * y\n\nf(x)\n",
        ));
        assert!(
            repl.lines()
                .any(|l| l.trim_start_matches(">>> ").trim() == "10"),
            "{repl}"
        );

        let bad = server.evervm(&["machine", "new", "--tag", "no-equals-sign"]);
        assert!(!bad.status.success());
        assert!(stderr(&bad).contains("KEY=VALUE"), "{}", stderr(&bad));

        ok(server.evervm(&["machine", "delete", name]));
        let gone = server.evervm(&["machine", "info", name]);
        assert!(!gone.status.success());
        assert!(stderr(&gone).contains("NotFound"), "{}", stderr(&gone));
    }
}

#[test]
fn files_are_copied_listed_and_removed_through_the_cli() {
    for backend in backends() {
        let server = Server::start(&backend);
        let name = ok(server.evervm(&["machine", "new"]));
        let name = name.trim();
        let local = tempfile::tempdir().unwrap();
        let csv = local.path().join("table.csv");
        std::fs::write(&csv, "a,b\n1,2\n").unwrap();

        // Into the machine's home by its own name, and into a new directory.
        let home_dest = format!("{name}:");
        let csv_arg = csv.to_str().unwrap();
        ok(server.evervm(&["cp", csv_arg, &home_dest]));
        let nested = format!("{name}:data/in/t.csv");
        ok(server.evervm(&["cp", "--parents", "--mode", "600", csv_arg, &nested]));
        assert_eq!(
            ok(server.evervm(&["exec", "--machine", name, "open('table.csv').read()"])),
            "'a,b\\n1,2\\n'\n"
        );
        assert_eq!(ok(server.evervm(&["ls", name])), "data/\ntable.csv\n");
        let long = ok(server.evervm(&["ls", "-l", &format!("{name}:data/in")]));
        assert!(long.starts_with("-0600            8 "), "{long}");
        assert!(long.trim_end().ends_with(" t.csv"), "{long}");

        // Standard input in, standard output out, back to a local directory.
        let piped = format!("{name}:~/piped.txt");
        ok(server.evervm_with_input(&["cp", "-", &piped], "from stdin"));
        assert_eq!(ok(server.evervm(&["cp", &piped, "-"])), "from stdin");
        let out_dir = format!("{}/", local.path().join("out").display());
        std::fs::create_dir(local.path().join("out")).unwrap();
        ok(server.evervm(&["cp", &nested, &out_dir]));
        assert_eq!(
            std::fs::read_to_string(local.path().join("out/t.csv")).unwrap(),
            "a,b\n1,2\n"
        );

        ok(server.evervm(&["mkdir", "-p", &format!("{name}:x/y")]));
        ok(server.evervm(&["rm", "-r", &format!("{name}:x")]));
        let listed: serde_json::Value =
            serde_json::from_str(&ok(server.evervm(&["ls", "--json", name]))).unwrap();
        let names: Vec<&str> = listed["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["data", "piped.txt", "table.csv"]);

        // The image is not the caller's to change (on gVisor it may be read: the sandbox's own).
        let refused = server.evervm_with_input(&["cp", "-", &format!("{name}:/etc/passwd")], "x");
        assert!(!refused.status.success());
        assert!(
            stderr(&refused).contains("PermissionDenied"),
            "{}",
            stderr(&refused)
        );
        let missing = server.evervm(&["cp", &format!("{name}:nothing"), "-"]);
        assert!(
            stderr(&missing).contains("NotFound"),
            "{}",
            stderr(&missing)
        );
    }
}

#[test]
fn secret_environment_values_are_seen_by_the_machine_only() {
    for backend in backends() {
        let server = Server::start(&backend);
        let secret = "s3cr3t-value-that-must-not-leak";
        let output = run_with_input(
            Command::new(EVERVM)
                .args([
                    "machine",
                    "new",
                    "--env",
                    "STAGE=ci",
                    "--secret-env",
                    "DB_PASSWORD",
                    "--ttl",
                    "2h",
                ])
                .env("DB_PASSWORD", secret)
                .env("EVERVM_URL", &server.url)
                .env("EVERVM_TOKEN", &server.token),
            "",
        );
        let name = ok(output);
        let name = name.trim();
        assert_eq!(
            ok(server.evervm(&[
                "exec",
                "--machine",
                name,
                "import os; os.environ['DB_PASSWORD'] == 'SECRET', os.environ['STAGE']"
                    .replace("SECRET", secret)
                    .as_str()
            ])),
            "(True, 'ci')\n"
        );
        let info = ok(server.evervm(&["machine", "info", name]));
        assert!(info.contains("env:          STAGE=ci"), "{info}");
        assert!(info.contains("DB_PASSWORD (value not shown)"), "{info}");
        assert!(
            info.lines()
                .any(|l| l.starts_with("  expires:") && !l.contains("never")),
            "{info}"
        );
        ok(server.evervm(&["machine", "new"]));
        let page = server.evervm(&["machine", "list", "--limit", "1", "--json"]);
        assert!(
            stderr(&page).contains("next page: --cursor m"),
            "{}",
            stderr(&page)
        );
        let listed: serde_json::Value = serde_json::from_str(&ok(page)).unwrap();
        assert_eq!(listed.as_array().unwrap().len(), 1);
        let json = ok(server.evervm(&["machine", "info", name, "--json"]));
        let list = ok(server.evervm(&["machine", "list", "--json"]));
        let log = std::fs::read_to_string(server.log.path()).unwrap();
        assert!(
            log.contains(name),
            "the log has the machine's requests: {log}"
        );
        for (what, text) in [
            ("info", &info),
            ("json", &json),
            ("list", &list),
            ("log", &log),
        ] {
            assert!(
                !text.contains(secret),
                "the secret is in the {what}: {text}"
            );
        }
    }
}

#[test]
fn local_mode_needs_no_server() {
    for backend in backends() {
        let home = tempfile::tempdir().unwrap();
        let local = |args: &[&str]| {
            run_with_input(
                Command::new(EVERVM)
                    .arg("--local")
                    .args(["--backend", &backend, "--home"])
                    .arg(home.path())
                    .args(args)
                    .env_remove("EVERVM_TOKEN")
                    .env_remove("EVERVM_URL"),
                "",
            )
        };
        let name = ok(local(&["machine", "new", "--tag", "mode=local"]));
        let name = name.trim();
        let out = ok(local(&[
            "exec",
            "-m",
            name,
            "import math\nr = 2\nprint(r)\nmath.pi > 3",
        ]));
        assert_eq!(out, "2\nTrue\n");
        let listed = ok(local(&["machine", "list", "--tag", "mode=local"]));
        assert!(listed.contains(name), "{listed}");
        // The result was stored before the command printed it and exited.
        let info: serde_json::Value =
            serde_json::from_str(&ok(local(&["machine", "info", name, "--json"]))).unwrap();
        assert_eq!(info["instruction_count"], 1);
        assert!(info["last_error"].is_null(), "{info}");
        if backend == "gvisor" {
            // Each command swaps its machine out when it ends; the next one restores it.
            assert_eq!(info["state"], "swapped", "{info}");
            assert_eq!(ok(local(&["exec", "-m", name, "r + 1"])), "3\n");
        }
    }
}

/// Where gVisor cannot run (`EVERVM_RUNSC` names no binary), `serve` refuses to fall back to
/// the process backend, which is not a security boundary, and says what to do; named
/// explicitly, the process backend serves. `--local` still falls back, with a warning.
#[test]
fn serve_refuses_the_process_fallback_unless_it_is_named() {
    let home = tempfile::tempdir().unwrap();
    let without_gvisor = |command: &mut Command| {
        command
            .arg("--home")
            .arg(home.path())
            .env("EVERVM_RUNSC", "/nonexistent/runsc")
            .env_remove("EVERVM_BACKEND")
            .env_remove("EVERVM_URL")
            .env_remove("EVERVM_TOKEN");
    };
    let mut serve = Command::new(EVERVM);
    serve.args(["serve", "--listen", "127.0.0.1:0"]);
    without_gvisor(&mut serve);
    let mut child = serve
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A server that starts prints its banner; a refused one exits with nothing on stdout.
    let banner = BufReader::new(child.stdout.take().unwrap()).lines().next();
    if let Some(line) = banner {
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve started on the process fallback: {line:?}");
    }
    let refused = child.wait_with_output().unwrap();
    assert!(!refused.status.success(), "{refused:?}");
    let why = stderr(&refused);
    for needed in [
        "not a security boundary",
        "runsc",
        "scripts/setup.sh",
        "--backend process",
    ] {
        assert!(why.contains(needed), "{needed:?} is not in: {why}");
    }

    let mut local = Command::new(EVERVM);
    local.args(["--local", "exec", "1 + 1"]);
    without_gvisor(&mut local);
    let fell_back = run_with_input(&mut local, "");
    let warning = stderr(&fell_back);
    assert_eq!(ok(fell_back), "2\n");
    assert!(warning.contains("not a security boundary"), "{warning}");

    // The refused server released the home; named, the process backend serves on it.
    let mut server = Command::new(EVERVM);
    server.args(["serve", "--listen", "127.0.0.1:0", "--backend", "process"]);
    without_gvisor(&mut server);
    let mut child = server
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(first.contains("listening on"), "{first}");
    assert!(first.contains("backend process"), "{first}");
}

/// SIGTERM stops `serve` gracefully (machines saved where the backend can), like Ctrl-C.
#[test]
fn sigterm_stops_the_server_gracefully() {
    let mut server = Server::start("process");
    let pid = server.child.id();
    // SAFETY: kill has no memory effects; the pid is our own child, not yet reaped.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

fn forevervm_cli() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    profile_dir.join("examples").join("forevervm")
}

#[test]
fn the_forevervm_cli_works_against_evervm() {
    let program = forevervm_cli();
    assert!(
        program.is_file(),
        "{} is missing: `cargo test` builds it from cli/examples",
        program.display()
    );
    for backend in backends() {
        let server = Server::start(&backend);
        let home = tempfile::tempdir().unwrap();
        let config_dir = home.path().join(".config/forevervm");
        std::fs::create_dir_all(&config_dir).unwrap();
        std::fs::write(
            config_dir.join("config.json"),
            serde_json::json!({"token": server.token, "server_url": format!("{}/", server.url)})
                .to_string(),
        )
        .unwrap();
        let forevervm = |args: &[&str], input: &str| {
            run_with_input(
                Command::new(&program)
                    .args(args)
                    .env("HOME", home.path())
                    .env("NO_COLOR", "1"),
                input,
            )
        };
        let who = plain(&ok(forevervm(&["whoami"], "")));
        assert!(who.contains("as default"), "{who}");
        let created = plain(&ok(forevervm(
            &["machine", "new", "--tag", "cli=forevervm"],
            "",
        )));
        let name = created
            .trim()
            .strip_prefix("Created machine ")
            .expect("the ForeverVM CLI's message")
            .to_owned();
        let listed = plain(&ok(forevervm(
            &["machine", "list", "--tag", "cli=forevervm"],
            "",
        )));
        assert!(listed.contains(&name), "{listed}");
        assert!(listed.contains("Status:  idle"), "{listed}");
        assert!(listed.contains("Tag: cli = forevervm"), "{listed}");
        let repl = plain(&ok(forevervm(
            &["repl", &name],
            "x = 21\nprint('hi')\nx * 2\n",
        )));
        assert!(repl.contains(&format!("Connected to {name}")), "{repl}");
        assert!(
            repl.lines().any(|l| l.trim_start_matches(">>> ") == "hi"),
            "{repl}"
        );
        assert!(
            repl.lines().any(|l| l.trim_start_matches(">>> ") == "42"),
            "{repl}"
        );
        // The state is the machine's: our own CLI sees what the ForeverVM REPL defined.
        assert_eq!(ok(server.evervm(&["exec", "-m", &name, "x"])), "21\n");
    }
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|entry| {
            std::fs::read(entry.path().join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
        })
        .count()
}

#[test]
fn a_killed_server_leaves_no_sandbox_behind() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let mut server = Server::start("gvisor");
    let name = ok(server.evervm(&["machine", "new"]));
    assert_eq!(
        ok(server.evervm(&["exec", "-m", name.trim(), "1 + 1"])),
        "2\n"
    );
    let state_dir = server.home.path().join("runsc");
    let needle = format!("--root={}", state_dir.display());
    assert!(
        processes_mentioning(&needle) > 0,
        "the machine's sandbox runs"
    );
    let state_files = || -> Vec<String> {
        std::fs::read_dir(&state_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| Path::new(n).extension().is_some_and(|e| e == "state"))
            .collect()
    };
    // Where the runsc restores into sandboxes created ahead of time, one is made in the
    // background after the machine's restore; once the engine is killed, nothing but its
    // watchdog removes it. Give it the time to be made, at most 5 s (a runsc that cannot,
    // Debian's, makes none: the wait runs out); the server is another process, so its bundle's
    // pid file is the only sign.
    let created = || {
        std::fs::read_dir(server.home.path().join("sandboxes"))
            .unwrap()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with("pre-")
                    && e.path().join("pid").is_file()
            })
    };
    for _ in 0..50 {
        if created() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    eprintln!("a sandbox created ahead of time waits: {}", created());
    let before = state_files();
    assert!(
        !before.is_empty(),
        "runsc keeps state for running sandboxes"
    );

    // SIGKILL: the engine gets no chance to clean up.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // The sandboxes are other processes (not the test's children): the process table is the
    // only sign of their end, looked at for at most 10 s.
    let mut left = processes_mentioning(&needle);
    for _ in 0..100 {
        if left == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        left = processes_mentioning(&needle);
    }
    assert_eq!(left, 0, "sandbox processes outlived the engine");
    // The dead sandboxes' state may still be there (the engine may have cleaned up a sandbox it
    // had checkpointed, such as the one its base snapshot was taken from, before it died, and
    // its watchdog deletes the sandboxes it created ahead of time).
    let stale = state_files();
    assert!(
        stale.iter().all(|s| before.contains(s)),
        "runsc's state before a restart: {stale:?}, before the kill: {before:?}"
    );

    // The next engine on the same home removes runsc's state of the dead sandboxes.
    let token = server.token.clone();
    let home = std::mem::replace(&mut server.home, tempfile::tempdir().unwrap());
    drop(server);
    let restarted = Server::start_in("gvisor", home, Some(token));
    let after = state_files();
    assert!(
        stale.iter().all(|stale| !after.contains(stale)),
        "stale sandbox state after a restart: {after:?}"
    );
    assert_eq!(
        ok(restarted.evervm(&["exec", "-m", name.trim(), "2 + 2"])),
        "4\n"
    );
}

/// The network namespaces `pid` and the processes whose command line mentions `needle` are in
/// or hold descriptors on (`net:[4026532801]`), other than this process's own.
fn network_namespaces_of(pid: u32, needle: &str) -> std::collections::BTreeSet<String> {
    let ours = std::fs::read_link("/proc/self/ns/net").unwrap();
    let mut found = std::collections::BTreeSet::new();
    for process in std::fs::read_dir("/proc").unwrap().flatten() {
        let base = process.path();
        let is_it = process.file_name().to_string_lossy() == pid.to_string()
            || std::fs::read(base.join("cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle));
        if !is_it {
            continue;
        }
        let mut links = vec![base.join("ns/net")];
        for dir in ["fd", "task"] {
            for entry in std::fs::read_dir(base.join(dir))
                .into_iter()
                .flatten()
                .flatten()
            {
                links.push(if dir == "task" {
                    entry.path().join("ns/net")
                } else {
                    entry.path()
                });
            }
        }
        for link in links {
            if let Ok(target) = std::fs::read_link(link)
                && target != ours
                && target.to_string_lossy().starts_with("net:")
            {
                found.insert(target.to_string_lossy().into_owned());
            }
        }
    }
    found
}

/// What of this server's (its sandboxes' processes, found by `needle` in their command lines,
/// and mounts under `home`) still names network namespace `id`. Only these: namespace numbers
/// are reused, and other tests make namespaces at the same time.
fn holders_of_namespace(id: &str, needle: &str, home: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for process in std::fs::read_dir("/proc").unwrap().flatten() {
        let base = process.path();
        if !std::fs::read(base.join("cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
        {
            continue;
        }
        let mut links = vec![base.join("ns/net")];
        for dir in ["fd", "task"] {
            for entry in std::fs::read_dir(base.join(dir))
                .into_iter()
                .flatten()
                .flatten()
            {
                links.push(if dir == "task" {
                    entry.path().join("ns/net")
                } else {
                    entry.path()
                });
            }
        }
        found.extend(
            links
                .into_iter()
                .filter(|l| std::fs::read_link(l).is_ok_and(|t| t.to_string_lossy() == id))
                .map(|l| l.display().to_string()),
        );
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let home = home.display().to_string();
    found.extend(
        mounts
            .lines()
            .filter(|line| line.contains(id) && line.contains(&home))
            .map(str::to_owned),
    );
    found
}

/// The host's network interfaces and nftables tables (machines' networks must add neither).
fn host_network() -> (String, String) {
    let links = Command::new("/usr/sbin/ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    let names = stdout(&links)
        .lines()
        .filter_map(|line| line.split(':').nth(1))
        .map(|name| name.trim().to_owned() + "\n")
        .collect();
    let tables = Command::new("/usr/sbin/nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    (names, stdout(&tables))
}

#[test]
fn a_killed_server_leaves_no_network_namespace_behind() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/sbin/nft").exists() {
        let why = "machines' networks need root and nft (apt-get install nftables)";
        assert!(
            std::env::var_os("CI").is_none(),
            "{why}: CI must run this test"
        );
        eprintln!("skipping: {why}");
        return;
    }
    let host_before = host_network();
    let mut server = Server::start("gvisor");
    let made = server.evervm(&["machine", "new", "--network", "public"]);
    if !made.status.success() {
        // Debian's 2022 runsc cannot run a sandbox with a network on current kernels: CI's
        // second pass runs on it.
        assert!(
            std::env::var_os("EVERVM_RUNSC").is_some() || std::env::var_os("CI").is_none(),
            "the engine's runsc must run machines with a network in CI: {}",
            stderr(&made)
        );
        eprintln!(
            "skipping: this runsc gives machines no network: {}",
            stderr(&made)
        );
        return;
    }
    let name = stdout(&made).trim().to_owned();
    assert_eq!(
        ok(server.evervm(&["exec", "-m", &name, "x = 21\nx * 2"])),
        "42\n"
    );
    let needle = format!("--root={}", server.home.path().join("runsc").display());
    let namespaces = network_namespaces_of(server.child.id(), &needle);
    // The machine's sandbox's and its gate's, at least.
    assert!(
        namespaces.len() >= 2,
        "the networked machine's namespaces: {namespaces:?}"
    );

    // SIGKILL: the engine gets no chance to clean up.
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    // Nothing holds its namespaces any more: the gate's were held by the engine alone, the
    // sandbox's by runsc's processes, which end with it (looked at for at most 10 s: they are
    // not this test's children). So there is nothing for the next start to clean.
    let mut left: Vec<String> = Vec::new();
    for _ in 0..100 {
        left = namespaces
            .iter()
            .flat_map(|id| holders_of_namespace(id, &needle, server.home.path()))
            .collect();
        if left.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(
        left,
        Vec::<String>::new(),
        "namespaces of a killed engine still held"
    );
    // Nothing was ever added to the host's own namespace.
    assert_eq!(host_network(), host_before);

    // The next engine brings the machine back with a network of its own.
    let token = server.token.clone();
    let home = std::mem::replace(&mut server.home, tempfile::tempdir().unwrap());
    drop(server);
    let restarted = Server::start_in("gvisor", home, Some(token));
    assert_eq!(ok(restarted.evervm(&["exec", "-m", &name, "2 + 2"])), "4\n");
    let info: serde_json::Value =
        serde_json::from_str(&ok(restarted.evervm(&["machine", "info", &name, "--json"]))).unwrap();
    assert_eq!(info["network"]["mode"], "public", "{info}");
    let now = network_namespaces_of(restarted.child.id(), &needle);
    assert!(now.len() >= 2, "the restored machine's namespaces: {now:?}");
    assert_eq!(host_network(), host_before);
}

#[test]
fn a_server_on_postgres_keeps_its_tokens_and_machines_there() {
    let Some(database) = evervm_tests::postgres::ScratchPostgres::create() else {
        return;
    };
    let env = [("EVERVM_DATABASE", database.url.as_str())];
    let server = Server::start_with("process", tempfile::tempdir().unwrap(), None, &env);
    let name = ok(server.evervm(&["machine", "new", "--tag", "store=postgres"]));
    let name = name.trim();
    assert_eq!(ok(server.evervm(&["exec", "-m", name, "6 * 7"])), "42\n");
    // Nothing of the store is in the home: it is all in PostgreSQL.
    assert!(!server.home.path().join("evervm.db").exists());
    // `evervm token` works on the same store while the server runs.
    let made = run_with_input(
        Command::new(EVERVM)
            .args(["token", "create", "--account", "second"])
            .args(["--database", &database.url]),
        "",
    );
    let second = ok(made).trim().to_owned();
    let listed = run_with_input(
        Command::new(EVERVM).args(["token", "list", "--json", "--database", &database.url]),
        "",
    );
    let listed: serde_json::Value = serde_json::from_str(&ok(listed)).unwrap();
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");

    // Another server on another home with the same database knows the token and the machine.
    let token = server.token.clone();
    drop(server);
    let other = Server::start_with("process", tempfile::tempdir().unwrap(), Some(token), &env);
    let listed = ok(other.evervm(&["machine", "list", "--tag", "store=postgres"]));
    assert!(listed.contains(name), "{listed}");
    let as_second = run_with_input(
        Command::new(EVERVM)
            .args(["machine", "list"])
            .env("EVERVM_URL", &other.url)
            .env("EVERVM_TOKEN", &second)
            .env_remove("EVERVM_HOME"),
        "",
    );
    assert!(as_second.status.success(), "{}", stderr(&as_second));
    assert!(!stdout(&as_second).contains(name), "accounts stay apart");
    // A database that is not there is a clear error, and nothing is served.
    let refused = run_with_input(
        Command::new(EVERVM)
            .args(["token", "list", "--database"])
            .arg(format!("{}_missing", database.url)),
        "",
    );
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("PostgreSQL"),
        "{}",
        stderr(&refused)
    );
}

/// The value an `evervm exec` printed, if it succeeded.
fn acknowledged(output: &Output) -> Option<i64> {
    if !output.status.success() {
        return None;
    }
    stdout(output).trim().parse().ok()
}

#[test]
fn with_instruction_durability_a_sigkilled_engine_loses_no_acknowledged_state() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let mut server = Server::start("gvisor");
    let name = ok(server.evervm(&["machine", "new", "--durability", "instruction"]));
    let name = name.trim().to_owned();
    let step = "n = globals().get('n', 0) + 1\nopen('/tmp/n', 'w').write(str(n))\nn";
    let mut last_acknowledged = 0;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let read_back = "import os\n(globals().get('n', 0), \
                     int(open('/tmp/n').read()) if os.path.exists('/tmp/n') else 0)";
    for round in 0..3u32 {
        // The machine is up (restored, or started from its image's base snapshot) before the
        // killer's clock starts.
        ok(server.evervm(&["exec", "-m", &name, read_back]));
        // Kill the engine at a random point of a loop of instructions, once the loop has had an
        // instruction acknowledged (however slow the host, each round then acknowledges some).
        let delay = 400 + u64::from(seed.rotate_left(round * 7) % 1600);
        let pid = server.child.id();
        let (first_acknowledged, started) = std::sync::mpsc::channel::<()>();
        let killer = std::thread::spawn(move || {
            // Waits for the round's first acknowledgement (or gives up after 2 minutes).
            let _ = started.recv_timeout(std::time::Duration::from_secs(120));
            std::thread::sleep(std::time::Duration::from_millis(delay));
            // SAFETY: kill has no memory effects; the pid is our own child, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        loop {
            let run = server.evervm(&["exec", "-m", &name, step]);
            match acknowledged(&run) {
                Some(n) => {
                    assert_eq!(n, last_acknowledged + 1, "round {round}");
                    last_acknowledged = n;
                    let _ = first_acknowledged.send(());
                }
                None => break,
            }
        }
        killer.join().unwrap();
        let _ = server.child.wait();
        let token = server.token.clone();
        let home = std::mem::replace(&mut server.home, tempfile::tempdir().unwrap());
        drop(server);
        server = Server::start_in("gvisor", home, Some(token));
        // Every acknowledged instruction's state is there; at most the one in flight when the
        // engine died (saved, but its result never reported) is there too.
        let now = ok(server.evervm(&["exec", "-m", &name, read_back]));
        let (n, file): (i64, i64) = {
            let inner = now.trim().trim_start_matches('(').trim_end_matches(')');
            let mut parts = inner.split(',').map(|p| p.trim().parse::<i64>().unwrap());
            (parts.next().unwrap(), parts.next().unwrap())
        };
        assert_eq!(n, file);
        assert!(
            n == last_acknowledged || n == last_acknowledged + 1,
            "round {round}: acknowledged {last_acknowledged}, machine has {n}"
        );
        last_acknowledged = n;
    }
    assert!(last_acknowledged >= 2, "the loop ran instructions");
}

#[test]
fn with_idle_durability_a_sigkilled_engine_says_what_it_lost() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let mut server = Server::start("gvisor");
    let name = ok(server.evervm(&["machine", "new"]));
    let name = name.trim().to_owned();
    let step = "n = globals().get('n', 0) + 1\nopen('/tmp/n', 'w').write(str(n))\nn";
    let read_back = "import os\n(globals().get('n', 0), \
                     int(open('/tmp/n').read()) if os.path.exists('/tmp/n') else 0)";
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let mut last_acknowledged = 0;
    for round in 0..3u32 {
        ok(server.evervm(&["exec", "-m", &name, read_back]));
        // Two instructions, then a swap: the snapshot holds `saved`; what comes after it is
        // in memory only until the engine dies.
        for _ in 0..2 {
            last_acknowledged = acknowledged(&server.evervm(&["exec", "-m", &name, step])).unwrap();
        }
        ok(server.evervm(&["machine", "swap", &name]));
        let saved = [last_acknowledged];
        let delay = 800 + u64::from(seed.rotate_left(round * 7) % 1600);
        let pid = server.child.id();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(delay));
            // SAFETY: kill has no memory effects; the pid is our own child, not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        });
        while let Some(n) = acknowledged(&server.evervm(&["exec", "-m", &name, step])) {
            assert_eq!(n, last_acknowledged + 1, "round {round}");
            last_acknowledged = n;
        }
        killer.join().unwrap();
        let _ = server.child.wait();
        let token = server.token.clone();
        let home = std::mem::replace(&mut server.home, tempfile::tempdir().unwrap());
        drop(server);
        server = Server::start_in("gvisor", home, Some(token));
        // The machine is there, back at its last snapshot; when that is older than what was
        // acknowledged, its next instruction says so first.
        let output = server.evervm(&["exec", "-m", &name, read_back]);
        let now = ok(output.clone());
        let (n, file): (i64, i64) = {
            let inner = now.trim().trim_start_matches('(').trim_end_matches(')');
            let mut parts = inner.split(',').map(|p| p.trim().parse::<i64>().unwrap());
            (parts.next().unwrap(), parts.next().unwrap())
        };
        assert_eq!(n, file, "round {round}: memory and files agree");
        if n != last_acknowledged {
            assert!(
                saved.contains(&n),
                "round {round}: {n} is not a saved state {saved:?}"
            );
            let said = String::from_utf8_lossy(&output.stderr).into_owned() + &now;
            assert!(
                said.contains("the engine stopped while the machine was running"),
                "round {round}: rolled back from {last_acknowledged} to {n} without a word: {said}"
            );
        }
        last_acknowledged = n;
    }
}

#[test]
fn tokens_are_listed_revoked_and_expire_while_the_server_runs() {
    let backend = backends()
        .first()
        .cloned()
        .unwrap_or_else(|| "process".to_owned());
    let server = Server::start(&backend);
    let admin = |args: &[&str]| {
        run_with_input(
            Command::new(EVERVM)
                .args(args)
                .arg("--home")
                .arg(server.home.path()),
            "",
        )
    };
    let whoami = |token: &str| {
        run_with_input(
            Command::new(EVERVM).args(["--url", &server.url, "--token", token, "machine", "list"]),
            "",
        )
    };
    let extra = ok(admin(&["token", "create", "--account", "ci"]));
    let extra = extra.trim().to_owned();
    let short = ok(admin(&[
        "token",
        "create",
        "--account",
        "ci",
        "--expires-in",
        "2s",
    ]));
    let short = short.trim().to_owned();
    assert!(whoami(&extra).status.success());
    assert!(whoami(&short).status.success());

    let listed: serde_json::Value =
        serde_json::from_str(&ok(admin(&["token", "list", "--json"]))).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(
        listed.len(),
        3,
        "the first start's token and two more: {listed:?}"
    );
    let (extra_id, _) = extra.split_once('.').unwrap();
    assert!(
        listed
            .iter()
            .any(|t| t["id"] == extra_id && t["expires_at"].is_null())
    );
    assert!(
        listed
            .iter()
            .any(|t| t["account"] == "ci" && t["expires_at"].is_string())
    );
    let table = ok(admin(&["token", "list"]));
    assert!(
        table.contains(extra_id) && table.contains("never"),
        "{table}"
    );
    assert!(
        !table.contains(extra.split_once('.').unwrap().1),
        "no secrets"
    );

    // Revoked: refused at the next request, by the running server.
    ok(admin(&["token", "revoke", extra_id]));
    let refused = whoami(&extra);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("unknown token"),
        "{}",
        stderr(&refused)
    );
    let again = admin(&["token", "revoke", extra_id]);
    assert!(!again.status.success());
    assert!(stderr(&again).contains("no token"), "{}", stderr(&again));

    // Expired: expiry is wall-clock time (no event to wait for), 2 s after the token was made.
    std::thread::sleep(std::time::Duration::from_millis(2200));
    let expired = whoami(&short);
    assert!(!expired.status.success());
    assert!(stderr(&expired).contains("expired"), "{}", stderr(&expired));
    let bad = admin(&["token", "create", "--expires-in", "soon"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("not a duration"), "{}", stderr(&bad));
    // The server's own token still works.
    assert!(whoami(&server.token).status.success());

    // The operator's token commands are in the audit log, newest first; reads are not.
    let audit: serde_json::Value =
        serde_json::from_str(&ok(admin(&["audit", "--account", "ci", "--json"]))).unwrap();
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["token.revoke", "token.create", "token.create"]);
    let table = ok(admin(&["audit", "--action", "token.revoke"]));
    assert!(table.contains(&format!("token {extra_id}")), "{table}");
    let bad = admin(&["audit", "--limit", "0"]);
    assert!(stderr(&bad).contains("out of range"), "{}", stderr(&bad));

    // A secret key made, and the store's secrets sealed with it (recorded too).
    let key = ok(admin(&["secret-key", "generate"]));
    let key = key.trim();
    assert!(
        key.len() == 64 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "{key}"
    );
    let keyless = admin(&["secret-key", "rotate"]);
    assert!(!keyless.status.success());
    assert!(
        stderr(&keyless).contains("EVERVM_SECRET_KEY"),
        "{}",
        stderr(&keyless)
    );
    let rotated = run_with_input(
        Command::new(EVERVM)
            .args(["secret-key", "rotate", "--home"])
            .arg(server.home.path())
            .env("EVERVM_SECRET_KEY", key),
        "",
    );
    assert!(
        stderr(&rotated).contains("sealed the secrets of"),
        "{}",
        stderr(&rotated)
    );
    assert!(!stderr(&rotated).contains(key), "the key is never repeated");
    let table = ok(admin(&["audit", "--action", "secret-key.rotate"]));
    assert!(table.contains("machines sealed with key"), "{table}");
}

/// `evervm mcp install` with HOME in a fresh directory: every assistant's file written with the
/// entry, a second run changes nothing, a changed entry replaces the old one with a backup of
/// the file, other settings stay, and `--print` writes nothing.
#[test]
fn mcp_install_writes_each_assistants_configuration() {
    let home = tempfile::tempdir().unwrap();
    let install = |extra: &[&str]| {
        let mut command = Command::new(EVERVM);
        command
            .env("HOME", home.path())
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("EVERVM_URL")
            .env_remove("EVERVM_TOKEN")
            .env_remove("EVERVM_HOME")
            .env_remove("EVERVM_BACKEND")
            .args(["mcp", "install"])
            .args(extra);
        run_with_input(&mut command, "")
    };
    let all = [
        "--claude-desktop",
        "--claude-code",
        "--cursor",
        "--vscode",
        "--windsurf",
        "--goose",
    ];
    let claude_code = home.path().join(".claude.json");
    std::fs::write(
        &claude_code,
        "{\"numStartups\": 7, \"mcpServers\": {\"other\": {\"command\": \"o\"}}}",
    )
    .unwrap();
    let goose = home.path().join(".config/goose/config.yaml");
    std::fs::create_dir_all(goose.parent().unwrap()).unwrap();
    std::fs::write(&goose, "# mine\nGOOSE_MODEL: m\n").unwrap();

    // --print writes nothing.
    let printed = ok(install(&[&all[..], &["--print"]].concat()));
    assert!(printed.contains("\"mcpServers\"") && printed.contains("extensions:"));
    assert_eq!(
        std::fs::read_to_string(&claude_code).unwrap(),
        "{\"numStartups\": 7, \"mcpServers\": {\"other\": {\"command\": \"o\"}}}"
    );

    let said = ok(install(&all));
    assert_eq!(said.lines().count(), 6, "{said}");
    let exe = std::fs::canonicalize(EVERVM).unwrap();
    let exe = exe.to_str().unwrap();
    let json = |path: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(home.path().join(path)).unwrap()).unwrap()
    };
    for (path, key, typed) in [
        (
            ".config/Claude/claude_desktop_config.json",
            "mcpServers",
            false,
        ),
        (".claude.json", "mcpServers", true),
        (".cursor/mcp.json", "mcpServers", false),
        (".config/Code/User/mcp.json", "servers", true),
        (".codeium/windsurf/mcp_config.json", "mcpServers", false),
    ] {
        let entry = &json(path)[key]["evervm"];
        assert_eq!(entry["command"], exe, "{path}");
        assert_eq!(entry["args"], serde_json::json!(["mcp"]), "{path}");
        assert_eq!(entry.get("type").is_some(), typed, "{path}");
    }
    // Claude Code's other settings stay, and its old file is kept as a backup.
    assert_eq!(json(".claude.json")["numStartups"], 7);
    assert_eq!(json(".claude.json")["mcpServers"]["other"]["command"], "o");
    let backups = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".evervm-backup-")
            })
            .count()
    };
    assert_eq!(backups(home.path()), 1);
    let yaml = std::fs::read_to_string(&goose).unwrap();
    assert!(yaml.starts_with("# mine\nGOOSE_MODEL: m\n"), "{yaml}");
    assert!(yaml.contains(&format!("cmd: \"{exe}\"")), "{yaml}");

    // Again: nothing changes, no new backup.
    let again = ok(install(&all));
    assert_eq!(again.matches("nothing changed").count(), 6, "{again}");
    assert_eq!(backups(home.path()), 1);

    // Another target replaces the entry, with a backup.
    let moved = ok(install(&["--cursor", "--home", "/tmp/elsewhere"]));
    assert!(moved.contains("previous file"), "{moved}");
    assert_eq!(
        json(".cursor/mcp.json")["mcpServers"]["evervm"]["args"],
        serde_json::json!(["mcp", "--home", "/tmp/elsewhere"])
    );
    assert_eq!(backups(&home.path().join(".cursor")), 1);

    // No assistant named: a usage error.
    assert!(!install(&[]).status.success());
}
