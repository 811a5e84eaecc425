//! A machine's environment on gVisor (and how its interpreter began): set at creation (on a sandbox restored from the image's
//! base snapshot, so set after the interpreter started), kept across swap, engine restart and
//! fork; secret values never shown.

use evervm::{CreateMachineOptions, SecretEnv};
use evervm_tests::backends;

use crate::{open_gvisor as open, value};

const SEEN: &str =
    "import os\n(os.environ.get('STAGE'), os.environ.get('DB_PASSWORD'), os.getcwd())";
const EXPECTED: &str = "('test', 'hunter2-secret', '/home/user')";

#[tokio::test(flavor = "multi_thread")]
async fn the_environment_survives_swap_restart_and_fork_and_secrets_stay_hidden() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (engine, client) = open(home.path()).await;
    let m = client
        .create_machine(CreateMachineOptions {
            env: [("STAGE".to_owned(), "test".to_owned())].into(),
            secret_env: SecretEnv([("DB_PASSWORD".to_owned(), "hunter2-secret".to_owned())].into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(value(&m, SEEN).await, EXPECTED);
    let info = m.info().await.unwrap();
    assert_eq!(info.env.get("STAGE").map(String::as_str), Some("test"));
    assert_eq!(info.secret_env, ["DB_PASSWORD"]);
    let shown = format!(
        "{info:?} {:?}",
        client.list_machines(&evervm::Tags::new()).await.unwrap()
    );
    assert!(!shown.contains("hunter2-secret"), "{shown}");

    m.swap_out().await.unwrap();
    assert_eq!(value(&m, SEEN).await, EXPECTED);
    // Its interpreter came back from the snapshot the swap-out wrote.
    let interpreter = m.info().await.unwrap().interpreter.unwrap();
    assert_eq!(interpreter.began, "restored");
    assert!(
        interpreter
            .snapshot_at
            .is_some_and(|at| at <= interpreter.started_at)
    );
    let fork = m.fork(None).await.unwrap();
    assert_eq!(value(&fork, SEEN).await, EXPECTED);
    assert_eq!(fork.info().await.unwrap().secret_env, ["DB_PASSWORD"]);

    let name = m.name().to_owned();
    engine.shutdown().await;
    drop((m, fork, client, engine));
    let (engine, client) = open(home.path()).await;
    let m = client.machine(&name);
    assert_eq!(value(&m, SEEN).await, EXPECTED);
    engine.shutdown().await;
}
