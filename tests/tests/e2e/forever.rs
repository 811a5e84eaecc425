//! Machines that live forever (gVisor): forks, checkpoints and rollback, state in the `data`
//! profile across a swap. The process backend refuses forks and checkpoints with a clear error.

use evervm::{Client, CreateMachineOptions, ErrorKind, Machine};
use evervm_tests::{TestServer, backends};

async fn value(machine: &Machine, code: &str) -> String {
    let run = machine.exec(code).await.unwrap();
    match (run.result.value, run.result.error) {
        (Some(value), None) => value,
        (None, None) => String::new(),
        (_, Some(error)) => panic!("{code:?} on {} failed: {error}", machine.name()),
    }
}

fn gvisor_server() -> Option<TestServer> {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return None;
    }
    Some(TestServer::start("gvisor"))
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_are_independent_and_draw_different_numbers() {
    let Some(server) = gvisor_server() else {
        return;
    };
    let client: Client = server.client();
    let parent = client
        .create_machine(CreateMachineOptions {
            tags: [("role".to_owned(), "parent".to_owned())].into(),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap();
    value(
        &parent,
        "import random\nrandom.seed(7)\nx = [1]\nopen('/tmp/shared', 'w').write('before')",
    )
    .await;
    let fork = parent
        .fork(Some([("role".to_owned(), "fork".to_owned())].into()))
        .await
        .unwrap();
    assert_ne!(fork.name(), parent.name());
    value(
        &fork,
        "x.append('fork')\nopen('/tmp/shared', 'w').write('fork')",
    )
    .await;
    value(&parent, "x.append('parent')").await;
    assert_eq!(
        value(&fork, "x, open('/tmp/shared').read()").await,
        "([1, 'fork'], 'fork')"
    );
    assert_eq!(
        value(&parent, "x, open('/tmp/shared').read()").await,
        "([1, 'parent'], 'before')"
    );
    // Both were seeded with 7 before the fork; the fork was reseeded, so their streams differ.
    let draws = "[random.random() for _ in range(4)]";
    assert_ne!(value(&fork, draws).await, value(&parent, draws).await);
    // A second fork of the same parent differs from the first too.
    let second = parent.fork(None).await.unwrap();
    assert_ne!(value(&second, draws).await, value(&fork, draws).await);
    assert_eq!(
        second
            .info()
            .await
            .unwrap()
            .tags
            .get("role")
            .map(String::as_str),
        Some("parent")
    );

    let forks: Vec<String> = client
        .list_machines(&[("role".to_owned(), "fork".to_owned())].into())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect();
    assert_eq!(forks, [fork.name().to_owned()]);
    let info = fork.info().await.unwrap();
    assert_eq!(
        info.instruction_count,
        Some(4),
        "a fork numbers its own instructions from 0"
    );
    assert!(info.disk_bytes.is_some_and(|b| b > 0), "{info:?}");
    // Deleting the parent leaves the fork whole.
    parent.delete().await.unwrap();
    assert_eq!(value(&fork, "len(x)").await, "2");
    let err = client
        .machine("nosuchmachine")
        .fork(None)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_roll_a_machine_back() {
    let Some(server) = gvisor_server() else {
        return;
    };
    let client = server.client();
    let m = client
        .create_machine(CreateMachineOptions::default())
        .await
        .unwrap();
    value(&m, "n = 1\nopen('/tmp/a', 'w').write('a')").await;
    let one = m.checkpoint(Some("v1.0")).await.unwrap();
    assert_eq!(one.name, "v1.0");
    assert_eq!(one.instruction_count, 1);
    value(&m, "n = 2\nimport os\nopen('/tmp/b', 'w').write('b')").await;
    let generated = m.checkpoint(None).await.unwrap();
    assert!(generated.name.starts_with("cp-"), "{generated:?}");
    value(&m, "n = 3").await;

    let names: Vec<String> = m
        .checkpoints()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["v1.0".to_owned(), generated.name.clone()]);
    let again = m.checkpoint(Some("v1.0")).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::Conflict, "{again}");
    let bad = m.checkpoint(Some("../x")).await.unwrap_err();
    assert_eq!(bad.kind(), ErrorKind::InvalidInput, "{bad}");

    m.rollback("v1.0").await.unwrap();
    assert_eq!(
        value(
            &m,
            "import os\nn, os.path.exists('/tmp/a'), os.path.exists('/tmp/b')"
        )
        .await,
        "(1, True, False)"
    );
    m.rollback(&generated.name).await.unwrap();
    assert_eq!(value(&m, "n").await, "2");

    // A machine whose snapshot is damaged can still be rolled back.
    m.swap_out().await.unwrap();
    evervm_tests::damage_snapshot(
        &server
            .home()
            .join("machines")
            .join(m.name())
            .join("snapshot"),
    );
    // The engine names the snapshot's path; a client sees it without the server's home,
    // whether it comes as the instruction's failure or as the request's error.
    let home = server.home().to_string_lossy().into_owned();
    let damaged = match m.exec("n").await {
        Ok(run) => run.result.error.unwrap(),
        Err(e) => e.message().to_owned(),
    };
    assert!(damaged.contains("<evervm home>/machines/"), "{damaged}");
    assert!(!damaged.contains(&home), "{damaged}");
    let info = m.info().await.unwrap();
    assert_eq!(info.state.as_deref(), Some("damaged"));
    let last_error = info.last_error.unwrap();
    assert!(!last_error.contains(&home), "{last_error}");
    let refused = m.fork(None).await.unwrap_err();
    assert!(refused.message().contains("do not match"), "{refused}");
    assert!(!refused.message().contains(&home), "{refused}");
    m.rollback("v1.0").await.unwrap();
    assert_eq!(value(&m, "n").await, "1");
    assert_ne!(m.info().await.unwrap().state.as_deref(), Some("damaged"));

    m.delete_checkpoint("v1.0").await.unwrap();
    let gone = m.rollback("v1.0").await.unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::NotFound, "{gone}");
    assert_eq!(m.checkpoints().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_numpy_array_survives_a_swap() {
    let Some(server) = gvisor_server() else {
        return;
    };
    let m = server
        .client()
        .create_machine(CreateMachineOptions {
            image: Some("data".to_owned()),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap();
    value(
        &m,
        "import numpy as np, pandas as pd\na = np.arange(100000, dtype=np.float64).reshape(100, 1000)\ndf = pd.DataFrame({'v': [1, 2, 3]})",
    )
    .await;
    m.swap_out().await.unwrap();
    assert_eq!(m.info().await.unwrap().state.as_deref(), Some("swapped"));
    assert_eq!(
        value(&m, "float(a.sum()), a.shape, int(df.v.sum())").await,
        "(4999950000.0, (100, 1000), 6)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_process_backend_refuses_forks_and_checkpoints() {
    if !backends().iter().any(|b| b == "process") {
        eprintln!("skipping: the process backend is not available here");
        return;
    }
    let server = TestServer::start("process");
    let client = server.client();
    let m = client
        .create_machine(CreateMachineOptions::default())
        .await
        .unwrap();
    value(&m, "x = 1").await;
    let err = m.fork(None).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.message().contains("gVisor"), "{err}");
    let err = m.checkpoint(Some("c")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(m.checkpoints().await.unwrap().is_empty());
    // A dotted checkpoint name reaches the server, which answers about the checkpoint.
    let err = m.rollback("v1.2").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(err.message().contains(r#"no checkpoint "v1.2""#), "{err}");
    let err = m.delete_checkpoint("v1.2").await.unwrap_err();
    assert!(err.message().contains(r#"no checkpoint "v1.2""#), "{err}");
    let err = m.rollback(".hidden").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let err = client
        .create_machine(CreateMachineOptions {
            durability: Some("instruction".to_owned()),
            ..CreateMachineOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    // The machine itself is untouched.
    assert_eq!(value(&m, "x").await, "1");
}

#[tokio::test(flavor = "multi_thread")]
async fn new_machines_start_from_the_image_base_snapshot() {
    if gvisor_server().is_none() {
        return;
    }
    // By default the `data` base imports nothing; with `EVERVM_BASE_PREIMPORT` its libraries
    // are imported before the snapshot, into sys.modules only.
    for preimport in [false, true] {
        let server = TestServer::start_with("gvisor", move |config| {
            config.base_preimport = preimport;
        });
        let client = server.client();
        let a = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        let b = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        assert_eq!(a.info().await.unwrap().image.as_deref(), Some("data"));
        let imported = if preimport { "True" } else { "False" };
        assert_eq!(
            value(
                &a,
                "import sys\n'pandas' in sys.modules, 'pandas' in globals()"
            )
            .await,
            format!("({imported}, False)")
        );
        let base = server.home().join("base");
        let suffix = if preimport { "-imported" } else { "" };
        let names: Vec<String> = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("data-") && n.ends_with(&format!("512{suffix}"))),
            "no data base snapshot{suffix} in {}: {names:?}",
            base.display()
        );
        // Machines restored from one base snapshot still draw different random numbers.
        let draws = "import random\n[random.random() for _ in range(4)]";
        assert_ne!(value(&a, draws).await, value(&b, draws).await);
        assert!(
            value(&b, "import pandas\npandas.__name__")
                .await
                .contains("pandas")
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_resident_limit_the_least_recently_used_swap_out() {
    if !backends().iter().any(|b| b == "gvisor") {
        eprintln!("skipping: the gVisor backend is not available here");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let mut config = crate::gvisor_config(home.path());
    config.max_resident = Some(2);
    let engine = evervm::engine::Engine::open(config).await.unwrap();
    let account = engine.ensure_account("local").await.unwrap();
    let client = Client::from_engine(engine.clone(), account);
    let mut machines = Vec::new();
    for i in 0..4 {
        let m = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        value(&m, &format!("i = {i}")).await;
        machines.push(m);
    }
    let resident = || async {
        let mut names = Vec::new();
        for m in &machines {
            if m.info().await.unwrap().state.as_deref() == Some("resident") {
                names.push(m.name().to_owned());
            }
        }
        names
    };
    let mut now = resident().await;
    for _ in 0..100 {
        if now.len() <= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        now = resident().await;
    }
    assert!(now.len() <= 2, "resident: {now:?}");
    // The most recently used machine stays; the first ones went to disk.
    assert!(now.contains(&machines[3].name().to_owned()), "{now:?}");
    assert_eq!(
        machines[0].info().await.unwrap().state.as_deref(),
        Some("swapped")
    );
    for (i, m) in machines.iter().enumerate() {
        assert_eq!(value(m, "i").await, i.to_string());
    }
    // The last one used is resident (the budget swaps out the least recently used).
    let info = machines[3].info().await.unwrap();
    assert_eq!(info.state.as_deref(), Some("resident"));
    assert!(
        info.resident_bytes.is_some_and(|b| b > 1_000_000),
        "{info:?}"
    );
    engine.shutdown().await;
}
