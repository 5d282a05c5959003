//! The directory's replicated state: cells, namespaces and the directory
//! generation, and the commands that change them.
//!
//! Apply is deterministic: the leader stamps the clock into a command
//! (`created_us`) before proposing it, and placement on the least-loaded
//! cell is decided here, from the state alone, so every member agrees.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Snapshot format version.
pub const STATE_V: u16 = 1;
/// Longest cell id, in bytes.
pub const CELL_ID_BYTES_MAX: usize = 64;
/// Most controllers a cell may list.
pub const CELL_CONTROLLERS_MAX: usize = 7;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CellStatus {
    Active,
    /// Takes no new namespaces; only an empty cell retires, and a retired
    /// id is never registered again.
    Retired,
}

impl CellStatus {
    pub fn name(self) -> &'static str {
        match self {
            CellStatus::Active => "active",
            CellStatus::Retired => "retired",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellRec {
    pub id: String,
    pub controllers: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub status: CellStatus,
    pub generation: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Records older than this are dropped (0: forever).
    pub retention_s: u64,
    /// Soft limit on stored bytes (0: none).
    pub size_limit_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceRec {
    pub name: String,
    /// The owning cell: fixed at creation, never changed.
    pub cell: String,
    pub created_us: u64,
    pub policy: Policy,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterCell {
        id: String,
        controllers: Vec<String>,
        labels: BTreeMap<String, String>,
    },
    RetireCell {
        id: String,
    },
    CreateNamespace {
        name: String,
        /// None: the least-loaded active cell.
        cell: Option<String>,
        policy: Policy,
        created_us: u64,
    },
    UpdateNamespace {
        name: String,
        policy: Policy,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Cell(CellRec),
    Namespace(NamespaceRec),
    /// A create of a namespace that exists: the existing record (the
    /// caller decides whether that is a conflict).
    Exists(NamespaceRec),
    Refused(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryState {
    pub v: u16,
    /// Bumped by every change.
    pub generation: u64,
    pub cells: BTreeMap<String, CellRec>,
    pub namespaces: BTreeMap<String, NamespaceRec>,
}

impl Default for DirectoryState {
    fn default() -> Self {
        DirectoryState::new()
    }
}

/// Checks a cell id: 1 to 64 bytes of ASCII letters, digits, `_`, `-`, `.`.
pub fn validate_cell_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > CELL_ID_BYTES_MAX {
        return Err(format!(
            "cell id {id:?} must be 1 to {CELL_ID_BYTES_MAX} bytes"
        ));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(format!(
            "cell id {id:?} may hold only letters, digits, '_', '-', '.'"
        ));
    }
    Ok(())
}

/// The reply to a command that meets a broken invariant of the state.
///
/// Every member applies the same command at the same index: a panic here
/// would stop them all, and again on every replay of the log. So a release
/// build refuses the command and changes nothing; a debug build (tests,
/// development) stops at the assertion so the bug is seen.
fn broken(why: String) -> Reply {
    debug_assert!(false, "directory state invariant broken: {why}");
    Reply::Refused(format!("directory state invariant broken: {why}"))
}

impl DirectoryState {
    pub fn new() -> DirectoryState {
        DirectoryState {
            v: STATE_V,
            generation: 0,
            cells: BTreeMap::new(),
            namespaces: BTreeMap::new(),
        }
    }

    /// Namespaces each cell holds.
    pub fn load(&self) -> BTreeMap<&str, u64> {
        let mut load: BTreeMap<&str, u64> = self.cells.keys().map(|id| (id.as_str(), 0)).collect();
        for ns in self.namespaces.values() {
            *load.entry(ns.cell.as_str()).or_default() += 1;
        }
        load
    }

    /// The active cell holding the fewest namespaces (the smallest id
    /// among equals).
    pub fn least_loaded(&self) -> Option<&str> {
        let load = self.load();
        self.cells
            .values()
            .filter(|c| c.status == CellStatus::Active)
            .min_by_key(|c| (load.get(c.id.as_str()).copied().unwrap_or(0), c.id.as_str()))
            .map(|c| c.id.as_str())
    }

    /// Applies one command. A refusal changes nothing.
    pub fn apply(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::RegisterCell {
                id,
                controllers,
                labels,
            } => {
                if let Err(e) = validate_cell_id(&id) {
                    return Reply::Refused(e);
                }
                if controllers.is_empty() || controllers.len() > CELL_CONTROLLERS_MAX {
                    return Reply::Refused(format!(
                        "a cell lists 1 to {CELL_CONTROLLERS_MAX} controllers, got {}",
                        controllers.len()
                    ));
                }
                if let Some(bad) = controllers
                    .iter()
                    .find(|c| !(c.starts_with("http://") || c.starts_with("https://")))
                {
                    return Reply::Refused(format!(
                        "controller endpoint {bad:?} is not an http:// or https:// URL"
                    ));
                }
                match self.cells.get(&id) {
                    Some(c) if c.status == CellStatus::Retired => {
                        return Reply::Refused(format!(
                            "cell {id:?} is retired; a retired id is never reused"
                        ));
                    }
                    Some(c) if c.controllers == controllers && c.labels == labels => {
                        return Reply::Cell(c.clone());
                    }
                    _ => {}
                }
                self.generation += 1;
                let rec = CellRec {
                    id: id.clone(),
                    controllers,
                    labels,
                    status: CellStatus::Active,
                    generation: self.generation,
                };
                self.cells.insert(id, rec.clone());
                Reply::Cell(rec)
            }
            Command::RetireCell { id } => {
                let Some(cell) = self.cells.get_mut(&id) else {
                    return Reply::Refused(format!("no cell {id:?}"));
                };
                if cell.status == CellStatus::Retired {
                    return Reply::Cell(cell.clone());
                }
                let held = self.namespaces.values().filter(|n| n.cell == id).count();
                if held > 0 {
                    return Reply::Refused(format!("cell {id:?} still holds {held} namespace(s)"));
                }
                self.generation += 1;
                cell.status = CellStatus::Retired;
                cell.generation = self.generation;
                Reply::Cell(cell.clone())
            }
            Command::CreateNamespace {
                name,
                cell,
                policy,
                created_us,
            } => {
                if let Err(e) = stele_proto::limits::validate_namespace(&name) {
                    return Reply::Refused(e.to_string());
                }
                if let Some(ns) = self.namespaces.get(&name) {
                    return Reply::Exists(ns.clone());
                }
                let cell = match cell {
                    Some(id) => match self.cells.get(&id) {
                        None => return Reply::Refused(format!("no cell {id:?}")),
                        Some(c) if c.status == CellStatus::Retired => {
                            return Reply::Refused(format!(
                                "cell {id:?} is retired and takes no namespaces"
                            ));
                        }
                        Some(c) => c.id.clone(),
                    },
                    None => match self.least_loaded() {
                        Some(id) => id.to_string(),
                        None => return Reply::Refused("no active cell".into()),
                    },
                };
                // `least_loaded` names a cell by its record's id, which is
                // its key in `cells`; a namespace must never name a cell
                // that is not registered.
                if !self.cells.contains_key(&cell) {
                    return broken(format!(
                        "cell record {cell:?} is not under its own id; namespace {name:?} not created"
                    ));
                }
                self.generation += 1;
                let rec = NamespaceRec {
                    name: name.clone(),
                    cell,
                    created_us,
                    policy,
                    generation: self.generation,
                };
                self.namespaces.insert(name, rec.clone());
                Reply::Namespace(rec)
            }
            Command::UpdateNamespace { name, policy } => {
                let Some(ns) = self.namespaces.get_mut(&name) else {
                    return Reply::Refused(format!("no namespace {name:?}"));
                };
                if ns.policy == policy {
                    return Reply::Namespace(ns.clone());
                }
                self.generation += 1;
                ns.policy = policy;
                ns.generation = self.generation;
                Reply::Namespace(ns.clone())
            }
        }
    }
}

pub use stele_quorum::{from_cbor, to_cbor};

/// Commands, replies and snapshots as CBOR.
impl stele_quorum::CborState for DirectoryState {
    type Command = Command;
    type Reply = Reply;
    const VERSION: u16 = STATE_V;

    fn version(&self) -> u16 {
        self.v
    }

    fn apply_command(&mut self, cmd: Command) -> Reply {
        DirectoryState::apply(self, cmd)
    }

    fn refused(reason: String) -> Reply {
        Reply::Refused(reason)
    }

    fn name() -> &'static str {
        "directory"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stele_quorum::QuorumState;

    fn register(s: &mut DirectoryState, id: &str) -> Reply {
        s.apply(Command::RegisterCell {
            id: id.into(),
            controllers: vec![format!("http://{id}:7450")],
            labels: BTreeMap::new(),
        })
    }

    fn create(s: &mut DirectoryState, name: &str, cell: Option<&str>) -> Reply {
        s.apply(Command::CreateNamespace {
            name: name.into(),
            cell: cell.map(str::to_string),
            policy: Policy::default(),
            created_us: 7,
        })
    }

    fn cell_of(r: Reply) -> String {
        match r {
            Reply::Namespace(ns) => ns.cell,
            other => panic!("not created: {other:?}"),
        }
    }

    #[test]
    fn namespaces_go_to_the_least_loaded_active_cell() {
        let mut s = DirectoryState::new();
        assert!(matches!(create(&mut s, "a/b", None), Reply::Refused(_)));
        register(&mut s, "c1");
        register(&mut s, "c2");
        assert_eq!(cell_of(create(&mut s, "w/1", None)), "c1");
        assert_eq!(cell_of(create(&mut s, "w/2", None)), "c2");
        assert_eq!(cell_of(create(&mut s, "w/3", Some("c1"))), "c1");
        assert_eq!(cell_of(create(&mut s, "w/4", None)), "c2");
        register(&mut s, "c3");
        assert_eq!(cell_of(create(&mut s, "w/5", None)), "c3");
        assert_eq!(s.generation, 8);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = DirectoryState::new();
        register(&mut s, "c1");
        register(&mut s, "c2");
        create(&mut s, "w/1", Some("c1"));
        let before = s.clone();
        let refused = |r: Reply| assert!(matches!(r, Reply::Refused(_)), "{r:?}");
        for bad in ["", "a", "a/b/c", "a/", "/b", "a b/c", "a/b!"] {
            refused(create(&mut s, bad, None));
        }
        refused(create(&mut s, &format!("{}/x", "w".repeat(65)), None));
        refused(create(&mut s, "w/2", Some("nope")));
        refused(s.apply(Command::RetireCell { id: "c1".into() }));
        refused(s.apply(Command::RetireCell { id: "nope".into() }));
        refused(s.apply(Command::UpdateNamespace {
            name: "w/none".into(),
            policy: Policy::default(),
        }));
        for (id, controllers) in [
            ("", vec!["http://x".to_string()]),
            ("bad id", vec!["http://x".to_string()]),
            ("c9", vec![]),
            ("c9", vec!["x:1".to_string()]),
        ] {
            refused(s.apply(Command::RegisterCell {
                id: id.into(),
                controllers,
                labels: BTreeMap::new(),
            }));
        }
        // A duplicate create answers with the record that exists.
        assert!(matches!(create(&mut s, "w/1", Some("c2")), Reply::Exists(ns) if ns.cell == "c1"));
        assert_eq!(s, before);
        // Retiring an empty cell works once; it then takes nothing and its
        // id is never registered again.
        assert!(matches!(
            s.apply(Command::RetireCell { id: "c2".into() }),
            Reply::Cell(c) if c.status == CellStatus::Retired
        ));
        let retired = s.clone();
        refused(create(&mut s, "w/2", Some("c2")));
        refused(register(&mut s, "c2"));
        assert_eq!(s, retired);
        assert_eq!(cell_of(create(&mut s, "w/2", None)), "c1");
    }

    /// A command that meets a broken invariant is refused and changes
    /// nothing in a release build; a debug build stops at the
    /// `debug_assert!` so the bug is seen. The test checks whichever half
    /// the build has: under `cargo test` the assertion's panic (proving
    /// the check sees the broken state), under `cargo test --release` the
    /// refusal. It fails in both if the check is removed.
    #[test]
    #[cfg_attr(
        debug_assertions,
        should_panic(expected = "directory state invariant broken")
    )]
    fn a_namespace_never_names_a_cell_that_is_not_registered() {
        let mut s = DirectoryState::new();
        register(&mut s, "c1");
        // Broken: the record under "c1" claims another id, which
        // `least_loaded` would hand out.
        s.cells.get_mut("c1").unwrap().id = "c0".into();
        let before = s.clone();
        let r = create(&mut s, "w/1", None);
        assert!(
            matches!(&r, Reply::Refused(why) if why.contains("invariant broken")),
            "{r:?}"
        );
        assert_eq!(s, before);
    }

    #[test]
    fn snapshots_round_trip_and_garbage_is_refused() {
        let mut s = DirectoryState::new();
        register(&mut s, "c1");
        create(&mut s, "w/1", None);
        let mut t = DirectoryState::new();
        t.restore(&s.snapshot()).unwrap();
        assert_eq!(t, s);
        let snap = s.snapshot();
        assert!(t.restore(&snap[..snap.len() / 2]).is_err());
        assert_eq!(t, s);
        let reply: Reply = from_cbor(&QuorumState::apply(&mut t, 9, b"\xff\x00")).unwrap();
        assert!(matches!(reply, Reply::Refused(_)));
        assert_eq!(t, s);
    }
}
