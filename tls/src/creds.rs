//! A process's TLS credentials: the roots it trusts (every certificate in
//! `ca.pem`; two during a CA rotation) and, for a server or an identified
//! client, its certificate chain and key. Every TLS config of the process
//! reads them through one [`Credentials`], so [`Credentials::reload`]
//! (SIGHUP, or a file change seen by [`watch`]) changes what new
//! handshakes present and trust without a restart; connections already
//! open keep the certificate they were made with.
//!
//! A reload that fails (a file half written, a key that does not match its
//! certificate) keeps the credentials in use and returns the error.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

use crate::roles::{Role, roles_of};
use crate::{Error, Result, provider};

/// Where the credentials are read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Files {
    /// The trusted roots: one or more PEM certificates.
    pub ca: PathBuf,
    /// This process's certificate (chain) and key; none for a client
    /// without an identity.
    pub cert: Option<(PathBuf, PathBuf)>,
}

impl Files {
    /// `DIR/ca.pem` and `DIR/<stem>.pem` + `DIR/<stem>.key`.
    pub fn in_dir(dir: &Path, stem: &str) -> Files {
        Files {
            ca: dir.join("ca.pem"),
            cert: Some((
                dir.join(format!("{stem}.pem")),
                dir.join(format!("{stem}.key")),
            )),
        }
    }

    /// `DIR/ca.pem` only: a client that proves no identity.
    pub fn roots_only(dir: &Path) -> Files {
        Files {
            ca: dir.join("ca.pem"),
            cert: None,
        }
    }

    fn paths(&self) -> Vec<&Path> {
        let mut v = vec![self.ca.as_path()];
        if let Some((c, k)) = &self.cert {
            v.push(c);
            v.push(k);
        }
        v
    }
}

/// What one load read.
pub(crate) struct Loaded {
    pub(crate) server_verifier: Arc<WebPkiServerVerifier>,
    pub(crate) client_verifier: Arc<dyn ClientCertVerifier>,
    pub(crate) key: Option<Arc<CertifiedKey>>,
    roles: Vec<Role>,
    serial: Option<String>,
    not_after: Option<SystemTime>,
    roots: usize,
}

/// A process's roots and identity, reloadable. Cheap to share (`Arc`).
pub struct Credentials {
    files: Option<Files>,
    loaded: RwLock<Arc<Loaded>>,
    /// Counts successful reloads: what reads the same files for another
    /// config (the node-to-node QUIC transport) follows it ([`Credentials::changes`]).
    reloads: tokio::sync::watch::Sender<u64>,
    /// Roles a reloaded certificate must still name ([`Credentials::require`]).
    required: RwLock<Vec<Role>>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = self.loaded();
        f.debug_struct("Credentials")
            .field("files", &self.files)
            .field("roles", &l.roles)
            .field("serial", &l.serial)
            .finish()
    }
}

impl Credentials {
    /// Reads the files; every error names the file.
    pub fn load(files: Files) -> Result<Arc<Credentials>> {
        let loaded = load_files(&files)?;
        Ok(Arc::new(Credentials {
            files: Some(files),
            loaded: RwLock::new(Arc::new(loaded)),
            reloads: tokio::sync::watch::Sender::new(0),
            required: RwLock::new(Vec::new()),
        }))
    }

    /// From PEM text held in memory (dev cells, tests); not reloadable.
    pub fn from_pem(ca: &str, cert_and_key: Option<(&str, &str)>) -> Result<Arc<Credentials>> {
        let mem = Path::new("(memory)");
        let loaded = build(
            mem,
            ca.as_bytes(),
            cert_and_key.map(|(c, k)| (mem, c.as_bytes(), mem, k.as_bytes())),
        )?;
        Ok(Arc::new(Credentials {
            files: None,
            loaded: RwLock::new(Arc::new(loaded)),
            reloads: tokio::sync::watch::Sender::new(0),
            required: RwLock::new(Vec::new()),
        }))
    }

    pub(crate) fn loaded(&self) -> Arc<Loaded> {
        self.loaded.read().expect("credentials lock").clone()
    }

    /// Reads the files again and, if they make valid credentials, uses
    /// them for every later handshake. On error the old ones stay.
    pub fn reload(&self) -> Result<()> {
        let Some(files) = &self.files else {
            return Ok(());
        };
        let fresh = load_files(files)?;
        let required = self.required.read().expect("credentials lock").clone();
        if let (Some(missing), Some((cert, _))) = (
            required.iter().find(|r| !fresh.roles.contains(r)),
            &files.cert,
        ) {
            return Err(bad(
                cert,
                format!(
                    "does not name {missing}, which this process runs as (it names {})",
                    fresh
                        .roles
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        let serial = fresh.serial.clone();
        *self.loaded.write().expect("credentials lock") = Arc::new(fresh);
        self.reloads.send_modify(|n| *n += 1);
        tracing::info!(
            serial = serial.as_deref().unwrap_or("-"),
            "TLS credentials reloaded"
        );
        Ok(())
    }

    /// Refuses, from now on, a reload whose certificate lacks one of
    /// `roles` (a server's roles, checked at start the same way).
    pub fn require(&self, roles: &[Role]) {
        *self.required.write().expect("credentials lock") = roles.to_vec();
    }

    /// Changes each time a reload succeeds; a task that builds another
    /// config from the same files waits on it (`changed()`).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// The files these credentials are read from (none from memory).
    pub fn files(&self) -> Option<&Files> {
        self.files.as_ref()
    }

    /// The roles of this process's certificate (none without one).
    pub fn roles(&self) -> Vec<Role> {
        self.loaded().roles.clone()
    }

    /// This process's certificate serial, lowercase hex.
    pub fn serial(&self) -> Option<String> {
        self.loaded().serial.clone()
    }

    /// When this process's certificate expires.
    pub fn not_after(&self) -> Option<SystemTime> {
        self.loaded().not_after
    }

    /// How many roots are trusted (two during a CA rotation).
    pub fn roots(&self) -> usize {
        self.loaded().roots
    }

    /// Whether there is a certificate to present.
    pub fn has_identity(&self) -> bool {
        self.loaded().key.is_some()
    }

    fn fingerprint(&self) -> Vec<Option<(SystemTime, u64)>> {
        let Some(files) = &self.files else {
            return Vec::new();
        };
        files
            .paths()
            .into_iter()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
            })
            .collect()
    }
}

/// Reloads `creds` whenever one of its files changes (checked every
/// `every`), until `cancel`. A failed reload is logged and retried at the
/// next change.
pub fn watch(creds: Arc<Credentials>, every: Duration, cancel: CancellationToken) {
    tokio::spawn(async move {
        let mut seen = creds.fingerprint();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let now = creds.fingerprint();
            if now == seen {
                continue;
            }
            seen = now;
            if let Err(e) = creds.reload() {
                tracing::warn!(error = %e, "TLS credentials changed on disk but did not load; keeping the ones in use");
            }
        }
    });
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn load_files(files: &Files) -> Result<Loaded> {
    let ca = read(&files.ca)?;
    match &files.cert {
        None => build(&files.ca, &ca, None),
        Some((cert, key)) => {
            let c = read(cert)?;
            let k = read(key)?;
            build(&files.ca, &ca, Some((cert, &c, key, &k)))
        }
    }
}

fn bad(path: &Path, reason: impl ToString) -> Error {
    Error::BadFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(path, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn build(
    ca_path: &Path,
    ca_pem: &[u8],
    identity: Option<(&Path, &[u8], &Path, &[u8])>,
) -> Result<Loaded> {
    let provider = provider();
    let mut store = RootCertStore::empty();
    let root_ders = certs(ca_path, ca_pem)?;
    for der in &root_ders {
        store
            .add(der.clone())
            .map_err(|e| bad(ca_path, format!("not a usable CA certificate: {e}")))?;
    }
    let store = Arc::new(store);
    let server_verifier =
        WebPkiServerVerifier::builder_with_provider(store.clone(), provider.clone())
            .build()
            .map_err(|e| bad(ca_path, e))?;
    let client_verifier = WebPkiClientVerifier::builder_with_provider(store, provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| bad(ca_path, e))?;
    let (key, roles, serial, not_after) = match identity {
        None => (None, Vec::new(), None, None),
        Some((cert_path, cert_pem, key_path, key_pem)) => {
            let chain = certs(cert_path, cert_pem)?;
            let key = PrivateKeyDer::from_pem_slice(key_pem)
                .map_err(|e| bad(key_path, format!("not a PEM private key: {e}")))?;
            let certified = CertifiedKey::from_der(chain.clone(), key, &provider).map_err(|e| {
                bad(
                    key_path,
                    format!("does not match {}: {e}", cert_path.display()),
                )
            })?;
            let roles = roles_of(&chain[0]).map_err(|e| bad(cert_path, e))?;
            let (serial, not_after) =
                serial_and_expiry(&chain[0]).map_err(|e| bad(cert_path, e))?;
            (
                Some(Arc::new(certified)),
                roles,
                Some(serial),
                Some(not_after),
            )
        }
    };
    Ok(Loaded {
        server_verifier,
        client_verifier,
        key,
        roles,
        serial,
        not_after,
        roots: root_ders.len(),
    })
}

/// A certificate's serial (lowercase hex) and its end of validity.
pub fn serial_and_expiry(
    cert: &CertificateDer<'_>,
) -> std::result::Result<(String, SystemTime), String> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| format!("unparsable certificate: {e}"))?;
    let serial = x509
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let secs = x509.validity().not_after.timestamp();
    let not_after = if secs >= 0 {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        SystemTime::UNIX_EPOCH
    };
    Ok((serial, not_after))
}

#[cfg(test)]
#[path = "creds_test.rs"]
mod tests;
