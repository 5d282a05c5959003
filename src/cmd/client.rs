//! What the data subcommands (`append`, `scan`, `bench`, `status`) share:
//! the default endpoint, a client for a namespace's cell, and positions as
//! text and JSON.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use stele_client::{Client, Position};

/// Where a local node listens by default.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7450";

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

pub fn position_json(p: &Position) -> serde_json::Value {
    serde_json::json!({ "tablet": p.tablet, "index": p.index, "slot": p.slot })
}

pub fn position_text(p: Option<&Position>) -> String {
    p.map_or_else(
        || "-".into(),
        |p| format!("{}:{}:{}", p.tablet, p.index, p.slot),
    )
}

/// A client of the cell that holds `namespace`: through the node at
/// `endpoint` when one is given; else through the directory when one is
/// (which may create the namespace on first use, if it allows that); else
/// through the local node ([`DEFAULT_ENDPOINT`]).
pub async fn client_for(
    endpoint: Option<&str>,
    directory: &[String],
    namespace: &str,
) -> anyhow::Result<Client> {
    if let Some(endpoint) = endpoint {
        if !directory.is_empty() {
            eprintln!("stele: --endpoint {endpoint} given: not routing through the directory");
        }
        return Client::connect(endpoint, crate::security::cli_options()?)
            .await
            .with_context(|| format!("connecting to {endpoint}"));
    }
    if directory.is_empty() {
        let endpoint = DEFAULT_ENDPOINT;
        return Client::connect(endpoint, crate::security::cli_options()?)
            .await
            .with_context(|| format!("connecting to {endpoint}"));
    }
    let global = stele_client::GlobalClient::new(directory, crate::security::cli_options()?)?
        .create_if_missing(true);
    global
        .cell(namespace)
        .await
        .with_context(|| format!("resolving {namespace} through the directory"))
}
