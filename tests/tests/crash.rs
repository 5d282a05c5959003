//! Crash safety, black box: `stele dev` as a child process, several clients
//! appending with acknowledgements, SIGKILL at a random moment, restart, and
//! every acknowledged record must be present exactly once (DESIGN.md 5.4:
//! an acknowledgement means a quorum fsynced the entry).
//!
//! Thresholds are tiny so seals, journal rolls and trims happen all the time
//! and kills land in the middle of them. Batches whose outcome is unknown at
//! the kill are retried after the restart with the same batch id: each must
//! then be applied exactly once, whether or not it had been before.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use stele_client::{Client, ClientOptions, retry::RetryPolicy};
use stele_proto::pb;
use stele_tests::Proc;

const NAMESPACES: [&str; 2] = ["crash/a", "crash/b"];

#[derive(Clone)]
struct Batch {
    namespace: &'static str,
    id: [u8; 16],
    /// (key, unique value token)
    records: Vec<(String, String)>,
}

#[derive(Default)]
struct Ledger {
    /// Value tokens of acknowledged records.
    acked: HashSet<String>,
    /// Every token ever sent (acked or not).
    sent: HashSet<String>,
    /// Batches whose outcome is unknown.
    unknown: Vec<Batch>,
}

fn dev_args(dir: &str) -> Vec<String> {
    [
        "dev",
        "--data-dir",
        dir,
        "--listen",
        "127.0.0.1:0",
        "--tablets",
        "4",
        "--memtable-bytes-max",
        "16384",
        "--batch-bytes-max",
        "16384",
        "--batch-records-max",
        "16",
        "--journal-file-bytes-max",
        "262144",
        "--journal-retained-bytes-max",
        "524288",
        "--disk-reserve-bytes",
        "0",
        "--journal-reserve-bytes",
        "0",
        "--election-timeout-ms",
        "600",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn client_options() -> ClientOptions {
    ClientOptions {
        retry: RetryPolicy {
            attempts_max: 3,
            deadline: Duration::from_millis(500),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(100),
        },
        request_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    }
}

fn records_of(b: &Batch) -> Vec<pb::Record> {
    b.records
        .iter()
        .map(|(k, v)| stele_client::record(k.as_bytes().to_vec(), 1, v.as_bytes().to_vec()))
        .collect()
}

async fn send(client: &Client, b: &Batch) -> Result<bool, stele_client::Error> {
    client
        .append_batch(b.namespace, records_of(b), None, Some(b.id))
        .await
        .map(|o| o.duplicate)
}

/// Retries every batch of unknown outcome until it is acknowledged.
async fn settle_unknown(client: &Client, ledger: &Mutex<Ledger>) {
    let unknown = std::mem::take(&mut ledger.lock().unwrap().unknown);
    for b in unknown {
        let mut tries = 0;
        loop {
            match send(client, &b).await {
                Ok(_) => {
                    let mut l = ledger.lock().unwrap();
                    for (_, v) in &b.records {
                        l.acked.insert(v.clone());
                    }
                    break;
                }
                Err(e) => {
                    tries += 1;
                    assert!(tries < 50, "retry of an unknown batch keeps failing: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn worker(
    client: Client,
    worker: usize,
    ledger: Arc<Mutex<Ledger>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        n += 1;
        let (namespace, id, len) = {
            let mut rng = rand::rng();
            (
                NAMESPACES[rng.random_range(0..2)],
                rng.random::<[u8; 16]>(),
                rng.random_range(1..=4usize),
            )
        };
        let tag = hex(&id);
        let records: Vec<(String, String)> = (0..len)
            .map(|i| {
                (
                    format!("k{}", (n as usize + i) % 37),
                    format!("{tag}-{i}-{}", "x".repeat(200)),
                )
            })
            .collect();
        let b = Batch {
            namespace,
            id,
            records,
        };
        {
            let mut l = ledger.lock().unwrap();
            for (_, v) in &b.records {
                l.sent.insert(v.clone());
            }
        }
        match send(&client, &b).await {
            Ok(_) => {
                let mut l = ledger.lock().unwrap();
                for (_, v) in &b.records {
                    l.acked.insert(v.clone());
                }
            }
            Err(_) => {
                ledger.lock().unwrap().unknown.push(b);
                // The node is probably gone; stop this worker.
                return;
            }
        }
        let _ = worker;
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn connect(endpoint: &str) -> Client {
    for _ in 0..100 {
        if let Ok(c) = Client::connect(endpoint, client_options()).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot connect to {endpoint}");
}

/// Every acknowledged token exactly once, nothing that was never sent.
async fn verify(client: &Client, ledger: &Mutex<Ledger>) -> usize {
    let (acked, sent) = {
        let l = ledger.lock().unwrap();
        (l.acked.clone(), l.sent.clone())
    };
    let mut seen: HashMap<String, usize> = HashMap::new();
    for ns in NAMESPACES {
        let rows = client
            .scan_all(ns, 0, 0, b"", pb::ReadOptions::default())
            .await
            .expect("scan after restart");
        for row in rows {
            *seen
                .entry(String::from_utf8(row.value).unwrap())
                .or_default() += 1;
        }
    }
    for (token, count) in &seen {
        assert_eq!(*count, 1, "record {} applied {count} times", &token[..40]);
        assert!(
            sent.contains(token),
            "record {} was never sent",
            &token[..40]
        );
    }
    for token in &acked {
        assert!(
            seen.contains_key(token),
            "acknowledged record {} lost",
            &token[..40]
        );
    }
    seen.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_sigkill_exactly_once() {
    let kills: usize = std::env::var("STELE_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap().to_string();
    let args = dev_args(&dir_s);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let (mut max_files, mut saw_trim, mut seals) = (0u64, false, 0u64);
    for round in 0..kills {
        let proc = Proc::start(&args, &[]).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let client = connect(&proc.endpoint).await;
        settle_unknown(&client, &ledger).await;
        if round % 10 == 9 {
            verify(&client, &ledger).await;
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..3)
            .map(|w| tokio::spawn(worker(client.clone(), w, ledger.clone(), stop.clone())))
            .collect();
        let run_ms = rand::rng().random_range(300..1500);
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
        if let Ok(st) = client.status().await {
            if st.journal_files < max_files {
                saw_trim = true;
            }
            max_files = max_files.max(st.journal_files);
            seals += st.segments_sealed;
        }
        proc.kill9();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in workers {
            w.await.unwrap();
        }
    }
    let proc = Proc::start(&args, &[]).unwrap();
    let client = connect(&proc.endpoint).await;
    settle_unknown(&client, &ledger).await;
    let found = verify(&client, &ledger).await;
    let ledger = ledger.lock().unwrap();
    eprintln!(
        "{kills} kills: {} acknowledged, {found} stored, {seals} seals seen, journal files up to {max_files}, trim seen: {saw_trim}",
        ledger.acked.len()
    );
    assert!(
        ledger.acked.len() > 100,
        "too little traffic to mean anything"
    );
    assert!(
        seals >= kills as u64,
        "kills should land among seals; saw {seals} seals"
    );
    assert!(max_files >= 2, "the journal never rolled");
    assert!(saw_trim, "the journal was never trimmed between kills");
    proc.terminate();
}
