//! Appends: records grouped by tablet and cut into batches within the
//! limits, each batch sent under one batch id through the driver until it
//! is placed, a split re-sending its parts under the same id.

use std::collections::HashMap;

use stele_proto::limits;
use stele_proto::pb::{AppendRequest, AppendResponse, Condition, Position, Record};

use crate::driver::{Budget, Target, Verdict};
use crate::records::{invalid, too_large};
use crate::routes::{Route, RouteTable};
use crate::{Client, Error, Result, chunk, record_bytes, record_vshard, validate};

/// The result of one atomic batch.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendOutcome {
    /// One position per record, in input order.
    pub positions: Vec<Position>,
    /// True when the node had already applied this batch id.
    pub duplicate: bool,
}

pub(crate) fn new_batch_id() -> [u8; limits::BATCH_ID_BYTES] {
    rand::random()
}

/// A record waiting to be sent: its index in the caller's input and its vshard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Item {
    idx: usize,
    vshard: u32,
}

/// How one batch's attempt ended: placed, or left on several tablets by a
/// split (each part is then sent on its own, with the same batch id).
#[derive(Debug, PartialEq)]
enum Sent {
    Placed {
        positions: Vec<(usize, Position)>,
        duplicate: bool,
    },
    Split(Vec<Vec<Item>>),
}

impl Client {
    /// Appends records, each atomically and idempotently with the others
    /// of its tablet group; groups for different tablets are independent
    /// batches sent concurrently. Returns positions in input order.
    ///
    /// On error, some groups may have been applied and others not; every
    /// group was retried with its own batch id until the policy gave up.
    pub async fn append(&self, namespace: &str, records: Vec<Record>) -> Result<Vec<Position>> {
        validate(namespace, &records, &self.inner.opts)?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let groups = self.group_by_tablet(namespace, &records).await;
        let opts = &self.inner.opts;
        let mut sends = Vec::new();
        for (_, idxs) in groups {
            for run in chunk(&records, idxs, opts.batch_records_max, opts.batch_bytes_max) {
                let items = run
                    .into_iter()
                    .map(|idx| Item {
                        idx,
                        vshard: record_vshard(namespace, &records[idx]),
                    })
                    .collect();
                sends.push(self.send_batch(
                    namespace,
                    &records,
                    items,
                    new_batch_id(),
                    None,
                    false,
                ));
            }
        }
        let mut positions: Vec<Option<Position>> = vec![None; records.len()];
        for result in futures::future::join_all(sends).await {
            let (placed, _duplicate) = result?;
            for (idx, pos) in placed {
                positions[idx] = Some(pos);
            }
        }
        positions
            .into_iter()
            .map(|p| p.ok_or_else(|| Error::Protocol("a record got no position".into())))
            .collect()
    }

    /// Appends one atomic batch. Every record must route to one tablet.
    /// With `expect`, the batch applies only if the condition holds, else
    /// fails with `ConditionFailed { actual }`. Without `batch_id`, a fresh
    /// random one is used; pass the same id to retry a batch whose outcome
    /// is unknown.
    pub async fn append_batch(
        &self,
        namespace: &str,
        records: Vec<Record>,
        expect: Option<Condition>,
        batch_id: Option<[u8; 16]>,
    ) -> Result<AppendOutcome> {
        let opts = &self.inner.opts;
        validate(namespace, &records, opts)?;
        if records.is_empty() {
            return Err(invalid("records", "a batch needs at least one record"));
        }
        if let Some(c) = &expect {
            limits::validate_key("expect.key", &c.key)?;
        }
        let bytes: usize = records.iter().map(record_bytes).sum();
        if bytes > opts.batch_bytes_max {
            return Err(too_large("batch", bytes, opts.batch_bytes_max));
        }
        if records.len() > opts.batch_records_max {
            return Err(too_large(
                "batch records",
                records.len(),
                opts.batch_records_max,
            ));
        }
        let items: Vec<Item> = records
            .iter()
            .enumerate()
            .map(|(idx, r)| Item {
                idx,
                vshard: record_vshard(namespace, r),
            })
            .collect();
        let first = items[0].vshard;
        if items.iter().any(|i| i.vshard != first) {
            // Different vshards may still share a tablet; check by route.
            // Records with no route yet are left to the driver, which
            // fails the batch if they turn out to span tablets.
            let groups = self.group_by_tablet(namespace, &records).await;
            if groups.iter().filter(|(t, _)| t.is_some()).count() > 1 {
                return Err(invalid(
                    "records",
                    "an atomic batch must route to one tablet",
                ));
            }
        }
        let batch_id = batch_id.unwrap_or_else(new_batch_id);
        let (placed, duplicate) = self
            .send_batch(namespace, &records, items, batch_id, expect.as_ref(), true)
            .await?;
        let mut positions = vec![Position::default(); records.len()];
        for (idx, pos) in placed {
            positions[idx] = pos;
        }
        Ok(AppendOutcome {
            positions,
            duplicate,
        })
    }

    /// Groups record indices by the tablet of their vshard, refreshing the
    /// routes once if some vshard has none. Records still without a route
    /// (a cell whose tablets are not placed yet) form one group of their
    /// own: its batch goes through the driver, which refreshes the routes
    /// and retries within the budget like any other redirect. Each group
    /// comes with its tablet (`None` for that one).
    async fn group_by_tablet(
        &self,
        namespace: &str,
        records: &[Record],
    ) -> Vec<(Option<u64>, Vec<usize>)> {
        let mut pass = 0;
        loop {
            let routes = self.inner.routes.read().expect("routes lock").clone();
            let mut groups: HashMap<Option<u64>, Vec<usize>> = HashMap::new();
            for (i, r) in records.iter().enumerate() {
                let tablet = routes.lookup(record_vshard(namespace, r)).map(|r| r.tablet);
                groups.entry(tablet).or_default().push(i);
            }
            if pass == 0 && groups.contains_key(&None) {
                pass += 1;
                if let Err(e) = self.refresh_routes().await {
                    tracing::debug!(error = %e, "route refresh failed");
                }
                continue;
            }
            let mut groups: Vec<(Option<u64>, Vec<usize>)> = groups.into_iter().collect();
            groups.sort_by_key(|(_, g)| g[0]);
            return groups;
        }
    }

    /// Sends one batch (one batch id) until it is placed or the policy gives
    /// up. If a split leaves the items on several tablets, a non-atomic batch
    /// is re-sent per tablet with the same batch id: the node's receipts
    /// cover vshard ranges, so a part applied before the split is reported
    /// as a duplicate, not applied twice. The parts share one retry budget.
    async fn send_batch(
        &self,
        namespace: &str,
        records: &[Record],
        items: Vec<Item>,
        batch_id: [u8; 16],
        expect: Option<&Condition>,
        atomic: bool,
    ) -> Result<(Vec<(usize, Position)>, bool)> {
        let mut budget = Budget::start();
        let mut pending = vec![items];
        let mut placed = Vec::new();
        let mut duplicate = false;
        while let Some(group) = pending.pop() {
            let sent = self
                .drive(
                    "append",
                    &mut budget,
                    |routes| {
                        let (route, part) = route_batch(routes, &group, atomic)?;
                        Ok(Target {
                            tablet: Some(route.tablet),
                            endpoint: self.endpoint_of(&route).to_string(),
                            payload: (route, part),
                        })
                    },
                    |mut c, target| {
                        let (route, part) = &target.payload;
                        let req = AppendRequest {
                            tablet: route.tablet,
                            generation: route.generation,
                            batch_id: batch_id.to_vec(),
                            namespace: namespace.to_string(),
                            records: part.iter().map(|i| records[i.idx].clone()).collect(),
                            expect: expect.cloned(),
                        };
                        async move { c.append(req).await }
                    },
                    |target, reply| placed_by(&target.payload.1, reply),
                )
                .await?;
            match sent {
                Sent::Placed {
                    positions,
                    duplicate: d,
                } => {
                    duplicate |= d;
                    placed.extend(positions);
                }
                Sent::Split(parts) => pending.extend(parts),
            }
        }
        Ok((placed, duplicate))
    }
}

/// Where a batch goes by the current routes: one tablet's route and the
/// items; or, without one, what the attempt comes to at once (no route: the
/// policy decides; a split: an atomic batch fails, another is re-sent in
/// parts).
fn route_batch(
    routes: &RouteTable,
    items: &[Item],
    atomic: bool,
) -> Result<(Route, Vec<Item>), Verdict<Sent>> {
    match plan(routes, items) {
        Err(vshard) => Err(Verdict::Failed(Error::NoRoute { vshard })),
        Ok(mut parts) if parts.len() == 1 => Ok(parts.pop().expect("one part")),
        Ok(_) if atomic => Err(Verdict::Fatal(invalid(
            "records",
            "the tablet split: the atomic batch now spans tablets",
        ))),
        Ok(parts) => Err(Verdict::Done(Sent::Split(
            parts.into_iter().map(|(_, p)| p).collect(),
        ))),
    }
}

/// Reads an append's reply: one position per record sent, else the node
/// broke the protocol.
fn placed_by(part: &[Item], reply: Result<AppendResponse>) -> Verdict<Sent> {
    match reply {
        Ok(resp) if resp.positions.len() == part.len() => Verdict::Done(Sent::Placed {
            positions: part.iter().map(|i| i.idx).zip(resp.positions).collect(),
            duplicate: resp.duplicate,
        }),
        Ok(resp) => Verdict::Fatal(Error::Protocol(format!(
            "{} positions for {} records",
            resp.positions.len(),
            part.len()
        ))),
        Err(e) => Verdict::Failed(e),
    }
}

/// Groups items by the route of their vshard; `Err(vshard)` when one has none.
fn plan(routes: &RouteTable, items: &[Item]) -> Result<Vec<(Route, Vec<Item>)>, u32> {
    let mut parts: Vec<(Route, Vec<Item>)> = Vec::new();
    for item in items {
        let route = routes.lookup(item.vshard).ok_or(item.vshard)?;
        match parts.iter_mut().find(|(r, _)| r.tablet == route.tablet) {
            Some((_, p)) => p.push(*item),
            None => parts.push((route.clone(), vec![*item])),
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use stele_proto::pb::TabletDescriptor;

    use super::*;

    #[test]
    fn plan_groups_by_tablet() {
        let routes = two_tablets();
        let items = |vs: &[u32]| -> Vec<Item> {
            vs.iter()
                .enumerate()
                .map(|(idx, &vshard)| Item { idx, vshard })
                .collect()
        };
        let parts = plan(&routes, &items(&[1, 150, 2, 199])).unwrap();
        let got: Vec<(u64, Vec<usize>)> = parts
            .iter()
            .map(|(r, p)| (r.tablet, p.iter().map(|i| i.idx).collect()))
            .collect();
        assert_eq!(got, [(1, vec![0, 2]), (2, vec![1, 3])]);
        assert_eq!(plan(&routes, &items(&[1, 500])).unwrap_err(), 500);
    }

    fn two_tablets() -> RouteTable {
        RouteTable::from_descriptors(&[
            TabletDescriptor {
                id: 1,
                vshard_lo: 0,
                vshard_hi: 100,
                ..Default::default()
            },
            TabletDescriptor {
                id: 2,
                vshard_lo: 100,
                vshard_hi: 200,
                ..Default::default()
            },
        ])
    }

    fn items(vs: &[u32]) -> Vec<Item> {
        vs.iter()
            .enumerate()
            .map(|(idx, &vshard)| Item { idx, vshard })
            .collect()
    }

    /// Each case: the vshards of a batch, whether it is atomic, and where
    /// the attempt goes: a tablet, or what it comes to at once.
    #[test]
    fn batch_routing() {
        let routes = two_tablets();
        let cases = [
            ("one tablet", vec![1, 2], false, "tablet 1"),
            ("one tablet, atomic", vec![101, 199], true, "tablet 2"),
            (
                "no route: the policy decides",
                vec![1, 500],
                false,
                "failed",
            ),
            ("split, not atomic: parts", vec![1, 150], false, "split 2"),
            ("split, atomic: refused", vec![1, 150], true, "fatal"),
        ];
        for (name, vs, atomic, want) in cases {
            let got = match route_batch(&routes, &items(&vs), atomic) {
                Ok((route, part)) => {
                    assert_eq!(part, items(&vs), "{name}");
                    format!("tablet {}", route.tablet)
                }
                Err(Verdict::Failed(Error::NoRoute { vshard: 500 })) => "failed".into(),
                Err(Verdict::Done(Sent::Split(parts))) => format!("split {}", parts.len()),
                Err(Verdict::Fatal(e)) => {
                    assert_eq!(e.kind(), stele_proto::ErrorKind::Refuse, "{name}");
                    "fatal".into()
                }
                Err(v) => format!("{v:?}"),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn append_replies() {
        let part = items(&[1, 2]);
        let pos = |index| Position {
            tablet: 1,
            index,
            slot: 0,
        };
        let reply = |n: u64, duplicate| {
            Ok(AppendResponse {
                positions: (0..n).map(pos).collect(),
                duplicate,
            })
        };
        match placed_by(&part, reply(2, true)) {
            Verdict::Done(Sent::Placed {
                positions,
                duplicate,
            }) => {
                assert_eq!(positions, [(0, pos(0)), (1, pos(1))]);
                assert!(duplicate);
            }
            v => panic!("two positions for two records: {v:?}"),
        }
        assert!(matches!(
            placed_by(&part, reply(1, false)),
            Verdict::Fatal(Error::Protocol(_))
        ));
        let unavailable = stele_proto::Error::Unavailable { reason: "x".into() };
        assert!(matches!(
            placed_by(&part, Err(unavailable.into())),
            Verdict::Failed(_)
        ));
    }
}
