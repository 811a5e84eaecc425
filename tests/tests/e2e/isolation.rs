//! What a machine cannot do: reach the network, see host processes, or take more memory than
//! its limit (and a machine that tries hurts nobody else).

use evervm::{Client, CreateMachineOptions, LocalOptions};
use evervm_tests::backends;

async fn local(backend: &str, home: &tempfile::TempDir) -> Client {
    Client::local(LocalOptions {
        home: Some(home.path().to_owned()),
        backend: Some(backend.to_owned()),
        account: None,
        pool_size: None,
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn no_network_even_to_a_loopback_port_the_host_opened() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    for backend in backends() {
        let home = tempfile::tempdir().unwrap();
        let client = local(backend, &home).await;
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        let code = format!(
            "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=3)\n    \
             outcome = 'connected'\nexcept OSError as e:\n    outcome = 'refused: ' + type(e).__name__\noutcome"
        );
        let run = machine.exec(&code).await.unwrap();
        let value = run.result.value.unwrap_or_default();
        assert!(value.starts_with("'refused"), "{backend}: {value}");
        let interfaces = machine
            .exec("import socket\nsorted(name for _, name in socket.if_nameindex())")
            .await
            .unwrap();
        assert_eq!(
            interfaces.result.value.as_deref(),
            Some("['lo']"),
            "{backend}"
        );
    }
    drop(listener);
}

#[tokio::test(flavor = "multi_thread")]
async fn host_processes_are_invisible() {
    for backend in backends() {
        let home = tempfile::tempdir().unwrap();
        let client = local(backend, &home).await;
        let machine = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        let run = machine
            .exec("import os\nsorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
            .await
            .unwrap();
        let value = run.result.value.unwrap();
        let pids: Vec<u32> = value
            .trim_matches(['[', ']'])
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        assert!(pids.len() < 10, "{backend}: the machine sees {pids:?}");
        assert!(
            !pids.contains(&std::process::id()) || std::process::id() < 10,
            "{backend}: {pids:?}"
        );
        let kill = machine
            .exec(&format!("import os\nos.kill({}, 0)", std::process::id()))
            .await
            .unwrap();
        assert!(
            kill.result.is_error(),
            "{backend}: the machine could signal the engine"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_limit_gives_memory_error_and_hurts_no_one_else() {
    for backend in backends() {
        let home = tempfile::tempdir().unwrap();
        let client = local(backend, &home).await;
        let bystander = client
            .create_machine(CreateMachineOptions::default())
            .await
            .unwrap();
        bystander.exec("kept = 'fine'").await.unwrap();
        let hog = client
            .create_machine(CreateMachineOptions {
                tags: evervm::Tags::new(),
                memory_mb: Some(128),
                image: None,
                ..CreateMachineOptions::default()
            })
            .await
            .unwrap();
        hog.exec("before = 1").await.unwrap();
        let big = hog
            .exec("block = bytearray(512 * 1024 * 1024)")
            .await
            .unwrap();
        let text = big.result.error.unwrap_or_default();
        assert!(
            text.contains("MemoryError") || text.contains("out of memory"),
            "{backend}: {text}"
        );
        let growing = hog
            .exec("chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))")
            .await
            .unwrap();
        let text = growing.result.error.unwrap_or_default();
        assert!(
            text.contains("MemoryError") || text.contains("out of memory"),
            "{backend}: {text}"
        );
        hog.exec("chunks = None").await.unwrap();
        let after = hog.exec("before + 1").await.unwrap();
        let survived = after.result.value.as_deref() == Some("2");
        let restarted = after
            .result
            .error
            .as_deref()
            .is_some_and(|e| e.contains("NameError"));
        assert!(survived || restarted, "{backend}: {:?}", after.result);
        assert_eq!(
            bystander
                .exec("kept")
                .await
                .unwrap()
                .result
                .value
                .as_deref(),
            Some("'fine'"),
            "{backend}"
        );
    }
}
