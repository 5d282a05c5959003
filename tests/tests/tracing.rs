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
    // Log lines are JSON; the few sentences `stele` prints itself (a stop)
    // are not log lines.
    let lines: Vec<Value> = proc
        .stderr_lines()
        .iter()
        .filter(|l| !l.starts_with("stele:"))
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

/// An OTLP/gRPC collector in the test: every exported span, with the
/// `service.name` of its resource.
#[cfg(feature = "otel")]
mod collector {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
        TraceService, TraceServiceServer,
    };
    use opentelemetry_proto::tonic::collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    };
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
    use opentelemetry_proto::tonic::trace::v1::Span;
    use tokio::sync::mpsc;

    /// (service.name, resource attributes, the span).
    pub type Received = (String, Vec<KeyValue>, Span);

    struct Collector(mpsc::UnboundedSender<Received>);

    #[tonic::async_trait]
    impl TraceService for Collector {
        async fn export(
            &self,
            req: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
            for rs in req.into_inner().resource_spans {
                let attrs = rs.resource.map(|r| r.attributes).unwrap_or_default();
                let service = text(&attrs, "service.name").unwrap_or_default();
                for ss in rs.scope_spans {
                    for span in ss.spans {
                        let _ = self.0.send((service.clone(), attrs.clone(), span));
                    }
                }
            }
            Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
        }
    }

    /// An attribute as text (strings as they are, integers in decimal).
    pub fn text(attrs: &[KeyValue], key: &str) -> Option<String> {
        let v = attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?;
        match v {
            AnyValue {
                value: Some(Value::StringValue(s)),
            } => Some(s.clone()),
            AnyValue {
                value: Some(Value::IntValue(i)),
            } => Some(i.to_string()),
            _ => None,
        }
    }

    /// Serves on a free loopback port; returns its URL and what arrives.
    pub async fn start() -> (String, mpsc::UnboundedReceiver<Received>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Collector(tx)))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (url, rx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "otel"),
    ignore = "needs --features otel; scripts/test runs it"
)]
async fn an_append_reaches_an_otlp_collector_as_spans_with_its_tablet() {
    #[cfg(not(feature = "otel"))]
    panic!("run with `-p stele-tests --features otel` and a stele built with --features otel");
    #[cfg(feature = "otel")]
    {
        use collector::text;
        let (url, mut received) = collector::start().await;
        let dir = tempfile::tempdir().unwrap();
        let listen = format!("127.0.0.1:{}", stele_tests::free_port_base(1));
        let d = dir.path().to_str().unwrap();
        let proc = Proc::start(
            &[
                "--otlp-endpoint",
                &url,
                "dev",
                "--data-dir",
                d,
                "--listen",
                &listen,
                // A lone voter has no one to hand its leaderships to.
                "--shutdown-deadline-ms",
                "500",
            ],
            // Spans leave only at the graceful stop's flush: a batch every
            // 10 minutes never comes within the test.
            &[("OTEL_BSP_SCHEDULE_DELAY", "600000")],
        )
        .unwrap_or_else(|e| panic!("{e} (is the stele binary built with --features otel?)"));
        let pos = append_through_cli(&proc.endpoint, "exported").await;
        let tablet = pos["tablet"].as_u64().unwrap().to_string();
        let status = proc.terminate();
        assert!(status.success(), "graceful stop: {status:?}");
        let mut spans = Vec::new();
        while let Ok(s) = received.try_recv() {
            spans.push(s);
        }
        let names: Vec<&str> = spans.iter().map(|(_, _, s)| s.name.as_str()).collect();
        let append = spans
            .iter()
            .find(|(_, _, s)| s.name == "append")
            .unwrap_or_else(|| panic!("no append span among {names:?}"));
        let (service, resource, span) = append;
        assert_eq!(service, "node");
        assert_eq!(text(resource, "stele.node.id").as_deref(), Some("1"));
        assert_eq!(text(resource, "stele.cell.id").as_deref(), Some("dev"));
        assert_eq!(text(&span.attributes, "tablet"), Some(tablet.clone()));
        assert!(text(&span.attributes, "replica").is_some(), "{span:?}");
        let batch = text(&span.attributes, "batch").unwrap_or_default();
        // The same batch applied, in its own span, under the same tablet.
        assert!(
            spans.iter().any(|(_, _, s)| s.name == "apply"
                && text(&s.attributes, "batch") == Some(batch.clone())
                && text(&s.attributes, "tablet") == Some(tablet.clone())),
            "no apply span of batch {batch} among {names:?}"
        );
        // Its proposal is a child of the append span, and knows its index.
        let propose = spans
            .iter()
            .find(|(_, _, s)| s.name == "propose" && s.parent_span_id == span.span_id)
            .unwrap_or_else(|| panic!("no propose child of append among {names:?}"));
        assert!(text(&propose.2.attributes, "index").is_some());
        assert!(names.contains(&"journal_group"), "{names:?}");
    }
}
