//! Namespace tokens in the controller: the cell's signing keys and the
//! tokens issued, in the replicated state; issue, revoke and list for
//! operators; the public keys and revocations every heartbeat answer
//! carries to a node whose copy is older.
//!
//! ```text
//! IssueToken   validate ─► token format on (every member supports it)
//!              ─► a signing key (the first issue proposes one)
//!              ─► propose IssueToken{id, record} ─► sign ─► the token, once
//! RevokeToken  propose RevokeToken{id} ─► epoch+1 ─► nodes refuse it from
//!              their next heartbeat answer on
//! ```
//!
//! The private key lives in the controller state (its Raft log, snapshots
//! and backups): whoever reads those can mint tokens, as whoever holds the
//! CA key can mint certificates. The token itself is never stored.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use stele_proto::{formats, limits, pb};
use stele_quorum::refuse;
use stele_tls::token::{self, Claims, Right};
use tonic::{Response, Status};

use crate::server::Controller;
use crate::state::{Command, Reply};

/// The longest a token may live: ten years.
pub const TTL_MAX_S: u64 = 3650 * 86_400;
/// Patterns one token may name.
pub const PATTERNS_MAX: usize = 64;
/// How long past its expiry a token's record stays (so a node whose clock
/// runs behind still hears of its revocation).
const KEEP_EXPIRED_S: u64 = 86_400;

/// The token part of the controller state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// Bumped by every change a node must hear: a key, a revocation.
    pub epoch: u64,
    pub keys: BTreeMap<u32, SigningKey>,
    /// By token id.
    pub issued: BTreeMap<String, TokenRec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SigningKey {
    /// Ed25519, PKCS#8.
    #[serde(with = "serde_bytes")]
    pub pkcs8: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub public: Vec<u8>,
    pub created_at: u64,
}

/// A token as issued: everything but its signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRec {
    pub name: String,
    pub namespaces: Vec<String>,
    pub rights: Vec<Right>,
    pub key: u32,
    pub issued_at: u64,
    pub expires_at: u64,
    pub revoked_at: Option<u64>,
}

impl Tokens {
    pub fn is_empty(&self) -> bool {
        *self == Tokens::default()
    }

    /// Applies [`Command::TokenKey`]: `key` must be one past the newest.
    pub fn add_key(&mut self, key: u32, k: SigningKey) -> Reply {
        let next = self.keys.keys().next_back().map_or(1, |k| k + 1);
        if key != next {
            return Reply::Refused(format!("token key {key} is not the next one ({next})"));
        }
        self.keys.insert(key, k);
        self.epoch += 1;
        Reply::Ok
    }

    /// Applies [`Command::IssueToken`].
    pub fn issue(&mut self, id: String, rec: TokenRec) -> Reply {
        if !self.keys.contains_key(&rec.key) {
            return Reply::Refused(format!("no token key {}", rec.key));
        }
        if self.issued.contains_key(&id) {
            return Reply::Refused(format!("token {id} exists"));
        }
        self.prune(rec.issued_at);
        self.issued.insert(id, rec);
        Reply::Ok
    }

    /// Applies [`Command::RevokeToken`] (again: no change).
    pub fn revoke(&mut self, id: &str, at: u64) -> Reply {
        let Some(rec) = self.issued.get_mut(id) else {
            return Reply::Refused(format!("no token {id} (never issued, or expired)"));
        };
        if rec.revoked_at.is_none() {
            rec.revoked_at = Some(at);
            self.epoch += 1;
        }
        self.prune(at);
        Reply::Ok
    }

    /// Forgets tokens expired a day before `now` (the command's time, so
    /// every member forgets the same).
    fn prune(&mut self, now: u64) {
        let before = self.revoked().count();
        self.issued
            .retain(|_, r| r.expires_at.saturating_add(KEEP_EXPIRED_S) > now);
        if self.revoked().count() != before {
            self.epoch += 1;
        }
    }

    fn revoked(&self) -> impl Iterator<Item = &String> {
        self.issued
            .iter()
            .filter(|(_, r)| r.revoked_at.is_some())
            .map(|(id, _)| id)
    }

    /// What a heartbeat answer carries to a node holding `node_epoch`:
    /// nothing when it is current.
    pub fn keys_pb(&self, node_epoch: Option<u64>) -> Option<pb::TokenKeys> {
        if node_epoch == Some(self.epoch) {
            return None;
        }
        Some(pb::TokenKeys {
            epoch: self.epoch,
            keys: self
                .keys
                .iter()
                .map(|(id, k)| pb::TokenKey {
                    id: *id,
                    public_key: k.public.clone(),
                })
                .collect(),
            revoked: self.revoked().cloned().collect(),
        })
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks a namespace pattern: `workspace/project`, `workspace/*` or `*`.
pub fn validate_pattern(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    let ns = match pattern.strip_suffix("/*") {
        Some(ws) => format!("{ws}/x"),
        None => pattern.to_string(),
    };
    limits::validate_namespace(&ns).map_err(|_| {
        format!("{pattern:?} is not workspace/project, workspace/* or * (parts: 1 to 64 of letters, digits, '_', '-', '.')")
    })
}

fn info(id: &str, r: &TokenRec) -> pb::TokenInfo {
    pb::TokenInfo {
        id: id.into(),
        name: r.name.clone(),
        namespaces: r.namespaces.clone(),
        rights: r.rights.iter().map(|r| r.name().to_string()).collect(),
        issued_at: r.issued_at,
        expires_at: r.expires_at,
        revoked_at: r.revoked_at.unwrap_or(0),
    }
}

/// A request's claims, checked: (name, patterns, rights, ttl).
fn checked(req: pb::IssueTokenRequest) -> Result<(String, Vec<String>, Vec<Right>, u64), Status> {
    let name = req.name.trim().to_string();
    if name.is_empty() || name.len() > 64 || name.chars().any(char::is_control) {
        return Err(refuse(
            "name",
            "1 to 64 bytes, no control characters (who the token is for)",
        ));
    }
    if req.namespaces.is_empty() || req.namespaces.len() > PATTERNS_MAX {
        return Err(refuse(
            "namespaces",
            format!("name 1 to {PATTERNS_MAX} namespace patterns"),
        ));
    }
    for p in &req.namespaces {
        validate_pattern(p).map_err(|e| refuse("namespaces", e))?;
    }
    let mut rights = Vec::new();
    for r in &req.rights {
        let right = Right::parse(r)
            .ok_or_else(|| refuse("rights", format!("{r:?} is not a right (append, read)")))?;
        if !rights.contains(&right) {
            rights.push(right);
        }
    }
    if rights.is_empty() {
        return Err(refuse("rights", "name at least one of append, read"));
    }
    rights.sort();
    if req.ttl_s == 0 || req.ttl_s > TTL_MAX_S {
        return Err(refuse(
            "ttl_s",
            format!("1 second to ten years ({TTL_MAX_S} s)"),
        ));
    }
    Ok((name, req.namespaces, rights, req.ttl_s))
}

async fn propose(c: &Controller, cmd: Command) -> Result<(), Status> {
    match c.propose(cmd).await? {
        Reply::Refused(why) => Err(Status::failed_precondition(why)),
        Reply::Ok | Reply::Intent(_) => Ok(()),
    }
}

/// Handles `IssueToken`.
pub async fn issue(
    c: &Controller,
    req: pb::IssueTokenRequest,
) -> Result<Response<pb::IssueTokenResponse>, Status> {
    let (name, namespaces, rights, ttl) = checked(req)?;
    c.require_leader()?;
    if c.snapshot().format(formats::TOKEN) < formats::TOKEN_MAX {
        crate::formats::raise(c, formats::TOKEN, formats::TOKEN_MAX).await?;
    }
    let key_error = |e: token::TokenError| Status::internal(e.to_string());
    if c.snapshot().tokens.keys.is_empty() {
        let (pkcs8, public) = token::generate_key().map_err(key_error)?;
        let k = SigningKey {
            pkcs8,
            public,
            created_at: now_s(),
        };
        // Two first issues at once: one key wins, the other is refused
        // here and both sign with the winner.
        let _ = c.propose(Command::TokenKey { key: 1, k }).await?;
        tracing::info!("token signing key 1 created");
    }
    let (key, signing) = c
        .snapshot()
        .tokens
        .keys
        .last_key_value()
        .map(|(id, k)| (*id, k.pkcs8.clone()))
        .ok_or_else(|| Status::unavailable("no token key yet; try again"))?;
    let id = token::new_id().map_err(key_error)?;
    let now = now_s();
    let rec = TokenRec {
        name,
        namespaces,
        rights,
        key,
        issued_at: now,
        expires_at: now.saturating_add(ttl),
        revoked_at: None,
    };
    propose(
        c,
        Command::IssueToken {
            id: id.clone(),
            rec: rec.clone(),
        },
    )
    .await?;
    let claims = Claims {
        id: id.clone(),
        key,
        name: rec.name.clone(),
        namespaces: rec.namespaces.clone(),
        rights: rec.rights.clone(),
        issued_at: rec.issued_at,
        expires_at: rec.expires_at,
    };
    let token = token::sign(&signing, &claims).map_err(key_error)?;
    tracing::info!(
        id,
        name = claims.name,
        grants = claims.describe(),
        "token issued"
    );
    Ok(Response::new(pb::IssueTokenResponse {
        token,
        info: Some(info(&id, &rec)),
    }))
}

/// Handles `RevokeToken`.
pub async fn revoke(
    c: &Controller,
    req: pb::RevokeTokenRequest,
) -> Result<Response<pb::TokenInfo>, Status> {
    let id = req.id.trim().to_ascii_lowercase();
    if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(refuse(
            "id",
            "a token id is 32 hex digits (stele token list)",
        ));
    }
    c.require_leader()?;
    if !c.snapshot().tokens.issued.contains_key(&id) {
        return Err(Status::not_found(format!(
            "no token {id} (never issued, or expired)"
        )));
    }
    propose(
        c,
        Command::RevokeToken {
            id: id.clone(),
            at: now_s(),
        },
    )
    .await?;
    let s = c.snapshot();
    let rec = s
        .tokens
        .issued
        .get(&id)
        .ok_or_else(|| Status::not_found(format!("token {id} expired meanwhile")))?;
    tracing::info!(id, "token revoked");
    Ok(Response::new(info(&id, rec)))
}

/// Handles `ListTokens`: the tokens not yet expired, oldest first.
pub fn list(c: &Controller) -> Response<pb::ListTokensResponse> {
    let s = c.snapshot();
    let now = now_s();
    let mut tokens: Vec<pb::TokenInfo> = s
        .tokens
        .issued
        .iter()
        .filter(|(_, r)| r.expires_at > now)
        .map(|(id, r)| info(id, r))
        .collect();
    tokens.sort_by(|a, b| (a.issued_at, &a.id).cmp(&(b.issued_at, &b.id)));
    Response::new(pb::ListTokensResponse { tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(key: u32, expires_at: u64) -> TokenRec {
        TokenRec {
            name: "t".into(),
            namespaces: vec!["acme/*".into()],
            rights: vec![Right::Read],
            key,
            issued_at: 10,
            expires_at,
            revoked_at: None,
        }
    }

    fn key() -> SigningKey {
        SigningKey {
            pkcs8: vec![1],
            public: vec![2],
            created_at: 0,
        }
    }

    #[test]
    fn keys_issue_revoke_and_prune() {
        let mut t = Tokens::default();
        assert!(t.is_empty());
        assert!(matches!(
            t.issue("a".into(), rec(1, 100)),
            Reply::Refused(_)
        ));
        assert!(matches!(t.add_key(2, key()), Reply::Refused(_)));
        assert_eq!(t.add_key(1, key()), Reply::Ok);
        assert_eq!(t.epoch, 1);
        assert_eq!(t.issue("a".into(), rec(1, 100)), Reply::Ok);
        assert!(matches!(
            t.issue("a".into(), rec(1, 100)),
            Reply::Refused(_)
        ));
        // Issuing changes nothing a node holds.
        assert_eq!(t.epoch, 1);
        assert_eq!(t.keys_pb(Some(1)), None);
        assert!(matches!(t.revoke("b", 20), Reply::Refused(_)));
        assert_eq!(t.revoke("a", 20), Reply::Ok);
        assert_eq!(t.epoch, 2);
        assert_eq!(t.revoke("a", 21), Reply::Ok);
        assert_eq!(t.epoch, 2);
        let sent = t.keys_pb(Some(1)).unwrap();
        assert_eq!(sent.revoked, vec!["a".to_string()]);
        assert_eq!(sent.keys.len(), 1);
        assert!(t.keys_pb(None).is_some());
        // A day after it expired, a revoked token is forgotten, and the
        // nodes hear that too.
        assert_eq!(
            t.issue("c".into(), rec(1, 100 + 2 * KEEP_EXPIRED_S)),
            Reply::Ok
        );
        let mut later = rec(1, 200 + 2 * KEEP_EXPIRED_S);
        later.issued_at = 101 + KEEP_EXPIRED_S;
        assert_eq!(t.issue("d".into(), later), Reply::Ok);
        assert!(!t.issued.contains_key("a"));
        assert_eq!(t.epoch, 3);
        assert!(t.keys_pb(Some(3)).is_none());
    }

    #[test]
    fn patterns_and_requests_are_checked() {
        for ok in ["*", "acme/*", "acme/web", "a-b.c/d_e"] {
            assert!(validate_pattern(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "acme", "acme/", "*/x", "acme/**", "a/b/c", "ac me/x", "acme/x*",
        ] {
            assert!(validate_pattern(bad).is_err(), "{bad}");
        }
        let good = pb::IssueTokenRequest {
            name: "ingest".into(),
            namespaces: vec!["acme/*".into()],
            rights: vec!["read".into(), "append".into(), "read".into()],
            ttl_s: 60,
        };
        let (_, _, rights, _) = checked(good.clone()).unwrap();
        assert_eq!(rights, vec![Right::Append, Right::Read]);
        let bad = |f: fn(&mut pb::IssueTokenRequest)| {
            let mut r = good.clone();
            f(&mut r);
            checked(r).unwrap_err()
        };
        assert!(bad(|r| r.name.clear()).message().contains("name"));
        assert!(
            bad(|r| r.namespaces.clear())
                .message()
                .contains("namespace")
        );
        assert!(
            bad(|r| r.rights = vec!["write".into()])
                .message()
                .contains("write")
        );
        assert!(bad(|r| r.rights.clear()).message().contains("rights"));
        assert!(bad(|r| r.ttl_s = 0).message().contains("ttl"));
        assert!(bad(|r| r.ttl_s = TTL_MAX_S + 1).message().contains("ttl"));
        assert!(
            bad(|r| r.namespaces = vec!["x".into()])
                .message()
                .contains("namespace")
        );
    }
}
