//! TLS on Stele's gRPC listeners and in its clients.
//!
//! ```text
//! roles    who a certificate speaks for (node-<id>.stele, controller-<id>.stele, ...)
//! creds    roots + own certificate/key, reloadable (SIGHUP, file change)
//! expiry   a WARN at start and daily while the certificate expires within 30 days
//! server   rustls server config, the TLS connection stream tonic serves
//! client   channels to https:// endpoints that check the server's role
//! auth     method -> role table, the layer that enforces it, Caller
//! token    namespace tokens: sign (controllers), verify (nodes), carry (clients)
//! ```
//!
//! One crypto provider, aws-lc-rs, named for every config (the QUIC
//! transport uses the same; with two providers compiled in, rustls'
//! default builders panic).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub mod auth;
pub mod client;
pub mod creds;
pub mod expiry;
pub mod roles;
pub mod server;
pub mod token;

pub use auth::{AuthLayer, Caller, Policy};
pub use client::{ClientTls, channel};
pub use creds::{Credentials, Files};
pub use roles::{Kind, Role};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", .path.display())]
    BadFile { path: PathBuf, reason: String },
    #[error("a TLS listener needs a certificate and key; these credentials hold only roots")]
    NoIdentity,
    #[error("TLS configuration: {0}")]
    Config(String),
    #[error("{endpoint}: not a usable endpoint: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error(
        "{endpoint} is https:// but this client has no CA to trust (give --certs-dir or STELE_CERTS_DIR)"
    )]
    TlsNeeded { endpoint: String },
}

/// The crypto provider of every TLS config (aws-lc-rs).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    static PROVIDER: OnceLock<Arc<rustls::crypto::CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .clone()
}
