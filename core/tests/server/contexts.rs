//! Code contexts over HTTP: made, listed, run in, restarted and removed, their errors, and the
//! Rust client's context verbs against the server.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn contexts_over_http_and_through_the_client() {
    let server = Server::start().await;
    let machine = server.new_machine(json!({})).await;
    let somewhere = tempfile::tempdir().unwrap();
    let cwd = somewhere.path().to_str().unwrap().to_owned();
    let base = format!("/v1/machine/{machine}/contexts");

    let made = ok(server.req(POST, &base).json(&json!({"cwd": cwd}))).await;
    let id = made["id"].as_str().unwrap().to_owned();
    assert_eq!(made["cwd"], cwd.as_str());
    assert!(made["pid"].as_u64().is_some(), "{made}");
    let listed = ok(server.req(GET, &base)).await;
    let ids: Vec<&str> = listed["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["default", id.as_str()]);

    // An instruction names its context; its globals and working directory are its own.
    server.exec(&machine, "x = 'default'").await;
    let body = json!({"instruction": {"code": "import os; os.getcwd()", "context": id}});
    let seq = ok(server.exec_request(&machine, &body)).await["instruction_seq"]
        .as_i64()
        .unwrap();
    assert_eq!(
        server.result(&machine, seq).await["value"],
        format!("'{cwd}'")
    );
    let body = json!({"instruction": {"code": "x", "context": id}});
    let seq = ok(server.exec_request(&machine, &body)).await["instruction_seq"]
        .as_i64()
        .unwrap();
    assert_eq!(
        server.result(&machine, seq).await["exception"]["name"],
        "NameError"
    );

    // Bad and unknown ids, the default context, another account.
    let bad = json!({"instruction": {"code": "1", "context": "a/b"}});
    fails(
        server.exec_request(&machine, &bad),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;
    let restart = |context: &str| format!("{base}/{context}/restart");
    fails(
        server.req(POST, &restart("nope")),
        StatusCode::NOT_FOUND,
        "NotFound",
    )
    .await;
    fails(
        server.req(POST, &restart("default")),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;
    let not_hers = server.bob(GET, &base);
    fails(not_hers, StatusCode::NOT_FOUND, "MachineNotFound").await;
    let nul_cwd = json!({"cwd": "a\u{0}b"});
    fails(
        server.req(POST, &base).json(&nul_cwd),
        StatusCode::BAD_REQUEST,
        "BadRequest",
    )
    .await;

    // Restarted over HTTP; removed over HTTP.
    let restarted = ok(server.req(POST, &restart(&id))).await;
    assert_eq!(restarted["id"], id.as_str());
    let removed = ok(server.req(Method::DELETE, &format!("{base}/{id}"))).await;
    assert_eq!(removed, json!({"deleted": true}));
    let removed_again = server.req(Method::DELETE, &format!("{base}/{id}"));
    fails(removed_again, StatusCode::NOT_FOUND, "NotFound").await;

    // The Rust client's verbs.
    let client = evervm::Client::remote(&server.base, &server.alice).unwrap();
    let m = client.machine(&machine);
    let context = m.create_context(None).await.unwrap();
    let options = evervm::ExecOptions {
        context: Some(context.id.clone()),
        ..Default::default()
    };
    let run = m.exec_with("y = 2; y * 21", &options).await.unwrap();
    assert_eq!(run.result.value.as_deref(), Some("42"));
    let contexts = m.contexts().await.unwrap();
    assert_eq!(
        contexts.last().map(|c| c.id.as_str()),
        Some(context.id.as_str())
    );
    m.restart_context(&context.id).await.unwrap();
    let run = m.exec_with("y", &options).await.unwrap();
    assert_eq!(
        run.result.exception.map(|e| e.name).as_deref(),
        Some("NameError")
    );
    m.remove_context(&context.id).await.unwrap();
    let run = m.exec_with("1", &options).await.unwrap();
    assert_eq!(
        run.result.exception.map(|e| e.name).as_deref(),
        Some("ContextNotFound")
    );
    let missing = m.remove_context(&context.id).await.unwrap_err();
    assert_eq!(missing.kind(), evervm::ErrorKind::NotFound);
    server.stop().await;
}
