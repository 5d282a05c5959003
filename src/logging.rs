//! Logs on stderr: text for people, JSON lines for collectors
//! (`--log-format`, `STELE_LOG_FORMAT`), levels from `RUST_LOG`.
//!
//! openraft warns about things a Stele cell does routinely: a vote answer
//! arriving after the candidate moved on (every group's first election),
//! and peers that do not host a group yet (replicas are created by the
//! controller's assignments, a moment after their group's first messages).
//! Those lines are demoted: shown only when `RUST_LOG` asks openraft for
//! debug or more. Anything else openraft says at WARN stays.
//!
//! With the `otel` feature and a collector, spans are also exported
//! (`crate::otel`), through a filter of their own.

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The levels a bare `stele` logs at.
const DEFAULT_FILTER: &str = "warn,stele=info,stele_node=info";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line (timestamp, level, target, fields, spans).
    Json,
}

impl LogFormat {
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

static FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// The format [`init`] set (text before).
pub fn format() -> LogFormat {
    FORMAT.get().copied().unwrap_or(LogFormat::Text)
}

/// Messages of openraft's WARN events that are routine here.
const ROUTINE: &[&str] = &[
    "A message will be ignored because",
    "is not hosted here",
    // A peer in its own graceful stop (every `stele dev --nodes` child
    // stops at once on Ctrl-C).
    "raft stopped",
];

/// Whether an openraft WARN event is routine start-up (or move) chatter.
pub fn routine(target: &str, message: &str) -> bool {
    target.starts_with("openraft") && ROUTINE.iter().any(|p| message.contains(p))
}

/// The filter that drops routine openraft warnings unless asked for.
struct Chatter {
    show: bool,
}

#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        // The message and any field a routine pattern may sit in (openraft
        // puts the error in `error` for some of them).
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl<S> Filter<S> for Chatter {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let meta = event.metadata();
        if self.show || *meta.level() != Level::WARN || !meta.target().starts_with("openraft") {
            return true;
        }
        let mut m = Message::default();
        event.record(&mut m);
        !routine(meta.target(), &m.0)
    }
}

/// Whether `filter` (a `RUST_LOG` value) asks openraft for debug or more.
fn wants_raft_debug(filter: &str) -> bool {
    filter.split(',').any(|d| {
        let d = d.trim();
        let level = d.rsplit_once('=').map_or(d, |(_, l)| l);
        let target_ok = !d.contains('=') || d.starts_with("openraft");
        target_ok && matches!(level, "debug" | "trace")
    })
}

/// The layer that writes log lines to stderr.
fn lines<S>(format: LogFormat) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    }
}

/// Installs the process's subscriber; with `export` (the `otel` feature:
/// a collector and who this process is), spans also go to the collector,
/// through their own filter (`crate::otel`). Inside the tokio runtime.
pub fn init(
    format: LogFormat,
    export: Option<(&str, &crate::otel::Identity)>,
) -> anyhow::Result<crate::otel::Flush> {
    let _ = FORMAT.set(format);
    let rust_log = std::env::var("RUST_LOG").unwrap_or_default();
    let env = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_FILTER.into());
    let chatter = Chatter {
        show: wants_raft_debug(&rust_log),
    };
    #[cfg(feature = "otel")]
    if let Some((url, who)) = export {
        use tracing_subscriber::filter::FilterExt;
        // RUST_LOG filters the printed lines only: the exported spans pass
        // their own filter, so they need no DEBUG lines on stderr.
        let exported = std::env::var(crate::otel::FILTER_ENV)
            .unwrap_or_else(|_| crate::otel::FILTER_DEFAULT.into());
        let exported = tracing_subscriber::EnvFilter::try_new(&exported)
            .map_err(|e| anyhow::anyhow!("{}={exported:?}: {e}", crate::otel::FILTER_ENV))?;
        let (otel, flush) = crate::otel::layer(url, who)?;
        tracing_subscriber::registry()
            .with(lines(format).with_filter(env.and(chatter)))
            .with(otel.with_filter(exported))
            .init();
        return Ok(flush);
    }
    // Without the feature, `crate::otel::choose` refused an export.
    #[cfg(not(feature = "otel"))]
    let _ = export;
    tracing_subscriber::registry()
        .with(env)
        .with(lines(format).with_filter(chatter))
        .init();
    Ok(crate::otel::Flush::none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routine_lines_and_debug_requests() {
        assert!(routine(
            "openraft::core::raft_core",
            "A message will be ignored because Candidate vote changed"
        ));
        assert!(routine(
            "openraft::replication",
            "ReplicationCore recv RPCError: node 1 answered: group 13 is not hosted here"
        ));
        assert!(!routine("openraft::core::raft_core", "storage error"));
        assert!(!routine("stele_node::agent", "group 3 is not hosted here"));
        assert!(wants_raft_debug("openraft=debug"));
        assert!(wants_raft_debug("warn,openraft::core=trace"));
        assert!(wants_raft_debug("debug"));
        assert!(!wants_raft_debug("warn,stele=debug"));
        assert!(!wants_raft_debug(""));
    }
}
