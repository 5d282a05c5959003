//! The seal and compaction policy of a node, as a pure function: from what
//! each tablet replica holds (memtable size and age, seals in flight,
//! segments), the node's memtable budget, the tablets holding back the
//! journal's trim and the time, which tablets to seal (and why) and which
//! segments to compact. The node's policy driver (`node::policy`) gathers
//! the inputs, proposes what this returns and trims the journal.

use stele_proto::command::SealReason;

use super::seal::{self, Candidate};

/// One tablet replica as the policy sees it.
#[derive(Debug, Clone, Default)]
pub struct TabletState {
    pub id: u64,
    /// This replica leads its group: only leaders propose.
    pub leader: bool,
    /// A frozen memtable is waiting for its segment: one seal (or
    /// compaction) in flight per tablet.
    pub seal_in_flight: bool,
    /// Frozen for a merge: no compaction (the merge adopts its segments).
    pub merge_frozen: bool,
    /// Bytes in the active memtable.
    pub memtable_bytes: usize,
    /// Proposal time of the oldest row in the active memtable.
    pub oldest_at_us: Option<u64>,
    pub memtable_bytes_max: usize,
    pub memtable_age_max_us: u64,
    /// The published segments, for compaction (may be left empty for a
    /// tablet that is not a leader, or has a seal in flight).
    pub segments: Vec<Candidate>,
    pub compact_target_bytes: u64,
    pub compact_min_inputs: usize,
}

/// What the policy decided for one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decisions {
    /// Seals to propose, in order.
    pub seals: Vec<(u64, SealReason)>,
    /// Compactions to propose: (tablet, segment ids), in order.
    pub compactions: Vec<(u64, Vec<String>)>,
}

/// Decides one pass.
///
/// - A leader with no seal in flight seals when its memtable reaches
///   `memtable_bytes_max` (`Size`) or its oldest row `memtable_age_max_us`
///   (`Age`).
/// - When the memtables of those leaders together pass `budget_bytes`, the
///   largest of the rest seal until the excess is covered (`NodeBudget`).
/// - Each tablet in `laggards` (holding back the journal's trim) that leads
///   and has no seal in flight seals (`JournalTrim`), even if empty.
/// - A leader not sealing now, with no seal in flight and not frozen for a
///   merge, compacts what [`seal::compaction_plan`] picks: one run per
///   tablet and pass, so the work per pass is bounded.
pub fn plan(
    tablets: &[TabletState],
    laggards: &[u64],
    budget_bytes: usize,
    now_us: u64,
) -> Decisions {
    let mut seals: Vec<(u64, SealReason)> = Vec::new();
    let mut sizes = Vec::new();
    let mut total = 0usize;
    for t in tablets {
        // An empty memtable has nothing to seal.
        if t.seal_in_flight || t.memtable_bytes == 0 || !t.leader {
            continue;
        }
        let bytes = t.memtable_bytes;
        total += bytes;
        if bytes >= t.memtable_bytes_max {
            seals.push((t.id, SealReason::Size));
        } else if t
            .oldest_at_us
            .is_some_and(|at| now_us.saturating_sub(at) >= t.memtable_age_max_us)
        {
            seals.push((t.id, SealReason::Age));
        } else {
            sizes.push((bytes, t.id));
        }
    }
    if total > budget_bytes {
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut over = total - budget_bytes;
        for (bytes, id) in sizes {
            if over == 0 {
                break;
            }
            seals.push((id, SealReason::NodeBudget));
            over = over.saturating_sub(bytes);
        }
    }
    for id in laggards {
        if let Some(t) = tablets.iter().find(|t| t.id == *id)
            && t.leader
            && !t.seal_in_flight
            && !seals.iter().any(|(s, _)| s == id)
        {
            seals.push((*id, SealReason::JournalTrim));
        }
    }
    let mut compactions = Vec::new();
    for t in tablets {
        if seals.iter().any(|(s, _)| *s == t.id) || t.merge_frozen || !t.leader || t.seal_in_flight
        {
            continue;
        }
        if let Some(inputs) =
            seal::compaction_plan(&t.segments, t.compact_target_bytes, t.compact_min_inputs)
        {
            compactions.push((t.id, inputs));
        }
    }
    Decisions { seals, compactions }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: usize = 1 << 20;

    fn leader(id: u64, bytes: usize) -> TabletState {
        TabletState {
            id,
            leader: true,
            memtable_bytes: bytes,
            oldest_at_us: (bytes > 0).then_some(1_000_000),
            memtable_bytes_max: 32 * MB,
            memtable_age_max_us: 60_000_000,
            compact_target_bytes: 64 << 20,
            compact_min_inputs: 4,
            ..Default::default()
        }
    }

    fn small_segments(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                id: format!("s{i}"),
                bytes: 1 << 20,
                origin: 0,
                movable: true,
                holds_unread: false,
            })
            .collect()
    }

    /// One row of a policy table: tablets, laggards, budget, now, and the
    /// decisions expected.
    struct Case {
        name: &'static str,
        tablets: Vec<TabletState>,
        laggards: Vec<u64>,
        budget: usize,
        now_us: u64,
        seals: Vec<(u64, SealReason)>,
        compactions: Vec<(u64, Vec<String>)>,
    }

    fn check(cases: Vec<Case>) {
        for c in cases {
            let got = plan(&c.tablets, &c.laggards, c.budget, c.now_us);
            assert_eq!(got.seals, c.seals, "{}: seals", c.name);
            assert_eq!(got.compactions, c.compactions, "{}: compactions", c.name);
        }
    }

    #[test]
    fn seals_by_size_age_budget_and_journal_trim() {
        let now = 2_000_000;
        check(vec![
            Case {
                name: "idle",
                tablets: vec![leader(1, 0), leader(2, 0)],
                laggards: vec![],
                budget: 1 << 30,
                now_us: now,
                seals: vec![],
                compactions: vec![],
            },
            Case {
                name: "size",
                tablets: vec![leader(1, 32 * MB), leader(2, MB)],
                laggards: vec![],
                budget: 1 << 30,
                now_us: now,
                seals: vec![(1, SealReason::Size)],
                compactions: vec![],
            },
            Case {
                name: "age at the limit",
                tablets: vec![leader(1, MB)],
                laggards: vec![],
                budget: 1 << 30,
                now_us: 61_000_000,
                seals: vec![(1, SealReason::Age)],
                compactions: vec![],
            },
            Case {
                name: "age just below the limit",
                tablets: vec![leader(1, MB)],
                laggards: vec![],
                budget: 1 << 30,
                now_us: 60_999_999,
                seals: vec![],
                compactions: vec![],
            },
            Case {
                name: "budget: the largest go until the excess is covered",
                tablets: vec![leader(1, 3 * MB), leader(2, 5 * MB), leader(3, 4 * MB)],
                laggards: vec![],
                budget: 7 * MB,
                now_us: now,
                seals: vec![(2, SealReason::NodeBudget)],
                compactions: vec![],
            },
            Case {
                name: "budget: two needed",
                tablets: vec![leader(1, 3 * MB), leader(2, 5 * MB), leader(3, 4 * MB)],
                laggards: vec![],
                budget: 4 * MB,
                now_us: now,
                seals: vec![(2, SealReason::NodeBudget), (3, SealReason::NodeBudget)],
                compactions: vec![],
            },
            Case {
                name: "budget: all of them when the excess is that large",
                tablets: vec![leader(1, 3 * MB), leader(2, 5 * MB), leader(3, 4 * MB)],
                laggards: vec![],
                budget: 2 * MB,
                now_us: now,
                seals: vec![
                    (2, SealReason::NodeBudget),
                    (3, SealReason::NodeBudget),
                    (1, SealReason::NodeBudget),
                ],
                compactions: vec![],
            },
            Case {
                name: "followers and seals in flight never seal",
                tablets: vec![
                    TabletState {
                        leader: false,
                        ..leader(1, 32 * MB)
                    },
                    TabletState {
                        seal_in_flight: true,
                        ..leader(2, 32 * MB)
                    },
                ],
                laggards: vec![1, 2],
                budget: 0,
                now_us: now,
                seals: vec![],
                compactions: vec![],
            },
            Case {
                name: "journal trim: even empty, once, after the others",
                tablets: vec![leader(1, 32 * MB), leader(2, 0), leader(3, MB)],
                laggards: vec![1, 2, 9],
                budget: 1 << 30,
                now_us: now,
                seals: vec![(1, SealReason::Size), (2, SealReason::JournalTrim)],
                compactions: vec![],
            },
        ]);
    }

    #[test]
    fn compactions_only_on_leaders_not_sealing_or_frozen() {
        let with_segments = |t: TabletState| TabletState {
            segments: small_segments(4),
            ..t
        };
        let run: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
        check(vec![
            Case {
                name: "a leader with a run of small segments",
                tablets: vec![with_segments(leader(1, 0))],
                laggards: vec![],
                budget: 1 << 30,
                now_us: 0,
                seals: vec![],
                compactions: vec![(1, run.clone())],
            },
            Case {
                name: "too few inputs",
                tablets: vec![TabletState {
                    segments: small_segments(3),
                    ..leader(1, 0)
                }],
                laggards: vec![],
                budget: 1 << 30,
                now_us: 0,
                seals: vec![],
                compactions: vec![],
            },
            Case {
                name: "sealing now, seal in flight, merge-frozen, follower",
                tablets: vec![
                    with_segments(leader(1, 32 * MB)),
                    with_segments(TabletState {
                        seal_in_flight: true,
                        ..leader(2, 0)
                    }),
                    with_segments(TabletState {
                        merge_frozen: true,
                        ..leader(3, 0)
                    }),
                    with_segments(TabletState {
                        leader: false,
                        ..leader(4, 0)
                    }),
                    with_segments(leader(5, 0)),
                ],
                laggards: vec![],
                budget: 1 << 30,
                now_us: 0,
                seals: vec![(1, SealReason::Size)],
                compactions: vec![(5, run)],
            },
        ]);
    }
}
