//! The cell CA and node certificates that authenticate node-to-node traffic.
//!
//! ```text
//! stele cert init  --out <ca_dir>                          -> ca.key (0600), ca.pem
//! stele cert issue --ca <ca_dir> --node-id <id> --out <out> -> node.key (0600), node.pem, ca.pem
//! NodeIdentity::load(<out>)               -> chain + key + CA roots for the transport
//! ```
//!
//! A node certificate names its node in a DNS subject alternative name
//! `node-<id>.stele` (plus `localhost` and `127.0.0.1` for development), and
//! is valid for both TLS server and client authentication: the transport uses
//! one certificate for both directions of mutual TLS. The node id a peer
//! presents is read from that name, so a node cannot claim another's id
//! without a certificate the cell CA issued for it.
//!
//! Every file is published with `fsutil::durable_write`; keys are written
//! with mode 0600. `stele dev` and tests use `NodeIdentity::ephemeral_cell`,
//! which never touches the disk.

use std::fmt;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use stele_tls::Role;

use crate::fsutil;

pub const CA_KEY_FILE: &str = "ca.key";
pub const CA_CERT_FILE: &str = "ca.pem";
pub const NODE_KEY_FILE: &str = "node.key";
pub const NODE_CERT_FILE: &str = "node.pem";
pub const OPERATOR_KEY_FILE: &str = "operator.key";
pub const OPERATOR_CERT_FILE: &str = "operator.pem";
/// Validity of a new cell CA, and of the certificates it issues by
/// default, in days.
pub const CA_DAYS: u32 = 3650;
pub const DAYS_DEFAULT: u32 = 365;
pub const DAYS_MAX: u32 = 3650;

/// The DNS suffix of node names in certificates: `node-<id>.stele`.
const NODE_NAME_PREFIX: &str = "node-";
const NODE_NAME_SUFFIX: &str = ".stele";

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of certificate handling. Each names the file involved, so an
/// operator knows which one to restore or re-issue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: missing; create it with `stele cert init --out CA` and `stele cert issue --ca CA --node-id N --out DIR`", .path.display())]
    Missing { path: PathBuf },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a valid PEM {what}: {reason}", .path.display())]
    BadPem {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("{}: a cell CA already exists; refusing to overwrite it", .path.display())]
    CaExists { path: PathBuf },
    #[error("certificate names no node (expected one DNS name `node-<id>.stele`): {reason}")]
    NoNodeName { reason: String },
    #[error("certificate generation failed: {0}")]
    Generate(String),
    #[error("{}: not a usable certificate signing request: {reason}", .path.display())]
    BadRequest { path: PathBuf, reason: String },
    #[error("node id {0}: node ids are 1..65535")]
    BadNodeId(u64),
    #[error(transparent)]
    BadRole(#[from] stele_tls::roles::RoleError),
    #[error("a certificate names an operator or server roles, not both; and at least one role")]
    MixedRoles,
    #[error("--days {0}: a certificate is valid for 1 to {max} days", max = DAYS_MAX)]
    BadValidity(u32),
    #[error("{}: a key already exists; refusing to replace it (remove it to start over)", .path.display())]
    KeyExists { path: PathBuf },
}

impl Error {
    fn io(path: &Path, source: io::Error) -> Error {
        if source.kind() == io::ErrorKind::NotFound {
            Error::Missing {
                path: path.to_path_buf(),
            }
        } else {
            Error::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}

impl From<rcgen::Error> for Error {
    fn from(e: rcgen::Error) -> Error {
        Error::Generate(e.to_string())
    }
}

/// The DNS name a node's certificate carries, and that a peer dials.
pub fn node_dns_name(node_id: u64) -> String {
    format!("{NODE_NAME_PREFIX}{node_id}{NODE_NAME_SUFFIX}")
}

/// Parses `node-<id>.stele`; `None` for any other name.
pub fn parse_node_dns_name(name: &str) -> Option<u64> {
    match Role::parse(name) {
        Some(Role::Node(id)) => Some(id),
        _ => None,
    }
}

/// The node id named by a DER certificate's `node-<id>.stele` DNS name.
/// Exactly one such name must be present.
pub fn node_id_of(cert: &CertificateDer<'_>) -> Result<u64> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert).map_err(|e| Error::NoNodeName {
        reason: format!("unparsable certificate: {e}"),
    })?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| Error::NoNodeName {
            reason: format!("bad subject alternative names: {e}"),
        })?
        .ok_or_else(|| Error::NoNodeName {
            reason: "no subject alternative names".into(),
        })?;
    let mut ids = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => parse_node_dns_name(dns),
            _ => None,
        });
    match (ids.next(), ids.next()) {
        (Some(id), None) => Ok(id),
        (None, _) => Err(Error::NoNodeName {
            reason: "no DNS name of the form node-<id>.stele".into(),
        }),
        (Some(a), Some(b)) => Err(Error::NoNodeName {
            reason: format!("several node names ({a}, {b}, ...)"),
        }),
    }
}

/// A cell certificate authority: its signing key and self-signed certificate.
pub struct CellCa {
    key: KeyPair,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
}

impl fmt::Debug for CellCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CellCa").finish_non_exhaustive()
    }
}

impl CellCa {
    /// A new CA with a fresh P-256 key.
    pub fn generate() -> Result<CellCa> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "Stele cell CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        set_validity(&mut params, CA_DAYS);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(CellCa {
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            key,
        })
    }

    /// Loads `ca.key` and `ca.pem` from `dir`.
    pub fn load(dir: &Path) -> Result<CellCa> {
        let key_path = dir.join(CA_KEY_FILE);
        let cert_path = dir.join(CA_CERT_FILE);
        let key_pem = read_string(&key_path)?;
        let cert_pem = read_string(&cert_path)?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| Error::BadPem {
            path: key_path,
            what: "private key",
            reason: e.to_string(),
        })?;
        let cert_der = one_cert(&cert_path, cert_pem.as_bytes())?;
        Ok(CellCa {
            key,
            cert_pem,
            cert_der,
        })
    }

    /// The CA certificate in PEM form, as written to `ca.pem`.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate in DER form, a trust root for the transport.
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Issues a node certificate; returns `(cert_pem, key_pem)`.
    pub fn issue_pem(&self, node_id: u64) -> Result<(String, String)> {
        self.issue_roles_pem(&[Role::Node(node_id)], DAYS_DEFAULT)
    }

    /// Issues a certificate naming `roles`, valid for `days`; returns
    /// `(cert_pem, key_pem)`.
    pub fn issue_roles_pem(&self, roles: &[Role], days: u32) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let params = role_params(roles, days)?;
        let issuer = self.issuer()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// This CA as the issuer of certificates.
    pub(crate) fn issuer(&self) -> Result<Issuer<'_, &KeyPair>> {
        Ok(Issuer::from_ca_cert_der(&self.cert_der, &self.key)?)
    }

    /// Issues a node certificate and returns it as an in-memory identity.
    pub fn issue(&self, node_id: u64) -> Result<NodeIdentity> {
        let (cert_pem, key_pem) = self.issue_pem(node_id)?;
        NodeIdentity::from_pem(
            Path::new("<memory>"),
            cert_pem.as_bytes(),
            key_pem.as_bytes(),
            self.cert_pem.as_bytes(),
        )
    }

    fn write(&self, dir: &Path) -> Result<()> {
        write_file(
            &dir.join(CA_KEY_FILE),
            self.key.serialize_pem().as_bytes(),
            true,
        )?;
        write_file(&dir.join(CA_CERT_FILE), self.cert_pem.as_bytes(), false)
    }
}

/// What a certificate for `roles` says: one DNS name per role
/// (`stele_tls::roles`), valid from an hour ago (clocks a little behind
/// the CA's) for `days`. Server roles (node, controller, directory) may be
/// combined, get server and client authentication, and `localhost` and
/// `127.0.0.1` for development; an operator certificate is for client
/// authentication only and names nothing else.
pub fn role_params(roles: &[Role], days: u32) -> Result<CertificateParams> {
    if days == 0 || days > DAYS_MAX {
        return Err(Error::BadValidity(days));
    }
    for role in roles {
        role.validate()?;
    }
    let operators = roles.iter().filter(|r| !r.serves()).count();
    if roles.is_empty() || (operators > 0 && roles.len() > 1) {
        return Err(Error::MixedRoles);
    }
    let server = operators == 0;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, roles[0].dns_name());
    params.distinguished_name = dn;
    params.subject_alt_names = roles
        .iter()
        .map(|r| Ok(SanType::DnsName(r.dns_name().try_into()?)))
        .collect::<Result<Vec<_>>>()?;
    if server {
        params
            .subject_alt_names
            .push(SanType::DnsName("localhost".try_into()?));
        params
            .subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = if server {
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ]
    } else {
        vec![ExtendedKeyUsagePurpose::ClientAuth]
    };
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, days);
    Ok(params)
}

fn set_validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// Creates a cell CA in `dir` (`ca.key`, mode 0600, and `ca.pem`). Refuses
/// to overwrite an existing CA: every node certificate depends on it.
pub fn init_ca(dir: &Path) -> Result<()> {
    for name in [CA_KEY_FILE, CA_CERT_FILE] {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => return Err(Error::CaExists { path }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&path, e)),
        }
    }
    fsutil::create_dir_durable(dir).map_err(|e| Error::io(dir, e))?;
    CellCa::generate()?.write(dir)
}

/// Issues the certificate of node `node_id` with the CA in `ca_dir`, writing
/// `node.key` (0600), `node.pem` and a copy of `ca.pem` to `out_dir`.
/// Re-issuing replaces the node's previous certificate and key.
pub fn issue_node(ca_dir: &Path, node_id: u64, out_dir: &Path) -> Result<()> {
    issue(ca_dir, &[Role::Node(node_id)], DAYS_DEFAULT, out_dir)
}

/// Issues a certificate for `roles` (valid `days`) with the CA in
/// `ca_dir`: `node.pem` + `node.key` (0600) for server roles, or
/// `operator.pem` + `operator.key` for an operator, and a copy of
/// `ca.pem`, into `out_dir`. Checks the roles before anything is written.
pub fn issue(ca_dir: &Path, roles: &[Role], days: u32, out_dir: &Path) -> Result<()> {
    role_params(roles, days)?;
    let ca = CellCa::load(ca_dir)?;
    let (cert_pem, key_pem) = ca.issue_roles_pem(roles, days)?;
    let (cert_file, key_file) = if roles.iter().all(Role::serves) {
        (NODE_CERT_FILE, NODE_KEY_FILE)
    } else {
        (OPERATOR_CERT_FILE, OPERATOR_KEY_FILE)
    };
    fsutil::create_dir_durable(out_dir).map_err(|e| Error::io(out_dir, e))?;
    write_file(&out_dir.join(key_file), key_pem.as_bytes(), true)?;
    write_file(&out_dir.join(cert_file), cert_pem.as_bytes(), false)?;
    write_file(&out_dir.join(CA_CERT_FILE), ca.cert_pem.as_bytes(), false)
}

/// What a node presents and trusts on node-to-node connections.
pub struct NodeIdentity {
    node_id: u64,
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Vec<CertificateDer<'static>>,
}

impl Clone for NodeIdentity {
    fn clone(&self) -> Self {
        NodeIdentity {
            node_id: self.node_id,
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
            roots: self.roots.clone(),
        }
    }
}

impl fmt::Debug for NodeIdentity {
    // The private key is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("node_id", &self.node_id)
            .field("cert_chain_len", &self.cert_chain.len())
            .field("roots_len", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl NodeIdentity {
    /// Loads `node.pem`, `node.key` and `ca.pem` from `dir`.
    pub fn load(dir: &Path) -> Result<NodeIdentity> {
        let cert = read_bytes(&dir.join(NODE_CERT_FILE))?;
        let key = read_bytes(&dir.join(NODE_KEY_FILE))?;
        let ca = read_bytes(&dir.join(CA_CERT_FILE))?;
        NodeIdentity::from_pem(dir, &cert, &key, &ca)
    }

    /// A fresh in-memory CA and identities for nodes `1..=n_nodes`, for
    /// `stele dev` and tests.
    pub fn ephemeral_cell(n_nodes: u64) -> Result<(CellCa, Vec<NodeIdentity>)> {
        let ca = CellCa::generate()?;
        let ids = (1..=n_nodes)
            .map(|id| ca.issue(id))
            .collect::<Result<Vec<_>>>()?;
        Ok((ca, ids))
    }

    fn from_pem(dir: &Path, cert: &[u8], key: &[u8], ca: &[u8]) -> Result<NodeIdentity> {
        let cert_path = dir.join(NODE_CERT_FILE);
        let key_path = dir.join(NODE_KEY_FILE);
        let ca_path = dir.join(CA_CERT_FILE);
        let cert_chain = certs(&cert_path, cert)?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::BadPem {
            path: key_path,
            what: "private key",
            reason: e.to_string(),
        })?;
        let roots = certs(&ca_path, ca)?;
        let node_id = node_id_of(&cert_chain[0])?;
        Ok(NodeIdentity {
            node_id,
            cert_chain,
            key,
            roots,
        })
    }

    /// The same certificate and key, trusting `roots` instead (e.g. the old
    /// and the new CA during a rotation).
    pub fn with_roots(mut self, roots: Vec<CertificateDer<'static>>) -> NodeIdentity {
        self.roots = roots;
        self
    }

    /// The node id named by the certificate.
    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The node certificate first, then any intermediates.
    pub fn cert_chain(&self) -> &[CertificateDer<'static>] {
        &self.cert_chain
    }

    pub fn key(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// The cell CA certificates this node trusts.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }
}

fn certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let bad = |reason: String| Error::BadPem {
        path: path.to_path_buf(),
        what: "certificate",
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE block".into()));
    }
    Ok(certs)
}

fn one_cert(path: &Path, pem: &[u8]) -> Result<CertificateDer<'static>> {
    let mut all = certs(path, pem)?;
    if all.len() != 1 {
        return Err(Error::BadPem {
            path: path.to_path_buf(),
            what: "certificate",
            reason: format!("expected one CERTIFICATE block, found {}", all.len()),
        });
    }
    Ok(all.remove(0))
}

fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

pub(crate) fn read_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

pub(crate) fn write_file(path: &Path, bytes: &[u8], secret: bool) -> Result<()> {
    if secret {
        // durable_write truncates and reuses an existing `<name>.tmp`, which
        // keeps that file's mode; creating it here with 0600 first means the
        // key is never readable by others, not even between write and rename.
        let mut tmp = path.as_os_str().to_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&tmp, e)),
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
    }
    fsutil::durable_write(path, bytes).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn node_names_parse_one_spelling() {
        for (name, want) in [
            ("node-1.stele", Some(1)),
            ("node-65535.stele", Some(65_535)),
            // Outside the node id range: no node's name.
            ("node-65536.stele", None),
            ("node-18446744073709551615.stele", None),
            ("node-0.stele", None),
            ("node-01.stele", None),
            ("node-+1.stele", None),
            ("node-.stele", None),
            ("node-1.stele.evil", None),
            ("localhost", None),
            ("node-18446744073709551616.stele", None),
        ] {
            assert_eq!(parse_node_dns_name(name), want, "{name}");
        }
        assert_eq!(parse_node_dns_name(&node_dns_name(42)), Some(42));
    }

    #[test]
    fn init_ca_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        init_ca(&ca_dir).unwrap();
        let before = std::fs::read(ca_dir.join(CA_KEY_FILE)).unwrap();
        let mode = std::fs::metadata(ca_dir.join(CA_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        match init_ca(&ca_dir) {
            Err(Error::CaExists { path }) => assert!(path.ends_with(CA_KEY_FILE)),
            other => panic!("expected CaExists, got {other:?}"),
        }
        assert_eq!(std::fs::read(ca_dir.join(CA_KEY_FILE)).unwrap(), before);
        // A lone ca.pem is refused too.
        std::fs::remove_file(ca_dir.join(CA_KEY_FILE)).unwrap();
        assert!(matches!(init_ca(&ca_dir), Err(Error::CaExists { .. })));
    }

    #[test]
    fn issue_node_and_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let node_dir = dir.path().join("n7");
        init_ca(&ca_dir).unwrap();
        issue_node(&ca_dir, 7, &node_dir).unwrap();
        let mode = std::fs::metadata(node_dir.join(NODE_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let id = NodeIdentity::load(&node_dir).unwrap();
        assert_eq!(id.node_id(), 7);
        assert_eq!(id.cert_chain().len(), 1);
        let ca = CellCa::load(&ca_dir).unwrap();
        assert_eq!(id.roots(), std::slice::from_ref(ca.cert_der()));
        // The copy of ca.pem is byte for byte the CA's.
        assert_eq!(
            std::fs::read(node_dir.join(CA_CERT_FILE)).unwrap(),
            std::fs::read(ca_dir.join(CA_CERT_FILE)).unwrap()
        );
        let cloned = id.clone();
        assert_eq!(cloned.node_id(), 7);
        assert!(!format!("{id:?}").contains("PRIVATE"));
    }

    #[test]
    fn another_ca_is_another_identity() {
        let (ca_a, ids_a) = NodeIdentity::ephemeral_cell(2).unwrap();
        let (ca_b, ids_b) = NodeIdentity::ephemeral_cell(2).unwrap();
        assert_ne!(ca_a.cert_der(), ca_b.cert_der());
        assert_eq!(ids_a[0].node_id(), ids_b[0].node_id());
        assert_ne!(ids_a[0].roots(), ids_b[0].roots());
        assert_ne!(ids_a[0].cert_chain(), ids_b[0].cert_chain());
        assert_eq!(
            ids_a.iter().map(NodeIdentity::node_id).collect::<Vec<_>>(),
            [1, 2]
        );
    }

    #[test]
    fn missing_and_bad_files_are_typed() {
        let dir = tempfile::tempdir().unwrap();
        match NodeIdentity::load(dir.path()) {
            Err(Error::Missing { path }) => assert!(path.ends_with(NODE_CERT_FILE)),
            other => panic!("expected Missing, got {other:?}"),
        }
        let ca_dir = dir.path().join("ca");
        init_ca(&ca_dir).unwrap();
        issue_node(&ca_dir, 3, dir.path()).unwrap();
        std::fs::write(dir.path().join(NODE_CERT_FILE), b"not pem").unwrap();
        assert!(matches!(
            NodeIdentity::load(dir.path()),
            Err(Error::BadPem {
                what: "certificate",
                ..
            })
        ));
        issue_node(&ca_dir, 3, dir.path()).unwrap();
        std::fs::write(dir.path().join(NODE_KEY_FILE), b"-----BEGIN JUNK-----\n").unwrap();
        assert!(matches!(
            NodeIdentity::load(dir.path()),
            Err(Error::BadPem {
                what: "private key",
                ..
            })
        ));
        std::fs::write(ca_dir.join(CA_KEY_FILE), b"garbage").unwrap();
        assert!(matches!(
            issue_node(&ca_dir, 4, dir.path()),
            Err(Error::BadPem { .. })
        ));
    }
}
