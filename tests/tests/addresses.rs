//! Listen and advertise (docs/OPERATIONS.md, "Addresses: listen and
//! advertise"), driven through the real binary:
//!
//! - a managed cell whose controllers and nodes listen on 127.0.0.1 and
//!   advertise the host name `localhost`: the route map and the node list
//!   hold the names, nodes reach each other over QUIC and the controllers
//!   by name, and clients write and read back through the names;
//! - a node listening on a name advertises that name;
//! - hostile start-ups (an unspecified address without its advertise flag,
//!   an unspecified or port-0 advertise, garbage) are refused with the
//!   flag named, a non-zero exit, and nothing created;
//! - a heartbeat advertising an undialable endpoint is refused with the
//!   field named, and changes nothing.
//!
//! Nothing here binds 0.0.0.0: this machine's tests listen on loopback
//! only. Advertising a name for a 0.0.0.0 listener is the same code path
//! as for 127.0.0.1 (`src/addresses.rs` and its unit tests).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stele_client::Client;
use stele_proto::pb;
use stele_tests::cell::client_options;
use stele_tests::controlled::{ControlledCell, Writer};
use stele_tests::{Proc, stele_bin};

/// The port of an `http://host:port` or `host:port` endpoint.
fn port_of(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_advertising_host_names_is_reached_through_them() {
    let mut cell = ControlledCell::new(1, 3);
    cell.advertise = Some("localhost".into());
    let (_controllers, _nodes) = cell.start(4);

    // The controllers' node list: every endpoint is the advertised name.
    let nodes = cell.node_list();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    for n in &nodes {
        let id = n["id"].as_u64().unwrap() as usize;
        let client = n["client_endpoint"].as_str().unwrap();
        let peer = n["peer_endpoint"].as_str().unwrap();
        assert_eq!(client, cell.node_endpoint(id), "{n}");
        assert_eq!(peer, format!("localhost:{}", port_of(client) + 100), "{n}");
    }

    // Clients route by the controllers' route map: every leader is named.
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let routes = client.routes();
    assert_eq!(routes.len(), 4);
    for r in routes.routes() {
        assert!(
            r.leader_endpoint.starts_with("https://localhost:"),
            "tablet {} routes to {:?}",
            r.tablet,
            r.leader_endpoint
        );
    }

    // Writes and reads go through the names (tonic resolves them on
    // connect); each acknowledged append was replicated over QUIC to
    // peers dialled by name.
    let writer = Writer::start(client.clone(), "addr/names", 2).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let acked = writer.stop_and_check(&client).await;
    assert!(acked >= 20, "too little traffic to mean anything: {acked}");

    // A heartbeat advertising what nobody can dial is refused, naming the
    // field, and registers nothing.
    // As node 1, whose certificate may heartbeat (as node 1 only).
    let as_node = stele_tests::tls::identity(&cell.dir.path().join("certs1"));
    let mut ctl = pb::controller_client::ControllerClient::new(stele_tests::tls::channel(
        &cell.controller_endpoint(1),
        &as_node,
        stele_tls::Kind::Controller,
    ));
    let beat = |client: &str, peer: &str| pb::HeartbeatRequest {
        node: Some(pb::NodeRegistration {
            id: 1,
            client_endpoint: client.into(),
            peer_endpoint: peer.into(),
            ..Default::default()
        }),
        replicas: Vec::new(),
        token_epoch: None,
        load: None,
        ..Default::default()
    };
    for (client, peer, field, says) in [
        (
            "http://0.0.0.0:7450",
            "node9:7550",
            "node.client_endpoint",
            "unspecified",
        ),
        (
            "http://node9:0",
            "node9:7550",
            "node.client_endpoint",
            "port 0",
        ),
        (
            "node9:7450",
            "node9:7550",
            "node.client_endpoint",
            "http://",
        ),
        (
            "http://node9:7450",
            "0.0.0.0:7550",
            "node.peer_endpoint",
            "unspecified",
        ),
        (
            "http://node9:7450",
            "[::]:7550",
            "node.peer_endpoint",
            "unspecified",
        ),
        (
            "http://node9:7450",
            "nonsense",
            "node.peer_endpoint",
            "HOST:PORT",
        ),
        ("http://node9:7450", "", "node.peer_endpoint", "HOST:PORT"),
    ] {
        let err = ctl.heartbeat(beat(client, peer)).await.expect_err(peer);
        assert_invalid(&err, field, says);
    }
    let after = cell.node_list();
    assert_eq!(
        after.len(),
        3,
        "a refused heartbeat registered a node: {after:?}"
    );
    assert!(
        !after.iter().any(|n| n.to_string().contains("node9")),
        "a refused heartbeat changed node 1's endpoints: {after:?}"
    );
    // Controllers dial each other at their init endpoints: same rule.
    let mut op = pb::controller_client::ControllerClient::new(stele_tests::tls::channel(
        &cell.controller_endpoint(1),
        &stele_tests::tls::client_tls(),
        stele_tls::Kind::Controller,
    ));
    let err = op
        .init(pb::InitRequest {
            controllers: vec![pb::ControllerPeer {
                id: 1,
                endpoint: "http://0.0.0.0:7400".into(),
            }],
            tablets: 4,
            replication: 3,
            cell_id: "cell".into(),
        })
        .await
        .expect_err("an unspecified controller endpoint");
    assert_invalid(
        &err,
        "controllers",
        "0.0.0.0:7400 is an unspecified address",
    );
}

fn assert_invalid(err: &tonic::Status, field: &str, says: &str) {
    match stele_proto::Error::from_status(err) {
        stele_proto::Error::InvalidArgument { field: f, reason } => {
            assert_eq!(f, field, "{reason}");
            assert!(reason.contains(says), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_refuses_an_undialable_member_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("dir");
    let member = Proc::start(
        &[
            "server",
            "--roles",
            "directory",
            "--directory-id",
            "1",
            "--listen",
            "localhost:0",
            "--data-dir",
            d.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    assert!(
        member.endpoint.starts_with("http://localhost:"),
        "{}",
        member.endpoint
    );
    let mut c = pb::directory_client::DirectoryClient::connect(member.endpoint.clone())
        .await
        .unwrap();
    for (endpoint, says) in [
        ("http://[::]:7440", "unspecified"),
        ("http://node1:0", "port 0"),
        ("node1:7440", "http://"),
    ] {
        let err = c
            .directory_init(pb::DirectoryInitRequest {
                members: vec![pb::DirectoryPeer {
                    id: 1,
                    endpoint: endpoint.into(),
                }],
            })
            .await
            .expect_err(endpoint);
        assert_invalid(&err, "members", says);
    }
    // Nothing was created by the refusals: a good init creates the quorum.
    let ok = c
        .directory_init(pb::DirectoryInitRequest {
            members: vec![pb::DirectoryPeer {
                id: 1,
                endpoint: member.endpoint.clone(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ok.created);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_listening_on_a_name_advertises_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("node");
    let node = Proc::start(
        &[
            "server",
            "--node-id",
            "1",
            "--listen",
            "localhost:0",
            "--data-dir",
            d.to_str().unwrap(),
            "--tablets",
            "2",
            "--disk-reserve-bytes",
            "0",
            "--journal-reserve-bytes",
            "0",
        ],
        &[],
    )
    .unwrap();
    assert!(
        node.endpoint.starts_with("http://localhost:") && port_of(&node.endpoint) != 0,
        "{}",
        node.endpoint
    );
    let client = Client::connect(&node.endpoint, client_options())
        .await
        .unwrap();
    for r in client.routes().routes() {
        assert_eq!(r.leader_endpoint, node.endpoint);
    }
    let writer = Writer::start(client.clone(), "addr/listen", 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let acked = writer.stop_and_check(&client).await;
    assert!(acked >= 10, "too little traffic to mean anything: {acked}");
}

/// Runs `stele server ARGS`; a process still running after `bound` was
/// not refused: it is killed and reported as started.
fn refused(args: &[&str], bound: Duration) -> Result<String, String> {
    let mut child = Command::new(stele_bin())
        .arg("server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            return if status.success() {
                Err(format!("exited 0: {err}"))
            } else {
                Ok(err)
            };
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            return Err(format!(
                "started instead of refusing: {}",
                String::from_utf8_lossy(&out.stdout)
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_addresses_are_refused_naming_the_flag_and_start_nothing() {
    let dir = tempfile::tempdir().unwrap();
    stele_tests::make_certs(dir.path(), 1);
    let certs = dir.path().join("certs1");
    let certs = certs.to_str().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let port = stele_tests::free_port_base(1);
    let on = |host: &str| format!("{host}:{port}");
    let lo = on("127.0.0.1");
    let peer = format!("127.0.0.1:{}", port + 100);
    let node = ["--node-id", "1", "--data-dir", data, "--certs", certs];
    let managed = [&node[..], &["--controllers", "http://127.0.0.1:1"]].concat();
    let (any4, any6) = (on("0.0.0.0"), on("[::]"));
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            [&["--listen", &any4], &node[..]].concat(),
            vec!["--listen 0.0.0.0", "set --advertise HOST:PORT"],
        ),
        (
            [&["--listen", &any6], &node[..]].concat(),
            vec!["--listen [::]", "set --advertise"],
        ),
        (
            [&["--listen", &lo, "--peer-listen", &any4], &managed[..]].concat(),
            vec!["--peer-listen 0.0.0.0", "set --peer-advertise HOST:PORT"],
        ),
        (
            [&["--listen", &lo, "--advertise", "0.0.0.0:1"], &node[..]].concat(),
            vec!["--advertise", "0.0.0.0:1", "unspecified"],
        ),
        (
            [&["--listen", &lo, "--advertise", "node1:0"], &node[..]].concat(),
            vec!["--advertise", "node1:0", "port 0"],
        ),
        (
            [
                &[
                    "--listen",
                    &lo,
                    "--peer-listen",
                    &peer,
                    "--peer-advertise",
                    "[::]:7550",
                ],
                &managed[..],
            ]
            .concat(),
            vec!["--peer-advertise", "unspecified"],
        ),
        (
            [
                &["--listen", &lo, "--peer-advertise", "node1:7550"],
                &node[..],
            ]
            .concat(),
            vec!["--peer-advertise needs --peer-listen"],
        ),
        (
            [
                &[
                    "--listen",
                    &lo,
                    "--peer-listen",
                    &peer,
                    "--peers",
                    "2=0.0.0.0:7550",
                ],
                &node[..],
            ]
            .concat(),
            vec!["--peers 2", "unspecified"],
        ),
        (
            [
                &[
                    "--listen",
                    &lo,
                    "--peer-listen",
                    &peer,
                    "--peers",
                    "2=localhost:7552",
                    "--peer-endpoints",
                    "2=http://[::]:7452",
                ],
                &node[..],
            ]
            .concat(),
            vec!["--peer-endpoints 2", "unspecified"],
        ),
        (
            [&["--listen", "nonsense"], &node[..]].concat(),
            vec!["--listen", "\"nonsense\": want HOST:PORT"],
        ),
        (
            [&["--listen", "127.0.0.1"], &node[..]].concat(),
            vec!["--listen", "want HOST:PORT"],
        ),
        (
            [&["--listen", "::1:7450"], &node[..]].concat(),
            vec!["--listen", "needs brackets"],
        ),
        (
            [
                &["--listen", &lo, "--advertise", "http://node1:7450"],
                &node[..],
            ]
            .concat(),
            vec!["--advertise", "not a host name"],
        ),
        (
            [
                &["--roles", "controller", "--controller-id", "1"][..],
                &["--listen", &any4, "--data-dir", data],
            ]
            .concat(),
            vec!["--listen 0.0.0.0", "set --advertise"],
        ),
        (
            [
                &["--roles", "directory", "--directory-id", "1"][..],
                &["--listen", &any6, "--data-dir", data],
            ]
            .concat(),
            vec!["--listen [::]", "set --advertise"],
        ),
    ];
    for (a, says) in &cases {
        let err = refused(a, Duration::from_secs(20)).unwrap_or_else(|e| panic!("{a:?}: {e}"));
        for s in says {
            assert!(
                err.contains(s),
                "{a:?}: the refusal does not say {s:?}: {err}"
            );
        }
        assert!(
            !Path::new(data).exists(),
            "{a:?}: a refused start-up created {data}"
        );
    }
}

/// A controller of another version that hands out peer endpoints nobody
/// can dial: the node ignores them, logs them, and counts them in status.
struct OldController;

#[tonic::async_trait]
impl pb::controller_server::Controller for OldController {
    async fn heartbeat(
        &self,
        _: tonic::Request<pb::HeartbeatRequest>,
    ) -> Result<tonic::Response<pb::HeartbeatResponse>, tonic::Status> {
        let peer = |node: u64, ep: &str| pb::PeerAddress {
            node,
            peer_endpoint: ep.into(),
            client_endpoint: format!("http://localhost:{}", 7450 + node),
        };
        Ok(tonic::Response::new(pb::HeartbeatResponse {
            node_state: "up".into(),
            peers: vec![
                peer(2, "0.0.0.0:7552"),
                peer(3, "nonsense"),
                peer(4, "localhost:7554"),
            ],
            lease_ms: 10_000,
            ..Default::default()
        }))
    }
    async fn init(
        &self,
        _: tonic::Request<pb::InitRequest>,
    ) -> Result<tonic::Response<pb::InitResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn get_routes(
        &self,
        _: tonic::Request<pb::GetRoutesRequest>,
    ) -> Result<tonic::Response<pb::GetRoutesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    type WatchRoutesStream = tonic::codegen::BoxStream<pb::GetRoutesResponse>;
    async fn watch_routes(
        &self,
        _: tonic::Request<pb::WatchRoutesRequest>,
    ) -> Result<tonic::Response<Self::WatchRoutesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn cell_status(
        &self,
        _: tonic::Request<pb::CellStatusRequest>,
    ) -> Result<tonic::Response<pb::CellStatusResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn list_nodes(
        &self,
        _: tonic::Request<pb::ListNodesRequest>,
    ) -> Result<tonic::Response<pb::ListNodesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn set_node_state(
        &self,
        _: tonic::Request<pb::SetNodeStateRequest>,
    ) -> Result<tonic::Response<pb::IntentList>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn list_cell_tablets(
        &self,
        _: tonic::Request<pb::ListCellTabletsRequest>,
    ) -> Result<tonic::Response<pb::ListCellTabletsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn move_tablet(
        &self,
        _: tonic::Request<pb::MoveTabletRequest>,
    ) -> Result<tonic::Response<pb::Intent>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn transfer_leader(
        &self,
        _: tonic::Request<pb::TransferLeaderRequest>,
    ) -> Result<tonic::Response<pb::Intent>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn restart_safe(
        &self,
        _: tonic::Request<pb::RestartSafeRequest>,
    ) -> Result<tonic::Response<pb::RestartSafeResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn enable_format(
        &self,
        _: tonic::Request<pb::EnableFormatRequest>,
    ) -> Result<tonic::Response<pb::EnableFormatResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn issue_token(
        &self,
        _: tonic::Request<pb::IssueTokenRequest>,
    ) -> Result<tonic::Response<pb::IssueTokenResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn revoke_token(
        &self,
        _: tonic::Request<pb::RevokeTokenRequest>,
    ) -> Result<tonic::Response<pb::TokenInfo>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn list_tokens(
        &self,
        _: tonic::Request<pb::ListTokensRequest>,
    ) -> Result<tonic::Response<pb::ListTokensResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn get_intent(
        &self,
        _: tonic::Request<pb::GetIntentRequest>,
    ) -> Result<tonic::Response<pb::Intent>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn split_tablet(
        &self,
        _: tonic::Request<pb::SplitTabletRequest>,
    ) -> Result<tonic::Response<pb::Intent>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn merge_tablets(
        &self,
        _: tonic::Request<pb::MergeTabletsRequest>,
    ) -> Result<tonic::Response<pb::Intent>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
    async fn abort_intent(
        &self,
        _: tonic::Request<pb::AbortIntentRequest>,
    ) -> Result<tonic::Response<pb::Intent>, tonic::Status> {
        Err(tonic::Status::unimplemented("old controller"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undialable_peer_endpoints_from_a_controller_are_counted_not_used() {
    let dir = tempfile::tempdir().unwrap();
    stele_tests::make_certs(dir.path(), 1);
    let base = stele_tests::free_port_base(2);
    let controller: std::net::SocketAddr = format!("127.0.0.1:{base}").parse().unwrap();
    let served = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pb::controller_server::ControllerServer::new(OldController))
            .serve(controller),
    );
    let node = Proc::start(
        &[
            "server",
            "--node-id",
            "1",
            "--listen",
            &format!("127.0.0.1:{}", base + 1),
            "--peer-listen",
            &format!("127.0.0.1:{}", base + 101),
            "--data-dir",
            dir.path().join("node").to_str().unwrap(),
            "--certs",
            dir.path().join("certs1").to_str().unwrap(),
            "--controllers",
            &format!("http://{controller}"),
            "--heartbeat-ms",
            "200",
            "--disk-reserve-bytes",
            "0",
            "--journal-reserve-bytes",
            "0",
        ],
        &[("RUST_LOG", "stele_node=warn")],
    )
    .unwrap();
    let started = Instant::now();
    let bad = loop {
        let (ok, out, err) = stele_tests::run(&["status", "--endpoint", &node.endpoint, "--json"]);
        assert!(ok, "stele status: {out}{err}");
        let s: serde_json::Value = serde_json::from_str(&out).unwrap();
        let bad = s["bad_peer_endpoints"].as_u64().unwrap();
        if bad >= 4 || started.elapsed() > Duration::from_secs(20) {
            break bad;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Two bad endpoints per heartbeat, counted every time.
    assert!(bad >= 4, "bad_peer_endpoints {bad}");
    let logged = node.stderr_lines();
    for ep in ["0.0.0.0:7552", "nonsense"] {
        assert!(
            logged
                .iter()
                .any(|l| l.contains("cannot be dialled") && l.contains(ep)),
            "no WARN names {ep}: {logged:?}"
        );
    }
    served.abort();
}
