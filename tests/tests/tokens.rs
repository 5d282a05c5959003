//! Namespace tokens on a cell of real processes: issued by `stele token`,
//! verified by the node alone, refused (PermissionDenied, counted, nothing
//! written) when absent, expired, for another namespace or right, forged,
//! or revoked; revocation reaches the node within a heartbeat or two.

use std::time::{Duration, Instant};

use stele_client::{Client, ClientOptions, Error, ReadOptions, Record};
use stele_proto::Error as ApiError;
use stele_tests::controlled::ControlledCell;
use stele_tests::tls::{anonymous_tls, client_tls};
use stele_tls::token::Bearer;

/// `stele token issue`, as the test operator: the token.
fn issue(cell: &ControlledCell, namespaces: &str, rights: &str, expires: &str) -> String {
    let ctl = cell.controllers_arg();
    let (ok, out, err) = stele_tests::run(&[
        "token",
        "issue",
        "--namespaces",
        namespaces,
        "--rights",
        rights,
        "--expires",
        expires,
        "--name",
        "ingest-test",
        "--controllers",
        &ctl,
    ]);
    assert!(ok, "token issue: {out}{err}");
    assert!(
        err.contains("token "),
        "what it grants goes to stderr: {err}"
    );
    let token = out.trim().to_string();
    assert!(token.starts_with("stele1."), "{out}");
    token
}

async fn client(cell: &ControlledCell, token: Option<&str>) -> Client {
    let opts = ClientOptions {
        tls: Some(anonymous_tls()),
        token: token.map_or_else(Bearer::none, |t| Bearer::new(t).expect("a token")),
        ..Default::default()
    };
    Client::connect_cell(&cell.controller_endpoints(), opts)
        .await
        .expect("connect")
}

fn record(key: &str) -> Vec<Record> {
    vec![Record {
        key: key.as_bytes().to_vec(),
        ts: 1,
        value: b"v".to_vec(),
        routing_key: None,
    }]
}

/// The reason of a PermissionDenied, or a panic naming what came instead.
fn denied<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Err(Error::Api(ApiError::PermissionDenied { reason })) => reason,
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

/// Reads with `token` until they work, revokes it, and reads until the
/// node refuses it: how long the revocation took to reach the node.
async fn revocation_delay(cell: &ControlledCell, token: &str) -> Duration {
    let c = client(cell, Some(token)).await;
    let read = ReadOptions::default();
    c.get("acme/web", b"k7", read)
        .await
        .expect("before revocation");
    let (claims, _, _) = stele_tls::token::decode(token).unwrap();
    let revoked: serde_json::Value = cell.json(&["token", "revoke", &claims.id]);
    assert!(revoked["revoked_at"].as_u64().is_some(), "{revoked}");
    let revoked_at = Instant::now();
    loop {
        match c.get("acme/web", b"k7", read).await {
            Ok(_) => {}
            Err(Error::Api(ApiError::PermissionDenied { reason })) => {
                assert!(reason.contains("revoked"), "{reason}");
                return revoked_at.elapsed();
            }
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            revoked_at.elapsed() < Duration::from_secs(5),
            "a revoked token still works after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_grant_what_they_name_and_nothing_else() {
    let cell = ControlledCell::new(1, 1);
    let (_ctl, _nodes) = cell.start(1);
    let operator = Client::connect_cell(
        &cell.controller_endpoints(),
        ClientOptions {
            tls: Some(client_tls()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let read = ReadOptions::default();
    let mut refusals = 0u64;

    // Hostile issue requests: refused, nothing issued.
    let ctl = cell.controllers_arg();
    for (ns, rights, why) in [
        ("acme", "append", "workspace/project"),
        ("acme/*", "write", "not a right"),
        ("acme/*,a/b/c", "read", "workspace/project"),
    ] {
        let (ok, out, err) = stele_tests::run(&[
            "token",
            "issue",
            "--namespaces",
            ns,
            "--rights",
            rights,
            "--controllers",
            &ctl,
        ]);
        assert!(!ok && err.contains(why), "{ns} {rights}: {out}{err}");
    }
    // Issuing needs an operator certificate: a CLI that trusts the CA but
    // has none is refused.
    let roots_only = tempfile::tempdir().unwrap();
    std::fs::copy(
        stele_tests::tls::test_ca().ca.join("ca.pem"),
        roots_only.path().join("ca.pem"),
    )
    .unwrap();
    let (ok, out, err) = stele_tests::run_env(
        &[
            "token",
            "issue",
            "--namespaces",
            "*",
            "--rights",
            "append",
            "--controllers",
            &ctl,
        ],
        &[("STELE_CERTS_DIR", roots_only.path().to_str().unwrap())],
    );
    assert!(!ok && err.contains("operator"), "{out}{err}");
    let listed: Vec<serde_json::Value> = cell.json(&["token", "list"]);
    assert!(listed.is_empty(), "{listed:?}");

    let acme = issue(&cell, "acme/*", "append,read", "1h");
    let reader = issue(&cell, "acme/*", "read", "1h");
    let short = issue(&cell, "acme/*", "append,read", "2s");
    let doomed = issue(&cell, "acme/web", "append,read", "1h");

    // The token's holder appends and reads its namespaces.
    let c = client(&cell, Some(&acme)).await;
    c.append("acme/web", record("k1")).await.expect("append");
    assert!(c.get("acme/web", b"k1", read).await.unwrap().is_some());
    c.append("acme/api", record("k1")).await.expect("append");

    // No token, no certificate.
    let none = client(&cell, None).await;
    let why = denied(none.append("acme/web", record("k2")).await);
    assert!(why.contains("needs a token"), "{why}");
    refusals += 1;
    let why = denied(none.get("acme/web", b"k1", read).await);
    assert!(why.contains("needs a token"), "{why}");
    refusals += 1;

    // Another namespace: refused both ways, nothing written.
    let why = denied(c.append("other/x", record("k1")).await);
    assert!(why.contains("not append on \"other/x\""), "{why}");
    refusals += 1;
    denied(c.get("other/x", b"k1", read).await);
    refusals += 1;
    // acme/* does not reach a workspace that merely starts with acme.
    denied(c.append("acmecorp/x", record("k1")).await);
    refusals += 1;

    // A read-only token cannot append.
    let r = client(&cell, Some(&reader)).await;
    assert!(r.get("acme/web", b"k1", read).await.unwrap().is_some());
    let why = denied(r.append("acme/web", record("k3")).await);
    assert!(why.contains("not append"), "{why}");
    refusals += 1;

    // A forged token: claims widened to every namespace, the signature
    // of the real one kept.
    let (claims, _, _) = stele_tls::token::decode(&acme).unwrap();
    let mut wide = claims.clone();
    wide.namespaces = vec!["*".into()];
    let (pkcs8, _) = stele_tls::token::generate_key().unwrap();
    let resigned = stele_tls::token::sign(&pkcs8, &wide).unwrap();
    let forged = format!(
        "{}.{}",
        resigned.rsplit_once('.').unwrap().0,
        acme.rsplit_once('.').unwrap().1
    );
    let f = client(&cell, Some(&forged)).await;
    let why = denied(f.append("other/x", record("k4")).await);
    assert!(why.contains("signature"), "{why}");
    refusals += 1;
    // ... and one signed by a key the cell does not have.
    let f = client(&cell, Some(&resigned)).await;
    let why = denied(f.append("other/x", record("k4")).await);
    assert!(why.contains("signature"), "{why}");
    refusals += 1;

    // Expired.
    let s = client(&cell, Some(&short)).await;
    s.append("acme/web", record("k5"))
        .await
        .expect("before expiry");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let why = denied(s.append("acme/web", record("k6")).await);
    assert!(why.contains("expired"), "{why}");
    refusals += 1;

    // Revoked: works, then is refused within a bounded delay (five
    // revocations, for the spread a heartbeat's phase gives).
    let (doomed_claims, _, _) = stele_tls::token::decode(&doomed).unwrap();
    client(&cell, Some(&doomed))
        .await
        .append("acme/web", record("k7"))
        .await
        .expect("before revocation");
    let mut delays = vec![revocation_delay(&cell, &doomed).await];
    for _ in 0..4 {
        let t = issue(&cell, "acme/web", "read", "1h");
        delays.push(revocation_delay(&cell, &t).await);
    }
    refusals += delays.len() as u64;
    delays.sort();
    println!(
        "revocation reached the node in {:?} (min) / {:?} (median) / {:?} (max) over {} revocations, heartbeat 500 ms",
        delays[0],
        delays[delays.len() / 2],
        delays[delays.len() - 1],
        delays.len()
    );
    // Revoking again is harmless; an unknown id is not found.
    let (ok, _, _) = cell.cli(&["token", "revoke", &doomed_claims.id]);
    assert!(ok);
    let (ok, _, err) = cell.cli(&["token", "revoke", &"0".repeat(32)]);
    assert!(!ok && err.contains("no token"), "{err}");

    // Nothing a refused request carried was written.
    for (ns, key) in [
        ("acme/web", "k2"),
        ("acme/web", "k3"),
        ("other/x", "k1"),
        ("other/x", "k4"),
        ("acmecorp/x", "k1"),
        ("acme/web", "k6"),
    ] {
        let row = operator.get(ns, key.as_bytes(), read).await.unwrap();
        assert!(row.is_none(), "{ns} {key} was written: {row:?}");
    }
    assert!(
        operator
            .get("acme/web", b"k7", read)
            .await
            .unwrap()
            .is_some()
    );

    // Every refusal counted, on the node that refused it.
    let status = operator.status_at(&cell.node_endpoint(1)).await.unwrap();
    assert_eq!(status.requests_refused, refusals, "{status:?}");
    assert!(status.token_epoch.unwrap_or(0) >= 2, "{status:?}");

    // The listing shows what was issued, the revocation, never a token.
    let (ok, out, _) = cell.cli(&["token", "list"]);
    assert!(ok);
    assert!(!out.contains("stele1."), "{out}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.len(), 7, "the expired one is not listed: {out}");
    assert_eq!(
        listed
            .iter()
            .filter(|t| t["revoked_at"].as_u64().is_some())
            .count(),
        5
    );
}
