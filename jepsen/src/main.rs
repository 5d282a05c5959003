//! `stele-jepsen`: one seeded run against real processes, or the CI smoke.
//!
//! ```sh
//! cargo run -p stele-jepsen -- run --nemesis kill,pause,partition --time-limit 60 --seed 7
//! cargo run -p stele-jepsen -- smoke      # what scripts/test runs
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use stele_jepsen::run::{Nemesis, RunOptions, Workload, run};

#[derive(Parser)]
#[command(
    name = "stele-jepsen",
    about = "Fault injection and history checking against real stele processes"
)]
struct Cli {
    /// The `stele` binary (default: target/debug/stele, else target/release/stele).
    #[arg(long, global = true)]
    bin: Option<PathBuf>,
    /// Where runs are written.
    #[arg(long, global = true, default_value = "jepsen/store")]
    store: PathBuf,
    /// `netns`: every node in its own network namespace, faults by
    /// nftables (needs root, iproute2, nftables); `loopback`: the transport
    /// peer filter; `auto`: netns where possible.
    #[arg(long, global = true, default_value = "auto")]
    net: String,
    /// An S3 server (moto) for the cold tier, `http://127.0.0.1:PORT`
    /// (default: $STELE_TEST_S3_ENDPOINT, which scripts/test sets); without
    /// one the cold tier is a `file://` bucket and the `s3` nemesis is out.
    #[arg(long, global = true)]
    s3_endpoint: Option<String>,
    /// The bucket on that server (default: $STELE_TEST_S3_BUCKET, else
    /// `stele-test`); it must exist. Each run writes under its own prefix.
    #[arg(long, global = true)]
    s3_bucket: Option<String>,
    /// An older `stele` binary for the `upgrade` nemesis (nodes start on
    /// it); `scripts/upgrade-test` builds one in target/upgrade/debug/stele.
    /// Without it the smoke leaves the upgrade case out.
    #[arg(long, global = true)]
    old_bin: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// One run; exits non-zero when the checker finds an anomaly.
    Run {
        #[arg(long, value_delimiter = ',', default_value = "kill,pause,partition")]
        nemesis: Vec<Nemesis>,
        #[arg(long, default_value_t = 60)]
        time_limit: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 6)]
        processes: u64,
        /// Keys written at once.
        #[arg(long, default_value_t = 5)]
        keys: u64,
        /// Appends a key takes before a fresh key replaces it (keeps lists
        /// short, so a long run stays checkable).
        #[arg(long, default_value_t = 200)]
        appends_per_key: u64,
        /// Negative control: nodes serve leader reads without a read index.
        #[arg(long)]
        unsafe_local_reads: bool,
        /// Negative control: nodes acknowledge journal writes without
        /// fdatasync (`power-cut` must then find lost writes).
        #[arg(long)]
        unsafe_skip_fsync: bool,
        /// Negative control: a restarted tablet leader resumes its term
        /// without an election (`power-cut` must then find diverged
        /// replicas: lost appends, reads that are not prefixes).
        #[arg(long)]
        unsafe_leader_restore: bool,
        /// Negative control: a tablet leader that slept (hibernation)
        /// serves reads without a read index until it loses leadership
        /// (`partition-leader` must then find stale reads).
        #[arg(long)]
        unsafe_wake_reads: bool,
        /// Negative control of the `gateway` workload: appends carry no
        /// Idempotency-Key, so a retried one may apply twice (`duplicate`).
        #[arg(long)]
        unsafe_gateway_retries: bool,
        /// Four nodes placed by a controller (needed for `churn`).
        #[arg(long)]
        controlled: bool,
        /// `list-append` (per-key lists, linearizable reads), `set` (unique
        /// inserts, one final read of the namespace, cold tier on) or
        /// `register` (read, write, compare-and-set per key; checked for
        /// linearizability) or `gateway` (list-append over HTTP through two
        /// `stele gateway` processes; a controlled cell).
        #[arg(long, default_value = "list-append")]
        workload: Workload,
        /// A cold tier for any workload (`all` turns it on when there is an
        /// S3 server): segments evicted within seconds, reads from the bucket.
        #[arg(long)]
        cold: bool,
    },
    /// Short seeded runs (kill, pause, partitions, packet loss, churn) and
    /// a negative control that must be caught; prints `N passed, N failed`.
    Smoke {
        #[arg(long, default_value_t = 20)]
        time_limit: u64,
        /// Run only these cases (by the names the smoke prints, e.g.
        /// `partition,upgrade`); the others are counted as left out.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
}

fn default_bin() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    for profile in ["debug", "release"] {
        let p = target.join(profile).join("stele");
        if p.exists() {
            return p;
        }
    }
    target.join("debug").join("stele")
}

/// The S3 server from `--s3-endpoint`/`--s3-bucket` or the test script's
/// environment.
fn s3_server(cli: &Cli) -> anyhow::Result<Option<stele_jepsen::cell::S3Server>> {
    use std::net::ToSocketAddrs;
    let Some(endpoint) = cli
        .s3_endpoint
        .clone()
        .or_else(|| std::env::var("STELE_TEST_S3_ENDPOINT").ok())
    else {
        return Ok(None);
    };
    let hostport = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--s3-endpoint {endpoint:?}: want http://host:port"))?
        .trim_end_matches('/');
    let addr = hostport
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("--s3-endpoint {endpoint:?}: no address"))?;
    let bucket = cli
        .s3_bucket
        .clone()
        .or_else(|| std::env::var("STELE_TEST_S3_BUCKET").ok())
        .unwrap_or_else(|| "stele-test".into());
    Ok(Some(stele_jepsen::cell::S3Server { addr, bucket }))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let s3 = match s3_server(&cli) {
        Ok(s3) => s3,
        Err(e) => {
            eprintln!("error: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let bin = cli.bin.clone().unwrap_or_else(default_bin);
    let netns = match cli.net.as_str() {
        "netns" => true,
        "loopback" => false,
        "auto" => {
            let ok = stele_jepsen::netns::Netns::available();
            if !ok {
                eprintln!(
                    "note: no network namespaces or nftables here; partitions use the transport peer filter"
                );
            }
            ok
        }
        other => {
            eprintln!("error: --net {other:?}: want auto, netns or loopback");
            return std::process::ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Cmd::Run {
                nemesis,
                time_limit,
                seed,
                processes,
                keys,
                appends_per_key,
                unsafe_local_reads,
                unsafe_skip_fsync,
                unsafe_leader_restore,
                unsafe_wake_reads,
                unsafe_gateway_retries,
                controlled,
                workload,
                cold,
            } => {
                let label = if nemesis.contains(&Nemesis::All) {
                    "all".to_string()
                } else {
                    nemesis
                        .iter()
                        .map(|n| format!("{n:?}").to_lowercase())
                        .collect::<Vec<_>>()
                        .join("+")
                };
                let (nemesis, controlled, cold) = if nemesis.contains(&Nemesis::All) {
                    let faketime =
                        std::path::Path::new(stele_jepsen::cell::FAKETIME_LIB).exists();
                    (
                        Nemesis::all(netns, faketime, s3.is_some()),
                        true,
                        cold || s3.is_some(),
                    )
                } else {
                    (nemesis, controlled, cold)
                };
                let name = format!(
                    "{}{}-seed{seed}{}",
                    match workload {
                        Workload::Set => "set-",
                        Workload::Register => "register-",
                        Workload::Gateway => "gateway-",
                        Workload::ListAppend => "",
                    },
                    label,
                    [
                        (unsafe_local_reads, "-unsafe"),
                        (unsafe_skip_fsync, "-unsafe-fsync"),
                        (unsafe_leader_restore, "-unsafe-restore"),
                        (unsafe_wake_reads, "-unsafe-wake"),
                        (unsafe_gateway_retries, "-unsafe-gateway"),
                    ]
                    .iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, tag)| *tag)
                    .collect::<String>()
                );
                let opts = RunOptions {
                    bin,
                    store: cli.store,
                    name,
                    seed,
                    time_limit: Duration::from_secs(time_limit),
                    nemeses: nemesis,
                    processes,
                    keys,
                    appends_per_key,
                    unsafe_local_reads,
                    unsafe_skip_fsync,
                    unsafe_leader_restore,
                    unsafe_wake_reads,
                    unsafe_gateway_retries,
                    controlled,
                    netns,
                    workload,
                    cold,
                    s3: s3.clone(),
                    old_bin: cli.old_bin.clone(),
                };
                let r = run(&opts).await?;
                println!("{}", serde_json::to_string_pretty(&r)?);
                Ok::<bool, anyhow::Error>(r.valid)
            }
            Cmd::Smoke { time_limit, only } => {
                let faketime = std::path::Path::new(stele_jepsen::cell::FAKETIME_LIB).exists();
                // (name, nemeses, unsafe reads, controlled cell, seed)
                let cases = [
                    (
                        "kill+fsync-fail",
                        vec![Nemesis::Kill, Nemesis::FsyncFail],
                        false,
                        false,
                        11,
                    ),
                    (
                        if faketime { "pause+clock" } else { "pause" },
                        if faketime {
                            vec![Nemesis::Pause, Nemesis::Clock]
                        } else {
                            vec![Nemesis::Pause]
                        },
                        false,
                        false,
                        12,
                    ),
                    ("partition", vec![Nemesis::Partition], false, false, 13),
                    (
                        "churn+split+merge+kill+restart+kill-controller",
                        vec![
                            Nemesis::Churn,
                            Nemesis::Split,
                            Nemesis::Merge,
                            Nemesis::Kill,
                            Nemesis::Restart,
                            Nemesis::KillController,
                        ],
                        false,
                        true,
                        15,
                    ),
                    (
                        "ring+loss",
                        if netns {
                            vec![Nemesis::PartitionRing, Nemesis::Loss]
                        } else {
                            vec![Nemesis::PartitionRing]
                        },
                        false,
                        false,
                        16,
                    ),
                    // Unique inserts, read once at the end, partly from
                    // segments evicted to the bucket.
                    ("set", vec![Nemesis::Kill, Nemesis::Partition], false, false, 17),
                    // The same on S3, whose requests stall or fail.
                    ("set+s3", vec![Nemesis::Kill, Nemesis::S3], false, false, 19),
                    // Reads, writes and compare-and-set per key, checked for
                    // linearizability.
                    (
                        "register",
                        vec![Nemesis::Kill, Nemesis::PartitionLeader],
                        false,
                        false,
                        18,
                    ),
                    // Rolling upgrades and back: every fault moves a node
                    // between the older binary and this one; mixed
                    // versions lose nothing.
                    ("upgrade", vec![Nemesis::Upgrade], false, true, 23),
                    // Power cuts of the whole cell lose nothing acknowledged.
                    ("power-cut", vec![Nemesis::PowerCut], false, false, 20),
                    // Must be caught: a deposed leader serving reads.
                    ("negative-control", vec![Nemesis::PartitionLeader], true, false, 14),
                    // Must be caught: acknowledged writes never synced,
                    // lost in a power cut.
                    ("negative-control-fsync", vec![Nemesis::PowerCut], true, false, 21),
                    // Must be caught: a leader resuming its term after a
                    // power cut took a tail its followers hold.
                    ("negative-control-restore", vec![Nemesis::PowerCut], true, false, 22),
                    // Must be caught: a leader woken from hibernation
                    // serving reads without proving it still leads.
                    (
                        "negative-control-wake",
                        vec![Nemesis::PartitionLeader],
                        true,
                        false,
                        24,
                    ),
                    // Producers through HTTP gateways, gateways and nodes
                    // killed and paused under them: retries under
                    // idempotency keys apply once.
                    (
                        "gateway",
                        vec![Nemesis::KillGateway, Nemesis::Kill, Nemesis::Pause],
                        false,
                        true,
                        25,
                    ),
                    // Must be caught: the same retries without keys. Every
                    // node fault hits the tablet's leader, so appends in
                    // flight wait out an election and their tries are
                    // abandoned.
                    (
                        "negative-control-gateway",
                        vec![Nemesis::KillGateway, Nemesis::KillLeader],
                        true,
                        true,
                        26,
                    ),
                ];
                let unknown: Vec<&String> = only
                    .iter()
                    .filter(|o| !cases.iter().any(|c| c.0 == o.as_str()))
                    .collect();
                anyhow::ensure!(unknown.is_empty(), "smoke --only: no case {unknown:?}");
                if !faketime {
                    println!("smoke: no libfaketime here; the clock nemesis is left out");
                }
                if s3.is_none() {
                    println!("smoke: no S3 server (STELE_TEST_S3_ENDPOINT); the s3 case is left out");
                }
                if cli.old_bin.is_none() {
                    println!("smoke: no older binary (--old-bin); the upgrade case is left out");
                }
                println!(
                    "smoke: faults by {}",
                    if netns {
                        "network namespaces and nftables"
                    } else {
                        "loopback and the transport peer filter (no namespaces or nftables here)"
                    }
                );
                let (mut passed, mut failed, mut left_out) = (0, 0, Vec::new());
                for (name, nemeses, unsafe_reads, controlled, seed) in cases {
                    if !only.is_empty() && !only.iter().any(|o| o == name) {
                        left_out.push("not in --only");
                        continue;
                    }
                    let on_s3 = nemeses.contains(&Nemesis::S3);
                    if on_s3 && s3.is_none() {
                        left_out.push("no S3 server");
                        continue;
                    }
                    if nemeses.contains(&Nemesis::Upgrade) && cli.old_bin.is_none() {
                        left_out.push("no older binary");
                        continue;
                    }
                    let opts = RunOptions {
                        bin: bin.clone(),
                        store: cli.store.clone(),
                        name: format!("smoke-{name}"),
                        seed,
                        // Twice as long: each cut catches it only when it
                        // finds a leader's tail in flight.
                        time_limit: Duration::from_secs(if name == "negative-control-restore" {
                            2 * time_limit
                        } else {
                            time_limit
                        }),
                        nemeses,
                        processes: 6,
                        keys: 4,
                        // Small, so the smoke exercises key rotation.
                        appends_per_key: 60,
                        unsafe_local_reads: unsafe_reads && name == "negative-control",
                        unsafe_skip_fsync: unsafe_reads && name == "negative-control-fsync",
                        unsafe_leader_restore: unsafe_reads && name == "negative-control-restore",
                        unsafe_wake_reads: unsafe_reads && name == "negative-control-wake",
                        unsafe_gateway_retries: unsafe_reads
                            && name == "negative-control-gateway",
                        controlled,
                        netns,
                        workload: match name {
                            "set" | "set+s3" => Workload::Set,
                            "register" => Workload::Register,
                            "gateway" | "negative-control-gateway" => Workload::Gateway,
                            _ => Workload::ListAppend,
                        },
                        cold: false,
                        s3: s3.clone().filter(|_| on_s3),
                        old_bin: cli.old_bin.clone(),
                    };
                    let ok = match run(&opts).await {
                        // A negative control passes only when the checker
                        // names an anomaly of the history (stale reads, lost
                        // acknowledged appends, diverged copies): the bug it
                        // switched on, seen.
                        Ok(r) => {
                            let caught = r.named_anomalies();
                            let ok = if unsafe_reads {
                                !caught.is_empty()
                            } else {
                                r.valid
                            };
                            let verdict = match (unsafe_reads, ok) {
                                (false, true) => "pass".to_string(),
                                (false, false) => "FAIL".to_string(),
                                (true, true) => format!(
                                    "pass (caught: {})",
                                    caught
                                        .iter()
                                        .map(|(kind, n)| format!("{n} {kind}"))
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                                (true, false) => {
                                    "FAIL (not caught: the checker named no anomaly)".to_string()
                                }
                            };
                            match (&r.set_report, &r.register_report) {
                                (_, Some(g)) => println!(
                                    "smoke {name}: {} ({} reads, {} writes, {} cas ok, {} cas failed, {} unknown, {} keys, {} not linearizable, {} unchecked)",
                                    verdict,
                                    g.reads_acknowledged,
                                    g.writes_acknowledged,
                                    g.cas_acknowledged,
                                    g.cas_failed,
                                    g.unknown_outcomes,
                                    g.keys,
                                    g.not_linearizable.len(),
                                    g.unknown.len()
                                ),
                                (Some(s), None) => println!(
                                    "smoke {name}: {} ({} inserts acknowledged, {} unknown, final read {} values, {} faults, {} lost, {} duplicated, {} unexpected)",
                                    verdict,
                                    s.inserts_acknowledged,
                                    s.inserts_unknown,
                                    s.final_size,
                                    r.faults,
                                    s.lost.len(),
                                    s.duplicated.len(),
                                    s.unexpected.len() + s.refused_but_present.len()
                                ),
                                (None, None) => println!(
                                    "smoke {name}: {} ({} appends acknowledged, {} unknown, {} reads, {} replica copies, {} faults, {} anomalies)",
                                    verdict,
                                    r.report.appends_acknowledged,
                                    r.report.appends_unknown,
                                    r.report.reads_acknowledged,
                                    r.report.replica_copies_checked,
                                    r.faults,
                                    r.report.anomalies.len()
                                ),
                            }
                            ok
                        }
                        // A run that errors (a cell that never recovered,
                        // a harness failure) has no verdict, and that is
                        // never a pass, not even for a negative control.
                        Err(e) => {
                            println!("smoke {name}: FAIL (run error: {e:#})");
                            false
                        }
                    };
                    if ok {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
                if !left_out.is_empty() {
                    let mut why = left_out.clone();
                    why.sort_unstable();
                    why.dedup();
                    println!(
                        "{passed} passed, {failed} failed, {} left out ({})",
                        left_out.len(),
                        why.join(", ")
                    );
                } else {
                    println!("{passed} passed, {failed} failed");
                }
                Ok(failed == 0)
            }
        }
    });
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
