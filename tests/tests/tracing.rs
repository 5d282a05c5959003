//! The write path's spans (`stele_node::trace`) seen from outside: in the
//! JSON log lines of a real `stele dev`, and (with the `otel` feature)
//! exported over OTLP to a collector.

use std::time::Duration;

use serde_json::Value;
use stele_tests::Proc;

/// `stele append --json` against `endpoint`: the position it printed.
async fn append_through_cli(endpoint: &str, key: &str) -> Value {
    let args = [
        "append",
        "--endpoint",
        endpoint,
        "--namespace",
        "dev/traced",
        "--key",
        key,
        "--value",
        "v",
        "--json",
    ]
    .map(String::from);
    let (ok, out, err) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        stele_tests::run_plain(&args)
    })
    .await
    .unwrap();
    assert!(ok, "{out}{err}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The span named `name` among a JSON log line's `spans`, if any.
fn span_of<'a>(line: &'a Value, name: &str) -> Option<&'a Value> {
    line["spans"].as_array()?.iter().find(|s| s["name"] == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_lines_of_an_append_carry_its_tablet_replica_and_batch() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", stele_tests::free_port_base(1));
    let d = dir.path().to_str().unwrap();
    let proc = Proc::start(
        &[
            "--log-format",
            "json",
            "dev",
            "--data-dir",
            d,
            "--listen",
            &listen,
        ],
        &[("RUST_LOG", "warn,stele_node=debug")],
    )
    .unwrap();
    let pos = append_through_cli(&proc.endpoint, "traced").await;
    let tablet = pos["tablet"].as_u64().expect("position names its tablet");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines: Vec<Value> = proc
        .stderr_lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    proc.kill9();
    let acked: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "append acknowledged")
        .collect();
    assert_eq!(acked.len(), 1, "one append, one acknowledgement");
    // The event itself names no ids: they come from its span.
    let line = acked[0];
    assert!(line.get("tablet").is_none(), "{line}");
    let span = span_of(line, "append").unwrap_or_else(|| panic!("no append span: {line}"));
    assert_eq!(span["tablet"].as_u64(), Some(tablet), "{line}");
    let replica = span["replica"].as_u64();
    assert!(replica.is_some_and(|r| r > 0), "replica id: {line}");
    let batch = span["batch"].as_str().unwrap_or_default();
    assert_eq!(batch.len(), 32, "batch id, 32 hex digits: {line}");
    assert_eq!(line["span"]["name"], "append", "innermost span: {line}");
}
