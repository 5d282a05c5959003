//! OpenTelemetry export of the process's tracing spans (the write path's
//! spans, `stele_node::trace`) over OTLP/gRPC, behind the `otel` cargo
//! feature.
//!
//! ```text
//! tracing spans ──► OpenTelemetryLayer (own filter, STELE_OTEL_FILTER)
//!     ──► batch span processor (its own thread) ──► OTLP/gRPC (tonic) ──► collector
//! ```
//!
//! Switched on at run time by `--otlp-endpoint URL` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`, for the server processes (`stele server`,
//! `stele dev`; a dev cell hands the endpoint to its children). The
//! resource is the process: `service.name` its roles (`node`, `controller`,
//! `node+controller`, `directory`), `stele.node.id`, `stele.controller.id`,
//! `stele.directory.id`, `stele.cell.id`. The processor is flushed when the
//! process stops ([`Flush::run`]). A build without the feature refuses the
//! flag, and warns when only the variable is set: it is never silently
//! ignored.

use std::sync::OnceLock;

/// The standard variable naming the collector.
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Which spans are exported (`EnvFilter` syntax), apart from `RUST_LOG`:
/// the write path's DEBUG spans without printing DEBUG lines.
#[cfg(feature = "otel")]
pub const FILTER_ENV: &str = "STELE_OTEL_FILTER";

/// The filter exported spans pass by default.
#[cfg(feature = "otel")]
pub const FILTER_DEFAULT: &str = "warn,stele=info,stele_node=debug";

/// Who a process is to a collector: the OpenTelemetry resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `service.name`: the roles this process runs, `+`-joined.
    pub service: String,
    /// Resource attributes (`stele.node.id`, `stele.cell.id`, ...).
    pub attributes: Vec<(&'static str, String)>,
}

static ENDPOINT: OnceLock<String> = OnceLock::new();

/// The collector this process exports to, if any (`stele dev` hands it to
/// the processes of a dev cell).
pub fn endpoint() -> Option<&'static str> {
    ENDPOINT.get().map(String::as_str)
}

/// Decides the collector from the flag (which wins) and the environment.
/// `exports`: whether this command runs a process whose spans are
/// exported (servers) or that hands the endpoint on (a dev cell).
pub fn choose(flag: Option<&str>, env: Option<String>, exports: bool) -> anyhow::Result<Choice> {
    let chosen = flag.map(str::to_string).or(env.filter(|e| !e.is_empty()));
    let Some(url) = chosen else {
        return Ok(Choice::Off);
    };
    if !cfg!(feature = "otel") {
        anyhow::ensure!(
            flag.is_none(),
            "--otlp-endpoint {url}: this stele was built without the otel feature \
             (cargo build --features otel)"
        );
        return Ok(if exports {
            Choice::Unsupported(url)
        } else {
            Choice::Off
        });
    }
    if !exports {
        anyhow::ensure!(
            flag.is_none(),
            "--otlp-endpoint: only `stele server` and `stele dev` export spans"
        );
        return Ok(Choice::Off);
    }
    let _ = ENDPOINT.set(url.clone());
    Ok(Choice::Export(url))
}

/// What [`choose`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Off,
    /// Export to this collector.
    Export(String),
    /// Only the variable named one, in a build without the feature: warn.
    Unsupported(String),
}

/// Flushes and stops the exporter when the process is done.
#[must_use = "run it before the runtime drops, or buffered spans are lost"]
pub struct Flush {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Flush {
    pub fn none() -> Flush {
        Flush {
            #[cfg(feature = "otel")]
            provider: None,
        }
    }

    /// Exports what is buffered and stops the exporter. Call it while the
    /// tokio runtime still runs (the gRPC channel's task lives there), on a
    /// thread outside it.
    pub fn run(self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown_with_timeout(std::time::Duration::from_secs(5))
        {
            eprintln!("stele: exporting the last spans failed: {e}");
        }
    }
}

/// The layer that exports spans to `url` as `who`, and its [`Flush`].
/// Must run inside the tokio runtime (tonic's channel starts there).
#[cfg(feature = "otel")]
pub fn layer<S>(
    url: &str,
    who: &Identity,
) -> anyhow::Result<(
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
    Flush,
)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use anyhow::Context;
    use opentelemetry::KeyValue;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;

    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(url)
        .build()
        .with_context(|| format!("OTLP exporter for {url}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(who.service.clone())
        .with_attributes(
            who.attributes
                .iter()
                .map(|(k, v)| KeyValue::new(*k, v.clone())),
        )
        .build();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("stele");
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    Ok((
        layer,
        Flush {
            provider: Some(provider),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_and_a_build_without_the_feature_refuses_it() {
        let env = || Some("http://env:4317".to_string());
        assert_eq!(choose(None, None, true).unwrap(), Choice::Off);
        assert_eq!(
            choose(None, Some(String::new()), true).unwrap(),
            Choice::Off
        );
        let flag = choose(Some("http://flag:4317"), env(), true);
        let from_env = choose(None, env(), true).unwrap();
        if cfg!(feature = "otel") {
            assert_eq!(flag.unwrap(), Choice::Export("http://flag:4317".into()));
            assert_eq!(from_env, Choice::Export("http://env:4317".into()));
            let client = choose(Some("http://flag:4317"), None, false).unwrap_err();
            assert!(
                client.to_string().contains("only `stele server`"),
                "{client}"
            );
        } else {
            let e = flag.unwrap_err().to_string();
            assert!(e.contains("built without the otel feature"), "{e}");
            assert_eq!(from_env, Choice::Unsupported("http://env:4317".into()));
        }
        // A client command with only the variable set exports nothing.
        assert_eq!(choose(None, env(), false).unwrap(), Choice::Off);
    }

    /// `crate::telemetry` of a command line.
    fn who(args: &[&str]) -> (bool, Option<Identity>) {
        use clap::Parser;
        let cli = crate::Cli::try_parse_from(args).expect("command line");
        crate::telemetry(&cli.command)
    }

    #[test]
    fn each_process_names_its_roles_and_ids() {
        let server = [
            "stele",
            "server",
            "--listen",
            "127.0.0.1:1",
            "--data-dir",
            "d",
        ];
        let with = |extra: &[&'static str]| [&server[..], extra].concat();
        let (exports, id) = who(&with(&[
            "--roles",
            "node,controller",
            "--node-id",
            "4",
            "--controller-id",
            "2",
            "--cell-id",
            "eu-1",
        ]));
        assert!(exports);
        let id = id.expect("a server exports");
        assert_eq!(id.service, "node+controller");
        assert_eq!(
            id.attributes,
            vec![
                ("stele.node.id", "4".to_string()),
                ("stele.controller.id", "2".to_string()),
                ("stele.cell.id", "eu-1".to_string()),
            ]
        );
        let (_, id) = who(&with(&["--roles", "directory", "--directory-id", "3"]));
        let id = id.unwrap();
        assert_eq!(id.service, "directory");
        assert_eq!(id.attributes, vec![("stele.directory.id", "3".to_string())]);
        let (exports, id) = who(&["stele", "dev"]);
        assert!(exports);
        assert_eq!(id.unwrap().service, "node");
        // A dev cell hands the collector to its processes and is none.
        assert_eq!(who(&["stele", "dev", "--nodes", "3"]), (true, None));
        assert_eq!(who(&["stele", "status"]), (false, None));
    }
}
