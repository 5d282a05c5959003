//! The console's multi-cell view (`/api/console` on a directory member's
//! HTTP status listener): the cells and the namespaces each holds. A pure
//! function of the applied state; read-only.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::state::DirectoryState;

/// Namespaces listed per cell (the count is always whole).
pub const NAMESPACES_SHOWN_MAX: usize = 500;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DirectoryView {
    /// `directory` (the controller's view says `controller`).
    pub role: &'static str,
    pub member_id: u64,
    pub leading: bool,
    pub generation: u64,
    pub cells: Vec<CellView>,
    /// Namespaces naming a cell the registry does not hold (none in a
    /// consistent state; shown rather than hidden).
    pub orphans: Vec<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CellView {
    pub id: String,
    /// active, retired.
    pub status: &'static str,
    pub controllers: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub namespace_count: usize,
    /// The first [`NAMESPACES_SHOWN_MAX`] by name.
    pub namespaces: Vec<String>,
}

/// The view of `s` as member `member_id` (leading or not) applied it.
pub fn view(s: &DirectoryState, member_id: u64, leading: bool) -> DirectoryView {
    let mut cells: BTreeMap<&str, CellView> = s
        .cells
        .values()
        .map(|c| {
            (
                c.id.as_str(),
                CellView {
                    id: c.id.clone(),
                    status: c.status.name(),
                    controllers: c.controllers.clone(),
                    labels: c.labels.clone(),
                    namespace_count: 0,
                    namespaces: Vec::new(),
                },
            )
        })
        .collect();
    let mut orphans = Vec::new();
    for ns in s.namespaces.values() {
        match cells.get_mut(ns.cell.as_str()) {
            Some(c) => {
                c.namespace_count += 1;
                if c.namespaces.len() < NAMESPACES_SHOWN_MAX {
                    c.namespaces.push(ns.name.clone());
                }
            }
            None if orphans.len() < NAMESPACES_SHOWN_MAX => orphans.push(ns.name.clone()),
            None => {}
        }
    }
    DirectoryView {
        role: "directory",
        member_id,
        leading,
        generation: s.generation,
        cells: cells.into_values().collect(),
        orphans,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, NamespaceRec, Policy};

    fn register(s: &mut DirectoryState, id: &str) {
        s.apply(Command::RegisterCell {
            id: id.into(),
            controllers: vec![format!("http://{id}")],
            labels: Default::default(),
        });
    }

    fn ns(name: &str, cell: &str) -> NamespaceRec {
        NamespaceRec {
            name: name.into(),
            cell: cell.into(),
            created_us: 0,
            policy: Policy::default(),
            generation: 1,
        }
    }

    #[test]
    fn an_empty_directory_and_an_empty_cell() {
        let mut s = DirectoryState::new();
        let v = view(&s, 1, true);
        assert!(v.cells.is_empty() && v.orphans.is_empty());
        register(&mut s, "c1");
        let v = view(&s, 1, true);
        assert_eq!(v.cells.len(), 1);
        assert_eq!(v.cells[0].namespace_count, 0);
        assert_eq!(v.cells[0].status, "active");
    }

    #[test]
    fn namespaces_group_by_cell_bounded_and_orphans_show() {
        let mut s = DirectoryState::new();
        register(&mut s, "c1");
        register(&mut s, "c2");
        for i in 0..(NAMESPACES_SHOWN_MAX + 3) {
            let n = format!("w/p{i:04}");
            s.namespaces.insert(n.clone(), ns(&n, "c1"));
        }
        s.namespaces.insert("a/b".into(), ns("a/b", "c2"));
        s.namespaces.insert("x/y".into(), ns("x/y", "gone"));
        let v = view(&s, 2, false);
        assert!(!v.leading);
        assert_eq!(v.cells[0].namespace_count, NAMESPACES_SHOWN_MAX + 3);
        assert_eq!(v.cells[0].namespaces.len(), NAMESPACES_SHOWN_MAX);
        assert_eq!(v.cells[1].namespaces, ["a/b"]);
        assert_eq!(v.orphans, ["x/y"]);
    }
}
