//! The client side: channels to `https://` endpoints that trust the cell
//! CA and check *who* answers rather than which host name it has.
//!
//! A Stele endpoint is dialled by host name or address, and may move
//! (containers, `--advertise`), so server certificates are not bound to
//! hosts. A client instead says which kind of server it expects (a node
//! for the data API, a controller, a directory member), and the server's
//! certificate must chain to a trusted root and carry a role of that kind:
//! a node's certificate cannot answer for a controller. The check is
//! rustls' WebPKI verification (chain, validity, server-auth usage), run
//! with the role's DNS name as the server name.
//!
//! `http://` endpoints get a plaintext channel (dev cells, loopback).

use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tonic::transport::{Channel, Endpoint};

use crate::creds::Credentials;
use crate::roles::{Kind, roles_of};
use crate::{Error, Result, provider};

/// A client's TLS settings: its credentials (roots, and maybe a
/// certificate to present). Cheap to clone.
#[derive(Clone, Debug)]
pub struct ClientTls {
    creds: Arc<Credentials>,
}

impl ClientTls {
    pub fn new(creds: Arc<Credentials>) -> ClientTls {
        ClientTls { creds }
    }

    pub fn credentials(&self) -> &Arc<Credentials> {
        &self.creds
    }

    /// The rustls config for a server of kind `expect`.
    pub fn config(&self, expect: Kind) -> Arc<rustls::ClientConfig> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("aws-lc-rs supports the default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RoleVerifier {
                creds: self.creds.clone(),
                expect,
            }))
            .with_client_cert_resolver(Arc::new(Presenter(self.creds.clone())));
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(cfg)
    }
}

/// A lazily connected channel to `endpoint`: TLS for `https://` (with
/// `tls`, expecting a server of kind `expect`), plaintext for `http://`.
pub fn channel(
    endpoint: &str,
    tls: Option<&ClientTls>,
    expect: Kind,
    connect_timeout: Duration,
) -> Result<Channel> {
    // TLS is this module's connector's work: tonic is given the endpoint
    // as `http://` (its own TLS, which cannot check roles, would refuse
    // an `https://` endpoint with a connector of ours).
    let (https, plain) = match endpoint.strip_prefix("https://") {
        Some(rest) => (true, format!("http://{rest}")),
        None => (false, endpoint.to_string()),
    };
    let ep = Endpoint::from_shared(plain)
        .map_err(|e| Error::Endpoint {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        })?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    match (https, tls) {
        (false, _) => Ok(ep.connect_lazy()),
        (true, None) => Err(Error::TlsNeeded {
            endpoint: endpoint.to_string(),
        }),
        (true, Some(tls)) => {
            let config = tls.config(expect);
            let connector = tower_service_fn(move |uri: Uri| {
                let config = config.clone();
                async move { connect(uri, config, connect_timeout).await }
            });
            Ok(ep.connect_with_connector_lazy(connector))
        }
    }
}

async fn connect(
    uri: Uri,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> std::io::Result<TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>> {
    let invalid =
        |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
    let host = uri.host().ok_or_else(|| invalid("endpoint has no host"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let name = ServerName::try_from(host.clone()).map_err(|_| invalid("bad host name"))?;
    let work = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        tcp.set_nodelay(true)?;
        tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
    };
    match tokio::time::timeout(timeout + crate::server::HANDSHAKE_TIMEOUT, work).await {
        Ok(Ok(tls)) => Ok(TokioIo::new(tls)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("connect and TLS handshake to {host}:{port} timed out"),
        )),
    }
}

/// A `tower::Service<Uri>` from a closure (what `tower::service_fn` does).
fn tower_service_fn<F, Fut>(f: F) -> ServiceFn<F>
where
    F: FnMut(Uri) -> Fut,
{
    ServiceFn(f)
}

#[derive(Clone)]
struct ServiceFn<F>(F);

impl<F, Fut, T> tower_service::Service<Uri> for ServiceFn<F>
where
    F: FnMut(Uri) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<T>>,
{
    type Response = T;
    type Error = std::io::Error;
    type Future = Fut;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Fut {
        (self.0)(uri)
    }
}

/// Presents the process's current certificate, if it has one.
#[derive(Debug)]
struct Presenter(Arc<Credentials>);

impl ResolvesClientCert for Presenter {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.0.loaded().key.clone()
    }

    fn has_certs(&self) -> bool {
        self.0.has_identity()
    }
}

/// Accepts a server certificate that chains to a trusted root and
/// carries a role of kind `expect`.
#[derive(Debug)]
struct RoleVerifier {
    creds: Arc<Credentials>,
    expect: Kind,
}

impl ServerCertVerifier for RoleVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let roles = roles_of(end_entity).map_err(|e| rustls::Error::General(e.to_string()))?;
        let role = roles
            .iter()
            .find(|r| r.kind() == self.expect)
            .ok_or_else(|| {
                rustls::Error::General(format!(
                    "the server is not a {}: its certificate names {}",
                    self.expect,
                    roles
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        let name = ServerName::try_from(role.dns_name())
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        self.creds.loaded().server_verifier.verify_server_cert(
            end_entity,
            intermediates,
            &name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.creds
            .loaded()
            .server_verifier
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.creds
            .loaded()
            .server_verifier
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.creds
            .loaded()
            .server_verifier
            .supported_verify_schemes()
    }
}
