//! The server side: a rustls config that presents the process's current
//! certificate and asks for (but does not demand) a client certificate
//! from the cell CA, and the stream of TLS connections tonic serves.
//!
//! A client without a certificate still connects: what it may call is the
//! authorization layer's decision ([`crate::auth`]), which answers
//! `PermissionDenied` rather than a bare TLS failure. A client certificate
//! that does not chain to the trusted roots fails the handshake.
//!
//! Handshakes run in their own tasks (at most 10 s each), so a slow or
//! hostile client never holds up the accept loop.

use std::sync::Arc;
use std::time::Duration;

use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::creds::Credentials;
use crate::provider;

/// Longest TLS handshake a server waits for.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The rustls server config of a process with `creds` (which must hold
/// a certificate): TLS 1.2 and 1.3, ALPN `h2`.
pub fn config(creds: Arc<Credentials>) -> crate::Result<Arc<rustls::ServerConfig>> {
    if !creds.has_identity() {
        return Err(crate::Error::NoIdentity);
    }
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| crate::Error::Config(e.to_string()))?
        .with_client_cert_verifier(Arc::new(ClientVerifier(creds.clone())))
        .with_cert_resolver(Arc::new(Resolver(creds)));
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

#[derive(Debug)]
struct Resolver(Arc<Credentials>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.loaded().key.clone()
    }
}

/// Verifies client certificates against the roots trusted now.
#[derive(Debug)]
struct ClientVerifier(Arc<Credentials>);

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: a client presents the one certificate it has.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .loaded()
            .client_verifier
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .loaded()
            .client_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .loaded()
            .client_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.loaded().client_verifier.supported_verify_schemes()
    }
}

/// The TLS connections accepted on `listener` until `cancel`, for
/// `serve_with_incoming`. Failed handshakes are logged and counted
/// (`stele_tls_handshake_failures_total`), never returned.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    cancel: CancellationToken,
) -> ReceiverStream<std::io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel::<std::io::Result<TlsStream<TcpStream>>>(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        metrics::counter!("stele_tls_handshake_failures_total").increment(1);
                        tracing::info!(%peer, error = %e, "TLS handshake refused");
                    }
                    Err(_) => {
                        metrics::counter!("stele_tls_handshake_failures_total").increment(1);
                        tracing::info!(%peer, "TLS handshake timed out");
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// What a TLS listener needs: the rustls config and the method table.
#[derive(Clone)]
pub struct Secure {
    pub config: Arc<rustls::ServerConfig>,
    pub policy: crate::Policy,
}

impl Secure {
    /// A listener presenting `creds`' certificate, enforcing `policy`.
    pub fn new(creds: Arc<Credentials>, policy: crate::Policy) -> crate::Result<Secure> {
        Ok(Secure {
            config: config(creds)?,
            policy,
        })
    }
}
