//! A client of a small quorum (the cell controllers, the directory): finds
//! the leader among the endpoints it was given (following `NotLeader`
//! hints), and retries through an election for a bounded time. Used for
//! routes, namespace lookups and operator commands, by the node agent's
//! heartbeat and by the node's namespace-ownership lookups.
//!
//! ```text
//! call(f) ─▶ member at `at` ─▶ Ok ─────────────────────────────▶ return
//!                      └─ Err ─▶ Walk::failed (pure)
//!                                  ├─ typed refusal ─────────────▶ return it
//!                                  ├─ NotLeader{endpoint} ───────▶ that member next
//!                                  ├─ no leader / unreachable ───▶ next untried member
//!                                  └─ every member tried ────────▶ pass done: pause, or
//!                                                                  give up (rounds_max, deadline)
//! ```
//!
//! One `Leader` is shared by the calls of its owner: it remembers the member
//! that answered (or that the last failure pointed at), the hinted endpoints
//! it learned, and one lazily connected channel per endpoint.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use stele_proto::pb::controller_client::ControllerClient;
use stele_proto::pb::directory_client::DirectoryClient;
use tonic::transport::{Channel, Endpoint};

use crate::{Error, Result};

/// A gRPC client made from a channel.
pub trait FromChannel {
    /// Who must answer at the other end (checked by TLS).
    const SERVER: stele_tls::Kind;
    fn from_channel(ch: Channel) -> Self;
}

impl FromChannel for ControllerClient<Channel> {
    const SERVER: stele_tls::Kind = stele_tls::Kind::Controller;
    fn from_channel(ch: Channel) -> Self {
        // A whole route map of a large cell (100,000 tablets) is about
        // 5-6 MB, past tonic's default 4 MiB.
        ControllerClient::new(ch).max_decoding_message_size(ROUTE_MAP_BYTES_MAX)
    }
}

impl FromChannel for DirectoryClient<Channel> {
    const SERVER: stele_tls::Kind = stele_tls::Kind::Directory;
    fn from_channel(ch: Channel) -> Self {
        DirectoryClient::new(ch)
    }
}

/// Largest controller answer a client decodes: a whole route map.
const ROUTE_MAP_BYTES_MAX: usize = 256 << 20;

/// Calls to the cell controllers.
pub type Admin = Leader<ControllerClient<Channel>>;
/// Calls to the directory.
pub type DirectoryAdmin = Leader<DirectoryClient<Channel>>;

/// A leader-following client of a quorum. The public fields bound every
/// call; [`Leader::new`] sets the bounds of an operator or route call, and
/// a caller with other needs (the agent's heartbeat: one pass, then the
/// next heartbeat) sets its own.
pub struct Leader<C> {
    endpoints: Mutex<Vec<String>>,
    /// The member the next call tries first.
    at: AtomicUsize,
    channels: Mutex<HashMap<String, Channel>>,
    /// Roots and identity for `https://` members.
    tls: Option<stele_tls::ClientTls>,
    /// How long a call keeps trying while no member leads: no attempt
    /// starts after this much time since the first.
    pub deadline: Duration,
    /// Longest single attempt.
    pub request_timeout: Duration,
    /// Longest wait for a connection to a member.
    pub connect_timeout: Duration,
    /// Passes over the members (each tried once per pass) before a call
    /// gives up, whatever time is left.
    pub rounds_max: u32,
    /// Wait after a pass in which no member answered: an election is
    /// likely under way.
    pub round_pause: Duration,
    client: std::marker::PhantomData<fn() -> C>,
}

impl<C: FromChannel> Leader<C> {
    /// A client of these members (`http://host:port`, any one will do),
    /// with the bounds of an operator or route call: 10 s per attempt, 1 s
    /// to connect, retried through an election for 15 s with a 200 ms
    /// pause after each pass.
    pub fn new(endpoints: Vec<String>) -> Result<Leader<C>> {
        Leader::with_tls(endpoints, None)
    }

    /// Like [`Leader::new`], with TLS settings for `https://` members.
    pub fn with_tls(
        endpoints: Vec<String>,
        tls: Option<stele_tls::ClientTls>,
    ) -> Result<Leader<C>> {
        if endpoints.is_empty() {
            return Err(Error::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no endpoints".into(),
            });
        }
        for ep in &endpoints {
            Endpoint::from_shared(ep.clone()).map_err(|e| Error::InvalidEndpoint {
                endpoint: ep.clone(),
                reason: e.to_string(),
            })?;
        }
        Ok(Leader {
            endpoints: Mutex::new(endpoints),
            at: AtomicUsize::new(0),
            channels: Mutex::new(HashMap::new()),
            tls,
            deadline: Duration::from_secs(15),
            request_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
            rounds_max: u32::MAX,
            round_pause: Duration::from_millis(200),
            client: std::marker::PhantomData,
        })
    }

    /// The members known, hinted ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.endpoints.lock().expect("lock poisoned").clone()
    }

    /// The client of one member, reusing its channel.
    fn client(&self, endpoint: &str) -> Result<C> {
        let mut channels = self.channels.lock().expect("lock poisoned");
        if let Some(ch) = channels.get(endpoint) {
            return Ok(C::from_channel(ch.clone()));
        }
        let ch = stele_tls::channel(endpoint, self.tls.as_ref(), C::SERVER, self.connect_timeout)
            .map_err(|e| Error::invalid_endpoint(endpoint, e))?;
        channels.insert(endpoint.to_string(), ch.clone());
        Ok(C::from_channel(ch))
    }

    /// Calls the leader. A typed refusal (bad argument, unknown tablet or
    /// namespace) returns at once; `NotLeader`, `Unavailable` and
    /// unreachable members are retried on the others, hinted leaders
    /// first, until `deadline` or `rounds_max` passes.
    pub async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        let (mut attempts, mut rounds) = (0u32, 0u32);
        let mut walk = Walk::default();
        let mut i = {
            let list = self.endpoints.lock().expect("lock poisoned");
            self.at.load(Ordering::Relaxed) % list.len()
        };
        loop {
            let ep = self.endpoints.lock().expect("lock poisoned")[i].clone();
            attempts += 1;
            let result = tokio::time::timeout(self.request_timeout, f(self.client(&ep)?)).await;
            let err: Error = match result {
                Ok(Ok(r)) => {
                    self.at.store(i, Ordering::Relaxed);
                    return Ok(r.into_inner());
                }
                Ok(Err(status)) => status.into(),
                Err(_) => Error::RequestTimeout {
                    endpoint: ep.clone(),
                    elapsed: self.request_timeout,
                },
            };
            tracing::debug!(endpoint = %ep, error = %err, "quorum member did not answer as leader");
            let step = walk.failed(&mut self.endpoints.lock().expect("lock poisoned"), i, &err);
            let (next, pass_done) = match step {
                Step::Return => return Err(err),
                Step::Try(j) => (j, false),
                Step::PassDone { next } => (next, true),
            };
            self.at.store(next, Ordering::Relaxed);
            rounds += u32::from(pass_done);
            if started.elapsed() > self.deadline || rounds >= self.rounds_max {
                return Err(Error::Exhausted {
                    attempts,
                    elapsed: started.elapsed(),
                    last: Box::new(err),
                });
            }
            if pass_done {
                tokio::time::sleep(self.round_pause).await;
            }
            i = next;
        }
    }
}

/// What a member's failure says about where the leader is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    /// The member named the leader's endpoint.
    Leader(String),
    /// This member cannot answer now (not the leader and no hint,
    /// unavailable, unreachable, timed out): another may.
    Another,
    /// A typed answer about the request itself: every member would say
    /// the same.
    Refused,
}

fn said(err: &Error) -> Said {
    match err {
        Error::Api(stele_proto::Error::NotLeader {
            leader_endpoint, ..
        }) if !leader_endpoint.is_empty() => Said::Leader(leader_endpoint.clone()),
        Error::Api(stele_proto::Error::NotLeader { .. })
        | Error::Api(stele_proto::Error::Unavailable { .. }) => Said::Another,
        Error::Api(_) => Said::Refused,
        _ => Said::Another,
    }
}

/// Where a call goes after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Try this member next.
    Try(usize),
    /// Every member failed once in this pass; the next pass starts here
    /// (the last leader named, else the member after the last one tried).
    PassDone { next: usize },
    /// Return the error.
    Return,
}

/// The pure part of [`Leader::call`]: which members this pass has tried,
/// and which member the last hint named.
#[derive(Debug, Default)]
struct Walk {
    tried: Vec<bool>,
    hint: Option<usize>,
}

impl Walk {
    /// Decides after member `i` failed with `err`. A hinted endpoint that is
    /// not a member yet is added to `endpoints` (members may advertise
    /// endpoints the caller was not given).
    fn failed(&mut self, endpoints: &mut Vec<String>, i: usize, err: &Error) -> Step {
        self.tried.resize(endpoints.len(), false);
        self.tried[i] = true;
        match said(err) {
            Said::Refused => return Step::Return,
            Said::Leader(ep) => {
                let j = match endpoints.iter().position(|e| *e == ep) {
                    Some(j) => j,
                    None => {
                        endpoints.push(ep);
                        self.tried.push(false);
                        endpoints.len() - 1
                    }
                };
                self.hint = Some(j);
                if !self.tried[j] {
                    return Step::Try(j);
                }
            }
            Said::Another => {}
        }
        let n = endpoints.len();
        if let Some(j) = (1..=n).map(|k| (i + k) % n).find(|&j| !self.tried[j]) {
            return Step::Try(j);
        }
        let next = self.hint.take().unwrap_or((i + 1) % n);
        self.tried.fill(false);
        Step::PassDone { next }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_leader(endpoint: &str) -> Error {
        stele_proto::Error::NotLeader {
            leader_node: None,
            leader_endpoint: endpoint.into(),
        }
        .into()
    }

    fn unavailable() -> Error {
        stele_proto::Error::Unavailable {
            reason: "election".into(),
        }
        .into()
    }

    fn members(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("http://m{i}")).collect()
    }

    #[test]
    fn what_a_failure_says() {
        let cases = [
            (not_leader("http://m2"), Said::Leader("http://m2".into())),
            (not_leader(""), Said::Another),
            (unavailable(), Said::Another),
            (
                Error::RequestTimeout {
                    endpoint: "http://m0".into(),
                    elapsed: Duration::from_secs(1),
                },
                Said::Another,
            ),
            (
                stele_proto::Error::NamespaceNotFound {
                    namespace: "a/b".into(),
                }
                .into(),
                Said::Refused,
            ),
            (
                stele_proto::Error::InvalidArgument {
                    field: "id".into(),
                    reason: "bad".into(),
                }
                .into(),
                Said::Refused,
            ),
        ];
        for (err, want) in cases {
            assert_eq!(said(&err), want, "{err}");
        }
    }

    /// Each case: members, then (member that failed, its error) in order,
    /// and the step after each; `hinted` is the member list afterwards.
    #[test]
    fn walks() {
        struct Case {
            name: &'static str,
            members: usize,
            failures: Vec<(usize, Error, Step)>,
            hinted: usize,
        }
        let cases = [
            Case {
                name: "a hint to an untried member is followed at once",
                members: 3,
                failures: vec![(0, not_leader("http://m2"), Step::Try(2))],
                hinted: 3,
            },
            Case {
                name: "a hint to an unknown endpoint adds it and goes there",
                members: 2,
                failures: vec![(0, not_leader("http://elsewhere"), Step::Try(2))],
                hinted: 3,
            },
            Case {
                name: "no leader: each member once, then the pass is done",
                members: 3,
                failures: vec![
                    (1, unavailable(), Step::Try(2)),
                    (2, not_leader(""), Step::Try(0)),
                    (0, unavailable(), Step::PassDone { next: 1 }),
                ],
                hinted: 3,
            },
            Case {
                name: "a hint to a member already tried waits for the next pass",
                members: 3,
                failures: vec![
                    (0, unavailable(), Step::Try(1)),
                    (1, not_leader("http://m0"), Step::Try(2)),
                    (2, unavailable(), Step::PassDone { next: 0 }),
                ],
                hinted: 3,
            },
            Case {
                name: "a refusal returns at once",
                members: 3,
                failures: vec![(
                    0,
                    stele_proto::Error::NamespaceNotFound {
                        namespace: "a/b".into(),
                    }
                    .into(),
                    Step::Return,
                )],
                hinted: 3,
            },
            Case {
                name: "a new pass tries every member again",
                members: 2,
                failures: vec![
                    (0, unavailable(), Step::Try(1)),
                    (1, unavailable(), Step::PassDone { next: 0 }),
                    (0, unavailable(), Step::Try(1)),
                ],
                hinted: 2,
            },
        ];
        for case in cases {
            let mut endpoints = members(case.members);
            let mut walk = Walk::default();
            for (k, (i, err, want)) in case.failures.iter().enumerate() {
                let got = walk.failed(&mut endpoints, *i, err);
                assert_eq!(got, *want, "{}: failure {k}", case.name);
            }
            assert_eq!(endpoints.len(), case.hinted, "{}", case.name);
        }
    }
}
