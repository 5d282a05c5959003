//! Node certificates without the CA key on every host:
//!
//! ```text
//! node host:  stele cert request --node-id N --out DIR -> DIR/node.key (0600), DIR/node.csr
//! CA host:    stele cert sign --ca CA --csr node.csr --out DIR [--days D]
//!                                                     -> DIR/node.pem, DIR/ca.pem
//! ```
//!
//! The key never leaves the node. The CA signs only a request naming
//! exactly one valid node (`node-<id>.stele`) and decides the certificate's
//! names, usages and validity itself (bounded, default a year), whatever
//! the request asks. A refusal writes nothing.

use std::path::Path;

use rcgen::{CertificateSigningRequestParams, KeyPair, SanType};

use crate::certs::{
    CA_CERT_FILE, CellCa, Error, NODE_CERT_FILE, NODE_KEY_FILE, Result, read_string, write_file,
};
use crate::fsutil;

/// The request file `stele cert request` writes.
pub const NODE_CSR_FILE: &str = "node.csr";
pub use crate::certs::{DAYS_DEFAULT, DAYS_MAX};

/// The node id rule the controller and the node apply (1..65535).
pub fn check_node_id(node_id: u64) -> Result<()> {
    if node_id == 0 || node_id >= 1 << crate::raft::router::NODE_BITS {
        return Err(Error::BadNodeId(node_id));
    }
    Ok(())
}

/// The node id a request's `node-<digits>.stele` name asks for, in range
/// or not (the range is checked after, with its own message).
fn requested_node_id(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("node-")?.strip_suffix(".stele")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

/// Makes a key and a signing request for `node_id` in `out_dir`. Refuses
/// to replace a key already there.
pub fn request(node_id: u64, out_dir: &Path) -> Result<()> {
    check_node_id(node_id)?;
    let key_path = out_dir.join(NODE_KEY_FILE);
    if std::fs::symlink_metadata(&key_path).is_ok() {
        return Err(Error::KeyExists { path: key_path });
    }
    let key = KeyPair::generate()?;
    // Only the name: the CA sets usages, extensions and validity.
    let params = rcgen::CertificateParams::new(vec![crate::certs::node_dns_name(node_id)])?;
    let csr = params.serialize_request(&key)?;
    let csr_pem = csr.pem()?;
    fsutil::create_dir_durable(out_dir).map_err(|e| Error::Io {
        path: out_dir.to_path_buf(),
        source: e,
    })?;
    write_file(&key_path, key.serialize_pem().as_bytes(), true)?;
    write_file(&out_dir.join(NODE_CSR_FILE), csr_pem.as_bytes(), false)
}

/// Signs the request in `csr` with the CA in `ca_dir`, valid for `days`,
/// writing `node.pem` and `ca.pem` to `out_dir`; returns the node id.
pub fn sign(ca_dir: &Path, csr: &Path, out_dir: &Path, days: u32) -> Result<u64> {
    if days == 0 || days > DAYS_MAX {
        return Err(Error::BadValidity(days));
    }
    let ca = CellCa::load(ca_dir)?;
    let bad = |reason: String| Error::BadRequest {
        path: csr.to_path_buf(),
        reason,
    };
    let req = CertificateSigningRequestParams::from_pem(&read_string(csr)?)
        .map_err(|e| bad(e.to_string()))?;
    let ids: Vec<u64> = req
        .params
        .subject_alt_names
        .iter()
        .filter_map(|s| match s {
            SanType::DnsName(n) => requested_node_id(n.as_str()),
            _ => None,
        })
        .collect();
    let &[node_id] = ids.as_slice() else {
        return Err(bad(format!(
            "names {} nodes; a node certificate names exactly one `node-<id>.stele`",
            ids.len()
        )));
    };
    check_node_id(node_id)?;
    let params = crate::certs::role_params(&[stele_tls::Role::Node(node_id)], days)?;
    let cert = params.signed_by(&req.public_key, &ca.issuer()?)?;
    fsutil::create_dir_durable(out_dir).map_err(|e| Error::Io {
        path: out_dir.to_path_buf(),
        source: e,
    })?;
    write_file(&out_dir.join(NODE_CERT_FILE), cert.pem().as_bytes(), false)?;
    write_file(&out_dir.join(CA_CERT_FILE), ca.cert_pem().as_bytes(), false)?;
    Ok(node_id)
}
