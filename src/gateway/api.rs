//! The HTTP API's handlers and their OpenAPI description (served at
//! `/openapi.json`; docs/OPERATIONS.md "HTTP API").
//!
//! ```text
//! POST /v1/namespaces/{ws}/{project}/records          append one or many (JSON, NDJSON)
//! GET  /v1/namespaces/{ws}/{project}/keys/{key}        a key's latest record
//! GET  /v1/namespaces/{ws}/{project}/keys/{key}/records  a key's records, paged
//! GET  /v1/namespaces/{ws}/{project}/records           the namespace's records, paged
//! ```

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use stele_client::{Client, Consistency, NsCursor, ReadOptions};
use utoipa::{IntoParams, OpenApi};

use super::Gateway;
use super::json::{
    ApiError, AppendBody, AppendOut, Base64Only, Base64Record, Encoding, ErrorBody, ErrorDetail,
    PageOut, PositionOut, RecordIn, RowOut, TextRecord, Utf8Only, records_of,
};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Stele HTTP API",
        description = "Append and read records of a Stele cell over HTTP/JSON. Errors are JSON with the data API's kinds; requests carry the producer's token as `Authorization: Bearer`."
    ),
    paths(append, get_key, scan_key, scan_namespace),
    components(schemas(
        AppendBody, RecordIn, TextRecord, Base64Record, Utf8Only, Base64Only, Encoding,
        ConsistencyParam, AppendOut, PositionOut, RowOut, PageOut, ErrorBody, ErrorDetail
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The namespace, `workspace/project`, as two path segments.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NsPath {
    /// The namespace's first part (1 to 64 of `A-Za-z0-9_.-`).
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    workspace: String,
    /// The namespace's second part.
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    project: String,
}

impl NsPath {
    fn namespace(&self) -> Result<String, ApiError> {
        let ns = format!("{}/{}", self.workspace, self.project);
        stele_proto::limits::validate_namespace(&ns)
            .map_err(|e| ApiError::from_client(&stele_client::Error::Api(e), true))?;
        Ok(ns)
    }
}

/// The path of a key's resources (described for the OpenAPI document;
/// the key is read from the raw path by [`key_of`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)]
pub struct KeyPath {
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    workspace: String,
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    project: String,
    /// The key's bytes, percent-encoded (1 to 4,096 bytes; any bytes).
    #[param(min_length = 1, max_length = 4096)]
    key: String,
}

/// The key of a `/keys/{key}` path: its segment's percent-encoded bytes.
fn key_of(uri: &axum::http::Uri) -> Result<Vec<u8>, ApiError> {
    let seg = uri
        .path()
        .split('/')
        .nth(6)
        .ok_or_else(|| ApiError::invalid("key", "missing"))?;
    let key: Vec<u8> = percent_encoding::percent_decode_str(seg).collect();
    stele_proto::limits::validate_key("key", &key)
        .map_err(|e| ApiError::from_client(&stele_client::Error::Api(e), true))?;
    Ok(key)
}

/// How a read is served.
#[derive(Debug, Clone, Copy, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConsistencyParam {
    /// From the tablet's leader, after everything acknowledged before.
    #[default]
    Linearizable,
    /// From any replica no staler than `max_staleness_ms`.
    Bounded,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReadQuery {
    #[serde(default)]
    consistency: ConsistencyParam,
    /// For bounded reads: the oldest acceptable data, in milliseconds.
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    max_staleness_ms: u64,
    /// How keys and values are written in the answer (base64 anyway for
    /// a row that is not UTF-8).
    #[serde(default)]
    encoding: Encoding,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct KeyPageQuery {
    /// Records with `ts >= from_ts` (microseconds).
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    from_ts: u64,
    /// Records with `ts < to_ts`; 0 or absent: no bound.
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    to_ts: u64,
    /// Most rows in the page (1 to 10,000; default 1,000).
    #[serde(default)]
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
    /// The previous page's `next_cursor`; empty or absent: the first page.
    #[serde(default)]
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    cursor: Option<String>,
    #[serde(default)]
    consistency: ConsistencyParam,
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    max_staleness_ms: u64,
    #[serde(default)]
    encoding: Encoding,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct NsPageQuery {
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    from_ts: u64,
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    to_ts: u64,
    /// Only keys starting with this text (at most 4,096 bytes).
    #[serde(default)]
    #[param(max_length = 4096)]
    prefix: Option<String>,
    #[serde(default)]
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u32>,
    #[serde(default)]
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    cursor: Option<String>,
    #[serde(default)]
    consistency: ConsistencyParam,
    #[serde(default)]
    #[param(maximum = 9223372036854775807_i64)]
    max_staleness_ms: u64,
    #[serde(default)]
    encoding: Encoding,
}

fn read_options(consistency: ConsistencyParam, max_staleness_ms: u64) -> ReadOptions {
    ReadOptions {
        consistency: match consistency {
            ConsistencyParam::Linearizable => Consistency::Linearizable,
            ConsistencyParam::Bounded => Consistency::Bounded,
        } as i32,
        max_staleness_ms,
        partial: false,
    }
}

/// Time bounds and staleness past 2^63 - 1 are refused (the document
/// says int64).
fn bounded(fields: &[(&str, u64)]) -> Result<(), ApiError> {
    match fields.iter().find(|(_, v)| *v > super::json::TS_MAX) {
        Some((f, _)) => Err(ApiError::invalid(f, "at most 2^63 - 1")),
        None => Ok(()),
    }
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::invalid("path", &e.body_text())
}

fn query_error(e: QueryRejection) -> ApiError {
    ApiError::invalid("query", &e.body_text())
}

/// The producer's token, passed through to the cell. A malformed one is
/// refused here, before anything is sent.
fn client_of(gw: &Gateway, headers: &HeaderMap) -> Result<(Client, bool), ApiError> {
    let Some(v) = headers.get(header::AUTHORIZATION) else {
        if gw.opts.require_token {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "permission_denied",
                "this gateway requires a producer token: Authorization: Bearer <token>",
            ));
        }
        return Ok((gw.client.clone(), false));
    };
    let token = v
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "permission_denied",
                "Authorization is not `Bearer <token>`",
            )
        })?;
    let bearer = stele_tls::token::Bearer::new(token).map_err(|e| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "permission_denied",
            format!("malformed token: {e}"),
        )
    })?;
    Ok((gw.client.with_token(bearer), true))
}

/// Appends one record or many. With `Idempotency-Key`, a retry of the
/// same request (same namespace, key and records, within the cell's
/// receipt window of 10 minutes) is applied once, through any gateway.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{workspace}/{project}/records",
    params(
        NsPath,
        ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,128}$", description = "1 to 128 printable ASCII characters naming this request; a retry with the same key is applied once"),
    ),
    request_body(content(
        (AppendBody = "application/json"),
        (String = "application/x-ndjson"),
    )),
    responses(
        (status = 200, description = "Durable on a quorum", body = AppendOut),
        (status = 400, description = "Malformed, invalid or past a limit (a key, a value, a batch); nothing written", body = ErrorBody),
        (status = 401, description = "No or malformed token", body = ErrorBody),
        (status = 403, description = "The token does not allow this", body = ErrorBody),
        (status = 404, description = "No such namespace or route", body = ErrorBody),
        (status = 413, description = "Body larger than the gateway's limit; nothing written", body = ErrorBody),
        (status = 415, description = "Not JSON or NDJSON; nothing written", body = ErrorBody),
        (status = 429, description = "The gateway's memory budget is full: retry after Retry-After", body = ErrorBody),
        (status = 503, description = "Retry after Retry-After (same Idempotency-Key)", body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn append(
    State(gw): State<Arc<Gateway>>,
    path: Result<Path<NsPath>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match append_inner(&gw, path, &headers, body).await {
        Ok(out) => axum::Json(out).into_response(),
        Err(e) => {
            gw.count("append", e.status);
            e.into_response()
        }
    }
}

async fn append_inner(
    gw: &Gateway,
    path: Result<Path<NsPath>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
) -> Result<AppendOut, ApiError> {
    let ns = path.map_err(path_error)?.namespace()?;
    let ndjson = match headers.get(header::CONTENT_TYPE).map(|v| v.to_str()) {
        None => false,
        Some(Ok(ct)) => {
            let mime = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            match mime.as_str() {
                "application/json" => false,
                "application/x-ndjson" | "application/jsonl" => true,
                _ => {
                    return Err(ApiError::new(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "invalid_argument",
                        format!(
                            "Content-Type {mime:?}: want application/json or application/x-ndjson"
                        ),
                    ));
                }
            }
        }
        Some(Err(_)) => return Err(ApiError::invalid("Content-Type", "not ASCII")),
    };
    let idem = match headers.get("idempotency-key") {
        None => None,
        Some(v) => Some(super::idempotency::key_of(v)?),
    };
    let (client, had_token) = client_of(gw, headers)?;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let _held = gw.admit(declared)?;
    let bytes = axum::body::to_bytes(body, gw.opts.body_bytes_max)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("body larger than {} bytes", gw.opts.body_bytes_max),
            )
        })?;
    // Whether each ts was the producer's: an idempotency key's batch ids
    // hash no ts of the gateway's (idempotency.rs).
    let (records, ts_given) = records_of(&bytes, ndjson, crate::cmd::client::now_us())?;
    drop(bytes);
    stele_client::validate(&ns, &records, client.options())
        .map_err(|e| ApiError::from_client(&e, had_token))?;
    let n = records.len();
    if n == 0 {
        return Ok(AppendOut {
            positions: Vec::new(),
            duplicate: false,
        });
    }
    let out = match idem {
        Some(key) => super::idempotency::append(&client, &ns, &key, records, &ts_given).await,
        None if n == 1 && !had_token => {
            let record = records.into_iter().next().expect("one record");
            gw.batcher
                .append(&ns, record)
                .await
                .map(|p| (vec![p], false))
        }
        None => client.append(&ns, records).await.map(|p| (p, false)),
    };
    let (positions, duplicate) = out.map_err(|e| ApiError::from_client(&e, had_token))?;
    gw.count("append", StatusCode::OK);
    gw.records(n);
    Ok(AppendOut {
        positions: positions.iter().map(PositionOut::from).collect(),
        duplicate,
    })
}

/// A key's latest record.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{workspace}/{project}/keys/{key}",
    params(KeyPath, ReadQuery),
    responses(
        (status = 200, body = RowOut),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No record of the key", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn get_key(
    State(gw): State<Arc<Gateway>>,
    path: Result<Path<NsPath>, PathRejection>,
    query: Result<Query<ReadQuery>, QueryRejection>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let ns = path.map_err(path_error)?.namespace()?;
        let Query(q) = query.map_err(query_error)?;
        bounded(&[("max_staleness_ms", q.max_staleness_ms)])?;
        let key = key_of(&uri)?;
        let (client, had_token) = client_of(&gw, &headers)?;
        let row = client
            .get(&ns, &key, read_options(q.consistency, q.max_staleness_ms))
            .await
            .map_err(|e| ApiError::from_client(&e, had_token))?;
        row.map(|r| RowOut::new(r, q.encoding)).ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", "no record of the key")
        })
    }
    .await;
    gw.answer("get", r)
}

/// A key's records with `from_ts <= ts < to_ts`, oldest first, a page at
/// a time.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{workspace}/{project}/keys/{key}/records",
    params(KeyPath, KeyPageQuery),
    responses(
        (status = 200, body = PageOut),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn scan_key(
    State(gw): State<Arc<Gateway>>,
    path: Result<Path<NsPath>, PathRejection>,
    query: Result<Query<KeyPageQuery>, QueryRejection>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let ns = path.map_err(path_error)?.namespace()?;
        let Query(q) = query.map_err(query_error)?;
        bounded(&[
            ("from_ts", q.from_ts),
            ("to_ts", q.to_ts),
            ("max_staleness_ms", q.max_staleness_ms),
        ])?;
        let key = key_of(&uri)?;
        let limit = limit_of(q.limit)?;
        let cursor = q
            .cursor
            .as_deref()
            .filter(|c| !c.is_empty())
            .map(cursor_bytes)
            .transpose()?;
        let (client, had_token) = client_of(&gw, &headers)?;
        let page = client
            .scan_key(
                &ns,
                &key,
                q.from_ts,
                q.to_ts,
                limit,
                cursor,
                read_options(q.consistency, q.max_staleness_ms),
            )
            .await
            .map_err(|e| ApiError::from_client(&e, had_token))?;
        Ok(PageOut {
            rows: page
                .rows
                .into_iter()
                .map(|r| RowOut::new(r, q.encoding))
                .collect(),
            next_cursor: page.next_cursor.map(|c| URL_SAFE_NO_PAD.encode(c)),
        })
    }
    .await;
    gw.answer("scan_key", r)
}

/// The namespace's records with `from_ts <= ts < to_ts`, a page at a
/// time: tablet by tablet, within a tablet by (ts, key).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{workspace}/{project}/records",
    params(NsPath, NsPageQuery),
    responses(
        (status = 200, body = PageOut),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = [])),
)]
pub async fn scan_namespace(
    State(gw): State<Arc<Gateway>>,
    path: Result<Path<NsPath>, PathRejection>,
    query: Result<Query<NsPageQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let ns = path.map_err(path_error)?.namespace()?;
        let Query(q) = query.map_err(query_error)?;
        bounded(&[
            ("from_ts", q.from_ts),
            ("to_ts", q.to_ts),
            ("max_staleness_ms", q.max_staleness_ms),
        ])?;
        let prefix = q.prefix.unwrap_or_default().into_bytes();
        if prefix.len() > stele_proto::limits::KEY_BYTES_MAX {
            return Err(ApiError::invalid("prefix", "longer than a key"));
        }
        let limit = limit_of(q.limit)?;
        let cursor = match q.cursor.as_deref().filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => Some(
                NsCursor::decode(&cursor_bytes(c)?)
                    .ok_or_else(|| ApiError::invalid("cursor", "not a cursor this API issued"))?,
            ),
        };
        let (client, had_token) = client_of(&gw, &headers)?;
        let (rows, next) = client
            .scan_page(
                &ns,
                q.from_ts,
                q.to_ts,
                &prefix,
                limit,
                cursor,
                read_options(q.consistency, q.max_staleness_ms),
            )
            .await
            .map_err(|e| ApiError::from_client(&e, had_token))?;
        Ok(PageOut {
            rows: rows
                .into_iter()
                .map(|r| RowOut::new(r, q.encoding))
                .collect(),
            next_cursor: next.map(|c| URL_SAFE_NO_PAD.encode(c.encode())),
        })
    }
    .await;
    gw.answer("scan", r)
}

fn limit_of(limit: Option<u32>) -> Result<u32, ApiError> {
    match limit {
        None => Ok(1000),
        Some(n @ 1..=10_000) => Ok(n),
        Some(_) => Err(ApiError::invalid("limit", "1 to 10000")),
    }
}

fn cursor_bytes(c: &str) -> Result<Vec<u8>, ApiError> {
    URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| ApiError::invalid("cursor", "not a cursor this API issued"))
}

/// Unknown paths and methods: a typed 404.
pub async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such resource").into_response()
}

/// The OpenAPI document.
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        ApiDoc::openapi().to_pretty_json().unwrap_or_default(),
    )
        .into_response()
}
