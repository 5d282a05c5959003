//! `stele restore` on a whole cell: a three-node cell with a `file://`
//! bucket takes acknowledged writes, seals and uploads them (age-based
//! seals, so nothing stays in a memtable); every node is killed and its
//! data directory deleted; `stele restore` rebuilds the tablets from the
//! bucket alone, and a node started on the result serves every
//! acknowledged record exactly once, and nothing else.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use stele_client::{Client, ReadOptions};
use stele_tests::cell::{Cell, client_options, status};
use stele_tests::{Proc, run};

const NS: &str = "restore/cell";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_brings_back_every_acknowledged_record_of_a_cell() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let cell = Cell::new()
        .flag("--tablets", "2")
        .flag("--object-store", &url)
        .flag("--cell-id", "rcell")
        .flag("--memtable-age-max-s", "1")
        // "Every sealed segment uploaded" below counts seals against
        // uploads; a segment compacted away before its upload never is.
        .flag("--compact-target-bytes", "0");
    let mut procs = cell.start(&[1, 2, 3]);
    let client = Client::connect(&cell.endpoint(1), client_options())
        .await
        .unwrap();
    let mut acked = Vec::new();
    for i in 0..300u64 {
        let value = format!("v{i:05}-{}", "r".repeat(300));
        let rec = stele_client::record(format!("key-{}", i % 37), i, value.clone().into_bytes());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match client.append(NS, vec![rec.clone()]).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "append {i}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        acked.push(value);
    }
    // Every memtable sealed (by age) and every sealed segment uploaded.
    let started = Instant::now();
    loop {
        let tablets = client.list_tablets().await.unwrap();
        let mut memtables = 0;
        for t in &tablets {
            let leader = Client::connect(&t.leader_endpoint, client_options())
                .await
                .unwrap();
            let here = leader.list_tablets().await.unwrap();
            memtables += here
                .iter()
                .find(|x| x.id == t.id)
                .map_or(1, |x| x.memtable_bytes);
        }
        let mut uploaded = 0;
        for n in 1..=3 {
            uploaded += status(&cell.endpoint(n)).await.segments_uploaded;
        }
        let sealed = status(&cell.endpoint(1)).await.segments_sealed;
        if memtables == 0 && sealed > 0 && uploaded >= sealed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not all sealed and uploaded: {memtables} memtable bytes, {uploaded} of {sealed} uploaded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A tier round publishes the manifests after the uploads.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (_, p) in procs.drain() {
        p.kill9();
    }
    for n in 1..=3 {
        std::fs::remove_dir_all(cell.data_dir(n)).unwrap();
    }

    let restored = cell.dir.path().join("restored");
    let (ok, out, err) = run(&[
        "restore",
        "--from",
        &url,
        "--cell",
        "rcell",
        "--data-dir",
        restored.to_str().unwrap(),
        "--node-id",
        "1",
    ]);
    assert!(ok, "restore: {out}{err}");
    eprintln!("{out}{err}");
    // Progress on stderr, as plain lines into a pipe: what there is to
    // fetch, then what was fetched.
    for want in ["restoring cell rcell: ", " to fetch", " fetched, done"] {
        assert!(
            err.contains(want),
            "restore progress without {want:?}: {err}"
        );
    }
    assert!(!err.contains('\r'), "a redrawn bar in a pipe: {err:?}");
    // Refused: a cell the bucket does not hold, and a data directory that
    // is not empty (the one just restored is left as it was).
    let other = cell.dir.path().join("other");
    let (ok, _, err) = run(&[
        "restore",
        "--from",
        &url,
        "--cell",
        "nope",
        "--data-dir",
        other.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("no manifest of cell nope"), "{err}");
    assert!(!other.exists());
    let (ok, _, err) = run(&[
        "restore",
        "--from",
        &url,
        "--cell",
        "rcell",
        "--data-dir",
        restored.to_str().unwrap(),
    ]);
    assert!(!ok, "restored over an existing data directory");
    eprintln!("second restore refused: {err}");
    // Started with the command the restore printed (HOST:PORT filled in;
    // no disk reserve on the shared test disk).
    let printed = out
        .split("start it with `stele ")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("no start command in {out}"))
        .replace("HOST:PORT", "127.0.0.1:0");
    let mut args: Vec<&str> = printed.split_whitespace().collect();
    args.extend(["--disk-reserve-bytes", "0", "--journal-reserve-bytes", "0"]);
    // Another cell id would key its objects elsewhere in the bucket: the
    // restored data directory refuses it, naming the right one.
    let mut wrong = args.clone();
    let at = wrong
        .iter()
        .position(|a| *a == "--cell-id")
        .expect("--cell-id printed");
    wrong[at + 1] = "othercell";
    let refused = Proc::start(&wrong, &[]).map(|_| ()).unwrap_err();
    assert!(
        refused.contains("belongs to cell \"rcell\"") && refused.contains("--cell-id rcell"),
        "{refused}"
    );
    let node = Proc::start(&args, &[]).unwrap();
    let client = Client::connect(&node.endpoint, client_options())
        .await
        .unwrap();
    let rows = client
        .scan_all(NS, 0, 0, b"", ReadOptions::default())
        .await
        .unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &rows {
        *seen
            .entry(String::from_utf8(r.value.clone()).unwrap())
            .or_default() += 1;
    }
    assert!(seen.values().all(|c| *c == 1), "a record restored twice");
    let missing: Vec<&String> = acked.iter().filter(|v| !seen.contains_key(*v)).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged records not restored, first {:?}",
        missing.len(),
        missing.first().map(|v| &v[..6])
    );
    assert_eq!(
        rows.len(),
        acked.len(),
        "records restored that were never acknowledged"
    );
    // The restored node takes writes.
    client
        .append(NS, vec![stele_client::record("after", 1, b"x".to_vec())])
        .await
        .unwrap();
    node.terminate();
}
