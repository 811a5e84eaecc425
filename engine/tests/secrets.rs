//! Secret environment values sealed at rest, end to end on the process backend: never in the
//! database files as given, in the interpreter as given; an engine without the key refuses to
//! start the machine's interpreter and says which key it needs; one given the key after a
//! rotation goes on.
// Test code: a failed step should stop the test at once, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use evervm_engine::secrets::SecretKeys;
use evervm_engine::{CreateMachine, Engine, EngineConfig, EnvVar, ExecRequest, Outcome};

const OLD: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const NEW: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";
/// The secret, written in the code only in two halves so that a stored instruction does not
/// hold it whole.
const SECRET: &str = "tok-9183-secret";

async fn engine(dir: &tempfile::TempDir, keys: Option<Arc<SecretKeys>>) -> Engine {
    let mut config = EngineConfig::new(dir.path());
    config.backend = evervm_engine::BackendChoice::parse("process");
    config.secret_keys = keys;
    Engine::open(config).await.unwrap()
}

fn keys(current: &str, previous: &[&str]) -> Arc<SecretKeys> {
    Arc::new(SecretKeys::parse(current, previous).unwrap())
}

/// Whether the secret is in the interpreter's environment, or the text of the engine's refusal.
async fn sees_secret(engine: &Engine, machine: &str) -> Result<String, String> {
    let account = engine.ensure_account("a").await.unwrap();
    let code = "import os; os.environ['TOKEN'] == 'tok-9183' + '-secret'";
    let seq = engine
        .exec(&account, machine, ExecRequest::new(code))
        .await
        .map_err(|e| e.to_string())?
        .seq;
    let result = engine
        .result(&account, machine, seq)
        .await
        .map_err(|e| e.to_string())?;
    match result.outcome {
        Outcome::Value(value) => Ok(value.unwrap_or_default()),
        Outcome::Error { text, .. } => Err(text),
    }
}

fn files_hold_the_secret(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir).unwrap().any(|entry| {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        name.starts_with("evervm.db")
            && std::fs::read(&path)
                .unwrap()
                .windows(SECRET.len())
                .any(|w| w == SECRET.as_bytes())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_sealed_at_rest_and_a_missing_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let sealing = engine(&dir, Some(keys(OLD, &[]))).await;
    let account = sealing.ensure_account("a").await.unwrap();
    let env = [(
        "TOKEN".to_owned(),
        EnvVar {
            value: SECRET.to_owned(),
            secret: true,
        },
    )]
    .into();
    let machine = sealing
        .create_machine(
            &account,
            CreateMachine {
                env,
                ..CreateMachine::default()
            },
        )
        .await
        .unwrap()
        .name
        .to_string();
    assert_eq!(sees_secret(&sealing, &machine).await.unwrap(), "True");
    sealing.shutdown().await;
    drop(sealing);
    assert!(
        !files_hold_the_secret(dir.path()),
        "the secret is in the database as given"
    );

    // Without the key: its interpreter does not start, and the error names the key.
    let keyless = engine(&dir, None).await;
    let refused = sees_secret(&keyless, &machine).await.unwrap_err();
    assert!(refused.contains("EVERVM_SECRET_KEY"), "{refused}");
    // What is not secret still reads.
    let info = keyless.machine_info(&account, &machine).await.unwrap();
    assert_eq!(info.secret_env, ["TOKEN"]);
    keyless.shutdown().await;
    drop(keyless);

    // Rotated: the new key with the old one among the previous ones.
    let rotated = engine(&dir, Some(keys(NEW, &[OLD]))).await;
    assert_eq!(sees_secret(&rotated, &machine).await.unwrap(), "True");
    rotated.shutdown().await;
}
