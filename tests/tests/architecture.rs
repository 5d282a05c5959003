//! The architecture invariants of docs/ARCHITECTURE.md, checked from the
//! crate graph (`cargo metadata`) and from the `use` lines of the sources.
//!
//! Each rule is a row of a table; the checkers are plain functions of text
//! so the negative tests at the bottom show that each would catch a break.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Workspace package name -> the workspace packages it depends on directly
/// (normal, dev and build dependencies alike).
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .map(|d| d["name"].as_str().expect("dep name").to_string())
                .filter(|d| names.contains(d))
                .collect();
            (p["name"].as_str().expect("name").to_string(), deps)
        })
        .collect()
}

/// Every workspace package `from` reaches through the graph (itself excluded).
fn reaches(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(p) = todo.pop() {
        for d in graph.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

/// Crate-graph rules: (package, what it may not reach, why).
const FORBIDDEN_DEPS: &[(&str, &str, &str)] = &[
    (
        "stele-controller",
        "stele-node",
        "the controller runs without the storage node",
    ),
    (
        "stele-directory",
        "stele-node",
        "the directory runs without the storage node",
    ),
    (
        "stele-quorum",
        "stele-node",
        "the control-plane Raft is its own crate",
    ),
    (
        "stele-client",
        "stele-node",
        "the client depends only on proto",
    ),
];

/// Packages that must depend on no other workspace package but these.
const ONLY_DEPS: &[(&str, &[&str])] = &[
    ("stele-proto", &[]),
    ("stele-client", &["stele-proto", "stele-tls"]),
    ("stele-tls", &[]),
];

fn graph_violations(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut bad = Vec::new();
    for (pkg, forbidden, why) in FORBIDDEN_DEPS {
        assert!(
            graph.contains_key(*pkg),
            "no package {pkg} in the workspace"
        );
        if reaches(graph, pkg).contains(*forbidden) {
            bad.push(format!("{pkg} depends on {forbidden} ({why})"));
        }
    }
    for (pkg, allowed) in ONLY_DEPS {
        for d in &graph[*pkg] {
            if !allowed.contains(&d.as_str()) {
                bad.push(format!(
                    "{pkg} depends on {d}; it may depend only on {allowed:?}"
                ));
            }
        }
    }
    for (pkg, deps) in graph {
        for leaf in ["stele-jepsen", "stele-tests"] {
            if deps.contains(leaf) {
                bad.push(format!("{pkg} depends on {leaf}; nothing may"));
            }
        }
    }
    bad
}

/// The source text with `//` comments and string literals blanked, so prose
/// that names a module ("openraft's leader restore") is not a use of it.
fn code_only(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut chars = src.chars().peekable();
    let mut in_str = false;
    let mut block = 0usize;
    while let Some(c) = chars.next() {
        if block > 0 {
            if c == '*' && chars.peek() == Some(&'/') {
                chars.next();
                block -= 1;
            } else if c == '\n' {
                out.push('\n');
            }
            continue;
        }
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => in_str = false,
                '\n' => out.push('\n'),
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                block += 1;
            }
            // A char literal such as '"' must not open a string.
            '\'' => {
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with("\"'") || rest.starts_with("\\\"") {
                    chars.next();
                    chars.next();
                    if rest.starts_with("\\\"") {
                        chars.next();
                    }
                    out.push_str("' '");
                } else {
                    out.push(c);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// Source rules: files under `dir` (relative to the workspace root), except
/// those under an `allowed` prefix, may not name `pattern` in code.
struct SourceRule {
    dir: &'static str,
    pattern: &'static str,
    allowed: &'static [&'static str],
    why: &'static str,
}

const SOURCE_RULES: &[SourceRule] = &[
    SourceRule {
        dir: "",
        pattern: "metrics_exporter_prometheus",
        allowed: &["src/"],
        why: "libraries record through the `metrics` facade; only the binary installs a recorder",
    },
    SourceRule {
        dir: "",
        pattern: "opentelemetry",
        allowed: &["src/", "tests/"],
        why: "libraries trace through the `tracing` facade; only the binary exports spans (src/otel.rs)",
    },
    SourceRule {
        dir: "node/src",
        pattern: "openraft",
        allowed: &["node/src/raft/"],
        why: "only node::raft names openraft types",
    },
    SourceRule {
        dir: "node/src",
        pattern: "crate::node::",
        allowed: &[],
        why: "node.rs is the composition root: nothing imports it",
    },
    SourceRule {
        dir: "node/src",
        pattern: "super::node::",
        allowed: &[],
        why: "node.rs is the composition root: nothing imports it",
    },
    SourceRule {
        dir: "node/src",
        pattern: "Weak<Node>",
        allowed: &[],
        why: "no service holds a back-reference to the node",
    },
    SourceRule {
        dir: "src",
        pattern: "stele_node::node::",
        allowed: &[],
        why: "node.rs is reached only through stele_node::{Node, NodeOptions}",
    },
    SourceRule {
        dir: "tests",
        pattern: "stele_node::node::",
        allowed: &[],
        why: "node.rs is reached only through stele_node::{Node, NodeOptions}",
    },
    SourceRule {
        dir: "jepsen",
        pattern: "stele_node::node::",
        allowed: &[],
        why: "node.rs is reached only through stele_node::{Node, NodeOptions}",
    },
    SourceRule {
        dir: "controller",
        pattern: "openraft",
        allowed: &[],
        why: "the controller's Raft is behind stele-quorum",
    },
    SourceRule {
        dir: "directory",
        pattern: "openraft",
        allowed: &[],
        why: "the directory's Raft is behind stele-quorum",
    },
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries {
        let p = e.expect("dir entry").path();
        if p.file_name().is_some_and(|n| n == "target") {
            continue;
        }
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// (file relative to the root, its text) -> violations of `rule`.
fn source_violations(rule: &SourceRule, files: &[(String, String)]) -> Vec<String> {
    let mut bad = Vec::new();
    for (rel, text) in files {
        if !rel.starts_with(rule.dir) || rule.allowed.iter().any(|a| rel.starts_with(a)) {
            continue;
        }
        for (n, line) in code_only(text).lines().enumerate() {
            if line.contains(rule.pattern) {
                bad.push(format!(
                    "{rel}:{}: names `{}` ({}): {}",
                    n + 1,
                    rule.pattern,
                    rule.why,
                    line.trim()
                ));
            }
        }
    }
    bad
}

fn workspace_sources() -> Vec<(String, String)> {
    let root = root();
    let mut files = Vec::new();
    for dir in [
        "node",
        "controller",
        "directory",
        "quorum",
        "client",
        "proto",
        "src",
        "tests",
        "jepsen",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(&root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&p).expect("read source");
            (rel, text)
        })
        .collect()
}

/// Library files that may pass the size mark because they are pure
/// decisions: checked below to name no I/O, task or clock.
const LONG_PURE_FILES: &[(&str, &str)] = &[
    (
        "controller/src/placement.rs",
        "placement and balance as pure functions of the cell state",
    ),
    (
        "controller/src/state.rs",
        "the replicated cell state and its deterministic apply",
    ),
];

/// What a pure file may not name in code.
const IMPURE: &[&str] = &[
    "async ",
    ".await",
    "tokio",
    "std::fs",
    "std::net",
    "Instant::now",
    "SystemTime::now",
    "tonic",
];

/// A file is a test file when its name or a directory says so.
fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    rel.split('/')
        .any(|d| d == "tests" || d == "benches" || d == "examples")
        || name == "tests.rs"
        || name.ends_with("_test.rs")
        || name.ends_with("_tests.rs")
}

const LINES_MAX: usize = 800;

fn size_violations(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(rel, _)| {
            !is_test_file(rel) && !rel.starts_with("jepsen/") && !rel.starts_with("tests/")
        })
        .filter_map(|(rel, text)| {
            // `#[cfg(test)] mod tests { .. }` at the bottom is test code.
            let body = text.split("#[cfg(test)]\nmod tests").next().unwrap_or(text);
            let n = body.lines().count();
            if n <= LINES_MAX {
                return None;
            }
            if !LONG_PURE_FILES.iter().any(|(f, _)| f == rel) {
                return Some(format!("{rel}: {n} lines (mark {LINES_MAX})"));
            }
            let code = code_only(body);
            let named: Vec<&str> = IMPURE
                .iter()
                .copied()
                .filter(|w| code.contains(w))
                .collect();
            (!named.is_empty())
                .then(|| format!("{rel}: {n} lines, allowed as pure, but names {named:?}"))
        })
        .collect()
}

#[test]
fn the_crate_graph_keeps_its_layers() {
    let bad = graph_violations(&workspace_graph());
    assert!(bad.is_empty(), "crate graph:\n{}", bad.join("\n"));
}

#[test]
fn sources_keep_their_layers() {
    let files = workspace_sources();
    assert!(
        files.len() > 100,
        "found only {} source files: wrong root?",
        files.len()
    );
    let bad: Vec<String> = SOURCE_RULES
        .iter()
        .flat_map(|r| source_violations(r, &files))
        .collect();
    assert!(bad.is_empty(), "sources:\n{}", bad.join("\n"));
}

#[test]
fn no_library_file_passes_the_size_mark() {
    let bad = size_violations(&workspace_sources());
    assert!(bad.is_empty(), "long files:\n{}", bad.join("\n"));
}

// Negative controls: each checker flags a made-up break.

#[test]
fn a_controller_that_reaches_the_node_is_flagged() {
    let mut graph = workspace_graph();
    // Through another crate, not directly: the closure must catch it.
    graph
        .get_mut("stele-client")
        .expect("client")
        .insert("stele-node".into());
    graph
        .get_mut("stele-controller")
        .expect("controller")
        .insert("stele-client".into());
    let bad = graph_violations(&graph);
    assert!(
        bad.iter()
            .any(|b| b.starts_with("stele-controller depends on stele-node")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|b| b.starts_with("stele-client depends on stele-node")),
        "{bad:?}"
    );
}

#[test]
fn openraft_outside_raft_is_flagged_but_prose_is_not() {
    let files = vec![
        (
            "node/src/service.rs".to_string(),
            "// openraft's read index\nlet s = \"openraft\";\nuse openraft::ReadPolicy;\n"
                .to_string(),
        ),
        (
            "node/src/raft/mod.rs".to_string(),
            "use openraft::Raft;\n".to_string(),
        ),
        (
            "node/src/agent.rs".to_string(),
            "let q = '\"'; use crate::node::Node;\n".to_string(),
        ),
    ];
    let bad: Vec<String> = SOURCE_RULES
        .iter()
        .flat_map(|r| source_violations(r, &files))
        .collect();
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].starts_with("node/src/service.rs:3:"), "{bad:?}");
    assert!(bad[1].starts_with("node/src/agent.rs:1:"), "{bad:?}");
}

#[test]
fn a_long_library_file_is_flagged() {
    let long = "fn f() {}\n".repeat(LINES_MAX + 1);
    let files = vec![
        ("node/src/hub.rs".to_string(), long.clone()),
        ("node/src/journal/tests.rs".to_string(), long.clone()),
        ("node/tests/node_test.rs".to_string(), long.clone()),
        ("controller/src/placement.rs".to_string(), long.clone()),
        (
            "controller/src/state.rs".to_string(),
            format!("{long}async fn io() {{ tokio::fs::read(\"x\").await; }}\n"),
        ),
        (
            "client/src/lib.rs".to_string(),
            format!("fn g() {{}}\n#[cfg(test)]\nmod tests {{\n{long}}}\n"),
        ),
    ];
    let bad = size_violations(&files);
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad[0].starts_with("node/src/hub.rs:"), "{bad:?}");
    assert!(
        bad[1].starts_with("controller/src/state.rs:") && bad[1].contains("tokio"),
        "{bad:?}"
    );
}

#[test]
fn a_recorder_outside_the_binary_is_flagged() {
    let files = vec![
        (
            "controller/src/metrics.rs".to_string(),
            "use metrics_exporter_prometheus::PrometheusBuilder;\n".to_string(),
        ),
        (
            "src/metrics.rs".to_string(),
            "use metrics_exporter_prometheus::Matcher;\n".to_string(),
        ),
    ];
    let bad: Vec<String> = SOURCE_RULES
        .iter()
        .flat_map(|r| source_violations(r, &files))
        .collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(bad[0].starts_with("controller/src/metrics.rs:1"), "{bad:?}");
}
