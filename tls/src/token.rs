//! Namespace tokens: what a client without a certificate shows the data
//! API, signed by the controllers, checked by each node on its own.
//!
//! ```text
//! stele1.<claims>.<signature>          both parts base64url, no padding
//!   claims     JSON: id, key, name, namespaces, rights, issued_at, expires_at
//!   signature  Ed25519 over "stele-token-v1." + <claims as sent>
//!
//! controller  Signer (the private key lives in the controller state)
//!     │ heartbeat answers: the public keys and the revoked ids (Keyring::set)
//!     ▼
//! node        Keyring::verify(token, now) ─► Claims ─► allows(namespace, right)
//! ```
//!
//! Ed25519 rather than HMAC: nodes hold only public keys, so a node's disk
//! or memory never yields a key that mints tokens. Verifying costs one
//! signature check per distinct token; the keyring caches verified tokens
//! until its keys or revocations change, and checks expiry on every use.
//!
//! A namespace pattern is `workspace/project` (exactly that namespace),
//! `workspace/*` (every project of the workspace) or `*` (every
//! namespace). Patterns are checked at issue (the controller), matched
//! here.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use aws_lc_rs::signature::{self, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

/// What every token starts with (the format's version).
pub const PREFIX: &str = "stele1.";
/// The longest token a node looks at; longer ones are refused unread.
pub const TOKEN_BYTES_MAX: usize = 4096;
/// Domain separation: a signature over anything else never verifies here.
const CONTEXT: &[u8] = b"stele-token-v1.";
/// Verified tokens a keyring remembers before it starts over.
const CACHE_MAX: usize = 4096;

/// What a token lets its holder do in the namespaces it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Right {
    /// `Append`.
    Append,
    /// `Get`, `ScanKey`, `Scan`.
    Read,
}

impl Right {
    pub const ALL: [Right; 2] = [Right::Append, Right::Read];

    pub fn name(self) -> &'static str {
        match self {
            Right::Append => "append",
            Right::Read => "read",
        }
    }

    pub fn parse(s: &str) -> Option<Right> {
        Right::ALL.into_iter().find(|r| r.name() == s)
    }
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a token says, as signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// 32 hex digits, random: what revocation names.
    pub id: String,
    /// The signing key's id.
    pub key: u32,
    /// Who it was issued to (free text, for listings and logs).
    pub name: String,
    pub namespaces: Vec<String>,
    pub rights: Vec<Right>,
    /// Seconds since the Unix epoch.
    pub issued_at: u64,
    /// Seconds since the Unix epoch; the token is refused from then on.
    pub expires_at: u64,
}

/// Whether namespace pattern `pattern` covers `namespace`.
pub fn pattern_matches(pattern: &str, namespace: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix("/*") {
        Some(workspace) => namespace
            .strip_prefix(workspace)
            .is_some_and(|rest| rest.starts_with('/')),
        None => pattern == namespace,
    }
}

impl Claims {
    /// Whether this token grants `right` on `namespace`.
    pub fn allows(&self, namespace: &str, right: Right) -> bool {
        self.rights.contains(&right)
            && self
                .namespaces
                .iter()
                .any(|p| pattern_matches(p, namespace))
    }

    /// What it grants, for refusals and listings.
    pub fn describe(&self) -> String {
        let rights: Vec<&str> = self.rights.iter().map(|r| r.name()).collect();
        format!("{} on {}", rights.join(","), self.namespaces.join(","))
    }
}

/// Why a token was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("token longer than {TOKEN_BYTES_MAX} bytes")]
    TooLong,
    #[error("token signed by key {0}, which this cell does not know")]
    UnknownKey(u32),
    /// The next key after the newest this node knows: a key created since
    /// its last heartbeat answer (retry shortly).
    #[error("token signed by key {0}, which this node has not heard of yet")]
    KeyNotYetHeard(u32),
    #[error("token signature does not verify")]
    BadSignature,
    #[error("token {id} expired at {expires_at} (Unix seconds)")]
    Expired { id: String, expires_at: u64 },
    #[error("token {0} was revoked")]
    Revoked(String),
    #[error("this node has not yet heard the cell's token keys from a controller")]
    NoKeys,
    #[error("token key: {0}")]
    Key(String),
}

/// The parts of a token, unverified: its claims, the bytes signed, the
/// signature. For the keyring, `stele token inspect` and the fuzzer.
pub fn decode(token: &str) -> Result<(Claims, Vec<u8>, Vec<u8>), TokenError> {
    if token.len() > TOKEN_BYTES_MAX {
        return Err(TokenError::TooLong);
    }
    let body = token
        .strip_prefix(PREFIX)
        .ok_or_else(|| TokenError::Malformed(format!("does not start with {PREFIX:?}")))?;
    let (claims_b64, sig_b64) = body
        .split_once('.')
        .ok_or_else(|| TokenError::Malformed("no signature part".into()))?;
    let bad = |what: &str, e: &dyn std::fmt::Display| TokenError::Malformed(format!("{what}: {e}"));
    let claims_json = URL_SAFE_NO_PAD
        .decode(claims_b64)
        .map_err(|e| bad("claims", &e))?;
    let sig = URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|e| bad("signature", &e))?;
    let claims: Claims = serde_json::from_slice(&claims_json).map_err(|e| bad("claims", &e))?;
    let mut signed = CONTEXT.to_vec();
    signed.extend_from_slice(claims_b64.as_bytes());
    Ok((claims, signed, sig))
}

/// A new Ed25519 key: (PKCS#8 private key, public key).
pub fn generate_key() -> Result<(Vec<u8>, Vec<u8>), TokenError> {
    let rng = aws_lc_rs::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|e| TokenError::Key(e.to_string()))?;
    let pair =
        Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|e| TokenError::Key(e.to_string()))?;
    Ok((pkcs8.as_ref().to_vec(), pair.public_key().as_ref().to_vec()))
}

/// A random token id: 32 hex digits.
pub fn new_id() -> Result<String, TokenError> {
    let mut bytes = [0u8; 16];
    aws_lc_rs::rand::fill(&mut bytes).map_err(|e| TokenError::Key(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Signs `claims` with the PKCS#8 key `claims.key` names.
pub fn sign(pkcs8: &[u8], claims: &Claims) -> Result<String, TokenError> {
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8).map_err(|e| TokenError::Key(e.to_string()))?;
    let json = serde_json::to_vec(claims).map_err(|e| TokenError::Key(e.to_string()))?;
    let claims_b64 = URL_SAFE_NO_PAD.encode(json);
    let mut signed = CONTEXT.to_vec();
    signed.extend_from_slice(claims_b64.as_bytes());
    let sig = pair.sign(&signed);
    Ok(format!(
        "{PREFIX}{claims_b64}.{}",
        URL_SAFE_NO_PAD.encode(sig.as_ref())
    ))
}

/// The gRPC metadata a token travels in: `authorization: Bearer <token>`.
pub const METADATA_KEY: &str = "authorization";

/// The token a request carries, if any (`None` also for a value that is
/// not `Bearer <ascii>`).
pub fn bearer_of<T>(req: &tonic::Request<T>) -> Option<String> {
    let v = req.metadata().get(METADATA_KEY)?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(|t| t.trim().to_string())
}

/// Adds a token to every request of a client (nothing without one). Its
/// `Debug` never shows the token.
#[derive(Clone, Default)]
pub struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl Bearer {
    pub fn new(token: &str) -> Result<Bearer, TokenError> {
        let token = token.trim();
        decode(token)?;
        format!("Bearer {token}")
            .parse()
            .map(|v| Bearer(Some(v)))
            .map_err(|_| TokenError::Malformed("not ASCII".into()))
    }

    pub fn none() -> Bearer {
        Bearer(None)
    }

    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(_) => f.write_str("Bearer(<token>)"),
            None => f.write_str("Bearer(none)"),
        }
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert(METADATA_KEY, v.clone());
        }
        Ok(req)
    }
}

/// What a node knows of the cell's tokens, as its controller last said.
#[derive(Debug, Default)]
pub struct Keyring {
    inner: RwLock<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    /// The controller's token epoch these keys and revocations are from;
    /// `None` until heard.
    epoch: Option<u64>,
    keys: HashMap<u32, Vec<u8>>,
    revoked: HashSet<String>,
    /// Tokens whose signature verified under these keys, by token text.
    verified: HashMap<String, Claims>,
}

impl Keyring {
    /// The epoch last set, `None` before the first.
    pub fn epoch(&self) -> Option<u64> {
        self.inner.read().expect("lock poisoned").epoch
    }

    /// Takes the cell's keys and revoked token ids as of `epoch`.
    pub fn set(
        &self,
        epoch: u64,
        keys: impl IntoIterator<Item = (u32, Vec<u8>)>,
        revoked: impl IntoIterator<Item = String>,
    ) {
        let mut ring = self.inner.write().expect("lock poisoned");
        *ring = Ring {
            epoch: Some(epoch),
            keys: keys.into_iter().collect(),
            revoked: revoked.into_iter().collect(),
            verified: HashMap::new(),
        };
    }

    /// The claims of `token` if it is signed by a key of the cell, not
    /// revoked and not expired at `now` (Unix seconds).
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let cached = {
            let ring = self.inner.read().expect("lock poisoned");
            if ring.epoch.is_none() {
                return Err(TokenError::NoKeys);
            }
            ring.verified.get(token).cloned()
        };
        let claims = match cached {
            Some(c) => c,
            None => {
                let (claims, signed, sig) = decode(token)?;
                let mut ring = self.inner.write().expect("lock poisoned");
                let Some(key) = ring.keys.get(&claims.key) else {
                    let newest = ring.keys.keys().max().copied().unwrap_or(0);
                    return Err(if claims.key == newest + 1 {
                        TokenError::KeyNotYetHeard(claims.key)
                    } else {
                        TokenError::UnknownKey(claims.key)
                    });
                };
                UnparsedPublicKey::new(&signature::ED25519, key)
                    .verify(&signed, &sig)
                    .map_err(|_| TokenError::BadSignature)?;
                if ring.revoked.contains(&claims.id) {
                    return Err(TokenError::Revoked(claims.id));
                }
                if ring.verified.len() >= CACHE_MAX {
                    ring.verified.clear();
                }
                ring.verified.insert(token.to_string(), claims.clone());
                claims
            }
        };
        if now >= claims.expires_at {
            return Err(TokenError::Expired {
                id: claims.id,
                expires_at: claims.expires_at,
            });
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(key: u32, expires_at: u64) -> Claims {
        Claims {
            id: new_id().unwrap(),
            key,
            name: "ingest".into(),
            namespaces: vec!["acme/*".into(), "other/one".into()],
            rights: vec![Right::Append],
            issued_at: 100,
            expires_at,
        }
    }

    #[test]
    fn patterns() {
        assert!(pattern_matches("*", "a/b"));
        assert!(pattern_matches("acme/*", "acme/x"));
        assert!(!pattern_matches("acme/*", "acmex/y"));
        assert!(!pattern_matches("acme/*", "other/acme"));
        assert!(pattern_matches("acme/x", "acme/x"));
        assert!(!pattern_matches("acme/x", "acme/xy"));
        let c = claims(1, 200);
        assert!(c.allows("acme/x", Right::Append));
        assert!(c.allows("other/one", Right::Append));
        assert!(!c.allows("acme/x", Right::Read));
        assert!(!c.allows("other/two", Right::Append));
    }

    #[test]
    fn signed_tokens_verify_and_everything_else_is_refused() {
        let (pkcs8, public) = generate_key().unwrap();
        let (_, other_public) = generate_key().unwrap();
        let ring = Keyring::default();
        let c = claims(1, 200);
        let token = sign(&pkcs8, &c).unwrap();
        assert_eq!(ring.verify(&token, 150), Err(TokenError::NoKeys));
        ring.set(0, [], []);
        assert_eq!(ring.verify(&token, 150), Err(TokenError::KeyNotYetHeard(1)));
        ring.set(1, [(1, public.clone())], []);
        assert_eq!(ring.verify(&token, 150), Ok(c.clone()));
        // Cached, and still expires.
        assert_eq!(ring.verify(&token, 150), Ok(c.clone()));
        assert!(matches!(
            ring.verify(&token, 200),
            Err(TokenError::Expired { .. })
        ));
        // Another key under the same id: the signature fails.
        ring.set(2, [(1, other_public)], []);
        assert_eq!(ring.verify(&token, 150), Err(TokenError::BadSignature));
        ring.set(3, [(2, public.clone())], []);
        assert_eq!(ring.verify(&token, 150), Err(TokenError::UnknownKey(1)));
        // Revoked, even once cached.
        ring.set(4, [(1, public.clone())], []);
        assert!(ring.verify(&token, 150).is_ok());
        ring.set(5, [(1, public.clone())], [c.id.clone()]);
        assert_eq!(
            ring.verify(&token, 150),
            Err(TokenError::Revoked(c.id.clone()))
        );
        // Claims changed after signing (more rights): refused.
        let (_, signed, _) = decode(&token).unwrap();
        assert!(signed.starts_with(CONTEXT));
        let mut wider = c.clone();
        wider.rights.push(Right::Read);
        let forged = sign(&generate_key().unwrap().0, &wider).unwrap();
        let sig = token.rsplit_once('.').unwrap().1;
        let spliced = format!("{}.{sig}", forged.rsplit_once('.').unwrap().0);
        ring.set(6, [(1, public)], []);
        assert_eq!(ring.verify(&spliced, 150), Err(TokenError::BadSignature));
        for junk in [
            "",
            "stele1.",
            "stele1.x",
            "bearer x.y",
            "stele1.!!.??",
            "stele1.e30.AAAA",
        ] {
            assert!(
                matches!(ring.verify(junk, 150), Err(TokenError::Malformed(_))),
                "{junk:?}"
            );
        }
        let long = format!("{PREFIX}{}", "A".repeat(TOKEN_BYTES_MAX));
        assert_eq!(ring.verify(&long, 150), Err(TokenError::TooLong));
    }
}
