//! Certificates without the CA key on every host (issue 18): a node makes
//! its key and a signing request, the CA host signs it, and a cell runs on
//! those certificates; hostile requests and flags are refused and write
//! nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use stele_client::Client;
use stele_tests::cell::client_options;
use stele_tests::controlled::{ControlledCell, Writer};
use stele_tests::run;

fn request(node: &str, out: &Path) -> (bool, String) {
    let (ok, o, e) = run(&[
        "cert",
        "request",
        "--node-id",
        node,
        "--out",
        out.to_str().unwrap(),
    ]);
    (ok, format!("{o}{e}"))
}

fn sign(ca: &Path, csr: &Path, out: &Path, days: &str) -> (bool, String) {
    let (ok, o, e) = run(&[
        "cert",
        "sign",
        "--ca",
        ca.to_str().unwrap(),
        "--csr",
        csr.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--days",
        days,
    ]);
    (ok, format!("{o}{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_runs_on_requested_and_signed_certificates() {
    let cell = ControlledCell::new(1, 3);
    // The cell's CA (which the controllers and clients trust), and every
    // node's certificate from a request made where the node's files live.
    let ca = cell.dir.path().join("ca");
    for n in 1..=3 {
        let dir = cell.dir.path().join(format!("certs{n}"));
        std::fs::remove_dir_all(&dir).unwrap();
        let (ok, said) = request(&n.to_string(), &dir);
        assert!(ok, "{said}");
        let mode = std::fs::metadata(dir.join("node.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "node.key mode {mode:o}");
        assert!(!dir.join("node.pem").exists());
        let (ok, said) = sign(&ca, &dir.join("node.csr"), &dir, "30");
        assert!(
            ok && said.contains(&format!("node {n} certificate")),
            "{said}"
        );
    }
    let (_ctl, _nodes) = cell.start(2);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let writer = Writer::start(client.clone(), "certs/ns", 2).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(writer.stop_and_check(&client).await > 0);
}

#[test]
fn hostile_requests_and_flags_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca");
    assert!(run(&["cert", "init", "--out", ca.to_str().unwrap()]).0);
    // Node ids the controller would refuse are refused at request.
    for bad in ["0", "65536"] {
        let out = dir.path().join(format!("req{bad}"));
        let (ok, said) = request(bad, &out);
        assert!(
            !ok && said.contains("node ids are 1..65535"),
            "{bad}: {said}"
        );
        assert!(!out.exists(), "{bad}: wrote {out:?}");
    }
    // A second request never replaces a node's key.
    let good = dir.path().join("good");
    assert!(request("7", &good).0);
    let key = std::fs::read(good.join("node.key")).unwrap();
    let (ok, said) = request("7", &good);
    assert!(!ok && said.contains("key already exists"), "{said}");
    assert_eq!(std::fs::read(good.join("node.key")).unwrap(), key);
    let csr = good.join("node.csr");
    // Validity out of bounds, a missing CA, a garbage request, requests
    // naming node 0 or two nodes: refused, nothing written.
    let garbage = dir.path().join("garbage.csr");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n").unwrap();
    let crafted = |names: &[&str]| {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let path = dir.path().join(format!("{}.csr", names.join("+")));
        std::fs::write(
            &path,
            params.serialize_request(&key).unwrap().pem().unwrap(),
        )
        .unwrap();
        path
    };
    let node0 = crafted(&["node-0.stele"]);
    let two = crafted(&["node-1.stele", "node-2.stele"]);
    let none = crafted(&["example.com"]);
    let cases: [(&Path, &Path, &str, &str); 7] = [
        (&ca, &csr, "0", "1 to 3650 days"),
        (&ca, &csr, "3651", "1 to 3650 days"),
        (&dir.path().join("no-ca"), &csr, "30", "missing"),
        (
            &ca,
            &garbage,
            "30",
            "not a usable certificate signing request",
        ),
        (&ca, &node0, "30", "node ids are 1..65535"),
        (&ca, &two, "30", "names 2 nodes"),
        (&ca, &none, "30", "names 0 nodes"),
    ];
    for (i, (ca, csr, days, want)) in cases.iter().enumerate() {
        let out = dir.path().join(format!("out{i}"));
        let (ok, said) = sign(ca, csr, &out, days);
        assert!(
            !ok && said.contains(want),
            "case {i}: want {want:?}: {said}"
        );
        assert!(!out.exists(), "case {i} wrote {out:?}");
    }
    // And the good request signs.
    let (ok, said) = sign(&ca, &csr, &good, "365");
    assert!(ok, "{said}");
    assert!(good.join("node.pem").exists() && good.join("ca.pem").exists());
}
