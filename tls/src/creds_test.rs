//! Reloads that must not take: a half-written certificate, garbage, a key
//! that does not match, a missing file. Each keeps the credentials in use
//! (same serial, still an identity) and names the file; a good pair then
//! takes, and only it counts as a change.

use std::path::Path;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use super::*;

struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

fn ca() -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

/// A `node-1.stele` certificate and its key, both PEM.
fn leaf(ca: &Ca) -> (String, String) {
    leaf_named(ca, "node-1.stele")
}

fn leaf_named(ca: &Ca, name: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let params = CertificateParams::new(vec![name.to_string()]).unwrap();
    let issuer = Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(dir: &Path, ca: &str, cert: &str, key: &str) {
    std::fs::write(dir.join("ca.pem"), ca).unwrap();
    std::fs::write(dir.join("node.pem"), cert).unwrap();
    std::fs::write(dir.join("node.key"), key).unwrap();
}

#[test]
fn a_reload_that_does_not_load_keeps_the_credentials_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let (cert1, key1) = leaf(&ca);
    let (cert2, key2) = leaf(&ca);
    write(dir.path(), &ca.pem, &cert1, &key1);
    let creds = Credentials::load(Files::in_dir(dir.path(), "node")).unwrap();
    creds.require(&[Role::Node(1)]);
    let serial1 = creds.serial().unwrap();
    let changes = creds.changes();
    let (cert_n2, key_n2) = leaf_named(&ca, "node-2.stele");

    let half = &cert2[..cert2.len() / 2];
    let cases: [(&str, &str, &str, &str); 6] = [
        (
            "another node's certificate",
            &cert_n2,
            &key_n2,
            "does not name node 1",
        ),
        ("half written", half, &key1, "node.pem"),
        ("garbage", "not a certificate", &key1, "node.pem"),
        ("no PEM block", "", &key1, "node.pem"),
        (
            "key of another certificate",
            &cert2,
            &key1,
            "does not match",
        ),
        (
            "garbage key",
            &cert1,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n",
            "node.key",
        ),
    ];
    for (what, cert, key, says) in cases {
        write(dir.path(), &ca.pem, cert, key);
        let err = creds.reload().expect_err(what).to_string();
        assert!(err.contains(says), "{what}: {err}");
        assert_eq!(creds.serial().as_deref(), Some(serial1.as_str()), "{what}");
        assert!(creds.has_identity(), "{what}");
    }
    std::fs::remove_file(dir.path().join("node.key")).unwrap();
    let err = creds.reload().expect_err("a missing key").to_string();
    assert!(err.contains("node.key"), "{err}");
    assert!(
        !changes.has_changed().unwrap(),
        "a failed reload is no change"
    );

    // The rotation the failures were steps of: the new pair takes.
    write(dir.path(), &ca.pem, &cert2, &key2);
    creds.reload().unwrap();
    let serial2 = creds.serial().unwrap();
    assert_ne!(serial1, serial2);
    assert!(changes.has_changed().unwrap());
}

#[tokio::test]
async fn watch_reloads_a_rotated_pair_and_survives_the_steps_between() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let (cert1, key1) = leaf(&ca);
    let (cert2, key2) = leaf(&ca);
    write(dir.path(), &ca.pem, &cert1, &key1);
    let creds = Credentials::load(Files::in_dir(dir.path(), "node")).unwrap();
    let serial1 = creds.serial().unwrap();
    let cancel = CancellationToken::new();
    watch(creds.clone(), Duration::from_millis(20), cancel.clone());

    // Key first (for a moment it does not match the old certificate),
    // then the certificate, as docs/SECURITY.md says.
    std::fs::write(dir.path().join("node.key"), &key2).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(creds.serial().as_deref(), Some(serial1.as_str()));
    std::fs::write(dir.path().join("node.pem"), &cert2).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while creds.serial().as_deref() == Some(serial1.as_str()) {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
}
