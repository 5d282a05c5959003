//! The unsafe switches: environment variables that inject faults or turn a
//! safety property off, for the process tests and the `jepsen/` harness.
//!
//! ```text
//!   plain build (release, packages, images)      --features fault-injection (tests, jepsen)
//!   any switch set -> refuse(): exit 1 naming it  switches honoured, each logged at start
//! ```
//!
//! Only a binary built with the cargo feature `fault-injection` reads them
//! (`arm`, `peer_block_file`); without it that code is not compiled, and
//! `main` refuses to start at all while one is set, so a switch left in an
//! environment file can never pass silently, nor silently do nothing.
//! No other code reads these variables: the node library takes its faults
//! as options (`journal::Faults`, `NodeOptions::unsafe_*`).

/// Every switch, with what it does (docs/OPERATIONS.md, "Fail points and
/// fault injection").
pub const UNSAFE_SWITCHES: [(&str, &str); 5] = [
    (
        "STELE_FAILPOINTS",
        "journal fail points (EIO, a simulated disk size, skipped fsyncs)",
    ),
    (
        "STELE_UNSAFE_LOCAL_READS",
        "linearizable reads without a read index (stale reads)",
    ),
    (
        "STELE_UNSAFE_WAKE_READS",
        "a leader that slept reads without a read index (stale reads)",
    ),
    (
        "STELE_UNSAFE_LEADER_RESTORE",
        "a restarted leader keeps its term without an election",
    ),
    (
        "STELE_PEER_BLOCK_FILE",
        "a file of peers whose Raft traffic is dropped",
    ),
];

/// Whether this binary was built with the `fault-injection` feature.
pub const FAULT_INJECTION: bool = cfg!(feature = "fault-injection");

/// The refusal of a binary without `fault-injection` when any switch is set
/// in `env` (names only; a switch counts as set whatever its value, even
/// empty). `None`: nothing to refuse.
pub fn refusal(fault_injection: bool, set: impl Fn(&str) -> bool) -> Option<String> {
    if fault_injection {
        return None;
    }
    let named: Vec<String> = UNSAFE_SWITCHES
        .iter()
        .filter(|(name, _)| set(name))
        .map(|(name, what)| format!("{name} ({what})"))
        .collect();
    if named.is_empty() {
        return None;
    }
    Some(format!(
        "refusing to start: {} set, but this stele binary was built without the \
         `fault-injection` feature, which test builds alone have (cargo build --features \
         fault-injection); unset it (docs/OPERATIONS.md, \"Fail points and fault injection\")",
        named.join(", ")
    ))
}

/// `refusal` for this process.
pub fn check_environment() -> Result<(), String> {
    match refusal(FAULT_INJECTION, |name| std::env::var_os(name).is_some()) {
        Some(refused) => Err(refused),
        None => Ok(()),
    }
}

/// Arms the node's journal fail points and unsafe modes from the
/// environment. Compiled only with `fault-injection`.
#[cfg(feature = "fault-injection")]
pub fn arm(o: &mut stele_node::NodeOptions) {
    if let Ok(spec) = std::env::var("STELE_FAILPOINTS") {
        // The journal logs the unsafe ones again when it opens.
        tracing::warn!(
            spec,
            "journal fail points armed from STELE_FAILPOINTS (fault injection)"
        );
        o.journal.faults = std::sync::Arc::new(stele_node::journal::Faults::parse(&spec));
    }
    if std::env::var("STELE_UNSAFE_LOCAL_READS").is_ok_and(|v| v == "1") {
        tracing::error!(
            "STELE_UNSAFE_LOCAL_READS=1: linearizable reads skip the read index; this node can serve stale reads (jepsen negative control only)"
        );
        o.unsafe_local_reads = true;
    }
    if std::env::var("STELE_UNSAFE_WAKE_READS").is_ok_and(|v| v == "1") {
        tracing::error!(
            "STELE_UNSAFE_WAKE_READS=1: a tablet leader that slept serves linearizable reads without a read index; this node can serve stale reads (jepsen negative control only)"
        );
        o.unsafe_wake_reads = true;
    }
    if std::env::var("STELE_UNSAFE_LEADER_RESTORE").is_ok_and(|v| v == "1") {
        tracing::error!(
            "STELE_UNSAFE_LEADER_RESTORE=1: a restarted tablet leader resumes its term without an election; replicas can diverge after a power cut (jepsen negative control only)"
        );
        o.unsafe_leader_restore = true;
    }
}

/// Without `fault-injection` there is nothing to arm (and `main` has
/// already refused any switch that is set).
#[cfg(not(feature = "fault-injection"))]
pub fn arm(_: &mut stele_node::NodeOptions) {}

/// The peer filter file of the partition tests (`STELE_PEER_BLOCK_FILE`),
/// only in a build with `fault-injection`.
pub fn peer_block_file() -> Option<std::ffi::OsString> {
    #[cfg(feature = "fault-injection")]
    if let Some(path) = std::env::var_os("STELE_PEER_BLOCK_FILE") {
        tracing::warn!(file = ?path, "peer filter armed from STELE_PEER_BLOCK_FILE (fault injection)");
        return Some(path);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(fault_injection: bool, set: &[&str]) -> Option<String> {
        refusal(fault_injection, |name| set.contains(&name))
    }

    #[test]
    fn a_plain_build_refuses_each_switch_by_name() {
        for (name, _) in UNSAFE_SWITCHES {
            let why = refused(false, &[name]).expect("refused");
            assert!(why.contains(name), "{why}");
            assert!(why.contains("fault-injection"), "{why}");
        }
        let both = refused(false, &["STELE_FAILPOINTS", "STELE_PEER_BLOCK_FILE"]).unwrap();
        assert!(both.contains("STELE_FAILPOINTS") && both.contains("STELE_PEER_BLOCK_FILE"));
    }

    #[test]
    fn nothing_set_or_a_test_build_starts() {
        assert_eq!(refused(false, &[]), None);
        assert_eq!(refused(false, &["STELE_OTHER"]), None);
        for (name, _) in UNSAFE_SWITCHES {
            assert_eq!(refused(true, &[name]), None);
        }
    }
}
