//! Restore of a whole managed cell from the bucket (issue 18, item 8): a
//! cell of three controllers and three nodes with a `file://` bucket takes
//! acknowledged writes, seals and uploads them, and its controller leader
//! backs the cell state up next to the manifests; every process is killed
//! and every data directory deleted; `stele restore cell` rebuilds
//! controllers and nodes into fresh directories; started on new ports,
//! the controllers know every tablet with the same ranges, every
//! acknowledged record reads back exactly once, and the cell takes new
//! appends. Also the refusals of `stele restore cell`: an empty bucket, a
//! wrong cell id, a non-empty --out, bad --controllers, a damaged backup
//! (the previous generation is used and the output says so; with none
//! usable, nothing is written).

use std::path::Path;
use std::time::{Duration, Instant};

use stele_client::Client;
use stele_tests::cell::{client_options, status};
use stele_tests::controlled::ControlledCell;
use stele_tests::run;

/// Namespaces enough that the records land in more than one tablet.
const NAMESPACES: usize = 8;
const CELL: &str = "rc";

fn restore_cell(url: &str, cell: &str, out: &Path, controllers: &str) -> (bool, String, String) {
    run(&[
        "restore",
        "cell",
        "--from",
        url,
        "--cell",
        cell,
        "--out",
        out.to_str().unwrap(),
        "--controllers",
        controllers,
    ])
}

/// `(id, lo, hi)` of every tablet the controllers list, sorted.
fn ranges(cell: &ControlledCell) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = cell
        .tablets()
        .iter()
        .map(|t| {
            (
                t["id"].as_u64().unwrap(),
                t["vshard_lo"].as_u64().unwrap(),
                t["vshard_hi"].as_u64().unwrap(),
            )
        })
        .collect();
    out.sort_unstable();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_cell_comes_back_from_the_bucket() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let store_flags = ["--object-store", &url, "--cell-id", CELL].map(String::from);
    let mut cell = ControlledCell::new(3, 3);
    cell.controller_flags.extend(store_flags.clone());
    cell.controller_flags
        .extend(["--control-backup-ms", "300"].map(String::from));
    cell.node_flags = store_flags.to_vec();
    cell.node_flags.extend(
        [
            "--hot-age-s",
            "0",
            "--memtable-age-max-s",
            "1",
            // Seals are counted against uploads below: a segment compacted
            // away before its upload never is.
            "--compact-target-bytes",
            "0",
        ]
        .map(String::from),
    );
    let (ctls, nodes) = cell.start(4);
    let before = ranges(&cell);
    assert_eq!(before.len(), 4);
    let client = Client::connect_cell(&cell.controller_endpoints(), client_options())
        .await
        .unwrap();
    let ns = |i: u64| format!("restore/ns{}", i as usize % NAMESPACES);
    let mut acked = Vec::new();
    for i in 0..240u64 {
        let v = format!("v{i:05}-{}", "x".repeat(200));
        let rec = stele_client::record(format!("k{}", i % 31), i + 1, v.clone().into_bytes());
        client.append(&ns(i), vec![rec]).await.unwrap();
        acked.push((ns(i), v));
    }
    // Every memtable sealed (by age) and every sealed segment uploaded:
    // each node holds a replica of every tablet, so node 1's seals are
    // every segment, and the leaders upload them.
    let started = Instant::now();
    loop {
        let mut memtable_bytes = 0;
        let mut uploaded = 0;
        for n in 1..=3 {
            let ep = cell.node_endpoint(n);
            let here = Client::connect(&ep, client_options())
                .await
                .unwrap()
                .list_tablets()
                .await
                .unwrap();
            memtable_bytes += here.iter().map(|t| t.memtable_bytes).sum::<u64>();
            uploaded += status(&ep).await.segments_uploaded;
        }
        let sealed = status(&cell.node_endpoint(1)).await.segments_sealed;
        if memtable_bytes == 0 && sealed > 0 && uploaded >= sealed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "not sealed and uploaded: {memtable_bytes} memtable bytes, {uploaded} of {sealed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A tier round publishes the manifests after the uploads; the control
    // state is backed up within its interval.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let control = bucket.path().join("cells").join(CELL).join("control");
    assert!(
        control.join("latest").exists(),
        "no control state backup in the bucket: {:?}",
        stele_tests::walk(bucket.path())
    );
    // The run means something: records in more than one tablet's
    // segments, and more than one backup generation to fall back to.
    let tablets_with_manifests =
        std::fs::read_dir(bucket.path().join("cells").join(CELL).join("tablets"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().join("manifests").exists())
            .count();
    assert!(
        tablets_with_manifests >= 2,
        "{tablets_with_manifests} tablets sealed"
    );
    let generations = std::fs::read_dir(&control).unwrap().count() - 1;
    assert!(generations >= 2, "{generations} control backup generations");
    for (_, p) in ctls.into_iter().chain(nodes) {
        p.kill9();
    }
    for name in ["ctl1", "ctl2", "ctl3", "node1", "node2", "node3"] {
        std::fs::remove_dir_all(cell.data_dir(name)).unwrap();
    }

    // The new machines: new ports, new certificates, the same node ids.
    let mut new = ControlledCell::new(3, 3);
    new.controller_flags.extend(store_flags.clone());
    new.controller_flags
        .extend(["--control-backup-ms", "300"].map(String::from));
    new.node_flags = store_flags.to_vec();
    let ctl_arg = new.controllers_arg();
    let scratch = tempfile::tempdir().unwrap();

    // Refused, nothing written: an empty bucket, a wrong cell id, bad
    // --controllers, an --out that is not empty.
    let out = scratch.path().join("out");
    let empty = tempfile::tempdir().unwrap();
    let empty_url = format!("file://{}", empty.path().display());
    let (ok, _, err) = restore_cell(&empty_url, CELL, &out, &ctl_arg);
    assert!(
        !ok && err.contains("no quorum state backup under cells/rc/control"),
        "{err}"
    );
    let (ok, _, err) = restore_cell(&url, "nope", &out, &ctl_arg);
    assert!(
        !ok && err.contains("no quorum state backup under cells/nope/control"),
        "{err}"
    );
    let dup = format!("{0},{0}", new.controller_endpoint(1));
    let (ok, _, err) = restore_cell(&url, CELL, &out, &dup);
    assert!(!ok && err.contains("is named twice"), "{err}");
    let (ok, _, err) = restore_cell(&url, CELL, &out, "127.0.0.1:1");
    assert!(!ok && err.contains("not an http(s):// endpoint"), "{err}");
    assert!(!out.exists(), "a refused restore wrote {}", out.display());
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep"), b"x").unwrap();
    let (ok, _, err) = restore_cell(&url, CELL, &out, &ctl_arg);
    assert!(!ok && err.contains("is not empty"), "{err}");
    assert_eq!(std::fs::read(out.join("keep")).unwrap(), b"x");

    // A damaged backup, on a copy of the control objects: the newest
    // truncated, the previous generation is used and the output says so;
    // all damaged, refused with nothing written.
    let damaged = tempfile::tempdir().unwrap();
    let damaged_control = damaged.path().join("cells").join(CELL).join("control");
    copy_dir(&control, &damaged_control);
    let latest = std::fs::read_to_string(damaged_control.join("latest")).unwrap();
    let newest = damaged_control.join(format!("{}.qbk", latest.trim()));
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    let damaged_url = format!("file://{}", damaged.path().display());
    let fallback = scratch.path().join("fallback");
    let (ok, _, err) = restore_cell(&damaged_url, CELL, &fallback, &ctl_arg);
    assert!(ok, "{err}");
    assert!(
        err.contains("is damaged") && err.contains("used the previous good generation"),
        "{err}"
    );
    assert!(fallback.join("controller-1").exists());
    for e in std::fs::read_dir(&damaged_control).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "qbk") {
            std::fs::write(&p, b"STELEQBK").unwrap();
        }
    }
    let none = scratch.path().join("none");
    let (ok, _, err) = restore_cell(&damaged_url, CELL, &none, &ctl_arg);
    assert!(!ok && err.contains("no usable backup"), "{err}");
    assert!(!none.exists());

    // A segment the manifests name is missing: refused naming it, and the
    // nodes' directories already written are removed with the rest.
    let holed = tempfile::tempdir().unwrap();
    let mut removed = None;
    for p in stele_tests::walk(bucket.path()) {
        let to = holed.path().join(p.strip_prefix(bucket.path()).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        if removed.is_none() && p.extension().is_some_and(|x| x == "seg") {
            removed = Some(p.file_name().unwrap().to_string_lossy().into_owned());
            continue;
        }
        std::fs::copy(&p, &to).unwrap();
    }
    let removed = removed.expect("a segment in the bucket");
    let holed_out = scratch.path().join("holed");
    let holed_url = format!("file://{}", holed.path().display());
    let (ok, _, err) = restore_cell(&holed_url, CELL, &holed_out, &ctl_arg);
    assert!(
        !ok && err.contains(&removed) && err.contains("missing"),
        "{err}"
    );
    assert!(!holed_out.exists());
    let staged: Vec<_> = std::fs::read_dir(scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().contains("restoring"))
        .collect();
    assert!(staged.is_empty(), "left behind: {staged:?}");

    // The restore itself.
    let restored_generation: u64 = std::fs::read_to_string(control.join("latest"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let restored = scratch.path().join("restored");
    let (ok, stdout, err) = restore_cell(&url, CELL, &restored, &ctl_arg);
    assert!(ok, "restore cell: {stdout}{err}");
    eprintln!("{stdout}{err}");
    // Progress on stderr, plain lines into a pipe.
    for want in ["restoring cell rc: ", " to fetch", " fetched, done"] {
        assert!(
            err.contains(want),
            "restore progress without {want:?}: {err}"
        );
    }
    for c in 1..=3 {
        std::fs::rename(
            restored.join(format!("controller-{c}")),
            new.data_dir(&format!("ctl{c}")),
        )
        .unwrap();
    }
    for n in 1..=3 {
        std::fs::rename(
            restored.join(format!("node-{n}")),
            new.data_dir(&format!("node{n}")),
        )
        .unwrap();
    }
    // No `stele cell init`: the controllers start from the restored state.
    let _ctls: Vec<_> = (1..=3).map(|c| new.start_controller(c)).collect();
    let _nodes: Vec<_> = (1..=3).map(|n| new.start_node(n)).collect();
    new.wait_settled(Duration::from_secs(90));
    assert_eq!(ranges(&new), before, "the controllers know every tablet");
    let nodes: Vec<u64> = new
        .node_list()
        .iter()
        .map(|n| n["id"].as_u64().unwrap())
        .collect();
    assert_eq!(nodes, vec![1, 2, 3]);

    let client = Client::connect_cell(&new.controller_endpoints(), client_options())
        .await
        .unwrap();
    let mut rows = Vec::new();
    for i in 0..NAMESPACES as u64 {
        rows.extend(
            client
                .scan_all(&ns(i), 0, 0, b"", stele_client::ReadOptions::default())
                .await
                .unwrap(),
        );
    }
    let seen = stele_tests::cell::value_counts(&rows);
    let lost: Vec<&String> = acked
        .iter()
        .map(|(_, v)| v)
        .filter(|v| !seen.contains_key(v.as_bytes()))
        .collect();
    assert!(lost.is_empty(), "{} acknowledged records lost", lost.len());
    assert!(seen.values().all(|c| *c == 1), "records doubled");
    assert_eq!(rows.len(), acked.len(), "records never written");
    // And the restored cell takes new writes, in every namespace.
    for i in 0..NAMESPACES as u64 {
        let rec = stele_client::record(format!("n{i}"), 10_000 + i, b"after".to_vec());
        client.append(&ns(i), vec![rec]).await.unwrap();
    }
    let mut after = 0;
    for i in 0..NAMESPACES as u64 {
        after += client
            .scan_all(&ns(i), 0, 0, b"", stele_client::ReadOptions::default())
            .await
            .unwrap()
            .len();
    }
    assert_eq!(after, acked.len() + NAMESPACES);
    // The restored controllers back their state up to the same bucket, past
    // the generation they came from.
    let started = Instant::now();
    loop {
        let latest: u64 = std::fs::read_to_string(control.join("latest"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        if latest > restored_generation {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the restored cell's backups stay behind generation {restored_generation}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One directory member on `port` with the bucket at `url`.
fn directory_member(data: &Path, port: u16, url: &str) -> stele_tests::Proc {
    stele_tests::Proc::start(
        &[
            "server",
            "--roles",
            "directory",
            "--directory-id",
            "1",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
            data.to_str().unwrap(),
            "--object-store",
            url,
            "--control-backup-ms",
            "200",
        ],
        &[],
    )
    .unwrap()
}

#[test]
fn the_directory_comes_back_from_the_bucket() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let tmp = tempfile::tempdir().unwrap();
    let base = stele_tests::free_port_base(2);
    let old = format!("http://127.0.0.1:{base}");
    let member = directory_member(&tmp.path().join("d1"), base, &url);
    let cli = |ep: &str, args: &[&str]| {
        let mut a = args.to_vec();
        a.extend(["--directory", ep, "--json"]);
        let (ok, out, err) = run(&a);
        assert!(ok, "{args:?}: {out}{err}");
        out
    };
    cli(&old, &["directory", "init"]);
    cli(
        &old,
        &[
            "cell",
            "register",
            "c1",
            "--controllers",
            "http://127.0.0.1:1",
        ],
    );
    cli(&old, &["ns", "create", "w/a", "--cell", "c1"]);
    // The namespace's creation is in a backup once `latest` names a
    // generation at or past it.
    let latest = bucket.path().join("directory").join("latest");
    let started = Instant::now();
    let restored = tmp.path().join("restored");
    let new = format!("http://127.0.0.1:{}", base + 1);
    loop {
        if latest.exists() {
            let probe = tmp.path().join("probe");
            let (ok, _, err) = run(&[
                "restore",
                "directory",
                "--from",
                &url,
                "--out",
                probe.to_str().unwrap(),
                "--members",
                &new,
            ]);
            assert!(ok, "{err}");
            std::fs::remove_dir_all(&probe).unwrap();
            // Stop once the state has stopped moving (init, register, create).
            if started.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no directory backup"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    member.kill9();
    std::fs::remove_dir_all(tmp.path().join("d1")).unwrap();
    // A bucket with no directory backup is refused.
    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = run(&[
        "restore",
        "directory",
        "--from",
        &format!("file://{}", empty.path().display()),
        "--out",
        restored.to_str().unwrap(),
        "--members",
        &new,
    ]);
    assert!(
        !ok && err.contains("no quorum state backup under directory"),
        "{err}"
    );
    assert!(!restored.exists());
    let (ok, out, err) = run(&[
        "restore",
        "directory",
        "--from",
        &url,
        "--out",
        restored.to_str().unwrap(),
        "--members",
        &new,
    ]);
    assert!(ok, "{out}{err}");
    let _member = directory_member(&restored.join("directory-1"), base + 1, &url);
    let started = Instant::now();
    loop {
        let mut a = vec!["ns", "list"];
        a.extend(["--directory", &new, "--json"]);
        let (ok, out, _) = run(&a);
        if ok && out.contains("w/a") && out.contains("c1") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the restored directory does not know w/a: {out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
