//! The peer port of a real node refuses what it must: a node certificate
//! from another CA, garbage datagrams. The refusal is counted in `Status`
//! and the node keeps serving.

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stele_client::{Client, ClientOptions};
use stele_node::certs::NodeIdentity;
use stele_node::transport::{
    Handler, HandlerFuture, MsgKind, RemoteError, Request, Transport, TransportOptions,
};
use stele_tests::Proc;

struct Nothing;

impl Handler for Nothing {
    fn handle(&self, _from: u64, _req: Request) -> HandlerFuture {
        Box::pin(async { Err(RemoteError::ShuttingDown) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_ca_and_garbage_are_refused_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let base = stele_tests::free_port_base(3);
    let listen = format!("127.0.0.1:{base}");
    let d = dir.path().to_str().unwrap();
    let proc = Proc::start(
        &[
            "dev",
            "--nodes",
            "3",
            "--data-dir",
            d,
            "--listen",
            &listen,
            "--tablets",
            "2",
            "--election-timeout-ms",
            "1000",
        ],
        &[],
    )
    .unwrap();
    let endpoint = format!("http://127.0.0.1:{base}");
    let peer1: std::net::SocketAddr = format!("127.0.0.1:{}", base + 100).parse().unwrap();
    let mut client = None;
    for _ in 0..100 {
        if let Ok(c) = Client::connect(&endpoint, ClientOptions::default()).await
            && c.list_tablets()
                .await
                .is_ok_and(|ts| ts.iter().all(|t| t.leader_node != 0))
        {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let client = client.expect("cell never came up");

    // Garbage datagrams at the QUIC port.
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..200u32 {
        let junk: Vec<u8> = (0..(i % 1200 + 1)).map(|_| rand::random::<u8>()).collect();
        sock.send_to(&junk, peer1).unwrap();
    }

    // A node certificate for "node 2" issued by another CA.
    let (_ca, ids) = NodeIdentity::ephemeral_cell(3).unwrap();
    let rogue = Transport::bind(
        TransportOptions::new(2, "127.0.0.1:0".parse().unwrap(), ids[1].clone()),
        Arc::new(Nothing),
    )
    .unwrap();
    rogue.set_peer(1, peer1);
    let r = rogue
        .call(
            1,
            Request {
                group: 1,
                target_replica: 1 << 16 | 1,
                kind: MsgKind::Control,
                body: Bytes::from_static(b"\x00"),
            },
        )
        .await;
    assert!(r.is_err(), "a peer with a foreign certificate was served");
    rogue.shutdown().await;

    let mut refused = 0;
    for _ in 0..50 {
        refused = client.status().await.unwrap().peer_connections_refused;
        if refused >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused >= 1, "the refused peer was not counted");
    // The node is unaffected: it still takes and replicates writes.
    for i in 0..10u64 {
        client
            .append(
                "peer/port",
                vec![stele_client::record(format!("k{i}"), i, b"v".to_vec())],
            )
            .await
            .unwrap();
    }
    let st = client.status().await.unwrap();
    assert_eq!(st.peers_with_extra_connections, 0);
    assert!(proc.terminate().success());
}
