//! The storage node's layering, checked from its sources (docs/ARCHITECTURE.md,
//! "Architecture invariant"): layers depend only downward,
//!
//! ```text
//! storage (journal, segment, catalog, fsutil, tier object I/O)
//!   → tablet (state, deterministic apply, seal, pure policy)
//!   → raft (types, log store, state machine adapter, router, inbound, pacer)
//!   → replicas (the one registry)
//!   → services (sealer, policy, pacer, tier worker, peering, data service, agent)
//!   → node.rs (composition root)
//! ```
//!
//! so nothing imports `node.rs`, nothing outside `node::raft` names an
//! openraft type, `tablet` takes from `raft` only the opaque log-id types
//! and their codec, and `raft` reaches no service or the registry.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a source file: every line with its `//` comment cut off.
fn code(path: &Path) -> Vec<(usize, String)> {
    std::fs::read_to_string(path)
        .expect("read source")
        .lines()
        .enumerate()
        .map(|(n, line)| {
            let code = match line.find("//") {
                Some(at) => &line[..at],
                None => line,
            };
            (n + 1, code.to_string())
        })
        .collect()
}

/// Every `(file, line, text)` under `src/` whose module path (relative to
/// `src/`) satisfies `in_scope` and whose code contains a needle that
/// `bad` rejects.
fn violations(
    in_scope: impl Fn(&str) -> bool,
    needles: &[&str],
    allowed: impl Fn(&str) -> bool,
) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        if !in_scope(&rel) {
            continue;
        }
        for (n, line) in code(&file) {
            for needle in needles {
                let mut rest = line.as_str();
                while let Some(at) = rest.find(needle) {
                    let tail = &rest[at..];
                    if !allowed(tail) {
                        found.push(format!("{rel}:{n}: {}", line.trim()));
                    }
                    rest = &rest[at + needle.len()..];
                }
            }
        }
    }
    found
}

#[test]
fn nothing_imports_the_composition_root() {
    let found = violations(
        |rel| rel != "node.rs" && rel != "lib.rs",
        &[
            "crate::node::",
            "crate::node;",
            "crate::node::{",
            "super::node",
        ],
        |_| false,
    );
    assert!(
        found.is_empty(),
        "node.rs imported by:\n{}",
        found.join("\n")
    );
}

#[test]
fn only_raft_names_openraft() {
    let found = violations(
        |rel| !rel.starts_with("raft/"),
        &["openraft::", "openraft_multi::"],
        |_| false,
    );
    assert!(
        found.is_empty(),
        "openraft named outside node::raft:\n{}",
        found.join("\n")
    );
}

#[test]
fn tablet_takes_from_raft_only_log_id_types() {
    // The opaque log-id types and their codec, and two known debts of the
    // seal's split publish: the child's initial Raft state and the node of
    // a replica id. Any other name from raft is a new upward dependency.
    let allowed = [
        "crate::raft::LogId",
        "crate::raft::StoredMembership",
        "crate::raft::decode",
        "crate::raft::encode",
        "crate::raft::{LogId, StoredMembership",
        "crate::raft::split_child_state",
        "crate::raft::router::node_of",
    ];
    let found = violations(
        |rel| rel.starts_with("tablet/"),
        &["crate::raft::"],
        |tail| allowed.iter().any(|a| tail.starts_with(a)),
    );
    assert!(
        found.is_empty(),
        "tablet reaches up into raft:\n{}",
        found.join("\n")
    );
    let found = violations(|rel| rel.starts_with("tablet/"), ABOVE_RAFT, |_| false);
    assert!(
        found.is_empty(),
        "tablet reaches up into a service:\n{}",
        found.join("\n")
    );
}

/// The registry and the services: the layers above `raft`.
const ABOVE_RAFT: &[&str] = &[
    "crate::replicas",
    "crate::service",
    "crate::agent",
    "crate::peering",
    "crate::policy",
    "crate::sealer",
    "crate::endpoints",
    "crate::ownership",
    "crate::tier::worker",
];

#[test]
fn raft_reaches_no_registry_or_service() {
    let found = violations(|rel| rel.starts_with("raft/"), ABOVE_RAFT, |_| false);
    assert!(
        found.is_empty(),
        "raft reaches up into the registry or a service:\n{}",
        found.join("\n")
    );
}
