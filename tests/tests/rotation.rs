//! Certificate rotation on a live three-node cell under load, the way
//! docs/SECURITY.md "Rotating" tells an operator to do it: every node's
//! certificate reissued from the same CA and written in place (key, then
//! certificate; one node told with SIGHUP), a SIGHUP alone for a change
//! the file watch cannot see, then a second CA trusted next to the first
//! and one node moved to it. Throughout, a client appends and
//! reads; no request may fail, and a fresh handshake to each node's gRPC
//! port and to its node-to-node QUIC port must present the new
//! certificate (compared by serial). Before that, hostile files (a
//! half-written certificate, a key that does not match, another node's
//! certificate) must leave the old certificate in place and say why in
//! the log.
//!
//! A certificate close to expiry is warned about at start and reported by
//! `stele status` (`a_certificate_close_to_expiry_is_warned_and_reported`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustls_pki_types::{CertificateDer, ServerName};
use stele_client::{Client, ClientOptions, ReadOptions};
use stele_tests::cell::client_options;
use stele_tests::controlled::{ControlledCell, Writer};
use stele_tests::{Proc, free_port_base, run, signal};
use stele_tls::{ClientTls, Credentials, Files, Kind};

fn port(endpoint: &str) -> u16 {
    endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

/// `stele cert issue` for node `n` into `out` (a fresh directory).
fn issue(ca: &Path, n: usize, out: &Path, days: &str) {
    let (ok, _, err) = run(&[
        "cert",
        "issue",
        "--ca",
        ca.to_str().unwrap(),
        "--node-id",
        &n.to_string(),
        "--days",
        days,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "issue node {n}: {err}");
}

/// The serial of the certificate in `dir/node.pem`.
fn serial_on_disk(dir: &Path) -> String {
    Credentials::load(Files::in_dir(dir, "node"))
        .unwrap()
        .serial()
        .unwrap()
}

/// Writes `from`'s key, then its certificate, over `to`'s: the rotation
/// of docs/SECURITY.md, in place.
fn write_in_place(from: &Path, to: &Path) {
    for f in ["node.key", "node.pem"] {
        std::fs::write(to.join(f), std::fs::read(from.join(f)).unwrap()).unwrap();
    }
}

fn serial_of(cert: &CertificateDer<'_>) -> String {
    stele_tls::creds::serial_and_expiry(cert).unwrap().0
}

/// The serial a fresh TLS handshake to a gRPC port shows, or the
/// handshake's error.
async fn grpc_serial(port: u16, tls: &ClientTls) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let conn = tokio_rustls::TlsConnector::from(tls.config(Kind::Node))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    Ok(serial_of(&conn.get_ref().1.peer_certificates().unwrap()[0]))
}

/// The serial a fresh node-to-node QUIC handshake to node `n` at `port`
/// shows, dialled as the node whose certificate and roots are in
/// `prober` (a node of no cell: its hello never comes).
async fn quic_serial(port: u16, n: usize, prober: &Path) -> Result<String, String> {
    let id = stele_node::certs::NodeIdentity::load(prober).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for r in id.roots() {
        roots.add(r.clone()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(stele_tls::provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(id.cert_chain().to_vec(), id.key().clone_key())
        .unwrap();
    cfg.alpn_protocols = vec![stele_node::transport::ALPN.to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(cfg).unwrap();
    let ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let conn = ep
        .connect_with(
            quinn::ClientConfig::new(Arc::new(quic)),
            addr,
            &format!("node-{n}.stele"),
        )
        .map_err(|e| e.to_string())?;
    let conn = tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .map_err(|_| "QUIC handshake timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let chain = conn
        .peer_identity()
        .unwrap()
        .downcast::<Vec<CertificateDer<'static>>>()
        .unwrap();
    conn.close(0u32.into(), b"probe");
    Ok(serial_of(&chain[0]))
}

/// Issues node `n` a pair into `out` whose files have the sizes of those
/// in `like` (a P-256 signature's length varies, so it may take a few).
fn same_sizes(ca: &Path, n: usize, like: &Path, out: &Path) -> std::path::PathBuf {
    let size = |dir: &Path, f: &str| std::fs::metadata(dir.join(f)).unwrap().len();
    for attempt in 0..40 {
        let dir = out.join(attempt.to_string());
        issue(ca, n, &dir, "365");
        if ["node.key", "node.pem"]
            .iter()
            .all(|f| size(&dir, f) == size(like, f))
        {
            return dir;
        }
    }
    panic!("no certificate of the same size in 40 issues");
}

/// Reads a key continuously, counting answers and failures.
struct Reader {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Reader {
    fn start(client: Client, ns: &str) -> Reader {
        let (stop, ok, failed) = Default::default();
        let (s, o, f): (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>) =
            (Arc::clone(&stop), Arc::clone(&ok), Arc::clone(&failed));
        let ns = ns.to_string();
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                match client.get(&ns, b"k0-1", ReadOptions::default()).await {
                    Ok(_) => o.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("read failed: {e}");
                        f.fetch_add(1, Ordering::Relaxed)
                    }
                };
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Reader {
            stop,
            ok,
            failed,
            task,
        }
    }

    fn ok(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }

    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// Waits until every node in `want` presents its serial on both ports.
async fn wait_presented(
    cell: &ControlledCell,
    want: &HashMap<usize, String>,
    tls: &ClientTls,
    prober: &Path,
    timeout: Duration,
) {
    let deadline = Instant::now() + timeout;
    for (n, serial) in want {
        let p = port(&cell.node_endpoint(*n));
        loop {
            let g = grpc_serial(p, tls).await;
            let q = quic_serial(p + 100, *n, prober).await;
            if g.as_ref() == Ok(serial) && q.as_ref() == Ok(serial) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {n} should present {serial}: gRPC {g:?}, QUIC {q:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Everything node `n` printed on stderr so far, kept in `log`.
fn log_of<'a>(
    log: &'a mut HashMap<usize, Vec<String>>,
    nodes: &HashMap<usize, Proc>,
    n: usize,
) -> &'a [String] {
    let lines = log.entry(n).or_default();
    lines.extend(nodes[&n].stderr_lines());
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn certificates_rotate_on_a_live_cell_under_load() {
    let cell = ControlledCell::new(1, 3);
    let (_ctl, mut nodes) = cell.start(3);
    let d = cell.dir.path();
    let ca = d.join("ca");
    let mut log: HashMap<usize, Vec<String>> = HashMap::new();
    // The prober dials QUIC as node 9 of the same CA.
    let prober = d.join("prober");
    issue(&ca, 9, &prober, "30");
    // The load's TLS reads a directory of its own, so it can be told of a
    // second CA later (an operator's client during a CA rotation).
    let client_dir = d.join("client");
    std::fs::create_dir_all(&client_dir).unwrap();
    for f in ["operator.pem", "operator.key", "ca.pem"] {
        std::fs::copy(
            stele_tests::tls::test_ca().operator.join(f),
            client_dir.join(f),
        )
        .unwrap();
    }
    let client_creds = Credentials::load(Files::in_dir(&client_dir, "operator")).unwrap();
    let tls = ClientTls::new(client_creds.clone());
    let opts = ClientOptions {
        tls: Some(tls.clone()),
        ..client_options()
    };
    let client = Client::connect_cell(&cell.controller_endpoints(), opts)
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), "rot/ns", 2).await;
    let reader = Reader::start(client.clone(), "rot/ns");
    let warm = Instant::now();
    while writer.acked_count() < 50 || reader.ok() < 20 {
        assert!(warm.elapsed() < Duration::from_secs(30), "no load");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let old: HashMap<usize, String> = (1..=3)
        .map(|n| (n, serial_on_disk(&d.join(format!("certs{n}")))))
        .collect();
    wait_presented(&cell, &old, &tls, &prober, Duration::from_secs(5)).await;

    // Hostile files on node 1: a half-written certificate, a key that
    // does not match, another node's pair. Each is refused; the old
    // certificate stays.
    let certs1 = d.join("certs1");
    let (good_cert, good_key) = (
        std::fs::read(certs1.join("node.pem")).unwrap(),
        std::fs::read(certs1.join("node.key")).unwrap(),
    );
    let other = d.join("other1");
    issue(&ca, 1, &other, "30");
    let only_node1 = HashMap::from([(1, old[&1].clone())]);
    std::fs::write(certs1.join("node.pem"), &good_cert[..good_cert.len() / 2]).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    wait_presented(&cell, &only_node1, &tls, &prober, Duration::ZERO).await;
    std::fs::write(certs1.join("node.pem"), &good_cert).unwrap();
    std::fs::write(
        certs1.join("node.key"),
        std::fs::read(other.join("node.key")).unwrap(),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    wait_presented(&cell, &only_node1, &tls, &prober, Duration::ZERO).await;
    // A whole, valid pair of another node: not node 1's identity.
    let node2 = d.join("other2");
    issue(&ca, 2, &node2, "30");
    write_in_place(&node2, &certs1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    wait_presented(&cell, &only_node1, &tls, &prober, Duration::ZERO).await;
    std::fs::write(certs1.join("node.key"), &good_key).unwrap();
    std::fs::write(certs1.join("node.pem"), &good_cert).unwrap();
    let said = log_of(&mut log, &nodes, 1).join("\n");
    for why in ["node.pem", "does not match", "does not name node 1"] {
        assert!(
            said.lines()
                .any(|l| l.contains("did not load") && l.contains(why)),
            "node 1 should say why it kept its certificate ({why}):\n{said}"
        );
    }

    // The rotation: every node reissued from the same CA, written in
    // place; node 3 is also told with SIGHUP.
    writer.take_longest();
    let started = Instant::now();
    let (acked0, read0) = (writer.acked_count(), reader.ok());
    let mut new = HashMap::new();
    for n in 1..=3 {
        let out = d.join(format!("new{n}"));
        issue(&ca, n, &out, "365");
        new.insert(n, serial_on_disk(&out));
        write_in_place(&out, &d.join(format!("certs{n}")));
        if n == 3 {
            signal(nodes[&3].child.id(), libc::SIGHUP);
        }
    }
    for n in 1..=3 {
        assert_ne!(new[&n], old[&n]);
    }
    wait_presented(&cell, &new, &tls, &prober, Duration::from_secs(20)).await;
    let rotation = started.elapsed();
    let (acked1, read1) = (writer.acked_count(), reader.ok());
    let longest_in_rotation = writer.take_longest();
    for n in 1..=3 {
        let s = client.status_at(&cell.node_endpoint(n)).await.unwrap();
        assert_eq!(s.tls_serial, new[&n], "node {n} status");
        let days = (s.tls_not_after_unix
            - SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_secs())
            / 86_400;
        assert!((363..=365).contains(&days), "node {n}: {days} days left");
    }
    let hup = log_of(&mut log, &nodes, 3).join("\n");
    assert!(
        hup.contains("SIGHUP: TLS credentials reloaded"),
        "node 3 should report the SIGHUP reload:\n{hup}"
    );
    for n in 1..=3 {
        let l = log_of(&mut log, &nodes, n).join("\n");
        assert!(!l.contains("expires in"), "node {n} warned of expiry:\n{l}");
        assert!(
            l.contains("node-to-node transport: new connections present the reloaded certificate"),
            "node {n}'s transport should follow the reload:\n{l}"
        );
    }

    // SIGHUP alone: node 3 gets a new pair the file watch cannot see (same
    // sizes, modification times put back), keeps presenting its
    // certificate, and takes the new one on SIGHUP.
    let certs3 = d.join("certs3");
    let hidden = same_sizes(&ca, 3, &certs3, &d.join("hup3"));
    let times: Vec<SystemTime> = ["node.key", "node.pem"]
        .iter()
        .map(|f| {
            std::fs::metadata(certs3.join(f))
                .unwrap()
                .modified()
                .unwrap()
        })
        .collect();
    // Each file is written beside its place with the old time set, then
    // renamed over it: the watch never sees a moment with a new time
    // (writing in place and putting the time back after left one, which a
    // poll under load caught, and the node took the pair unasked).
    for (f, t) in ["node.key", "node.pem"].iter().zip(times) {
        let staged = certs3.join(format!("{f}.staged"));
        std::fs::write(&staged, std::fs::read(hidden.join(f)).unwrap()).unwrap();
        let file = std::fs::File::options().write(true).open(&staged).unwrap();
        file.set_modified(t).unwrap();
        drop(file);
        std::fs::rename(&staged, certs3.join(f)).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let only_node3 = HashMap::from([(3, new[&3].clone())]);
    wait_presented(&cell, &only_node3, &tls, &prober, Duration::ZERO).await;
    signal(nodes[&3].child.id(), libc::SIGHUP);
    let hup_serial = HashMap::from([(3, serial_on_disk(&hidden))]);
    wait_presented(&cell, &hup_serial, &tls, &prober, Duration::from_secs(10)).await;

    // A second CA: trusted everywhere next to the first, then node 2
    // reissued from it. A client trusting only the old CA can no longer
    // reach node 2; one trusting both (the load) can.
    let ca2 = d.join("ca2");
    assert!(stele_tests::run_plain(&["cert", "init", "--out", ca2.to_str().unwrap()]).0);
    let mut both = std::fs::read_to_string(ca.join("ca.pem")).unwrap();
    both.push_str(&std::fs::read_to_string(ca2.join("ca.pem")).unwrap());
    for dir in [
        "certs1",
        "certs2",
        "certs3",
        "certs-ctl1",
        "prober",
        "client",
    ] {
        std::fs::write(d.join(dir).join("ca.pem"), &both).unwrap();
    }
    client_creds.reload().unwrap();
    assert_eq!(client_creds.roots(), 2);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let moved = d.join("new2-ca2");
    issue(&ca2, 2, &moved, "365");
    write_in_place(&moved, &d.join("certs2"));
    let on_ca2 = HashMap::from([(2, serial_on_disk(&moved))]);
    wait_presented(&cell, &on_ca2, &tls, &prober, Duration::from_secs(20)).await;
    let p2 = port(&cell.node_endpoint(2));
    let err = grpc_serial(p2, &stele_tests::tls::anonymous_tls())
        .await
        .expect_err("a client trusting only the old CA");
    assert!(err.contains("certificate"), "{err}");
    // New node-to-node connections both ways, under the two CAs: node 2
    // restarts and its replicas catch up with the others.
    nodes.remove(&2).unwrap().terminate();
    nodes.insert(2, cell.start_node(2));
    cell.wait_settled(Duration::from_secs(60));
    let s2 = client.status_at(&cell.node_endpoint(2)).await.unwrap();
    assert_eq!(s2.tls_serial, on_ca2[&2]);
    let settle = Instant::now();
    loop {
        let s = client.status_at(&cell.node_endpoint(2)).await.unwrap();
        if s.peer_connections >= 2 {
            break;
        }
        assert!(
            settle.elapsed() < Duration::from_secs(20),
            "node 2 peers: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let acked2 = writer.acked_count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        writer.acked_count() > acked2 + 20,
        "appends stopped after the CA rotation"
    );

    let longest_after = writer.take_longest();
    let failed_appends = writer.indeterminate.lock().unwrap().len();
    let (reads, failed_reads) = reader.stop().await;
    let acked = writer.stop_and_check(&client).await;
    eprintln!(
        "rotation of 3 nodes took {rotation:?}: {} appends and {} reads during it, \
         longest append {longest_in_rotation:?}; overall {acked} appends, {reads} reads; \
         longest append after it (CA overlap, node 2 restarted) {longest_after:?}",
        acked1 - acked0,
        read1 - read0,
    );
    assert!(
        acked1 - acked0 >= 10 && read1 - read0 >= 10,
        "too little traffic during the rotation to mean anything"
    );
    assert_eq!(failed_appends, 0, "appends failed");
    assert_eq!(failed_reads, 0, "reads failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_close_to_expiry_is_warned_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    stele_tests::make_certs(dir.path(), 0);
    let certs = dir.path().join("certs1");
    issue(&dir.path().join("ca"), 1, &certs, "10");
    let serial = serial_on_disk(&certs);
    let listen = format!("127.0.0.1:{}", free_port_base(1));
    let node = Proc::start(
        &[
            "server",
            "--node-id",
            "1",
            "--listen",
            &listen,
            "--data-dir",
            dir.path().join("node1").to_str().unwrap(),
            "--certs",
            certs.to_str().unwrap(),
        ],
        &[],
    )
    .unwrap();
    let endpoint = format!("https://{listen}");
    let (ok, out, err) = run(&["status", "--endpoint", &endpoint]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("tls_serial") && out.contains(&serial), "{out}");
    assert!(
        out.contains("expires in 9 days") || out.contains("expires in 10 days"),
        "{out}"
    );
    let (ok, out, err) = run(&["status", "--endpoint", &endpoint, "--json"]);
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tls_serial"], serial.as_str(), "{v}");
    assert!(v["tls_not_after_unix"].as_u64().unwrap() > 0, "{v}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut said = Vec::new();
    while !said
        .iter()
        .any(|l: &String| l.contains("WARN") && l.contains("expires in"))
    {
        assert!(
            Instant::now() < deadline,
            "no expiry warning:\n{}",
            said.join("\n")
        );
        said.extend(node.stderr_lines());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        said.iter().any(|l| l.contains(&serial)),
        "{}",
        said.join("\n")
    );
}
