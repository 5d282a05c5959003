//! rustls and quinn configurations for mutual TLS against the cell CA.
//!
//! One crypto provider (aws-lc-rs) is named explicitly for every config:
//! with two providers compiled in, rustls' default builders panic
//! (STACK.md). TLS 1.3 only, ALPN `stele-node/1` on both sides.

use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::CertificateDer;

use super::error::{Error, IdentityError, Result};
use crate::certs::{self, NodeIdentity};

pub const ALPN: &[u8] = b"stele-node/1";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn roots(identity: &NodeIdentity) -> Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    for ca in identity.roots() {
        roots
            .add(ca.clone())
            .map_err(|e| Error::Tls(format!("cell CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

fn tls(e: rustls::Error) -> Error {
    Error::Tls(e.to_string())
}

pub fn server_config(
    identity: &NodeIdentity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ServerConfig> {
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(identity)?, provider())
        .build()
        .map_err(|e| Error::Tls(format!("client verifier: {e}")))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.cert_chain().to_vec(), identity.key().clone_key())
        .map_err(tls)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicServerConfig::try_from(cfg).map_err(|e| Error::Tls(e.to_string()))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(quic));
    server.transport_config(transport);
    Ok(server)
}

pub fn client_config(
    identity: &NodeIdentity,
    transport: Arc<quinn::TransportConfig>,
) -> Result<quinn::ClientConfig> {
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots(identity)?)
        .with_client_auth_cert(identity.cert_chain().to_vec(), identity.key().clone_key())
        .map_err(tls)?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(cfg).map_err(|e| Error::Tls(e.to_string()))?;
    let mut client = quinn::ClientConfig::new(Arc::new(quic));
    client.transport_config(transport);
    Ok(client)
}

/// The node id in the verified client certificate of an accepted connection.
pub fn peer_node_id(conn: &quinn::Connection) -> Result<u64, IdentityError> {
    let identity = conn.peer_identity().ok_or(IdentityError::NoCertificate)?;
    let chain = identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| IdentityError::NotACertificateChain)?;
    let leaf = chain.first().ok_or(IdentityError::EmptyChain)?;
    Ok(certs::node_id_of(leaf)?)
}
