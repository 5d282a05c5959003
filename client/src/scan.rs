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
            let page = self
                .drive(
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
                .await?;
            rows.extend(page.rows);
            if page.next_cursor.is_empty() {
                return Ok(rows);
            }
            cursor = page.next_cursor;
        }
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
