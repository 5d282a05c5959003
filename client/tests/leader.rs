//! The leader-following client against in-process fake members: it goes
//! where a `NotLeader` hint points (even to an endpoint it was not given),
//! remembers the leader for the next call, and gives up after its passes.
//!
//! The fake is a data node, so the quorum's "leader" here is the member
//! that accepts an `Append`; what is tested is the walk over the members,
//! which does not depend on the service.

#[path = "../src/fake.rs"]
#[allow(dead_code)]
mod fake;

use std::time::Duration;

use fake::{FakeNode, Fault};
use stele_client::Error;
use stele_client::admin::{FromChannel, Leader};
use stele_proto::pb::data_client::DataClient;
use stele_proto::pb::{AppendRequest, AppendResponse};
use tonic::transport::Channel;

/// The data API as a quorum member's client.
struct Member(DataClient<Channel>);

impl FromChannel for Member {
    const SERVER: stele_tls::Kind = stele_tls::Kind::Node;
    fn from_channel(ch: Channel) -> Self {
        Member(DataClient::new(ch))
    }
}

async fn append(leader: &Leader<Member>) -> Result<AppendResponse, Error> {
    leader
        .call(|Member(mut c)| async move {
            c.append(AppendRequest {
                tablet: 1,
                generation: 1,
                batch_id: vec![1; 16],
                namespace: "acme/web".into(),
                records: vec![stele_client::record("k", 1, "v")],
                expect: None,
            })
            .await
        })
        .await
}

async fn members(n: usize) -> (Vec<FakeNode>, Vec<String>) {
    let mut nodes = Vec::new();
    let mut endpoints = Vec::new();
    for _ in 0..n {
        let node = FakeNode::one_tablet();
        endpoints.push(node.serve().await.unwrap());
        nodes.push(node);
    }
    (nodes, endpoints)
}

fn requests(nodes: &[FakeNode]) -> Vec<usize> {
    nodes.iter().map(|n| n.lock().append_requests).collect()
}

#[tokio::test]
async fn not_leader_hint_is_followed() {
    let (nodes, endpoints) = members(3).await;
    // The first member names the third; the second must never be asked.
    nodes[0]
        .lock()
        .faults
        .push_back(Fault::NotLeader(endpoints[2].clone()));
    let leader: Leader<Member> = Leader::new(endpoints).unwrap();
    append(&leader).await.unwrap();
    assert_eq!(requests(&nodes), [1, 0, 1]);
    // The next call goes straight to the leader.
    append(&leader).await.unwrap();
    assert_eq!(requests(&nodes), [1, 0, 2]);
}

#[tokio::test]
async fn hint_to_an_unknown_endpoint_is_learned() {
    let (nodes, endpoints) = members(3).await;
    nodes[0]
        .lock()
        .faults
        .push_back(Fault::NotLeader(endpoints[2].clone()));
    // Given only the first two members; the third is learned from the hint.
    let leader: Leader<Member> = Leader::new(endpoints[..2].to_vec()).unwrap();
    append(&leader).await.unwrap();
    assert_eq!(requests(&nodes), [1, 0, 1]);
    assert_eq!(leader.endpoints(), endpoints);
}

#[tokio::test]
async fn one_pass_tries_each_member_once() {
    let (nodes, endpoints) = members(3).await;
    for n in &nodes {
        n.lock()
            .faults
            .extend(std::iter::repeat_n(Fault::Unavailable, 10));
    }
    let mut leader: Leader<Member> = Leader::new(endpoints).unwrap();
    leader.rounds_max = 1;
    let err = append(&leader).await.unwrap_err();
    assert!(matches!(err, Error::Exhausted { attempts: 3, .. }), "{err}");
    assert_eq!(requests(&nodes), [1, 1, 1]);
}

#[tokio::test]
async fn an_election_is_waited_out_until_the_deadline() {
    let (nodes, endpoints) = members(2).await;
    for n in &nodes {
        n.lock()
            .faults
            .extend(std::iter::repeat_n(Fault::Unavailable, 1000));
    }
    let mut leader: Leader<Member> = Leader::new(endpoints).unwrap();
    leader.deadline = Duration::from_millis(300);
    leader.round_pause = Duration::from_millis(100);
    let err = append(&leader).await.unwrap_err();
    // Passes of two attempts, 100 ms apart, until 300 ms have passed.
    match err {
        Error::Exhausted {
            attempts, elapsed, ..
        } => {
            assert!((3..=10).contains(&attempts), "{attempts} attempts");
            assert!(elapsed >= Duration::from_millis(300), "{elapsed:?}");
            assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
        }
        e => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_refusal_returns_at_once() {
    let (nodes, endpoints) = members(2).await;
    // To the walk, `TabletNotFound` is a typed answer about the request
    // (neither a hint nor unavailability): the other members are not asked.
    nodes[0].lock().tablets.clear();
    let leader: Leader<Member> = Leader::new(endpoints).unwrap();
    let err = append(&leader).await.unwrap_err();
    assert!(
        matches!(
            err.api(),
            Some(stele_proto::Error::TabletNotFound { tablet: 1 })
        ),
        "{err}"
    );
    assert_eq!(requests(&nodes), [1, 0]);
}
