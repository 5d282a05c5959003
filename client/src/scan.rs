//! Namespace scans: one page from one node, or every row of a namespace
//! tablet by tablet, each from its own leader, starting over when a
//! tablet splits or moves under the scan.

use std::time::{Duration, Instant};

use stele_proto::ErrorKind;
use stele_proto::limits;
use stele_proto::pb::{self, ReadOptions, Row};
use stele_proto::vshard::namespace_range;

use crate::driver::{Budget, Target, Verdict, give_up};
use crate::{Client, Error, Result, Route, ScanPage};

/// How many times a tablet-by-tablet namespace scan starts over (a split
/// or move under it) before it gives up.
const SCAN_ROUNDS_MAX: u32 = 40;

/// Where a page-by-page namespace scan ([`Client::scan_page`]) stands: the
/// vshard its current tablet starts at; the end of the range its position
/// applies within (0: the tablet's own); the node's cursor in the current
/// tablet (empty: from its start); and `rest`, how far the part of that
/// range past the current tablet was read (a tablet split under the scan
/// resumes its other parts from there, not from where the first part got
/// to). Opaque to callers: carry it as [`NsCursor::encode`]'s bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsCursor {
    at: u32,
    until: u64,
    node: Vec<u8>,
    rest: Vec<u8>,
}

/// The first byte of an encoded [`NsCursor`].
const NS_CURSOR_V1: u8 = 1;

impl NsCursor {
    /// Version byte, `at`, `until` and the node cursor's length big-endian,
    /// the node cursor, then `rest`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(17 + self.node.len() + self.rest.len());
        out.push(NS_CURSOR_V1);
        out.extend_from_slice(&self.at.to_be_bytes());
        out.extend_from_slice(&self.until.to_be_bytes());
        out.extend_from_slice(&(self.node.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.node);
        out.extend_from_slice(&self.rest);
        out
    }

    /// `None` for bytes no [`NsCursor::encode`] made (the node checks its
    /// own parts when the cursor is used).
    pub fn decode(bytes: &[u8]) -> Option<NsCursor> {
        let (&v, rest) = bytes.split_first()?;
        if v != NS_CURSOR_V1 || rest.len() < 16 {
            return None;
        }
        let n = u32::from_be_bytes(rest[12..16].try_into().ok()?) as usize;
        let tail = &rest[16..];
        if tail.len() < n {
            return None;
        }
        Some(NsCursor {
            at: u32::from_be_bytes(rest[0..4].try_into().ok()?),
            until: u64::from_be_bytes(rest[4..12].try_into().ok()?),
            node: tail[..n].to_vec(),
            rest: tail[n..].to_vec(),
        })
    }
}

impl Client {
    /// One page of a namespace's records with `ts_from <= ts < ts_to` and
    /// keys starting with `key_prefix`, merged by (ts, key). In this version
    /// the node serves the scan over its local tablets, so the client sends
    /// it to one node: the leader of the namespace's first tablet, if known.
    #[allow(clippy::too_many_arguments)]
    pub async fn scan(
        &self,
        namespace: &str,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        limit: u32,
        cursor: Option<Vec<u8>>,
        read: ReadOptions,
    ) -> Result<ScanPage> {
        limits::validate_namespace(namespace)?;
        let req = pb::ScanRequest {
            namespace: namespace.to_string(),
            ts_from,
            ts_to,
            key_prefix: key_prefix.to_vec(),
            limit,
            cursor: cursor.unwrap_or_default(),
            read: Some(read),
            tablet: 0,
            generation: 0,
        };
        let (lo, _) = namespace_range(namespace);
        self.drive(
            "scan",
            &mut Budget::start(),
            |routes| Ok(self.read_target(routes, lo)),
            |mut c, _| {
                let req = req.clone();
                async move { c.scan(req).await }
            },
            |_, reply| reply.map(ScanPage::from).into(),
        )
        .await
    }

    /// One page of a namespace's records tablet by tablet, each tablet's
    /// page from its own leader: rows come in tablet order (by vshard),
    /// within a tablet by (ts, key). Pass the returned cursor to go on;
    /// `None` when the namespace is done. A tablet that splits between
    /// pages is followed (its parts resume from the same position); one
    /// that merged with a tablet already scanned cannot be resumed without
    /// repeating rows, and is refused as an invalid cursor (start over).
    #[allow(clippy::too_many_arguments)]
    pub async fn scan_page(
        &self,
        namespace: &str,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        limit: u32,
        cursor: Option<NsCursor>,
        read: ReadOptions,
    ) -> Result<(Vec<Row>, Option<NsCursor>)> {
        limits::validate_namespace(namespace)?;
        let (lo, hi) = namespace_range(namespace);
        let mut cur = cursor.unwrap_or(NsCursor {
            at: lo,
            until: 0,
            node: Vec::new(),
            rest: Vec::new(),
        });
        let bad = |reason: &str| -> Error {
            stele_proto::Error::InvalidArgument {
                field: "cursor".into(),
                reason: reason.into(),
            }
            .into()
        };
        // `until` is a tablet's end, which may lie past the namespace's.
        if cur.at < lo
            || u64::from(cur.at) >= hi
            || (cur.until != 0 && cur.until <= u64::from(cur.at))
        {
            return Err(bad("not a cursor of this namespace"));
        }
        let started = Instant::now();
        let mut last = None;
        for round in 0..SCAN_ROUNDS_MAX {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(50 * u64::from(round.min(10)))).await;
            }
            let route = self
                .inner
                .routes
                .read()
                .expect("routes lock")
                .lookup(cur.at)
                .cloned();
            let Some(route) = route else {
                if let Err(e) = self.refresh_routes().await {
                    last = Some(e);
                }
                continue;
            };
            // A merge since the last page: the tablet now also holds rows
            // already returned (left) or rows the position would skip (right).
            if (route.lo < cur.at && cur.at != lo)
                || (cur.until != 0 && route.hi > cur.until && !cur.node.is_empty())
            {
                return Err(bad(
                    "the namespace's tablets merged under the scan: start it over",
                ));
            }
            let req = pb::ScanRequest {
                namespace: namespace.to_string(),
                ts_from,
                ts_to,
                key_prefix: key_prefix.to_vec(),
                limit,
                cursor: cur.node.clone(),
                read: Some(read),
                tablet: route.tablet,
                generation: route.generation,
            };
            let page = self.tablet_page(&route, req).await;
            let page = match page {
                Ok(page) => page,
                Err(e) if e.kind() == ErrorKind::Redirect => {
                    // Split or moved under the page: the same cursor on the
                    // new routes.
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !page.next_cursor.is_empty() {
                // A tablet that reaches the range's end carries the rest
                // along; a split part (ending before it) leaves it behind.
                let next = if cur.until == 0 || route.hi >= cur.until {
                    NsCursor {
                        at: cur.at,
                        until: if cur.until == 0 { route.hi } else { cur.until },
                        node: page.next_cursor.clone(),
                        rest: page.next_cursor,
                    }
                } else {
                    NsCursor {
                        node: page.next_cursor,
                        ..cur
                    }
                };
                return Ok((page.rows, Some(next)));
            }
            // This tablet is done: on to the next range; the parts of a
            // tablet split under the scan resume from where the whole
            // range had been read.
            if route.hi >= hi {
                return Ok((page.rows, None));
            }
            cur = if cur.until != 0 && route.hi < cur.until {
                NsCursor {
                    at: route.hi as u32,
                    until: cur.until,
                    node: cur.rest.clone(),
                    rest: cur.rest,
                }
            } else {
                NsCursor {
                    at: route.hi as u32,
                    until: 0,
                    node: Vec::new(),
                    rest: Vec::new(),
                }
            };
            if !page.rows.is_empty() {
                return Ok((page.rows, Some(cur)));
            }
        }
        Err(give_up(
            last.unwrap_or(Error::NoRoute { vshard: cur.at }),
            SCAN_ROUNDS_MAX,
            started.elapsed(),
        ))
    }

    /// Every record of a namespace in the range, following cursors to the end.
    pub async fn scan_all(
        &self,
        namespace: &str,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        // Tablet by tablet, each from its own leader: the tablets of a
        // split namespace need not share a leader (or a node). A tablet
        // whose range changed under the scan (a split) answers StaleRoute,
        // and the scan starts over on the new routes.
        let (lo, hi) = namespace_range(namespace);
        let started = Instant::now();
        let mut last = None;
        for round in 0..SCAN_ROUNDS_MAX {
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(50 * u64::from(round.min(10)))).await;
            }
            let routes: Vec<Route> = {
                let table = self.inner.routes.read().expect("routes lock");
                table
                    .routes()
                    .filter(|r| u64::from(r.lo) < hi && r.hi > u64::from(lo))
                    .cloned()
                    .collect()
            };
            let mut reached = u64::from(lo);
            for r in &routes {
                if u64::from(r.lo) <= reached {
                    reached = reached.max(r.hi);
                }
            }
            if reached < hi {
                if let Err(e) = self.refresh_routes().await {
                    last = Some(e);
                }
                continue;
            }
            let mut rows = Vec::new();
            let mut restart = false;
            for route in &routes {
                match self
                    .scan_tablet(namespace, route, ts_from, ts_to, key_prefix, read)
                    .await
                {
                    Ok(r) => rows.extend(r),
                    Err(e) if e.kind() == ErrorKind::Redirect => {
                        last = Some(e);
                        restart = true;
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if restart {
                continue;
            }
            let order = |r: &Row| {
                let p = r.position.unwrap_or_default();
                (r.ts, r.key.clone(), p.tablet, p.index, p.slot)
            };
            rows.sort_by_key(order);
            return Ok(rows);
        }
        Err(give_up(
            last.unwrap_or(Error::NoRoute { vshard: lo }),
            SCAN_ROUNDS_MAX,
            started.elapsed(),
        ))
    }

    /// Every row of one tablet's part of a namespace, page by page from
    /// its leader, at the route's generation. A redirect-kind error other
    /// than `NotLeader` (the tablet split or moved away) is returned for
    /// the caller to start over; `NotLeader` and unavailability are retried.
    async fn scan_tablet(
        &self,
        namespace: &str,
        route: &Route,
        ts_from: u64,
        ts_to: u64,
        key_prefix: &[u8],
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        let mut cursor = Vec::new();
        loop {
            let req = pb::ScanRequest {
                namespace: namespace.to_string(),
                ts_from,
                ts_to,
                key_prefix: key_prefix.to_vec(),
                limit: self.inner.opts.page_records,
                cursor: cursor.clone(),
                read: Some(read),
                tablet: route.tablet,
                generation: route.generation,
            };
            let page = self.tablet_page(route, req).await?;
            rows.extend(page.rows);
            if page.next_cursor.is_empty() {
                return Ok(rows);
            }
            cursor = page.next_cursor;
        }
    }
}

impl Client {
    /// One page of one tablet's scan, from its leader, through the driver
    /// (`page_of` says what a reply means).
    async fn tablet_page(&self, route: &Route, req: pb::ScanRequest) -> Result<pb::ScanResponse> {
        self.drive(
            "scan page",
            &mut Budget::start(),
            |routes| {
                Ok(Target {
                    tablet: Some(route.tablet),
                    endpoint: match routes.get(route.tablet) {
                        Some(r) => self.endpoint_of(r).to_string(),
                        None => self.inner.seed.clone(),
                    },
                    payload: (),
                })
            },
            |mut c, _| {
                let req = req.clone();
                async move { c.scan(req).await }
            },
            |_, reply| page_of(reply),
        )
        .await
    }
}

/// Reads a reply to one page of a tablet's scan. A redirect other than
/// `NotLeader` (the tablet split or moved away) ends the tablet's scan for
/// the caller to start over on new routes; `NotLeader` and unavailability
/// are retried.
fn page_of(reply: Result<pb::ScanResponse>) -> Verdict<pb::ScanResponse> {
    match reply {
        Err(e)
            if e.kind() == ErrorKind::Redirect
                && !matches!(e.api(), Some(stele_proto::Error::NotLeader { .. })) =>
        {
            Verdict::Moved(e)
        }
        reply => reply.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ns_cursors_round_trip_and_refuse_other_bytes() {
        let c = NsCursor {
            at: 7,
            until: 1 << 32,
            node: vec![1, 2, 3],
            rest: vec![9],
        };
        assert_eq!(NsCursor::decode(&c.encode()), Some(c.clone()));
        let empty = NsCursor {
            at: 0,
            until: 0,
            node: vec![],
            rest: vec![],
        };
        assert_eq!(NsCursor::decode(&empty.encode()), Some(empty));
        let bytes = c.encode();
        for bad in [&b""[..], &[2u8; 20][..], &bytes[..10], &bytes[..18]] {
            assert_eq!(NsCursor::decode(bad), None, "{bad:?}");
        }
    }

    /// Each case: a page reply, and whether the driver retries it (by the
    /// policy), ends the tablet's scan after repairing the routes, or has
    /// its page.
    #[test]
    fn page_replies() {
        let api = |e: stele_proto::Error| -> Result<pb::ScanResponse> { Err(e.into()) };
        let cases: Vec<(&str, Result<pb::ScanResponse>, &str)> = vec![
            ("a page", Ok(pb::ScanResponse::default()), "done"),
            (
                "not the leader: follow the hint, same page",
                api(stele_proto::Error::NotLeader {
                    leader_node: Some(2),
                    leader_endpoint: "http://n2".into(),
                }),
                "failed",
            ),
            (
                "unavailable: retried",
                api(stele_proto::Error::Unavailable { reason: "x".into() }),
                "failed",
            ),
            (
                "split under the scan: start over",
                api(stele_proto::Error::StaleRoute {
                    descriptor: Default::default(),
                }),
                "moved",
            ),
            (
                "moved away: start over",
                api(stele_proto::Error::TabletNotFound { tablet: 3 }),
                "moved",
            ),
            (
                "no route: start over",
                Err(Error::NoRoute { vshard: 1 }),
                "moved",
            ),
            (
                "a refusal is for the policy (which returns it)",
                api(stele_proto::Error::InvalidArgument {
                    field: "cursor".into(),
                    reason: "x".into(),
                }),
                "failed",
            ),
        ];
        for (name, reply, want) in cases {
            let got = match page_of(reply) {
                Verdict::Done(_) => "done",
                Verdict::Failed(_) => "failed",
                Verdict::Moved(_) => "moved",
                Verdict::Fatal(_) => "fatal",
            };
            assert_eq!(got, want, "{name}");
        }
    }
}
