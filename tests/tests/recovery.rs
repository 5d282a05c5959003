//! Journal recovery through the real binary: a torn final frame is
//! truncated and the node starts; damage followed by valid acknowledged
//! frames refuses to start and names the file and the byte.

use std::path::Path;
use std::time::Duration;

use stele_client::{Client, ClientOptions};
use stele_proto::pb;
use stele_tests::Proc;

fn args(dir: &str) -> Vec<String> {
    [
        "dev",
        "--data-dir",
        dir,
        "--listen",
        "127.0.0.1:0",
        "--tablets",
        "2",
        "--disk-reserve-bytes",
        "0",
        "--journal-reserve-bytes",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn fill(dir: &str, n: usize) {
    let a = args(dir);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let proc = Proc::start(&a, &[]).unwrap();
    let client = Client::connect(&proc.endpoint, ClientOptions::default())
        .await
        .unwrap();
    for i in 0..n {
        client
            .append_batch(
                "rec/ns",
                vec![stele_client::record(
                    format!("k{i}"),
                    i as u64,
                    b"v".to_vec(),
                )],
                None,
                None,
            )
            .await
            .unwrap();
    }
    assert!(proc.terminate().success());
}

async fn count(endpoint: &str) -> usize {
    let client = Client::connect(endpoint, ClientOptions::default())
        .await
        .unwrap();
    client
        .scan_all("rec/ns", 0, 0, b"", pb::ReadOptions::default())
        .await
        .unwrap()
        .len()
}

fn journal_file(dir: &str) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(Path::new(dir).join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files.pop().expect("a journal file")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_tail_is_truncated_and_the_node_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    fill(d, 20).await;
    let wal = journal_file(d);
    // Half a frame of garbage at the end: a write torn by a crash.
    let mut bytes = std::fs::read(&wal).unwrap();
    let len = bytes.len();
    bytes.extend_from_slice(&[0x33, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 0, 0, 0]);
    std::fs::write(&wal, &bytes).unwrap();
    let a = args(d);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let proc = Proc::start(&a, &[]).unwrap();
    assert_eq!(count(&proc.endpoint).await, 20);
    std::thread::sleep(Duration::from_millis(100));
    let warn = proc.stderr_lines().join("\n");
    assert!(
        warn.contains("torn final frame"),
        "no warning about the torn tail: {warn}"
    );
    assert!(proc.terminate().success());
    assert!(std::fs::metadata(&wal).unwrap().len() >= len as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mid_journal_damage_refuses_to_start_naming_file_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    fill(d, 20).await;
    let wal = journal_file(d);
    let mut bytes = std::fs::read(&wal).unwrap();
    // The first frame starts right after the 16-byte file header; flip a
    // byte of its payload. Valid frames follow it.
    let offset = 16usize;
    bytes[offset + 30] ^= 0xff;
    std::fs::write(&wal, &bytes).unwrap();
    let a = args(d);
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    let err = match Proc::start(&a, &[]) {
        Ok(_) => panic!("a node with a damaged journal started"),
        Err(e) => e,
    };
    assert!(
        err.contains(&wal.display().to_string()),
        "file not named: {err}"
    );
    assert!(
        err.contains(&format!("byte offset {offset}")),
        "byte not named: {err}"
    );
    // Nothing was changed: the damage is still there for the operator.
    assert_eq!(std::fs::read(&wal).unwrap(), bytes);
}
