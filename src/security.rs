//! TLS for a server process's gRPC listener, and for the CLI's calls.
//!
//! ```text
//! stele server
//!   --certs DIR                    TLS: DIR/node.pem + node.key (this process's
//!                                  certificate, naming each of its roles), ca.pem
//!   no --certs, --listen loopback  plaintext (a single process on one host)
//!   --insecure-plaintext           plaintext anywhere, logged as a warning
//!   no --certs, not loopback       refused at start
//! CLI (every command that calls a cell)
//!   --certs-dir DIR / STELE_CERTS_DIR   DIR/ca.pem, and DIR/operator.pem +
//!                                       operator.key when present
//! ```
//!
//! A TLS server reloads its certificate, key and roots when a file
//! changes or on SIGHUP (`stele_tls::creds`); the node-to-node QUIC
//! transport follows the same reloads ([`follow_in_transport`]). While its
//! certificate expires within 30 days it warns at start and daily
//! (`stele_tls::expiry`).

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use stele_proto::addr::{Host, HostPort};
use stele_tls::{ClientTls, Credentials, Files, Role};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// The file stem of a server process's certificate in its `--certs` dir.
pub const SERVER_STEM: &str = "node";
/// The file stem of an operator's certificate in `--certs-dir`.
pub const OPERATOR_STEM: &str = "operator";
/// How often a server checks its certificate files for a change.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Whether an address is this host's alone (plaintext is allowed there).
pub fn is_loopback(listen: &HostPort) -> bool {
    match &listen.host {
        Host::Ip(ip) => ip.is_loopback(),
        Host::Name(n) => n == "localhost",
    }
}

/// The credentials of a server process's gRPC listener: `Some` for TLS,
/// `None` for plaintext. Refuses plaintext off loopback unless
/// `insecure_plaintext`, and a certificate that lacks one of `roles`.
pub fn server_credentials(
    certs: Option<&Path>,
    insecure_plaintext: bool,
    listen: &HostPort,
    roles: &[Role],
) -> anyhow::Result<Option<Arc<Credentials>>> {
    if insecure_plaintext {
        if is_loopback(listen) {
            tracing::info!(%listen, "gRPC listener is plaintext (--insecure-plaintext)");
        } else {
            tracing::warn!(%listen, "INSECURE: gRPC listener is plaintext on a non-loopback address (--insecure-plaintext): anyone who reaches it may call every API");
            eprintln!(
                "stele: WARNING: --insecure-plaintext: the gRPC listener {listen} takes unauthenticated plaintext calls"
            );
        }
        return Ok(None);
    }
    let Some(dir) = certs else {
        anyhow::ensure!(
            is_loopback(listen),
            "refusing a plaintext gRPC listener on {listen}: give --certs DIR (TLS; see `stele cert`) or --insecure-plaintext"
        );
        return Ok(None);
    };
    let creds = Credentials::load(Files::in_dir(dir, SERVER_STEM))
        .with_context(|| format!("load TLS credentials from {}", dir.display()))?;
    let have = creds.roles();
    for role in roles {
        anyhow::ensure!(
            have.contains(role),
            "the certificate in {} does not name {role} (it names {}); issue one with `stele cert issue`",
            dir.display(),
            have.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    // A reload must keep every role too: a rotated certificate that drops
    // one is refused like a malformed file.
    creds.require(roles);
    Ok(Some(creds))
}

/// Keeps `creds` current: reloads on a file change or SIGHUP, until
/// `cancel`; warns while the certificate is close to expiry.
pub fn keep_fresh(creds: &Arc<Credentials>, cancel: &CancellationToken) {
    stele_tls::creds::watch(creds.clone(), WATCH_EVERY, cancel.clone());
    stele_tls::expiry::warn_before_expiry(
        creds.clone(),
        stele_tls::expiry::WARN_WITHIN,
        stele_tls::expiry::CHECK_EVERY,
        cancel.clone(),
    );
    let mut changes = creds.changes();
    let followed = creds.clone();
    let stop = cancel.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            tracing::info!(
                serial = followed.serial().as_deref().unwrap_or("-"),
                "TLS credentials reloaded: new handshakes present this certificate"
            );
        }
    });
    let creds = creds.clone();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            return;
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            match creds.reload() {
                Ok(()) => eprintln!("stele: SIGHUP: TLS credentials reloaded"),
                Err(e) => eprintln!("stele: SIGHUP: TLS credentials not reloaded: {e:#}"),
            }
        }
    });
}

/// Makes the node-to-node transport present what `creds` (read from
/// `dir`, the same `--certs`) present after each reload, until `cancel`.
/// The transport reads the files again; if they no longer load, or name
/// another node, it keeps its certificate and says why.
pub fn follow_in_transport(
    creds: &Arc<Credentials>,
    dir: &Path,
    transport: Arc<stele_node::transport::Transport>,
    cancel: &CancellationToken,
) {
    let mut changes = creds.changes();
    let dir = dir.to_path_buf();
    let cancel = cancel.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            let reloaded = stele_node::certs::NodeIdentity::load(&dir)
                .map_err(anyhow::Error::from)
                .and_then(|id| Ok(transport.reload_identity(&id)?));
            match reloaded {
                Ok(()) => tracing::info!(
                    serial = transport.certificate_serial(),
                    "node-to-node transport: new connections present the reloaded certificate"
                ),
                Err(e) => tracing::warn!(
                    error = %e,
                    "node-to-node transport: reloaded certificate not taken; keeping the one in use"
                ),
            }
        }
    });
}

/// The client side of the same credentials (a server calling its peers,
/// controllers or the directory).
pub fn client_of(creds: &Option<Arc<Credentials>>) -> Option<ClientTls> {
    creds.as_ref().map(|c| ClientTls::new(c.clone()))
}

/// The CLI's TLS settings, set once at start ([`set_cli`]).
static CLI_TLS: OnceLock<Option<ClientTls>> = OnceLock::new();
/// Where the CLI's token comes from: `--token-file` / `STELE_TOKEN_FILE`.
static CLI_TOKEN_FILE: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();
/// `--certs-dir` / `STELE_CERTS_DIR`, for [`cli_anonymous`].
static CLI_CERTS_DIR: OnceLock<Option<std::path::PathBuf>> = OnceLock::new();

/// Loads the CLI's TLS from `--certs-dir` / `STELE_CERTS_DIR`: `DIR/ca.pem`,
/// with `DIR/operator.pem` + `operator.key` when both exist; notes where
/// its token is.
pub fn set_cli(dir: Option<&Path>, token_file: Option<&Path>) -> anyhow::Result<()> {
    let tls = cli_tls(dir)?;
    let _ = CLI_TLS.set(tls);
    let _ = CLI_CERTS_DIR.set(dir.map(Path::to_path_buf));
    let _ = CLI_TOKEN_FILE.set(token_file.map(Path::to_path_buf));
    Ok(())
}

/// The CLI's token, as text: `STELE_TOKEN`, else the token file.
pub fn cli_token_text() -> anyhow::Result<Option<String>> {
    if let Ok(t) = std::env::var("STELE_TOKEN")
        && !t.trim().is_empty()
    {
        return Ok(Some(t.trim().to_string()));
    }
    match CLI_TOKEN_FILE.get().cloned().flatten() {
        None => Ok(None),
        Some(path) => {
            let t = std::fs::read_to_string(&path)
                .with_context(|| format!("read token file {}", path.display()))?;
            Ok(Some(t.trim().to_string()))
        }
    }
}

/// The CLI's token, ready to send (none without one).
fn cli_token() -> anyhow::Result<stele_tls::token::Bearer> {
    match cli_token_text()? {
        None => Ok(stele_tls::token::Bearer::none()),
        Some(t) => stele_tls::token::Bearer::new(&t).context("STELE_TOKEN / --token-file"),
    }
}

/// The CLI's TLS settings (none without `--certs-dir`).
pub fn cli() -> Option<ClientTls> {
    CLI_TLS.get().cloned().flatten()
}

/// The CLI's TLS trusting the cell CA and presenting no certificate (a
/// gateway that must not lend its identity to tokenless requests); none
/// without `--certs-dir`.
pub fn cli_anonymous() -> anyhow::Result<Option<ClientTls>> {
    let Some(dir) = CLI_CERTS_DIR.get().cloned().flatten() else {
        return Ok(None);
    };
    let creds = Credentials::load(Files::roots_only(&dir))
        .with_context(|| format!("load the CA from {}", dir.display()))?;
    Ok(Some(ClientTls::new(creds)))
}

/// Client options of a CLI command: defaults, with the CLI's TLS and
/// token.
pub fn cli_options() -> anyhow::Result<stele_client::ClientOptions> {
    Ok(stele_client::ClientOptions {
        tls: cli(),
        token: cli_token()?,
        ..Default::default()
    })
}

/// A lazily connected channel from the CLI to one member of kind `kind`.
pub fn cli_channel(endpoint: &str, kind: stele_tls::Kind) -> anyhow::Result<Channel> {
    Ok(stele_tls::channel(
        endpoint,
        cli().as_ref(),
        kind,
        Duration::from_secs(2),
    )?)
}

fn cli_tls(dir: Option<&Path>) -> anyhow::Result<Option<ClientTls>> {
    let Some(dir) = dir else {
        return Ok(None);
    };
    let identity = Files::in_dir(dir, OPERATOR_STEM);
    let files = match &identity.cert {
        Some((c, k)) if c.exists() && k.exists() => identity,
        _ => Files::roots_only(dir),
    };
    let creds = Credentials::load(files)
        .with_context(|| format!("load TLS credentials from {}", dir.display()))?;
    Ok(Some(ClientTls::new(creds)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plaintext_only_on_loopback_or_when_told() {
        let hp = |s: &str| s.parse::<HostPort>().unwrap();
        for ok in ["127.0.0.1:1", "[::1]:1", "localhost:1"] {
            assert!(
                server_credentials(None, false, &hp(ok), &[])
                    .unwrap()
                    .is_none()
            );
        }
        for bad in ["0.0.0.0:1", "10.1.2.3:1", "node1:1", "[::]:1"] {
            let e = server_credentials(None, false, &hp(bad), &[]).unwrap_err();
            assert!(e.to_string().contains("--insecure-plaintext"), "{e}");
            assert!(
                server_credentials(None, true, &hp(bad), &[])
                    .unwrap()
                    .is_none()
            );
        }
    }
}
