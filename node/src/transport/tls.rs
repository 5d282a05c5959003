//! rustls and quinn configurations for mutual TLS against the cell CA.
//!
//! One crypto provider (aws-lc-rs) is named explicitly for every config:
//! with two providers compiled in, rustls' default builders panic
//! (STACK.md). TLS 1.3 only, ALPN `stele-node/1` on both sides.
//!
//! [`Presented`] holds what the transport presents now: a new identity
//! (a rotated certificate, new roots) replaces the endpoint's server
//! config and the client config of later dials; connections already
//! open keep the certificate they were made with.

use std::sync::{Arc, Mutex};

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

/// The transport's current TLS configs and the serial they present.
pub(super) struct Presented {
    node_id: u64,
    transport: Arc<quinn::TransportConfig>,
    now: Mutex<(quinn::ClientConfig, String)>,
}

impl Presented {
    /// The configs of `identity`, and the server config for the endpoint.
    pub(super) fn new(
        identity: &NodeIdentity,
        transport: Arc<quinn::TransportConfig>,
    ) -> Result<(Presented, quinn::ServerConfig)> {
        let server = server_config(identity, transport.clone())?;
        let client = client_config(identity, transport.clone())?;
        let presented = Presented {
            node_id: identity.node_id(),
            transport,
            now: Mutex::new((client, serial(identity)?)),
        };
        Ok((presented, server))
    }

    /// The client config of a new dial.
    pub(super) fn client(&self) -> quinn::ClientConfig {
        self.now.lock().expect("tls lock").0.clone()
    }

    /// The serial of the certificate new connections present.
    pub(super) fn serial(&self) -> String {
        self.now.lock().expect("tls lock").1.clone()
    }

    /// Presents `identity` on every later connection, both ways. Refuses
    /// (and keeps the current one) an identity of another node.
    pub(super) fn replace(
        &self,
        endpoint: &quinn::Endpoint,
        identity: &NodeIdentity,
    ) -> Result<()> {
        if identity.node_id() != self.node_id {
            return Err(Error::Config(format!(
                "the new certificate names node {}, not {}",
                identity.node_id(),
                self.node_id
            )));
        }
        let server = server_config(identity, self.transport.clone())?;
        let client = client_config(identity, self.transport.clone())?;
        let serial = serial(identity)?;
        let mut now = self.now.lock().expect("tls lock");
        endpoint.set_server_config(Some(server));
        *now = (client, serial);
        Ok(())
    }
}

fn serial(identity: &NodeIdentity) -> Result<String> {
    let leaf = identity
        .cert_chain()
        .first()
        .ok_or_else(|| Error::Tls("empty certificate chain".into()))?;
    let (serial, _) = stele_tls::creds::serial_and_expiry(leaf).map_err(Error::Tls)?;
    Ok(serial)
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
