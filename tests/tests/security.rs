//! TLS and roles on a cell of real processes: every listener is TLS, and
//! a caller without the identity a method needs is refused with
//! `PermissionDenied` (or fails the handshake) and changes nothing. The
//! same for the directory quorum's operator methods and its Raft.

use stele_proto::pb;
use stele_tests::controlled::ControlledCell;
use stele_tests::tls::{anonymous_tls, channel, client_tls, identity};
use stele_tls::Kind;
use tonic::Code;

fn controller(
    cell: &ControlledCell,
    tls: &stele_tls::ClientTls,
) -> pb::controller_client::ControllerClient<tonic::transport::Channel> {
    pb::controller_client::ControllerClient::new(channel(
        &cell.controller_endpoint(1),
        tls,
        Kind::Controller,
    ))
}

fn heartbeat_as(id: u64, client_endpoint: &str) -> pb::HeartbeatRequest {
    pb::HeartbeatRequest {
        node: Some(pb::NodeRegistration {
            id,
            client_endpoint: client_endpoint.into(),
            peer_endpoint: "127.0.0.1:9".into(),
            capacity: 1,
            ..Default::default()
        }),
        replicas: Vec::new(),
        token_epoch: None,
        load: None,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_the_right_identity_are_refused_and_change_nothing() {
    let mut cell = ControlledCell::new(1, 1);
    let http = stele_tests::free_port_base(1);
    cell.controller_flags
        .extend(["--http-listen".into(), format!("127.0.0.1:{http}")]);
    let (_ctl, _nodes) = cell.start(2);
    assert!(cell.controller_endpoint(1).starts_with("https://"));
    assert!(cell.node_endpoint(1).starts_with("https://"));
    let nodes_before = cell.node_list();
    let tablets_before = cell.tablets();

    // An operator command from a client with no certificate.
    let err = controller(&cell, &anonymous_tls())
        .set_node_state(pb::SetNodeStateRequest {
            node: 1,
            state: "draining".into(),
        })
        .await
        .expect_err("an anonymous drain");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("operator"), "{err:?}");
    // ... and from a node's certificate.
    let as_node1 = identity(&cell.dir.path().join("certs1"));
    let err = controller(&cell, &as_node1)
        .set_node_state(pb::SetNodeStateRequest {
            node: 1,
            state: "draining".into(),
        })
        .await
        .expect_err("a node's drain");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // A heartbeat as node 2 from node 1's certificate, pointing clients
    // at the caller: refused, no node 2 registered.
    let err = controller(&cell, &as_node1)
        .heartbeat(heartbeat_as(2, "https://127.0.0.1:9"))
        .await
        .expect_err("a forged heartbeat");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("node 2"), "{err:?}");
    // A heartbeat from an operator or nobody: refused before it is read.
    for tls in [client_tls(), anonymous_tls()] {
        let err = controller(&cell, &tls)
            .heartbeat(heartbeat_as(1, "https://127.0.0.1:9"))
            .await
            .expect_err("a heartbeat without a node certificate");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }

    // Raft to the controller quorum from a non-member (a node, an
    // operator): refused; the body is never decoded.
    for tls in [as_node1.clone(), client_tls()] {
        let mut q = pb::quorum_client::QuorumClient::new(channel(
            &cell.controller_endpoint(1),
            &tls,
            Kind::Controller,
        ));
        let err = q
            .raft(pb::RaftMessage {
                body: vec![0xa2, 0x61, 0x76, 0x01],
            })
            .await
            .expect_err("Raft from a non-member");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }

    // Quorum traffic on a node's port: nobody may send it there.
    let mut q = pb::quorum_client::QuorumClient::new(channel(
        &cell.node_endpoint(1),
        &identity(&cell.dir.path().join("certs-ctl1")),
        Kind::Node,
    ));
    let err = q
        .raft(pb::RaftMessage { body: vec![] })
        .await
        .expect_err("Raft on a node port");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    assert_eq!(cell.node_list().len(), nodes_before.len());
    for (before, after) in nodes_before.iter().zip(cell.node_list()) {
        assert_eq!(
            before["client_endpoint"], after["client_endpoint"],
            "{after}"
        );
        assert_eq!(before["state"], after["state"], "{after}");
    }
    assert_eq!(cell.tablets().len(), tablets_before.len());

    // Every refusal counted, by method, where a scraper finds it.
    let metrics = tokio::task::spawn_blocking(move || stele_tests::http_get(http, "/metrics"))
        .await
        .unwrap();
    let refused = |m: &str| stele_tests::counter(&metrics, "stele_auth_refused_total", m);
    assert_eq!(refused("/stele.v1.Controller/SetNodeState"), 2, "{metrics}");
    assert_eq!(refused("/stele.v1.Controller/Heartbeat"), 3, "{metrics}");
    assert_eq!(refused("/stele.v1.Quorum/Raft"), 2, "{metrics}");

    // The operator may: the same drain works with its certificate.
    controller(&cell, &client_tls())
        .set_node_state(pb::SetNodeStateRequest {
            node: 1,
            state: "active".into(),
        })
        .await
        .expect("the operator sets a node's state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_ca_or_the_wrong_role_fails_the_handshake() {
    let cell = ControlledCell::new(1, 1);
    let (_ctl, _nodes) = cell.start(1);

    // A client whose certificate another CA signed.
    let foreign = tempfile::tempdir().unwrap();
    let ca = foreign.path().join("ca");
    let op = foreign.path().join("op");
    assert!(stele_tests::run_plain(&["cert", "init", "--out", ca.to_str().unwrap()]).0);
    assert!(
        stele_tests::run_plain(&[
            "cert",
            "operator",
            "--ca",
            ca.to_str().unwrap(),
            "--name",
            "mallory",
            "--out",
            op.to_str().unwrap(),
        ])
        .0
    );
    // It trusts the cell's CA (so only its own certificate is at fault).
    std::fs::copy(
        stele_tests::tls::test_ca().ca.join("ca.pem"),
        op.join("ca.pem"),
    )
    .unwrap();
    let mallory = stele_tls::ClientTls::new(
        stele_tls::Credentials::load(stele_tls::Files::in_dir(&op, "operator")).unwrap(),
    );
    let err = controller(&cell, &mallory)
        .cell_status(pb::CellStatusRequest { local: true })
        .await
        .expect_err("a certificate from another CA");
    assert_ne!(err.code(), Code::Ok);
    assert_ne!(
        err.code(),
        Code::PermissionDenied,
        "a TLS failure, not a call"
    );

    // A client that trusts only another CA does not accept the cell.
    let stranger = stele_tls::ClientTls::new(
        stele_tls::Credentials::load(stele_tls::Files::roots_only(&ca)).unwrap(),
    );
    controller(&cell, &stranger)
        .cell_status(pb::CellStatusRequest { local: true })
        .await
        .expect_err("a server the client's CA did not sign");

    // A node cannot answer for a controller: expecting a controller at a
    // node's endpoint fails the handshake.
    let mut wrong = pb::controller_client::ControllerClient::new(channel(
        &cell.node_endpoint(1),
        &client_tls(),
        Kind::Controller,
    ));
    let err = wrong
        .cell_status(pb::CellStatusRequest { local: true })
        .await
        .expect_err("a node answering as a controller");
    assert!(format!("{err:?}").contains("not a controller"), "{err:?}");

    // Plaintext to a TLS listener gets nothing.
    let plain = cell.controller_endpoint(1).replace("https://", "http://");
    let err = pb::controller_client::ControllerClient::connect(plain)
        .await
        .expect("TCP connects")
        .cell_status(pb::CellStatusRequest { local: true })
        .await
        .expect_err("plaintext to a TLS port");
    assert_ne!(err.code(), Code::Ok);
}

/// What the directory holds, as the operator lists it.
fn directory_state(dir: &stele_tests::directory::Directory) -> (serde_json::Value, String, String) {
    (
        dir.json(&["directory", "status"])["generation"].clone(),
        dir.json(&["cell", "list"]).to_string(),
        dir.json(&["ns", "list"]).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_changes_need_an_operator_and_its_raft_a_member() {
    let dir = stele_tests::directory::Directory::new(3, true);
    let _members: Vec<_> = (1..=3).map(|i| dir.start(i)).collect();
    assert!(dir.endpoint(1).starts_with("https://"));
    let init = dir.json(&["directory", "init"]);
    assert_eq!(init["created"], true, "{init}");
    dir.json(&[
        "cell",
        "register",
        "c1",
        "--controllers",
        "https://127.0.0.1:9",
    ]);
    let before = directory_state(&dir);

    // A node's certificate of the same CA, a directory member's, and none.
    stele_tests::make_certs(dir.tmp.path(), 1);
    let callers = [
        ("no certificate", anonymous_tls()),
        ("a node", identity(&dir.tmp.path().join("certs1"))),
        ("a directory member", identity(&dir.certs(2))),
    ];
    for (who, tls) in &callers {
        for i in 1..=3 {
            let mut d = pb::directory_client::DirectoryClient::new(channel(
                &dir.endpoint(i),
                tls,
                Kind::Directory,
            ));
            let err = d
                .register_cell(pb::RegisterCellRequest {
                    id: "evil".into(),
                    controllers: vec!["https://127.0.0.1:9".into()],
                    ..Default::default()
                })
                .await
                .expect_err("RegisterCell without an operator");
            assert_eq!(err.code(), Code::PermissionDenied, "{who}: {err:?}");
            assert!(err.message().contains("operator"), "{who}: {err:?}");
            let err = d
                .create_namespace(pb::CreateNamespaceRequest {
                    name: "evil/ns".into(),
                    cell: "c1".into(),
                    ..Default::default()
                })
                .await
                .expect_err("CreateNamespace without an operator");
            assert_eq!(err.code(), Code::PermissionDenied, "{who}: {err:?}");
            // Reads stay open to any TLS client (a follower answers
            // NotLeader: not a refusal).
            if let Err(e) = d.list_cells(pb::ListCellsRequest {}).await {
                assert_ne!(e.code(), Code::PermissionDenied, "{who}: list cells: {e:?}");
            }
        }
    }

    // Raft to the directory quorum from a non-member (a node, an
    // operator, nobody): refused before the body is decoded.
    for (who, tls) in [
        ("a node", identity(&dir.tmp.path().join("certs1"))),
        ("the operator", client_tls()),
        ("no certificate", anonymous_tls()),
    ] {
        let mut q =
            pb::quorum_client::QuorumClient::new(channel(&dir.endpoint(1), &tls, Kind::Directory));
        let err = q
            .raft(pb::RaftMessage {
                body: vec![0xa2, 0x61, 0x76, 0x01],
            })
            .await
            .expect_err("Raft from a non-member");
        assert_eq!(err.code(), Code::PermissionDenied, "{who}: {err:?}");
    }
    assert_eq!(
        directory_state(&dir),
        before,
        "a refused call changed the directory"
    );

    // The operator may: the same calls with its certificate.
    dir.json(&[
        "cell",
        "register",
        "c2",
        "--controllers",
        "https://127.0.0.1:9",
    ]);
    let ns = dir.json(&["ns", "create", "ok/ns", "--cell", "c1"]);
    assert_eq!(ns["cell"], "c1", "{ns}");
    assert_ne!(directory_state(&dir).0, before.0);
}
