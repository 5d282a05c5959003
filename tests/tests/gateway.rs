//! `stele gateway` (docs/OPERATIONS.md "Gateways and the HTTP API") in
//! front of a controller-managed cell of real processes, driven over HTTP
//! the way a producer in any language would:
//! - appends (one record, an array, NDJSON, base64), reads (latest, a
//!   key's timeline, the namespace page by page across tablets, a split
//!   between pages followed, a merge between pages refused), idempotency
//!   keys (a key reused for other records applies them);
//! - hostile input: each refused with a typed 4xx and nothing written;
//!   a full memory budget answers 429 with Retry-After;
//! - under appends through the gateway, splits and moves: at most 1% of
//!   requests redirected (the gateway's route watch), every acknowledged
//!   record there exactly once; an idle gateway given only the nodes
//!   (their relay of the route map) is not redirected either;
//! - flags that cannot work are refused at start (the gateway's, and a
//!   TLS node asked to serve the plaintext API);
//! - the gRPC front (`--grpc-listen`) with generated stubs: appends routed
//!   and applied once per batch id, reads, pages, typed refusals,
//!   RESOURCE_EXHAUSTED with retry-after;
//! - a gateway killed mid-batch: retries with the same idempotency keys
//!   through another gateway apply each record once; without a key, a
//!   retried request is applied twice (the negative control);
//! - the API against its own OpenAPI document (schemathesis);
//! - the Python producer example (`examples/python/producer.py`) through a
//!   gateway, and through the API `stele dev` serves itself.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stele_proto::vshard::namespace_range;
use stele_tests::controlled::ControlledCell;
use stele_tests::gateway::{Gateway, read_answer, request, send_head};

/// Keys of the rows, each with how often it appears.
fn key_counts(rows: &[Value]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry(r["key"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    out
}

fn metric(gw: &Gateway, name: &str) -> f64 {
    let text = stele_tests::http_get(gw.port, "/metrics");
    stele_tests::series(&text, name).unwrap_or_else(|| panic!("no {name} in the gateway's metrics"))
}

#[test]
fn the_http_api_appends_reads_pages_and_refuses_bad_input() {
    const NS: &str = "gw/api";
    let path = format!("/v1/namespaces/{NS}/records");
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(1);
    let gw = Gateway::start(
        &cell.controllers_arg(),
        &[
            "--body-bytes-max",
            "65536",
            "--memory-budget-bytes",
            "100000",
        ],
    );

    // Appends of every shape.
    let r = gw.append(NS, &json!({"key": "a", "value": "1", "ts": 10}), None);
    assert_eq!(
        (r.status, r.json()["positions"].as_array().unwrap().len()),
        (200, 1),
        "{}",
        r.body
    );
    let r = gw.append(
        NS,
        &json!([{"key": "a", "value": "2", "ts": 20}, {"key": "b", "value": "x", "ts": 5}]),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let nd = b"{\"key\":\"a\",\"value\":\"3\",\"ts\":30}\n{\"key\":\"c\",\"value\":\"y\"}\n";
    let r = gw.call(
        "POST",
        &path,
        &[("Content-Type", "application/x-ndjson")],
        nd,
    );
    assert_eq!(
        (r.status, r.json()["positions"].as_array().unwrap().len()),
        (200, 2),
        "{}",
        r.body
    );
    let r = gw.append(
        NS,
        &json!({"key": "AAE=", "value": "/w==", "encoding": "base64", "ts": 7}),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);

    // Reads.
    let r = gw.call("GET", &format!("/v1/namespaces/{NS}/keys/a"), &[], b"");
    assert_eq!(
        (r.status, r.json()["value"].clone(), r.json()["ts"].clone()),
        (200, json!("3"), json!(30))
    );
    let r = gw.call("GET", &format!("/v1/namespaces/{NS}/keys/%00%01"), &[], b"");
    let row = r.json();
    assert_eq!(
        (
            row["key"].as_str(),
            row["value"].as_str(),
            row["encoding"].as_str()
        ),
        (Some("AAE="), Some("/w=="), Some("base64"))
    );
    let r = gw.call("GET", &format!("/v1/namespaces/{NS}/keys/nope"), &[], b"");
    assert_eq!((r.status, r.kind()), (404, "not_found".to_string()));
    let mut timeline = Vec::new();
    let mut cursor = String::new();
    loop {
        let r = gw.call(
            "GET",
            &format!("/v1/namespaces/{NS}/keys/a/records?limit=1&cursor={cursor}"),
            &[],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let page = r.json();
        timeline.extend(
            page["rows"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["value"].as_str().unwrap().to_string()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(timeline, ["1", "2", "3"]);

    // Idempotency: the same key and records, applied once.
    let body = json!([{"key": "i1", "value": "v"}, {"key": "i2", "value": "v"}]);
    let first = gw.append(NS, &body, Some("req-1"));
    let again = gw.append(NS, &body, Some("req-1"));
    assert_eq!(
        (first.status, again.status),
        (200, 200),
        "{} {}",
        first.body,
        again.body
    );
    assert_eq!(first.json()["duplicate"], false);
    assert_eq!(again.json()["duplicate"], true);
    assert_eq!(first.json()["positions"], again.json()["positions"]);
    // The key reused for other records (a producer's bug): applied as the
    // new request it is, never dropped as a duplicate of the first.
    let reused = gw.append(
        NS,
        &json!([{"key": "i1", "value": "reused"}]),
        Some("req-1"),
    );
    assert_eq!(reused.status, 200, "{}", reused.body);
    assert_eq!(reused.json()["duplicate"], false, "{}", reused.body);

    // Hostile input: a typed 4xx each, and nothing of it written.
    let json_ct = [("Content-Type", "application/json")];
    let big = format!(
        "{{\"key\":\"bad-big\",\"value\":\"{}\"}}",
        "x".repeat(70_000)
    );
    let long_key = format!("{{\"key\":\"bad-{}\",\"value\":\"v\"}}", "k".repeat(5000));
    // Name, path, headers, body (empty: a GET), status, kind.
    type Case<'a> = (
        &'a str,
        String,
        Vec<(&'a str, &'a str)>,
        String,
        u16,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            path.clone(),
            json_ct.to_vec(),
            "{\"key\":\"bad-1\",".into(),
            400,
            "malformed",
        ),
        (
            "unknown field",
            path.clone(),
            json_ct.to_vec(),
            r#"{"key":"bad-2","value":"v","colour":1}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            "a bad record among good ones",
            path.clone(),
            json_ct.to_vec(),
            r#"[{"key":"bad-3","value":"v"},{"key":"","value":"v"}]"#.into(),
            400,
            "invalid_argument",
        ),
        (
            "oversize body",
            path.clone(),
            json_ct.to_vec(),
            big,
            413,
            "too_large",
        ),
        (
            "a key past the limit",
            path.clone(),
            json_ct.to_vec(),
            long_key,
            400,
            "too_large",
        ),
        (
            "bad namespace",
            "/v1/namespaces/gw/ba:d/records".to_string(),
            json_ct.to_vec(),
            r#"{"key":"bad-4","value":"v"}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            "not JSON",
            path.clone(),
            vec![("Content-Type", "text/plain")],
            r#"{"key":"bad-5","value":"v"}"#.into(),
            415,
            "invalid_argument",
        ),
        (
            "bad idempotency key",
            path.clone(),
            vec![
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "a b"),
            ],
            r#"{"key":"bad-6","value":"v"}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            "ts past int64",
            path.clone(),
            json_ct.to_vec(),
            r#"{"key":"bad-7","value":"v","ts":9223372036854775808}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            "bad base64",
            path.clone(),
            json_ct.to_vec(),
            r#"{"key":"!!","value":"v","encoding":"base64"}"#.into(),
            400,
            "invalid_argument",
        ),
        (
            "not a bearer token",
            path.clone(),
            vec![
                ("Content-Type", "application/json"),
                ("Authorization", "Basic Zm9v"),
            ],
            r#"{"key":"bad-8","value":"v"}"#.into(),
            401,
            "permission_denied",
        ),
        (
            "a malformed bearer token",
            path.clone(),
            vec![
                ("Content-Type", "application/json"),
                ("Authorization", "Bearer nope"),
            ],
            r#"{"key":"bad-9","value":"v"}"#.into(),
            401,
            "permission_denied",
        ),
        (
            "unknown path",
            format!("/v1/namespaces/{NS}/rekords"),
            json_ct.to_vec(),
            r#"{"key":"bad-10","value":"v"}"#.into(),
            404,
            "not_found",
        ),
        (
            "a cursor not issued",
            format!("{path}?cursor=AAAA"),
            vec![],
            String::new(),
            400,
            "invalid_argument",
        ),
        (
            "an unknown query parameter",
            format!("{path}?colour=red"),
            vec![],
            String::new(),
            400,
            "invalid_argument",
        ),
    ];
    for (name, p, headers, body, status, kind) in &cases {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let r = gw.call(method, p, headers, body.as_bytes());
        assert_eq!(
            (r.status, r.kind().as_str()),
            (*status, *kind),
            "{name}: {}",
            r.body
        );
        assert_eq!(r.header("content-type"), Some("application/json"), "{name}");
    }

    // A full memory budget: a request held half sent takes all of it.
    let held = send_head(gw.port, "POST", &path, &json_ct, 60_000).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let r = gw.append(NS, &json!({"key": "bad-busy", "value": "v"}), None);
    assert_eq!(
        (r.status, r.kind().as_str(), r.header("retry-after")),
        (429, "overloaded", Some("1")),
        "{}",
        r.body
    );
    let prefix = "{\"key\":\"held\",\"value\":\"";
    let body = format!("{prefix}{}\"}}", "x".repeat(60_000 - prefix.len() - 2));
    let mut held = held;
    held.write_all(body.as_bytes()).unwrap();
    let r = read_answer(held).unwrap();
    assert_eq!(r.status, 200, "the held request: {}", r.body);
    let r = gw.append(NS, &json!({"key": "after-busy", "value": "v"}), None);
    assert_eq!(r.status, 200, "the budget was given back: {}", r.body);

    let keys = key_counts(&gw.scan_all(NS, 1000));
    let bad: Vec<&String> = keys.keys().filter(|k| k.starts_with("bad")).collect();
    assert!(bad.is_empty(), "refused requests wrote {bad:?}");
    for k in ["a", "b", "c", "i1", "i2", "held", "after-busy"] {
        assert!(keys.contains_key(k), "{k} missing: {keys:?}");
    }
    assert_eq!(keys["a"], 3);
    assert_eq!(
        (keys["i1"], keys["i2"]),
        (2, 1),
        "the idempotent request applied twice, or the reused key's record lost"
    );

    // Namespace pages across tablets, and a split between two pages.
    let (lo, _) = namespace_range(NS);
    cell.split_at(lo + 0x8000);
    cell.split_at(lo + 0x4000);
    let many: Vec<Value> = (0..60)
        .map(|i| json!({"key": format!("k{i}"), "value": "v"}))
        .collect();
    let r = gw.append(NS, &Value::Array(many), None);
    assert_eq!(r.status, 200, "{}", r.body);
    let rows = gw.scan_all(NS, 7);
    let counts = key_counts(&rows);
    assert!(
        (0..60).all(|i| counts.get(&format!("k{i}")) == Some(&1)),
        "{counts:?}"
    );
    let total = rows.len();
    let first = gw.call("GET", &format!("{path}?limit=5"), &[], b"").json();
    eprintln!("first page {first}; namespace from {lo}");
    let mut seen: Vec<Value> = first["rows"].as_array().unwrap().clone();
    cell.split_at(lo + 0x2000);
    let mut cursor = first["next_cursor"].as_str().unwrap().to_string();
    loop {
        let page = gw
            .call("GET", &format!("{path}?limit=5&cursor={cursor}"), &[], b"")
            .json();
        seen.extend(page["rows"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    let positions: std::collections::BTreeSet<String> =
        seen.iter().map(|r| r["position"].to_string()).collect();
    let lost: Vec<&Value> = rows
        .iter()
        .filter(|r| !positions.contains(&r["position"].to_string()))
        .collect();
    assert_eq!(
        (seen.len(), positions.len()),
        (total, total),
        "a split between pages lost or repeated rows: lost {lost:?}; tablets now {:?}",
        cell.tablets()
            .iter()
            .map(|t| (
                t["id"].clone(),
                t["vshard_lo"].clone(),
                t["vshard_hi"].clone()
            ))
            .collect::<Vec<_>>()
    );
    assert!(metric(&gw, "stele_gateway_records_total") >= 70.0);

    // A merge under a paged scan cannot be resumed without repeating or
    // skipping rows: the next page is refused (start over), and a new scan
    // reads every row once.
    let first = gw.call("GET", &format!("{path}?limit=5"), &[], b"").json();
    let cursor = first["next_cursor"].as_str().unwrap().to_string();
    // The tablet covering vshard `at`.
    let id_at = |at: u32| {
        let at = u64::from(at);
        cell.tablets()
            .iter()
            .find(|t| {
                t["vshard_lo"].as_u64().unwrap() <= at && at < t["vshard_hi"].as_u64().unwrap()
            })
            .unwrap_or_else(|| panic!("no tablet covers {at}"))["id"]
            .as_u64()
            .unwrap()
            .to_string()
    };
    let (left, right) = (id_at(lo), id_at(lo + 0x2000));
    let i = cell.json_retrying_busy(&["tablet", "merge", &left, &right, "--wait"]);
    assert_eq!(i["state"], "done", "{i}");
    let r = gw.call("GET", &format!("{path}?limit=5&cursor={cursor}"), &[], b"");
    assert_eq!(
        (r.status, r.kind().as_str()),
        (400, "invalid_argument"),
        "a page after a merge: {}",
        r.body
    );
    assert!(r.body.contains("merged"), "{}", r.body);
    assert_eq!(
        gw.scan_all(NS, 7).len(),
        total,
        "a new scan after the merge"
    );
}

#[test]
fn appends_through_a_gateway_go_straight_to_leaders_across_splits_and_moves() {
    const NS: &str = "gw/routes";
    let mut cell = ControlledCell::new(1, 4);
    cell.controller_flags
        .extend(["--leader-balance-ms".into(), "0".into()]);
    let (_controllers, _nodes) = cell.start(1);
    let gw = Gateway::start(&cell.controllers_arg(), &[]);
    // Connected before the changes and idle through them: its map is only
    // what was pushed (tests/watch_routes.rs shows an unwatched client's
    // map going stale under the same changes).
    let idle = Gateway::start(&cell.controllers_arg(), &[]);
    // The same, given only the nodes: its pushes are their relay's.
    let nodes_arg = (1..=4)
        .map(|n| cell.node_endpoint(n))
        .collect::<Vec<_>>()
        .join(",");
    let idle_nodes = Gateway::through_nodes(&nodes_arg, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(Mutex::new(Vec::new()));
    // Held (read) by each request and (write) by each route change: no
    // request is in flight across a change, so a redirect means a request
    // sent after the change went to the wrong node.
    let gate = Arc::new(std::sync::RwLock::new(()));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, acked, port, gate) = (stop.clone(), acked.clone(), gw.port, gate.clone());
            std::thread::spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _sending = gate.read().unwrap();
                    let key = format!("w{w}-{i}");
                    let body = json!({"key": key, "value": "v"}).to_string();
                    let h = [
                        ("Content-Type", "application/json"),
                        ("Idempotency-Key", key.as_str()),
                    ];
                    // Retried with the same key until acknowledged.
                    loop {
                        match request(
                            port,
                            "POST",
                            &format!("/v1/namespaces/{NS}/records"),
                            &h,
                            body.as_bytes(),
                        ) {
                            Ok(r) if r.status == 200 => break,
                            Ok(r) if r.status >= 500 || r.status == 429 => {}
                            Ok(r) => panic!("{key}: {} {}", r.status, r.body),
                            Err(_) => {}
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    acked.lock().unwrap().push(key);
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let base = metric(&gw, "stele_gateway_route_redirects_total");
    let sent_before = acked.lock().unwrap().len();
    let (lo, _) = namespace_range(NS);
    // Each change, 300 ms for it to be pushed, then a second of writes.
    let change = |f: &dyn Fn()| {
        let _changing = gate.write().unwrap();
        f();
        std::thread::sleep(Duration::from_millis(300));
    };
    for at in [0x8000, 0x4000, 0xc000, 0x2000, 0xe000] {
        change(&|| cell.split_at(lo + at));
        std::thread::sleep(Duration::from_secs(1));
    }
    for n in [1, 4] {
        change(&|| {
            cell.move_leader_away(NS, n);
            // The new leader reaches the controller with the next
            // heartbeats (every 500 ms here), and the gateway with a push.
            cell.wait_settled(Duration::from_secs(60));
            std::thread::sleep(Duration::from_millis(1500));
        });
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    // The metric is refreshed every second.
    std::thread::sleep(Duration::from_millis(1500));
    let redirects = metric(&gw, "stele_gateway_route_redirects_total") - base;
    let acked = acked.lock().unwrap().clone();
    let sent = (acked.len() - sent_before) as f64;
    eprintln!("gateway: {redirects} redirected of {sent} requests over 5 splits and 2 moves");
    assert!(sent > 300.0, "the writers barely wrote: {sent}");
    assert!(
        redirects * 100.0 <= sent,
        "{redirects} of {sent} requests were redirected"
    );
    let counts = key_counts(&gw.scan_all(NS, 5000));
    let wrong: Vec<_> = acked
        .iter()
        .filter(|k| counts.get(*k) != Some(&1))
        .collect();
    assert!(
        wrong.is_empty(),
        "acknowledged records not there exactly once: {wrong:?}"
    );

    // The idle gateways, to every tablet the changes made.
    let keys = cell.key_per_tablet(NS);
    assert!(keys.len() >= 6, "tablets of the namespace: {keys:?}");
    for (name, idle) in [("idle", &idle), ("idle through nodes", &idle_nodes)] {
        let before = metric(idle, "stele_gateway_route_redirects_total");
        for round in 0..5 {
            for (_, k) in &keys {
                let r = idle.append(NS, &json!({"key": k, "value": round.to_string()}), None);
                assert_eq!(r.status, 200, "{name}: {}", r.body);
            }
        }
        std::thread::sleep(Duration::from_millis(1500));
        let n = keys.len() * 5;
        let idle_redirects = metric(idle, "stele_gateway_route_redirects_total") - before;
        eprintln!("{name} gateway: {idle_redirects} redirected of {n} requests");
        assert!(
            idle_redirects * 100.0 <= n as f64,
            "the {name} gateway was redirected {idle_redirects} times in {n}"
        );
        assert_eq!(metric(idle, "stele_gateway_route_watching"), 1.0, "{name}");
    }
    assert_eq!(metric(&gw, "stele_gateway_route_watching"), 1.0);
}

#[test]
fn a_gateway_killed_mid_batch_loses_and_doubles_nothing_retried_with_the_same_keys() {
    const NS: &str = "gw/kill";
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(2);
    let first = Gateway::start(&cell.controllers_arg(), &[]);
    let second = Gateway::start(&cell.controllers_arg(), &[]);
    let body_of = |t: usize, i: usize| {
        json!([
            {"key": format!("t{t}-r{i}-a"), "value": "a"},
            {"key": format!("t{t}-r{i}-b"), "value": "b"},
            {"key": format!("t{t}-r{i}-c"), "value": "c"},
        ])
    };
    // Producers send to the first gateway until it dies; each remembers
    // what it sent and what was acknowledged.
    let sent: Arc<Mutex<HashMap<String, Option<Value>>>> = Arc::default();
    let producers: Vec<_> = (0..6)
        .map(|t| {
            let (sent, port) = (sent.clone(), first.port);
            std::thread::spawn(move || {
                for i in 0.. {
                    let key = format!("t{t}-r{i}");
                    let body = body_of(t, i).to_string();
                    sent.lock().unwrap().insert(key.clone(), None);
                    let h = [
                        ("Content-Type", "application/json"),
                        ("Idempotency-Key", key.as_str()),
                    ];
                    match request(
                        port,
                        "POST",
                        &format!("/v1/namespaces/{NS}/records"),
                        &h,
                        body.as_bytes(),
                    ) {
                        Ok(r) if r.status == 200 => {
                            sent.lock()
                                .unwrap()
                                .insert(key, Some(r.json()["positions"].clone()));
                        }
                        _ => return,
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    first.proc.kill9();
    for p in producers {
        p.join().unwrap();
    }
    let sent = sent.lock().unwrap().clone();
    let unanswered = sent.values().filter(|v| v.is_none()).count();
    eprintln!(
        "{} requests sent to the killed gateway, {unanswered} unanswered",
        sent.len()
    );
    assert!(
        sent.len() > 20,
        "too few requests before the kill: {}",
        sent.len()
    );
    // Every request again, through the other gateway, with its key.
    for (key, acked) in &sent {
        let (t, i) = key[1..].split_once("-r").unwrap();
        let body = body_of(t.parse().unwrap(), i.parse().unwrap());
        let r = second.append(NS, &body, Some(key));
        assert_eq!(r.status, 200, "{key}: {}", r.body);
        if let Some(positions) = acked {
            assert_eq!(
                &r.json()["positions"],
                positions,
                "{key}: positions changed on retry"
            );
            assert_eq!(r.json()["duplicate"], true, "{key}");
        }
    }
    // The negative control: without a key, a retry is a second append.
    for _ in 0..2 {
        let r = second.append(NS, &json!({"key": "no-key", "value": "v"}), None);
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let counts = key_counts(&second.scan_all(NS, 5000));
    assert_eq!(
        counts.get("no-key"),
        Some(&2),
        "the check cannot see a doubled record"
    );
    for key in sent.keys() {
        for part in ["a", "b", "c"] {
            let k = format!("{key}-{part}");
            assert_eq!(
                counts.get(&k),
                Some(&1),
                "{k} is there {:?} times",
                counts.get(&k)
            );
        }
    }
}

/// The workspace root.
fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn the_http_api_keeps_to_its_openapi_document_under_schemathesis() {
    let st = std::env::var("STELE_SCHEMATHESIS").map_or_else(
        |_| stele_tests::target_dir().join("api-venv/bin/schemathesis"),
        Into::into,
    );
    assert!(
        st.exists(),
        "no {}: scripts/lib.sh's ensure_api_tools installs schemathesis (scripts/test does)",
        st.display()
    );
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(1);
    let gw = Gateway::start(&cell.controllers_arg(), &["--body-bytes-max", "2000000"]);
    // Every check but positive_data_acceptance: an opaque cursor, or a key
    // too long once UTF-8 encoded, is schema-valid and still refused.
    let started = Instant::now();
    let out = Command::new(&st)
        .args(["run", &format!("{}/openapi.json", gw.url())])
        .args([
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
        ])
        .args(["--max-examples", "60", "--seed", "1", "--no-color"])
        .current_dir(stele_tests::target_dir())
        .output()
        .expect("run schemathesis");
    let text = String::from_utf8_lossy(&out.stdout);
    let tail: String = text
        .lines()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    eprintln!("schemathesis took {:?}:\n{tail}", started.elapsed());
    assert!(
        out.status.success(),
        "schemathesis found problems:\n{}\n{}",
        text.chars().take(20_000).collect::<String>(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("No issues found"), "{tail}");
}

/// Runs `examples/python/producer.py` against the API at `url`; its
/// stdout, once it has exited 0.
fn producer(url: &str, namespace: &str, extra: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(root().join("examples/python/producer.py"))
        .args(["--gateway", url, "--namespace", namespace])
        .args(extra)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "producer.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_python_producer_example_runs_against_a_gateway() {
    const NS: &str = "gw/python";
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(1);
    let gw = Gateway::start(&cell.controllers_arg(), &[]);
    let stdout = producer(&gw.url(), NS, &["--count", "50", "--batch", "5"]);
    let counts = key_counts(&gw.scan_all(NS, 1000));
    assert_eq!(counts.len(), 50, "{counts:?}");
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    assert!(stdout.contains("read back 50"), "{stdout}");
}

#[test]
fn the_python_producer_example_runs_against_stele_dev_itself() {
    let dir = tempfile::tempdir().unwrap();
    let port = stele_tests::free_port_base(1).to_string();
    let dev = stele_tests::Proc::start(
        &[
            "dev",
            "--data-dir",
            dir.path().to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--tablets",
            "4",
        ],
        &[],
    )
    .unwrap();
    let api = dev
        .started
        .iter()
        .find_map(|l| l.split("HTTP API at ").nth(1))
        .and_then(|rest| rest.split("/v1").next())
        .unwrap_or_else(|| panic!("no HTTP API line in {:?}", dev.started))
        .to_string();
    // The API answers once the node's client has its routes.
    let started = Instant::now();
    loop {
        let port: u16 = api.rsplit(':').next().unwrap().parse().unwrap();
        let r = request(port, "GET", "/v1/namespaces/dev/python/records", &[], b"").unwrap();
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{}", r.body);
        assert!(started.elapsed() < Duration::from_secs(30), "{}", r.body);
        std::thread::sleep(Duration::from_millis(100));
    }
    let stdout = producer(&api, "dev/python", &["--count", "30"]);
    assert!(stdout.contains("read back 30"), "{stdout}");
}

#[test]
fn the_gateway_refuses_flags_that_cannot_work() {
    let st = stele_tests::stele_bin();
    let cases: [(&[&str], &str); 5] = [
        (&["gateway"], "--controllers"),
        (
            &[
                "gateway",
                "--controllers",
                "http://127.0.0.1:1",
                "--nodes",
                "http://127.0.0.1:2",
            ],
            "cannot be used with",
        ),
        (
            &[
                "gateway",
                "--nodes",
                "http://127.0.0.1:2",
                "--http-listen",
                "0.0.0.0:0",
            ],
            "not loopback",
        ),
        (&["gateway", "--nodes", "not a url"], "not a url"),
        (
            &[
                "gateway",
                "--nodes",
                "http://127.0.0.1:2",
                "--grpc-listen",
                "0.0.0.0:0",
            ],
            "--grpc-listen 0.0.0.0:0 is not loopback",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(&st)
            .args(args)
            .env_remove("STELE_CONTROLLERS")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
    }
    // A node of a TLS cell refuses to serve the plaintext API itself,
    // before it opens anything.
    let tmp = tempfile::tempdir().unwrap();
    stele_tests::make_certs(tmp.path(), 1);
    let data = tmp.path().join("data");
    let certs = tmp.path().join("certs1");
    let (ok, _, err) = stele_tests::run_plain(&[
        "server",
        "--node-id",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--certs",
        certs.to_str().unwrap(),
        "--http-listen",
        "127.0.0.1:0",
        "--http-api",
    ]);
    assert!(
        !ok && err.contains("--http-api serves plaintext HTTP"),
        "{err}"
    );
    assert!(!data.exists(), "the refused node made its data directory");
}

/// The gateway's gRPC front (`--grpc-listen`), driven with the generated
/// stubs as a producer in another language would: appends routed by the
/// gateway (a retried batch id applies once), reads by key and routing
/// key, the namespace page by page; bad input (named tablets, short batch
/// ids, bad namespaces, records of two tablets, foreign or garbage
/// cursors, a message past the body limit, a malformed token) refused with
/// typed errors and nothing written; a full budget answers
/// RESOURCE_EXHAUSTED with retry-after.
#[test]
fn the_grpc_front_routes_appends_and_reads_and_refuses_bad_input() {
    use stele_proto::Error as ApiError;
    use stele_proto::pb;
    const NS: &str = "gw/grpc";
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(1);
    // Two tablets in the namespace.
    cell.split_at(namespace_range(NS).0 + 0x8000);
    let gw = Gateway::start(
        &cell.controllers_arg(),
        &[
            "--grpc-listen",
            "127.0.0.1:0",
            "--memory-budget-bytes",
            "100000",
            "--body-bytes-max",
            "65536",
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = rt
        .block_on(pb::data_client::DataClient::connect(gw.grpc_endpoint()))
        .unwrap();
    let rec = |k: &str, ts: u64, v: &str| pb::Record {
        key: k.into(),
        ts,
        value: v.into(),
        routing_key: None,
    };
    let append = |c: &mut pb::data_client::DataClient<_>, id: u8, records: Vec<pb::Record>| {
        rt.block_on(c.append(pb::AppendRequest {
            batch_id: vec![id; 16],
            namespace: NS.into(),
            records,
            ..Default::default()
        }))
        .map(|r| r.into_inner())
    };
    for i in 0..30u8 {
        let out = append(&mut c, i + 1, vec![rec(&format!("k{i}"), 1, "v")]).unwrap();
        assert_eq!((out.positions.len(), out.duplicate), (1, false));
    }
    // A retried batch id: applied once, the first positions.
    let first = append(&mut c, 200, vec![rec("k0", 2, "v2"), rec("k0", 3, "v3")]).unwrap();
    let again = append(&mut c, 200, vec![rec("k0", 2, "v2"), rec("k0", 3, "v3")]).unwrap();
    assert!(
        again.duplicate && again.positions == first.positions,
        "{again:?}"
    );
    let routed = pb::Record {
        routing_key: Some(b"rk".to_vec()),
        ..rec("by-rk", 1, "r")
    };
    append(&mut c, 201, vec![routed]).unwrap();

    let get = |c: &mut pb::data_client::DataClient<_>, key: &str, rk: Option<&str>| {
        rt.block_on(c.get(pb::GetRequest {
            namespace: NS.into(),
            key: key.into(),
            routing_key: rk.map(Into::into),
            read: None,
        }))
        .map(|r| r.into_inner().row)
    };
    assert_eq!(get(&mut c, "k0", None).unwrap().unwrap().value, b"v3");
    assert_eq!(
        get(&mut c, "by-rk", Some("rk")).unwrap().unwrap().value,
        b"r"
    );
    let rows = rt
        .block_on(c.scan_key(pb::ScanKeyRequest {
            namespace: NS.into(),
            key: "k0".into(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .rows;
    assert_eq!(rows.len(), 3);
    let scan_all = |c: &mut pb::data_client::DataClient<_>| {
        let (mut rows, mut cursor) = (Vec::new(), Vec::new());
        loop {
            let page = rt
                .block_on(c.scan(pb::ScanRequest {
                    namespace: NS.into(),
                    limit: 7,
                    cursor: cursor.clone(),
                    ..Default::default()
                }))
                .unwrap()
                .into_inner();
            rows.extend(page.rows);
            if page.next_cursor.is_empty() {
                return rows;
            }
            cursor = page.next_cursor;
        }
    };
    let before = scan_all(&mut c);
    let first_page_cursor = rt
        .block_on(c.scan(pb::ScanRequest {
            namespace: NS.into(),
            limit: 7,
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .next_cursor;
    assert!(!first_page_cursor.is_empty());
    assert_eq!(before.len(), 33, "30 keys, k0 twice more, by-rk");
    let tablets = rt
        .block_on(c.list_tablets(pb::ListTabletsRequest {}))
        .unwrap()
        .into_inner()
        .tablets;
    assert!(tablets.len() >= 2, "{tablets:?}");

    // Hostile input: typed errors, nothing written.
    let keys = cell.key_per_tablet(NS);
    let (k1, k2) = (keys[0].1.clone(), keys[1].1.clone());
    let kind = |r: Result<pb::AppendResponse, tonic::Status>| {
        let e = ApiError::from_status(&r.unwrap_err());
        format!("{e:?}")
            .split([' ', '{'])
            .next()
            .unwrap()
            .to_string()
    };
    let bad = |f: &dyn Fn(&mut pb::AppendRequest)| {
        let mut req = pb::AppendRequest {
            batch_id: vec![9; 16],
            namespace: NS.into(),
            records: vec![rec("bad", 1, "x")],
            ..Default::default()
        };
        f(&mut req);
        req
    };
    let cases: Vec<(&str, pb::AppendRequest, &str)> = vec![
        (
            "a tablet named",
            bad(&|r| r.tablet = tablets[0].id),
            "InvalidArgument",
        ),
        (
            "a short batch id",
            bad(&|r| r.batch_id = vec![1; 3]),
            "InvalidArgument",
        ),
        (
            "a bad namespace",
            bad(&|r| r.namespace = "no-slash".into()),
            "InvalidArgument",
        ),
        ("no records", bad(&|r| r.records.clear()), "InvalidArgument"),
        (
            "an empty key",
            bad(&|r| r.records[0].key.clear()),
            "InvalidArgument",
        ),
        (
            "records of two tablets",
            bad(&|r| r.records = vec![rec(&k1, 1, "bad"), rec(&k2, 1, "bad")]),
            "InvalidArgument",
        ),
    ];
    for (name, req, want) in cases {
        let got = kind(rt.block_on(c.append(req)).map(|r| r.into_inner()));
        assert_eq!(got, want, "{name}");
    }
    for (name, req) in [
        (
            "a tablet named",
            pb::ScanRequest {
                namespace: NS.into(),
                tablet: tablets[0].id,
                ..Default::default()
            },
        ),
        (
            "a cursor it never gave",
            pb::ScanRequest {
                namespace: NS.into(),
                cursor: vec![0xff, 0, 1],
                ..Default::default()
            },
        ),
        (
            "another namespace's cursor",
            pb::ScanRequest {
                namespace: "gw/other".into(),
                cursor: first_page_cursor.clone(),
                ..Default::default()
            },
        ),
    ] {
        let err = rt.block_on(c.scan(req)).unwrap_err();
        assert!(
            matches!(
                ApiError::from_status(&err),
                ApiError::InvalidArgument { .. }
            ),
            "scan with {name}: {err:?}"
        );
    }

    // A message past --body-bytes-max, and a malformed token: refused
    // before anything is sent.
    let err = append(&mut c, 240, vec![rec("bad-big", 1, &"x".repeat(70_000))]).unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    let mut req = tonic::Request::new(pb::AppendRequest {
        batch_id: vec![241; 16],
        namespace: NS.into(),
        records: vec![rec("bad-token", 1, "x")],
        ..Default::default()
    });
    req.metadata_mut()
        .insert("authorization", "Bearer nope".parse().unwrap());
    let err = rt.block_on(c.append(req)).unwrap_err();
    assert!(
        matches!(
            ApiError::from_status(&err),
            ApiError::PermissionDenied { .. }
        ),
        "{err:?}"
    );

    // A full budget (an HTTP request held half sent takes all of it).
    let path = format!("/v1/namespaces/{NS}/records");
    let held = send_head(
        gw.port,
        "POST",
        &path,
        &[("Content-Type", "application/json")],
        60_000,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let err = append(&mut c, 250, vec![rec("bad-busy", 1, "x")]).unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert_eq!(
        err.metadata()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert!(ApiError::from_status(&err).kind() == stele_proto::ErrorKind::Retry);
    drop(held);
    std::thread::sleep(Duration::from_millis(500));
    append(&mut c, 250, vec![rec("after-busy", 1, "x")]).unwrap();
    let after = scan_all(&mut c);
    assert_eq!(after.len(), before.len() + 1);
    assert!(
        !after.iter().any(|r| r.key.starts_with(b"bad")),
        "a refused request wrote"
    );
}

/// `stele gateway --require-token`: a request without a producer token is
/// refused (HTTP 401, gRPC PERMISSION_DENIED) and writes nothing, instead
/// of going out under the gateway's own identity, which here (the test
/// operator's certificate) may append anywhere, as the control without
/// the flag shows.
#[test]
fn a_gateway_that_requires_tokens_refuses_tokenless_requests() {
    const NS: &str = "gw/tok";
    let cell = ControlledCell::new(1, 3);
    let (_controllers, _nodes) = cell.start(1);
    let strict = Gateway::start(
        &cell.controllers_arg(),
        &["--require-token", "--grpc-listen", "127.0.0.1:0"],
    );
    let open = Gateway::start(&cell.controllers_arg(), &[]);
    let (ok, out, err) = stele_tests::run(&[
        "token",
        "issue",
        "--namespaces",
        NS,
        "--rights",
        "append,read",
        "--expires",
        "1h",
        "--name",
        "gw-test",
        "--controllers",
        &cell.controllers_arg(),
    ]);
    assert!(ok, "token issue: {out}{err}");
    let token = format!("Bearer {}", out.trim());
    let path = format!("/v1/namespaces/{NS}/records");
    let body = |k: &str| json!({"key": k, "value": "v"}).to_string();
    let json_ct = ("Content-Type", "application/json");

    let r = strict.call("POST", &path, &[json_ct], body("bad-none").as_bytes());
    assert_eq!(
        (r.status, r.kind().as_str()),
        (401, "permission_denied"),
        "{}",
        r.body
    );
    let r = strict.call("GET", &format!("/v1/namespaces/{NS}/keys/k1"), &[], b"");
    assert_eq!(r.status, 401, "a tokenless read: {}", r.body);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = rt
        .block_on(stele_proto::pb::data_client::DataClient::connect(
            strict.grpc_endpoint(),
        ))
        .unwrap();
    let err = rt
        .block_on(c.append(stele_proto::pb::AppendRequest {
            batch_id: vec![7; 16],
            namespace: NS.into(),
            records: vec![stele_proto::pb::Record {
                key: "bad-grpc".into(),
                ts: 1,
                value: "v".into(),
                routing_key: None,
            }],
            ..Default::default()
        }))
        .unwrap_err();
    assert!(
        matches!(
            stele_proto::Error::from_status(&err),
            stele_proto::Error::PermissionDenied { .. }
        ),
        "{err:?}"
    );

    // With the producer's token: through.
    let auth = ("Authorization", token.as_str());
    let r = strict.call("POST", &path, &[json_ct, auth], body("k1").as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    let r = strict.call("GET", &format!("/v1/namespaces/{NS}/keys/k1"), &[auth], b"");
    assert_eq!(r.status, 200, "{}", r.body);
    // Another namespace than the token's: refused by the cell.
    let r = strict.call(
        "POST",
        "/v1/namespaces/gw/other/records",
        &[json_ct, auth],
        body("bad-other").as_bytes(),
    );
    assert_eq!(r.status, 403, "{}", r.body);

    // The control: without the flag, a tokenless request is appended
    // under the gateway's identity.
    let r = open.call("POST", &path, &[json_ct], body("open").as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    let keys = key_counts(&open.scan_all(NS, 100));
    assert_eq!(
        keys.keys().cloned().collect::<Vec<_>>(),
        ["k1", "open"],
        "a refused request wrote"
    );
}
