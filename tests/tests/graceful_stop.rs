//! Graceful stop (issue 18): SIGTERM on a node hands each tablet it leads
//! to a caught-up voter before it goes, so writers see a short pause, not
//! an election timeout, and lose nothing; a hand-off that cannot finish is
//! cut short by `--shutdown-deadline-ms`.

use std::time::{Duration, Instant};

use stele_client::Client;
use stele_tests::cell::client_options;
use stele_tests::controlled::{ControlledCell, Writer};

/// Long enough that a stall of an election would show plainly.
const ELECTION_MS: u64 = 6000;

fn leaders_by_node(cell: &ControlledCell) -> std::collections::HashMap<u64, usize> {
    let mut led = std::collections::HashMap::new();
    for t in cell.tablets() {
        if let Some(n) = t["leader_node"].as_u64().filter(|n| *n > 0) {
            *led.entry(n).or_default() += 1;
        }
    }
    led
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_off_leadership_with_no_client_error() {
    let mut cell = ControlledCell::new(1, 3);
    cell.election_timeout_ms = ELECTION_MS;
    // Leaders stay where they are but for the stop itself.
    cell.controller_flags
        .extend(["--leader-balance-ms", "0"].map(String::from));
    let (_ctl, mut nodes) = cell.start(4);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), "stop/ns", 4).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (victim, led) = leaders_by_node(&cell)
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .expect("some node leads");
    writer.take_longest();
    let proc = nodes.remove(&(victim as usize)).unwrap();
    // A gRPC health Watch on the node, as a load balancer keeps open.
    let mut watch = stele_tests::health_client(&proc.endpoint)
        .await
        .unwrap()
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "stele.v1.Data".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        watch.message().await.unwrap().unwrap().status,
        stele_tests::SERVING
    );
    let watched = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Ok(Some(m)) = watch.message().await {
            seen.push(m.status);
        }
        seen
    });
    let stopping = Instant::now();
    let mut proc = proc;
    stele_tests::signal(proc.child.id(), libc::SIGTERM);
    let status = tokio::task::block_in_place(|| proc.child.wait().unwrap());
    let took = stopping.elapsed();
    let stderr = proc.stderr_lines();
    // Told before the server went (the stream ends with it), and the open
    // stream did not hold the stop to its deadline.
    let seen = tokio::time::timeout(Duration::from_secs(5), watched)
        .await
        .expect("the Watch stream outlived the process")
        .unwrap();
    assert_eq!(
        seen,
        vec![stele_tests::NOT_SERVING],
        "gRPC health during the stop"
    );
    assert!(
        !stderr.iter().any(|l| l.contains("calls in flight")),
        "the stop waited for calls in flight: {stderr:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed = writer.indeterminate.lock().unwrap().len();
    // Appends still waiting for a leader finish before the check reads.
    let longest = writer.longest_handle();
    let acked = writer.stop_and_check(&client).await;
    let stall = *longest.lock().unwrap();
    eprintln!(
        "node {victim} led {led} tablets; stopped in {took:?} ({status}); longest append across the stop {stall:?}; {acked} acknowledged"
    );
    assert!(status.success(), "exit {status}: {stderr:?}");
    assert!(
        stderr
            .iter()
            .any(|l| l.contains(&format!("handed off {led} tablets")) && l.contains("0 still led")),
        "no complete hand-off reported: {stderr:?}"
    );
    // An election would take at least ELECTION_MS.
    assert!(
        stall < Duration::from_millis(ELECTION_MS / 2),
        "writers stalled {stall:?} across the stop"
    );
    assert_eq!(failed, 0, "appends failed across a graceful stop");
    assert!(acked > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_cuts_a_stuck_hand_off_short() {
    let mut cell = ControlledCell::new(1, 3);
    cell.controller_flags
        .extend(["--leader-balance-ms", "0"].map(String::from));
    cell.node_flags = ["--shutdown-deadline-ms", "1500"]
        .map(String::from)
        .to_vec();
    let (_ctl, mut nodes) = cell.start(2);
    let (victim, _) = leaders_by_node(&cell)
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .expect("some node leads");
    // The other voters are frozen: no one can take the leaderships.
    let others: Vec<u32> = nodes
        .iter()
        .filter(|(n, _)| **n as u64 != victim)
        .map(|(_, p)| p.child.id())
        .collect();
    for pid in &others {
        stele_tests::signal(*pid, libc::SIGSTOP);
    }
    let mut proc = nodes.remove(&(victim as usize)).unwrap();
    let stopping = Instant::now();
    stele_tests::signal(proc.child.id(), libc::SIGTERM);
    let status = proc.child.wait().unwrap();
    let took = stopping.elapsed();
    for pid in &others {
        stele_tests::signal(*pid, libc::SIGCONT);
    }
    let stderr = proc.stderr_lines();
    eprintln!("stuck hand-off stopped in {took:?} ({status})");
    assert!(
        took < Duration::from_secs(6),
        "the deadline did not cut the stop short: {took:?}"
    );
    assert!(
        stderr
            .iter()
            .any(|l| l.contains("handed off") && !l.contains(" 0 still led")),
        "no cut-short hand-off reported: {stderr:?}"
    );
}
