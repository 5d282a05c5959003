//! Who may append to or read a namespace through the data API.
//!
//! ```text
//! plaintext listener                     anyone (dev cells, --insecure-plaintext)
//! TLS, operator or node certificate      every namespace
//! TLS, a token (authorization: Bearer)   what it grants, if it verifies here
//! TLS, neither                           refused
//! ```
//!
//! A token is verified by this node alone, against the keys and
//! revocations its controller's last heartbeat answer brought: nothing on
//! the data path calls anyone. A refusal is `PermissionDenied`, logged,
//! counted (`requests_refused` in status, `stele_auth_refused_total`), and
//! nothing is read or written.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use stele_proto::Error as ApiError;
use stele_tls::Caller;
use stele_tls::roles::Kind;
use stele_tls::token::{Right, TokenError, bearer_of};
use tonic::Request;

use super::DataParts;

/// The identity a data request came with.
pub(super) struct Access {
    caller: Caller,
    token: Option<String>,
}

impl Access {
    pub(super) fn of<T>(req: &Request<T>) -> Access {
        Access {
            caller: Caller::of(req),
            token: bearer_of(req),
        }
    }
}

impl DataParts {
    /// Ok if `access` may exercise `right` on `namespace` (`method` names
    /// the call in refusals).
    pub(super) fn permit(
        &self,
        access: &Access,
        method: &str,
        namespace: &str,
        right: Right,
    ) -> Result<(), ApiError> {
        let caller = &access.caller;
        if !caller.tls || caller.has(Kind::Operator) || caller.has(Kind::Node) {
            return Ok(());
        }
        let why = match &access.token {
            None => format!(
                "{method} on {namespace:?} needs a token (authorization: Bearer) or an operator certificate; the caller is {}",
                caller.describe()
            ),
            Some(token) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                match self.tokens.verify(token, now) {
                    Ok(claims) if claims.allows(namespace, right) => return Ok(()),
                    Ok(claims) => format!(
                        "token {} ({}) grants {}, not {right} on {namespace:?}",
                        claims.id,
                        claims.name,
                        claims.describe()
                    ),
                    // Keys the controller has and this node will hear of
                    // at its next heartbeat: retryable.
                    Err(e @ (TokenError::NoKeys | TokenError::KeyNotYetHeard(_)))
                        if self.options.controlled =>
                    {
                        return Err(ApiError::Unavailable {
                            reason: e.to_string(),
                        });
                    }
                    Err(TokenError::NoKeys | TokenError::KeyNotYetHeard(_)) => {
                        "this cell has no controller, so no tokens: use a certificate".to_string()
                    }
                    Err(e) => e.to_string(),
                }
            }
        };
        self.stats.requests_refused.fetch_add(1, Ordering::Relaxed);
        stele_tls::auth::refused(&format!("/stele.v1.Data/{method}"), &why);
        Err(ApiError::PermissionDenied { reason: why })
    }
}
