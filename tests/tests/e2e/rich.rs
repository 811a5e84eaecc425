//! Rich results on gVisor with the data image, through both transports (a server, and the
//! engine in this process): a DataFrame's HTML and every open figure from one instruction;
//! `display()` and `plt.show()` streamed in order with the prints; ForeverVM's `data` keeping its
//! `{"png": ...}` shape.

use evervm::{Client, ExecEvent, ExecOptions, LocalOptions, OutputStream, RichKind};
use evervm_tests::{TestServer, backends};
use futures::StreamExt;

use crate::new_machine;

fn gvisor_available() -> bool {
    let available = backends().iter().any(|b| b == "gvisor");
    if !available {
        eprintln!("skipping: the gVisor backend is not available here");
    }
    available
}

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_dataframe_and_two_figures_and_display_in_order_with_prints() {
    if !gvisor_available() {
        return;
    }
    let server = TestServer::start("gvisor");
    let home = tempfile::tempdir().unwrap();
    let local = Client::local(LocalOptions {
        home: Some(home.path().to_owned()),
        backend: Some("gvisor".into()),
        account: None,
        pool_size: Some(0),
    })
    .await
    .unwrap();
    for (label, client) in [("remote", server.client()), ("local", local)] {
        let m = new_machine(&client, Some("data")).await;

        // One instruction: a DataFrame as its value, two figures left open.
        let code = "import pandas as pd, matplotlib.pyplot as plt\n\
                    plt.figure(); plt.plot([1, 2, 3])\n\
                    plt.figure(figsize=(3, 2)); plt.bar(['a', 'b'], [3, 4])\n\
                    pd.DataFrame({'x': [1, 2], 'y': ['p', 'q']})";
        let run = m.exec(code).await.unwrap();
        let result = &run.result;
        assert_eq!(result.error, None, "{label}");
        let kinds: Vec<RichKind> = result.results.iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [RichKind::Value, RichKind::Figure, RichKind::Figure],
            "{label}"
        );
        let table = &result.results[0];
        let html = table.html().unwrap();
        assert!(
            html.contains("<table") && html.contains("<td>q</td>"),
            "{label}: {html}"
        );
        assert_eq!(table.text(), result.value.as_deref(), "{label}");
        let pngs: Vec<Vec<u8>> = result.results[1..]
            .iter()
            .map(|r| r.png().unwrap())
            .collect();
        for png in &pngs {
            assert!(png.starts_with(PNG_SIGNATURE), "{label}");
        }
        assert_ne!(pngs[0], pngs[1], "{label}: two figures, two images");
        assert!(
            result.results[1].text().unwrap().contains("Figure"),
            "{label}"
        );
        // ForeverVM's field: the last figure, as before.
        let last = result.results[2].get("image/png").unwrap();
        assert_eq!(
            result.data,
            Some(serde_json::json!({ "png": last })),
            "{label}"
        );
        // The figures were closed: the next instruction has none.
        let run = m.exec("1 + 1").await.unwrap();
        assert!(run.result.results.is_empty(), "{label}");
        assert_eq!(run.result.data, None, "{label}");

        // `display()` and `plt.show()` during an instruction, in order with its prints.
        let code = "print('first')\n\
                    display(pd.DataFrame({'n': [7]}))\n\
                    print('second')\n\
                    plt.plot([3, 1]); plt.show()\n\
                    print('third')";
        let (_, events) = m.stream(code, &ExecOptions::default()).await.unwrap();
        let events: Vec<ExecEvent> = events.map(Result::unwrap).collect().await;
        let order: Vec<String> = events
            .iter()
            .map(|event| match event {
                ExecEvent::Output(chunk) => format!("{:?} {}", chunk.stream, chunk.data),
                ExecEvent::Display(rich) => format!("{} result", rich.kind.as_str()),
                ExecEvent::Result(_) => "result".into(),
            })
            .collect();
        assert_eq!(
            order,
            [
                "Stdout first",
                "display result",
                "Stdout second",
                "figure result",
                "Stdout third",
                "result"
            ],
            "{label}"
        );
        let ExecEvent::Display(shown) = &events[1] else {
            unreachable!()
        };
        assert!(shown.html().unwrap().contains("<td>7</td>"), "{label}");
        let Some(ExecEvent::Result(result)) = events.last() else {
            unreachable!()
        };
        // The result repeats what was shown; `plt.show()` no longer warns that Agg cannot show.
        let shown: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                ExecEvent::Display(rich) => Some(rich.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(result.results, shown, "{label}");
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ExecEvent::Output(c) if c.stream == OutputStream::Stderr)),
            "{label}: {order:?}"
        );
        m.delete().await.unwrap();
    }
}
