//! The HTTP API's JSON: records in, positions and rows out, and typed
//! errors with the data API's kinds (docs/OPERATIONS.md "HTTP API").
//! Keys and values are UTF-8 text, or base64 (standard alphabet, padded)
//! with `"encoding": "base64"`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};
use stele_client::{Position, Record, Row};
use utoipa::ToSchema;

/// How keys and values are written in answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Utf8,
    /// Base64, standard alphabet with padding.
    Base64,
}

/// The base64 engine of records: standard, padded, any trailing bits.
fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    )
}

/// `"utf8"`, the default.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Utf8Only {
    #[default]
    Utf8,
}

/// `"base64"`.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Base64Only {
    Base64,
}

/// A record whose key and value are UTF-8 text.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextRecord {
    /// The record's key: 1 to 4,096 bytes of UTF-8.
    #[schema(min_length = 1, max_length = 4096)]
    pub key: String,
    /// The record's value (at most 1 MiB).
    #[schema(max_length = 1048576)]
    pub value: String,
    /// Microseconds since the Unix epoch; the gateway's clock when absent.
    #[serde(default, deserialize_with = "ts_of")]
    #[schema(minimum = 0, maximum = 9223372036854775807_i64)]
    pub ts: Option<u64>,
    /// Routes the record by this key instead of `key`, so related keys
    /// land in one tablet.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 4096)]
    pub routing_key: Option<String>,
    /// Checked by serde (only `"utf8"`), not read.
    #[serde(default)]
    #[allow(dead_code)]
    pub encoding: Option<Utf8Only>,
}

/// A record whose key, value and routing key are base64.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Base64Record {
    #[schema(
        pattern = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$",
        max_length = 5464
    )]
    pub key: String,
    #[schema(
        pattern = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
        max_length = 1398104
    )]
    pub value: String,
    #[serde(default, deserialize_with = "ts_of")]
    #[schema(minimum = 0, maximum = 9223372036854775807_i64)]
    pub ts: Option<u64>,
    #[serde(default)]
    #[schema(
        pattern = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$",
        max_length = 5464
    )]
    pub routing_key: Option<String>,
    /// Checked by serde (only `"base64"`), not read.
    #[allow(dead_code)]
    pub encoding: Base64Only,
}

/// One record to append: text, or base64 with `"encoding": "base64"`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // the schema; `records_of` parses by `encoding`
pub enum RecordIn {
    Text(TextRecord),
    Base64(Base64Record),
}

/// An append's body: one record, or an array of them (with
/// `Content-Type: application/x-ndjson`, one record per line).
#[derive(Deserialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // the schema of the body; parsed by `records_of`
pub enum AppendBody {
    One(RecordIn),
    Many(Vec<RecordIn>),
}

/// A timestamp: a JSON integer from 0 to 2^63 - 1 (an integral number
/// written with a fraction, `5.0`, is one too), or null.
fn ts_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    use serde::de::Error;
    let Some(n) = Option::<serde_json::Number>::deserialize(d)? else {
        return Ok(None);
    };
    let v = match (n.as_u64(), n.as_f64()) {
        (Some(v), _) => Some(v),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..9.223_372_036_854_775e18).contains(&f) => {
            Some(f as u64)
        }
        _ => None,
    };
    match v {
        Some(v) if v <= TS_MAX => Ok(Some(v)),
        _ => Err(D::Error::custom(format!(
            "ts {n}: want an integer from 0 to {TS_MAX}"
        ))),
    }
}

/// The largest timestamp (and time bound) the HTTP API takes.
pub const TS_MAX: u64 = i64::MAX as u64;

/// Reads one record, text or base64 by its `encoding`; whether its `ts`
/// was given (else it is `now_us`).
fn record_of(v: serde_json::Value, at: usize, now_us: u64) -> Result<(Record, bool), ApiError> {
    let field = |f: &str| format!("records[{at}].{f}");
    let base64 = v.get("encoding").and_then(|e| e.as_str()) == Some("base64");
    let bad = |e: serde_json::Error| ApiError::invalid(&format!("records[{at}]"), &e.to_string());
    if !base64 {
        let r: TextRecord = serde_json::from_value(v).map_err(bad)?;
        let given = r.ts.is_some();
        let record = Record {
            key: r.key.into_bytes(),
            ts: r.ts.unwrap_or(now_us),
            value: r.value.into_bytes(),
            routing_key: r.routing_key.map(String::into_bytes),
        };
        return Ok((record, given));
    }
    let r: Base64Record = serde_json::from_value(v).map_err(bad)?;
    let decode = |f: &str, s: &str| {
        b64()
            .decode(s)
            .map_err(|e| ApiError::invalid(&field(f), &format!("not base64: {e}")))
    };
    let record = Record {
        key: decode("key", &r.key)?,
        ts: r.ts.unwrap_or(now_us),
        value: decode("value", &r.value)?,
        routing_key: r
            .routing_key
            .map(|k| decode("routing_key", &k))
            .transpose()?,
    };
    Ok((record, r.ts.is_some()))
}

/// Parses an append body: a JSON object or array, or NDJSON lines. With
/// the records, whether each one's `ts` was given (the gateway's clock
/// filled in the others): what idempotency ids hash.
pub fn records_of(
    body: &[u8],
    ndjson: bool,
    now_us: u64,
) -> Result<(Vec<Record>, Vec<bool>), ApiError> {
    let items: Vec<serde_json::Value> = if ndjson {
        let mut out = Vec::new();
        for (n, line) in body.split(|b| *b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let v = serde_json::from_slice(line)
                .map_err(|e| ApiError::malformed(&format!("line {}: {e}", n + 1)))?;
            out.push(v);
        }
        out
    } else {
        match serde_json::from_slice(body).map_err(|e| ApiError::malformed(&e.to_string()))? {
            serde_json::Value::Array(items) => items,
            v @ serde_json::Value::Object(_) => vec![v],
            _ => {
                return Err(ApiError::invalid(
                    "body",
                    "a record object or an array of records",
                ));
            }
        }
    };
    items
        .into_iter()
        .enumerate()
        .map(|(n, v)| record_of(v, n, now_us))
        .collect::<Result<Vec<_>, _>>()
        .map(|parsed| parsed.into_iter().unzip())
}

/// Where a record was placed: its tablet, the log index of its batch and
/// its slot in that batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct PositionOut {
    pub tablet: u64,
    pub index: u64,
    pub slot: u32,
}

impl From<&Position> for PositionOut {
    fn from(p: &Position) -> Self {
        PositionOut {
            tablet: p.tablet,
            index: p.index,
            slot: p.slot,
        }
    }
}

/// An acknowledged append: every record is durable on a quorum.
#[derive(Debug, Serialize, ToSchema)]
pub struct AppendOut {
    /// One per record, in the order sent.
    pub positions: Vec<PositionOut>,
    /// True when every record had been applied before, by an earlier
    /// request with the same `Idempotency-Key`.
    pub duplicate: bool,
}

/// One stored record.
#[derive(Debug, Serialize, ToSchema)]
pub struct RowOut {
    pub key: String,
    pub value: String,
    pub ts: u64,
    pub position: PositionOut,
    /// How `key` and `value` are written: base64 when asked, or when
    /// either is not UTF-8.
    pub encoding: Encoding,
}

impl RowOut {
    pub fn new(row: Row, want: Encoding) -> RowOut {
        let position = PositionOut::from(&row.position.unwrap_or_default());
        let text = match want {
            Encoding::Utf8 => String::from_utf8(row.key.clone())
                .ok()
                .zip(String::from_utf8(row.value.clone()).ok()),
            Encoding::Base64 => None,
        };
        match text {
            Some((key, value)) => RowOut {
                key,
                value,
                ts: row.ts,
                position,
                encoding: Encoding::Utf8,
            },
            None => RowOut {
                key: b64().encode(&row.key),
                value: b64().encode(&row.value),
                ts: row.ts,
                position,
                encoding: Encoding::Base64,
            },
        }
    }
}

/// A page of rows.
#[derive(Debug, Serialize, ToSchema)]
pub struct PageOut {
    pub rows: Vec<RowOut>,
    /// Pass as `cursor` for the next page; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A typed error: the data API's kind in snake case (`invalid_argument`,
/// `too_large`, `permission_denied`, `unavailable`, ...), or one of the
/// HTTP API's own (`malformed`, `not_found`, `overloaded`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub kind: String,
    pub message: String,
    /// The request may succeed if sent again unchanged (after
    /// `Retry-After` seconds when given).
    pub retryable: bool,
}

/// An error answer: status, kind, message, and `Retry-After` for the
/// retryable ones.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub retry_after_s: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn invalid(field: &str, reason: &str) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            format!("invalid {field}: {reason}"),
        )
    }

    pub fn malformed(reason: &str) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed",
            format!("malformed JSON: {reason}"),
        )
    }

    pub fn retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after_s = Some(seconds);
        self
    }

    /// A client error as HTTP: the data API's kinds keep their names;
    /// refusals are 4xx, what a retry may cure is 429/503/504.
    pub fn from_client(e: &stele_client::Error, had_token: bool) -> ApiError {
        use stele_client::Error as C;
        use stele_proto::Error as P;
        if let Some(api) = e.api() {
            let (status, kind) = match api {
                P::InvalidArgument { .. } => (StatusCode::BAD_REQUEST, "invalid_argument"),
                // A field or batch past a limit: the request is wrong, not
                // its size on the wire (that is 413, from the gateway).
                P::TooLarge { .. } => (StatusCode::BAD_REQUEST, "too_large"),
                P::PermissionDenied { .. } if !had_token => {
                    (StatusCode::UNAUTHORIZED, "permission_denied")
                }
                P::PermissionDenied { .. } => (StatusCode::FORBIDDEN, "permission_denied"),
                P::NamespaceNotFound { .. } => (StatusCode::NOT_FOUND, "namespace_not_found"),
                P::WrongCell { .. } => (StatusCode::MISDIRECTED_REQUEST, "wrong_cell"),
                P::ConditionFailed { .. } => (StatusCode::CONFLICT, "condition_failed"),
                P::StorageFull { .. } => (StatusCode::INSUFFICIENT_STORAGE, "storage_full"),
                P::TooStale { .. } => (StatusCode::SERVICE_UNAVAILABLE, "too_stale"),
                P::Incomplete { .. } => (StatusCode::SERVICE_UNAVAILABLE, "incomplete"),
                P::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                P::NotLeader { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_leader"),
                P::StaleRoute { .. } => (StatusCode::SERVICE_UNAVAILABLE, "stale_route"),
                P::TabletNotFound { .. } => (StatusCode::SERVICE_UNAVAILABLE, "tablet_not_found"),
            };
            let err = ApiError::new(status, kind, e.to_string());
            return if status.is_server_error() {
                err.retry_after(1)
            } else {
                err
            };
        }
        match e {
            C::RequestTimeout { .. } | C::Exhausted { .. } => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, "unavailable", e.to_string())
                    .retry_after(1)
            }
            C::NoRoute { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            )
            .retry_after(1),
            _ => ApiError::new(StatusCode::BAD_GATEWAY, "internal", e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retryable = self.retry_after_s.is_some();
        let body = ErrorBody {
            error: ErrorDetail {
                kind: self.kind.to_string(),
                message: self.message,
                retryable,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies() {
        let one = records_of(br#"{"key":"k","value":"v","ts":5}"#, false, 9)
            .unwrap()
            .0;
        assert_eq!((one[0].key.as_slice(), one[0].ts), (&b"k"[..], 5));
        let many = records_of(
            br#"[{"key":"a","value":"1"},{"key":"b","value":"2"}]"#,
            false,
            9,
        )
        .unwrap()
        .0;
        assert_eq!(many.len(), 2);
        assert_eq!(many[1].ts, 9, "the gateway's clock when no ts");
        let mixed = records_of(
            br#"[{"key":"a","value":"1","ts":3},{"key":"b","value":"2"}]"#,
            false,
            9,
        )
        .unwrap();
        assert_eq!(mixed.1, [true, false], "which ts the producer gave");
        let nd = records_of(
            b"{\"key\":\"a\",\"value\":\"1\"}\n\n{\"key\":\"b\",\"value\":\"2\"}\n",
            true,
            9,
        )
        .unwrap()
        .0;
        assert_eq!(nd.len(), 2);
        assert!(
            records_of(b"[]", false, 9).unwrap().0.is_empty(),
            "nothing to append"
        );
        let float = records_of(br#"{"key":"k","value":"v","ts":1403.0}"#, false, 9)
            .unwrap()
            .0;
        assert_eq!(float[0].ts, 1403, "an integral number is an integer");
        let b64 = records_of(
            br#"{"key":"AAE=","value":"/w==","encoding":"base64"}"#,
            false,
            9,
        )
        .unwrap()
        .0;
        assert_eq!(
            (b64[0].key.as_slice(), b64[0].value.as_slice()),
            (&[0u8, 1][..], &[255u8][..])
        );
        for (body, nd, kind) in [
            (&b"{"[..], false, "malformed"),
            (
                br#"{"key":"k","value":"v","extra":1}"#,
                false,
                "invalid_argument",
            ),
            (br#"7"#, false, "invalid_argument"),
            (br#"{"key":"k"}"#, false, "invalid_argument"),
            (
                br#"{"key":"!","value":"v","encoding":"base64"}"#,
                false,
                "invalid_argument",
            ),
            (
                br#"{"key":"k","value":"v","ts":-1}"#,
                false,
                "invalid_argument",
            ),
            (
                br#"{"key":"k","value":"v","ts":9223372036854775808}"#,
                false,
                "invalid_argument",
            ),
            (
                br#"{"key":"k","value":"v","ts":1.5}"#,
                false,
                "invalid_argument",
            ),
            (
                b"{\"key\":\"a\",\"value\":\"1\"}\nnot json",
                true,
                "malformed",
            ),
        ] {
            let e = records_of(body, nd, 0).unwrap_err();
            assert_eq!(e.kind, kind, "{}", String::from_utf8_lossy(body));
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn rows_fall_back_to_base64() {
        let row = |key: &[u8], value: &[u8]| Row {
            key: key.to_vec(),
            ts: 1,
            value: value.to_vec(),
            position: None,
        };
        assert_eq!(
            RowOut::new(row(b"k", b"v"), Encoding::Utf8).encoding,
            Encoding::Utf8
        );
        let bin = RowOut::new(row(b"k", &[0xff]), Encoding::Utf8);
        assert_eq!(
            (bin.encoding, bin.value.as_str()),
            (Encoding::Base64, "/w==")
        );
        assert_eq!(RowOut::new(row(b"k", b"v"), Encoding::Base64).key, "aw==");
    }
}
