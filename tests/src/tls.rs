//! The test process's cell CA: every cell a test starts gets its
//! certificates from it (`make_certs` copies it into the cell's `ca/`),
//! so one operator identity and one client TLS setting serve every cell
//! of the process: [`client_tls`] for in-process clients, `STELE_CERTS_DIR`
//! for the CLI (`run`). Tests of a foreign CA make their own.
//!
//! Files live under `target/tmp/test-ca-<pid>` (build output, like the
//! binaries), made once per test process.

use std::path::PathBuf;
use std::sync::OnceLock;

use stele_tls::{ClientTls, Credentials, Files};

pub struct TestCa {
    /// `ca.pem` and `ca.key`.
    pub ca: PathBuf,
    /// `operator.pem`, `operator.key` and `ca.pem` of operator `test`: the
    /// CLI's `--certs-dir`.
    pub operator: PathBuf,
    /// The operator's client TLS, for in-process clients.
    pub client: ClientTls,
}

/// The process's CA, made on first use.
pub fn test_ca() -> &'static TestCa {
    static CA: OnceLock<TestCa> = OnceLock::new();
    CA.get_or_init(|| {
        let root = crate::target_dir()
            .join("tmp")
            .join(format!("test-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ca = root.join("ca");
        let operator = root.join("operator");
        let (ok, _, err) = crate::run_plain(&["cert", "init", "--out", ca.to_str().unwrap()]);
        assert!(ok, "test CA: {err}");
        let (ok, _, err) = crate::run_plain(&[
            "cert",
            "operator",
            "--ca",
            ca.to_str().unwrap(),
            "--name",
            "test",
            "--out",
            operator.to_str().unwrap(),
        ]);
        assert!(ok, "test operator certificate: {err}");
        let creds = Credentials::load(Files::in_dir(&operator, "operator")).expect("test operator");
        TestCa {
            ca,
            operator,
            client: ClientTls::new(creds),
        }
    })
}

/// Client TLS with the test CA and the test operator's certificate.
pub fn client_tls() -> ClientTls {
    test_ca().client.clone()
}

/// Client TLS that trusts the test CA and proves no identity (a data
/// client without a certificate).
pub fn anonymous_tls() -> ClientTls {
    let creds = Credentials::load(Files::roots_only(&test_ca().operator)).expect("test CA");
    ClientTls::new(creds)
}

/// Client TLS presenting the server certificate in `dir` (`node.pem`):
/// a caller with a node's or a controller's identity.
pub fn identity(dir: &std::path::Path) -> ClientTls {
    let creds = Credentials::load(Files::in_dir(dir, "node")).expect("server certificate");
    ClientTls::new(creds)
}

/// A lazily connected channel to `endpoint` (TLS for `https://`)
/// expecting a server of kind `kind`.
pub fn channel(
    endpoint: &str,
    tls: &ClientTls,
    kind: stele_tls::Kind,
) -> tonic::transport::Channel {
    stele_tls::channel(endpoint, Some(tls), kind, std::time::Duration::from_secs(2))
        .expect("endpoint")
}

/// A raw data-API client of one node, as the test operator.
pub fn data_client(
    endpoint: &str,
) -> stele_proto::pb::data_client::DataClient<tonic::transport::Channel> {
    stele_proto::pb::data_client::DataClient::new(channel(
        endpoint,
        &client_tls(),
        stele_tls::Kind::Node,
    ))
    .max_decoding_message_size(64 << 20)
}
