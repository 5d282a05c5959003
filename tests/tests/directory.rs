//! The global directory with real processes: a 3-member directory and two
//! one-node cells on loopback. A client given only the directory's
//! endpoints writes to and reads from both cells; records land only on the
//! owning cell; a cell refuses another cell's namespace naming the owner;
//! losing the directory leader, then the whole directory, stops no write
//! to a namespace already resolved (even across a node restart), while
//! namespace creation waits for a quorum.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use stele_client::admin::DirectoryAdmin;
use stele_client::{Client, GlobalClient, ReadOptions, record};
use stele_proto::pb;
use stele_tests::Proc;
use stele_tests::cell::client_options;
use stele_tests::controlled::ControlledCell;
use stele_tests::directory::Directory;

/// Every tablet's last log index on a node, summed: it moves only when
/// something is committed on that cell.
async fn log_total(endpoint: &str) -> u64 {
    let mut c = stele_tests::tls::data_client(endpoint);
    c.list_tablets(pb::ListTabletsRequest {})
        .await
        .unwrap()
        .into_inner()
        .tablets
        .iter()
        .map(|t| t.last_log_index)
        .sum()
}

fn cell(id: &str, directory: &str) -> ControlledCell {
    let mut c = ControlledCell::new(1, 1);
    c.node_flags = vec![
        "--directory".into(),
        directory.into(),
        "--cell-id".into(),
        id.into(),
    ];
    c
}

async fn scan_values(g: &GlobalClient, ns: &str) -> Vec<String> {
    let mut v: Vec<String> = g
        .scan_all(ns, 0, 0, b"", ReadOptions::default())
        .await
        .unwrap_or_else(|e| panic!("scan {ns}: {e}"))
        .into_iter()
        .map(|r| String::from_utf8(r.value).unwrap())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_route_across_cells_and_outlive_the_directory() {
    let dir = Directory::new(3, false);
    let mut members: HashMap<usize, Proc> = (1..=3).map(|i| (i, dir.start(i))).collect();
    let init = dir.json(&["directory", "init"]);
    assert_eq!(init["created"], true, "{init}");

    // Each cell is started after the previous one holds its ports.
    let a = cell("c1", &dir.arg());
    let (_ctl_a, mut nodes_a) = a.start(2);
    let b = cell("c2", &dir.arg());
    let (_ctl_b, _nodes_b) = b.start(2);
    let c1 = dir.json(&[
        "cell",
        "register",
        "c1",
        "--controllers",
        &a.controllers_arg(),
        "--label",
        "region=r1",
    ]);
    assert_eq!(
        (c1["id"].as_str(), c1["status"].as_str()),
        (Some("c1"), Some("active"))
    );
    dir.json(&[
        "cell",
        "register",
        "c2",
        "--controllers",
        &b.controllers_arg(),
    ]);

    // Placement: explicit, then least-loaded (c2 holds fewer).
    let wa = dir.json(&["ns", "create", "w/a", "--cell", "c1"]);
    assert_eq!(wa["cell"], "c1");
    let wb = dir.json(&["ns", "create", "w/b"]);
    assert_eq!(wb["cell"], "c2", "least-loaded placement: {wb}");

    // Bad input: each refused with a reason, and nothing changes.
    let before = (
        dir.json(&["directory", "status"])["generation"].clone(),
        dir.json(&["ns", "list"]),
        dir.json(&["cell", "list"]),
    );
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["ns".into(), "create".into(), "w/a".into()],
            "exists already",
        ),
        (vec!["ns".into(), "create".into(), "".into()], "namespace"),
        (
            vec![
                "ns".into(),
                "create".into(),
                format!("w/{}", "p".repeat(65)),
            ],
            "1 to 64 bytes",
        ),
        (
            vec!["ns".into(), "create".into(), "w/b c".into()],
            "letters, digits",
        ),
        (
            vec![
                "ns".into(),
                "create".into(),
                "w/x".into(),
                "--cell".into(),
                "c9".into(),
            ],
            "no cell",
        ),
        (
            vec!["cell".into(), "retire".into(), "c1".into()],
            "still holds 1 namespace",
        ),
        (vec!["cell".into(), "retire".into(), "c9".into()], "no cell"),
        (
            vec![
                "ns".into(),
                "update".into(),
                "w/none".into(),
                "--retention-s".into(),
                "5".into(),
            ],
            "not in the directory",
        ),
        (
            vec![
                "cell".into(),
                "register".into(),
                "bad id".into(),
                "--controllers".into(),
                "http://x".into(),
            ],
            "letters, digits",
        ),
        (
            vec![
                "cell".into(),
                "register".into(),
                "c3".into(),
                "--controllers".into(),
                "not-a-url".into(),
            ],
            "not an http",
        ),
    ];
    for (args, why) in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let err = dir.refused(&a);
        assert!(err.contains(why), "{args:?}: expected {why:?} in {err}");
    }
    // A retired cell takes nothing and its id is never registered again.
    let spare_ep = "http://127.0.0.1:1";
    dir.json(&["cell", "register", "c3", "--controllers", spare_ep]);
    dir.json(&["cell", "retire", "c3"]);
    assert!(
        dir.refused(&["ns", "create", "w/x", "--cell", "c3"])
            .contains("retired")
    );
    assert!(
        dir.refused(&["cell", "register", "c3", "--controllers", spare_ep])
            .contains("retired")
    );
    let after = (
        dir.json(&["directory", "status"])["generation"].clone(),
        dir.json(&["ns", "list"]),
    );
    assert_eq!(after.1, before.1, "a refusal changed the namespaces");
    assert_eq!(
        after.0.as_u64().unwrap(),
        before.0.as_u64().unwrap() + 2,
        "only the spare cell's register and retire changed the directory"
    );

    // A client given only the directory writes to and reads from each
    // cell; the records land only on the owning cell.
    let g = GlobalClient::new(&dir.endpoints(), client_options()).unwrap();
    let (a_node, b_node) = (a.node_endpoint(1), b.node_endpoint(1));
    let b_log = log_total(&b_node).await;
    for i in 0..30 {
        g.append(
            "w/a",
            vec![record(format!("k{i}"), i + 1, format!("a{i:03}"))],
        )
        .await
        .unwrap();
    }
    assert_eq!(
        log_total(&b_node).await,
        b_log,
        "w/a records reached cell c2"
    );
    let a_log = log_total(&a_node).await;
    for i in 0..30 {
        g.append(
            "w/b",
            vec![record(format!("k{i}"), i + 1, format!("b{i:03}"))],
        )
        .await
        .unwrap();
    }
    assert_eq!(
        log_total(&a_node).await,
        a_log,
        "w/b records reached cell c1"
    );
    let want = |p: &str| (0..30).map(|i| format!("{p}{i:03}")).collect::<Vec<_>>();
    assert_eq!(scan_values(&g, "w/a").await, want("a"));
    assert_eq!(scan_values(&g, "w/b").await, want("b"));
    assert_eq!(g.cached("w/a").unwrap().cell, "c1");

    // A stale or lying client sends w/a to cell c2: refused, naming c1,
    // and nothing is written there.
    let wrong = Client::connect_cell(&b.controller_endpoints(), client_options())
        .await
        .unwrap();
    let b_log = log_total(&b_node).await;
    let err = wrong
        .append("w/a", vec![record("k", 1, "lost")])
        .await
        .unwrap_err();
    match err.api() {
        Some(stele_proto::Error::WrongCell {
            namespace,
            cell,
            controllers,
        }) => {
            assert_eq!((namespace.as_str(), cell.as_str()), ("w/a", "c1"));
            assert_eq!(controllers, &a.controller_endpoints());
        }
        other => panic!("expected WrongCell, got {other:?} ({err})"),
    }
    let err = wrong
        .scan_all("w/a", 0, 0, b"", ReadOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err.api(), Some(stele_proto::Error::WrongCell { .. })),
        "{err}"
    );
    // A namespace the directory never heard of.
    let err = wrong
        .append("w/nowhere", vec![record("k", 1, "lost")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.api(),
            Some(stele_proto::Error::NamespaceNotFound { .. })
        ),
        "{err}"
    );
    assert_eq!(
        log_total(&b_node).await,
        b_log,
        "a refused request wrote on c2"
    );
    let err = g
        .append("w/nowhere", vec![record("k", 1, "x")])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.api(),
            Some(stele_proto::Error::NamespaceNotFound { .. })
        ),
        "{err}"
    );

    // Writers run while the directory leader is SIGKILLed: not one write
    // fails, and namespace creation resumes under the new leader.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for (w, ns) in ["w/a", "w/b"].into_iter().enumerate() {
        let (g, stop, acked) = (g.clone(), stop.clone(), acked.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                g.append(
                    ns,
                    vec![record(format!("w{w}-{i}"), 1000 + i, format!("w{i:05}"))],
                )
                .await
                .unwrap_or_else(|e| panic!("write to {ns} failed: {e}"));
                acked.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            i
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let leader = dir.json(&["directory", "status"])["leader_id"]
        .as_u64()
        .unwrap() as usize;
    members.remove(&leader).unwrap().kill9();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let wc = dir.json(&["ns", "create", "w/c", "--cell", "c1"]);
    assert_eq!(wc["cell"], "c1");
    let new_leader = dir.json(&["directory", "status"])["leader_id"]
        .as_u64()
        .unwrap() as usize;
    assert_ne!(new_leader, leader);

    // Then every directory member: resolved namespaces keep working.
    for (_, m) in members.drain() {
        m.kill9();
    }
    let during = acked.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        acked.load(Ordering::Relaxed) > during,
        "writes stopped with the directory"
    );
    // Even a node restarted while the directory is down serves the
    // namespaces it had resolved (their owners are in its catalog).
    stop.store(true, Ordering::Relaxed);
    let mut written = 0;
    for w in writers {
        written += w.await.unwrap();
    }
    assert!(written > 0);
    nodes_a.remove(&1).unwrap().kill9();
    nodes_a.insert(1, a.start_node(1));
    g.append("w/a", vec![record("after-restart", 9_999_999, "z")])
        .await
        .unwrap();
    let rows = g
        .scan_key_all("w/a", b"after-restart", 0, 0, ReadOptions::default())
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    // Creation waits for a quorum, and says it is unavailable.
    let mut d = DirectoryAdmin::new(dir.endpoints()).unwrap();
    d.deadline = Duration::from_secs(3);
    let err = d
        .call(|mut c| async move {
            c.create_namespace(pb::CreateNamespaceRequest {
                name: "w/late".into(),
                ..Default::default()
            })
            .await
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err.api(), Some(stele_proto::Error::Unavailable { .. })),
        "{err}"
    );
}

/// The pushed namespace map (`WatchNamespaces`): a client's cached
/// placement follows its cell's new controllers and a policy change
/// without a request, across a directory leader change; the control, its
/// watch off, keeps the old placement. A watch asked from a generation
/// ahead of the directory gets the whole map; a follower refuses a watch,
/// naming the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_placements_follow_the_pushed_namespace_map() {
    let dir = Directory::new(3, false);
    let mut members: HashMap<usize, Proc> = (1..=3).map(|i| (i, dir.start(i))).collect();
    dir.json(&["directory", "init"]);
    let a = cell("c1", &dir.arg());
    let (_ctl, _nodes) = a.start(1);
    dir.json(&[
        "cell",
        "register",
        "c1",
        "--controllers",
        &a.controllers_arg(),
    ]);
    dir.json(&["ns", "create", "w/a", "--cell", "c1"]);

    let g = GlobalClient::new(&dir.endpoints(), client_options()).unwrap();
    let control = GlobalClient::new(&dir.endpoints(), client_options())
        .unwrap()
        .watch_namespaces(false);
    for c in [&g, &control] {
        c.append("w/a", vec![record("k", 1, "v")]).await.unwrap();
    }
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let at = std::time::Instant::now();
        while !ok() {
            assert!(at.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait("the namespace watch opened", &|| g.namespace_pushes().0 > 0);

    // The cell gains a controller endpoint (a replaced controller, say).
    let old = a.controller_endpoints();
    let mut new = old.clone();
    new.push("http://127.0.0.1:1".into());
    dir.json(&["cell", "register", "c1", "--controllers", &new.join(",")]);
    wait("the new controllers were pushed", &|| {
        g.cached("w/a").unwrap().controllers == new
    });
    assert_eq!(
        control.cached("w/a").unwrap().controllers,
        old,
        "the control's placement changed without a watch"
    );
    g.append("w/a", vec![record("k", 2, "v2")]).await.unwrap();

    // The directory leader dies: the watch reopens at the new one.
    let leader = dir.json(&["directory", "status"])["leader_id"]
        .as_u64()
        .unwrap() as usize;
    members.remove(&leader).unwrap().kill9();
    let generation = g.cached("w/a").unwrap().generation;
    let at = std::time::Instant::now();
    while !dir.cli(&["ns", "update", "w/a", "--retention-s", "3600"]).0 {
        assert!(at.elapsed() < Duration::from_secs(30), "no new leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let at = std::time::Instant::now();
    while g.cached("w/a").unwrap().generation <= generation {
        assert!(
            at.elapsed() < Duration::from_secs(30),
            "the policy change after the leader change was not pushed: {:?}",
            g.namespace_pushes()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(control.cached("w/a").unwrap().generation, generation);

    // A watch from a generation the directory never reached (a directory
    // restored from an older backup): the whole map. A follower refuses.
    let d = DirectoryAdmin::new(dir.endpoints()).unwrap();
    let mut stream = d
        .call(|mut c| async move {
            c.watch_namespaces(pb::WatchNamespacesRequest {
                since_generation: u64::MAX,
            })
            .await
        })
        .await
        .unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert!(first.full, "{first:?}");
    assert_eq!(first.namespaces.len(), 1);
    assert_eq!(first.namespaces[0].controllers, new);
    let new_leader = dir.json(&["directory", "status"])["leader_id"]
        .as_u64()
        .unwrap() as usize;
    let follower = *members.keys().find(|m| **m != new_leader).unwrap();
    let mut raw = pb::directory_client::DirectoryClient::connect(dir.endpoint(follower))
        .await
        .unwrap();
    let err = raw
        .watch_namespaces(pb::WatchNamespacesRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            stele_proto::Error::from_status(&err),
            stele_proto::Error::NotLeader { .. }
        ),
        "{err:?}"
    );
}
