//! Who a certificate speaks for. The cell CA signs every certificate of a
//! cell; what a holder may do is read from the DNS names it carries:
//!
//! ```text
//! node-<id>.stele         a storage node (heartbeats as <id>, peer QUIC)
//! controller-<id>.stele   controller quorum member <id>
//! directory-<id>.stele    directory quorum member <id>
//! operator-<name>.stele   an operator (the operator API); client use only
//! ```
//!
//! One certificate may carry several (a process that is node 1 and
//! controller 1 has both names). Ids are 1..65535 with one spelling
//! ("01" and "+1" are no ids); operator names are 1 to 63 of `a-z`, `0-9`
//! and `-`, starting with a letter or digit.

use std::fmt;

use rustls_pki_types::CertificateDer;

const SUFFIX: &str = ".stele";

/// The largest node, controller or directory member id.
pub const ID_MAX: u64 = 65_535;

/// One identity a certificate carries.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Node(u64),
    Controller(u64),
    Directory(u64),
    Operator(String),
}

/// The kind of a [`Role`], without its id or name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Node,
    Controller,
    Directory,
    Operator,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Node => "node",
            Kind::Controller => "controller",
            Kind::Directory => "directory",
            Kind::Operator => "operator",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A role that cannot be written into a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    #[error("{kind} id {id}: ids are 1..{ID_MAX}")]
    BadId { kind: Kind, id: u64 },
    #[error("operator name {0:?}: 1 to 63 of a-z, 0-9 and '-', not starting with '-'")]
    BadOperatorName(String),
}

impl Role {
    pub fn kind(&self) -> Kind {
        match self {
            Role::Node(_) => Kind::Node,
            Role::Controller(_) => Kind::Controller,
            Role::Directory(_) => Kind::Directory,
            Role::Operator(_) => Kind::Operator,
        }
    }

    /// Checks that the role can be issued: ids in range, a valid name.
    pub fn validate(&self) -> Result<(), RoleError> {
        match self {
            Role::Node(id) | Role::Controller(id) | Role::Directory(id) => {
                if *id == 0 || *id > ID_MAX {
                    return Err(RoleError::BadId {
                        kind: self.kind(),
                        id: *id,
                    });
                }
                Ok(())
            }
            Role::Operator(name) => {
                if valid_operator_name(name) {
                    Ok(())
                } else {
                    Err(RoleError::BadOperatorName(name.clone()))
                }
            }
        }
    }

    /// The DNS name that carries this role in a certificate.
    pub fn dns_name(&self) -> String {
        match self {
            Role::Node(id) => format!("node-{id}{SUFFIX}"),
            Role::Controller(id) => format!("controller-{id}{SUFFIX}"),
            Role::Directory(id) => format!("directory-{id}{SUFFIX}"),
            Role::Operator(name) => format!("operator-{name}{SUFFIX}"),
        }
    }

    /// Parses a role name; `None` for any other name (such as
    /// `localhost`), and for ids or names outside their ranges.
    pub fn parse(name: &str) -> Option<Role> {
        let stem = name.strip_suffix(SUFFIX)?;
        let (kind, rest) = stem.split_once('-')?;
        let role = match kind {
            "node" => Role::Node(parse_id(rest)?),
            "controller" => Role::Controller(parse_id(rest)?),
            "directory" => Role::Directory(parse_id(rest)?),
            "operator" => Role::Operator(rest.to_string()),
            _ => return None,
        };
        role.validate().ok()?;
        Some(role)
    }

    /// Whether this role may answer as a server (every role but operator).
    pub fn serves(&self) -> bool {
        !matches!(self, Role::Operator(_))
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Node(id) => write!(f, "node {id}"),
            Role::Controller(id) => write!(f, "controller {id}"),
            Role::Directory(id) => write!(f, "directory member {id}"),
            Role::Operator(name) => write!(f, "operator {name}"),
        }
    }
}

fn parse_id(digits: &str) -> Option<u64> {
    // One spelling per id: no sign, no leading zero.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

fn valid_operator_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A certificate this module cannot read roles from.
#[derive(Debug, Clone, thiserror::Error)]
#[error("certificate names no role: {0}")]
pub struct NoRoles(pub String);

/// The roles a DER certificate's DNS names carry, in name order. Does not
/// check the signature: call it on certificates TLS has verified.
pub fn roles_of(cert: &CertificateDer<'_>) -> Result<Vec<Role>, NoRoles> {
    let (_, x509) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| NoRoles(format!("unparsable certificate: {e}")))?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| NoRoles(format!("bad subject alternative names: {e}")))?
        .ok_or_else(|| NoRoles("no subject alternative names".into()))?;
    let roles: Vec<Role> = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Role::parse(dns),
            _ => None,
        })
        .collect();
    if roles.is_empty() {
        return Err(NoRoles(
            "no DNS name of the form node-<id>.stele, controller-<id>.stele, directory-<id>.stele or operator-<name>.stele".into(),
        ));
    }
    Ok(roles)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_with_one_spelling() {
        for role in [
            Role::Node(1),
            Role::Controller(65_535),
            Role::Directory(7),
            Role::Operator("alice-2".into()),
        ] {
            assert_eq!(Role::parse(&role.dns_name()), Some(role));
        }
        for bad in [
            "node-0.stele",
            "node-01.stele",
            "node-+1.stele",
            "node-65536.stele",
            "node-.stele",
            "node-1.stele.evil",
            "controller-1",
            "operator-.stele",
            "operator--x.stele",
            "operator-Alice.stele",
            "operator-a.b.stele",
            "gateway-1.stele",
            "localhost",
        ] {
            assert_eq!(Role::parse(bad), None, "{bad}");
        }
        assert!(Role::Operator("x".repeat(64)).validate().is_err());
        assert!(Role::Node(0).validate().is_err());
    }
}
