//! A fault-injection filter on node-to-node Raft traffic (TiKV's transport
//! `Filter`): the node drops every message to or from a blocked node, so a
//! test can partition real processes without root, namespaces or restarts.
//!
//! ```text
//! SharedTransport::call(to)    ──blocks(to)?──► Err("... peer filter ...")  (fails fast)
//! RaftHandler::handle(from)    ──blocks(from)?─► RemoteError::Refused
//! watch_file(path) every 100 ms ──► set_blocked(parse(contents))
//! ```
//!
//! The filter is empty unless something sets it; `stele server` watches the
//! file named by `STELE_PEER_BLOCK_FILE` (docs/OPERATIONS.md). Only Raft
//! traffic is filtered: the QUIC connections stay up, as they would behind a
//! network that drops datagrams only after the handshake.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often [`PeerFilter::watch_file`] rereads its file.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Most node ids a filter file may name.
pub const BLOCKED_NODES_MAX: usize = 1024;

/// Why a filter file is not applied; the previous filter stays.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{token:?} is not a node id")]
    NotANodeId { token: String },
    #[error("more than {BLOCKED_NODES_MAX} node ids")]
    TooManyNodes,
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
}

/// The set of nodes this node refuses to talk to, and how many messages it
/// dropped because of it.
#[derive(Debug, Default)]
pub struct PeerFilter {
    blocked: RwLock<BTreeSet<u64>>,
    filtered: AtomicU64,
}

impl PeerFilter {
    /// Replaces the blocked set.
    pub fn set_blocked(&self, nodes: BTreeSet<u64>) {
        *self.blocked.write().expect("lock poisoned") = nodes;
    }

    /// The nodes currently blocked.
    pub fn blocked(&self) -> BTreeSet<u64> {
        self.blocked.read().expect("lock poisoned").clone()
    }

    /// True when traffic with `node` must be dropped; counts the drop.
    pub fn drops(&self, node: u64) -> bool {
        let blocked = self.blocked.read().expect("lock poisoned");
        if blocked.is_empty() || !blocked.contains(&node) {
            return false;
        }
        self.filtered.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Messages dropped (outgoing and incoming) since start.
    pub fn filtered(&self) -> u64 {
        self.filtered.load(Ordering::Relaxed)
    }

    /// The reason a dropped message carries.
    pub fn reason(node: u64) -> String {
        crate::raft::router::Error::Filtered { node }.to_string()
    }

    /// Parses a filter file: node ids separated by commas or whitespace.
    /// Empty text blocks nothing.
    pub fn parse(text: &str) -> Result<BTreeSet<u64>, Error> {
        let mut out = BTreeSet::new();
        for token in text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty())
        {
            let id: u64 = token.parse().map_err(|_| Error::NotANodeId {
                token: token.to_owned(),
            })?;
            out.insert(id);
            if out.len() > BLOCKED_NODES_MAX {
                return Err(Error::TooManyNodes);
            }
        }
        Ok(out)
    }

    /// Rereads `path` every `interval` until `cancel`, applying what it
    /// says: a missing or empty file blocks nothing; a file that does not
    /// parse (or cannot be read) is logged once per distinct problem and
    /// ignored, keeping the last good filter.
    pub fn watch_file(
        self: std::sync::Arc<Self>,
        path: PathBuf,
        interval: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_problem: Option<String> = None;
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let read = tokio::fs::read_to_string(&path).await;
                match self.apply(read) {
                    Ok(()) => last_problem = None,
                    Err(e) => {
                        // Compared as text: the same problem on every tick logs once.
                        let problem = e.to_string();
                        if last_problem.as_ref() != Some(&problem) {
                            tracing::warn!(file = %path.display(), %problem, "peer filter file ignored; keeping the previous filter");
                            last_problem = Some(problem);
                        }
                    }
                }
            }
        })
    }

    /// Applies one read of the filter file (the decision of `watch_file`,
    /// without the I/O).
    fn apply(&self, read: std::io::Result<String>) -> Result<(), Error> {
        let next = match read {
            Ok(text) => Self::parse(&text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(e) => return Err(Error::Read(e)),
        };
        let mut blocked = self.blocked.write().expect("lock poisoned");
        if *blocked != next {
            tracing::warn!(blocked = ?next, "peer filter changed (fault injection)");
            *blocked = next;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error as IoError, ErrorKind};

    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    #[test]
    fn parse_cases() {
        let check = |text: &str, want: Result<&[u64], ()>| {
            assert_eq!(
                PeerFilter::parse(text).map_err(|_| ()),
                want.map(set),
                "{text:?}"
            );
        };
        check("", Ok(&[]));
        check(" \n", Ok(&[]));
        check("2", Ok(&[2]));
        check("2,3", Ok(&[2, 3]));
        check("3 2\n", Ok(&[2, 3]));
        check(",2,, 3 ,", Ok(&[2, 3]));
        check("2;3", Err(()));
        check("node2", Err(()));
        check("-1", Err(()));
    }

    #[test]
    fn parse_errors_name_the_problem() {
        match PeerFilter::parse("2 x3") {
            Err(Error::NotANodeId { token }) => assert_eq!(token, "x3"),
            other => panic!("{other:?}"),
        }
        let many: Vec<String> = (0..=BLOCKED_NODES_MAX as u64)
            .map(|n| n.to_string())
            .collect();
        assert!(matches!(
            PeerFilter::parse(&many.join(",")),
            Err(Error::TooManyNodes)
        ));
        assert_eq!(
            PeerFilter::parse(&many[..BLOCKED_NODES_MAX].join(","))
                .unwrap()
                .len(),
            BLOCKED_NODES_MAX
        );
        let f = PeerFilter::default();
        assert!(matches!(
            f.apply(Err(IoError::from(ErrorKind::PermissionDenied))),
            Err(Error::Read(e)) if e.kind() == ErrorKind::PermissionDenied
        ));
    }

    #[test]
    fn drops_only_blocked_nodes_and_counts_them() {
        let f = PeerFilter::default();
        assert!(!f.drops(2));
        f.set_blocked(set(&[2, 3]));
        assert!(f.drops(2));
        assert!(f.drops(3));
        assert!(!f.drops(4));
        assert_eq!(f.filtered(), 2);
        f.set_blocked(BTreeSet::new());
        assert!(!f.drops(2));
        assert_eq!(f.filtered(), 2);
    }

    #[test]
    fn missing_file_clears_bad_file_keeps_last_good() {
        let f = PeerFilter::default();
        f.apply(Ok("2,3".into())).unwrap();
        assert_eq!(f.blocked(), set(&[2, 3]));
        assert!(f.apply(Ok("2,x".into())).is_err());
        assert_eq!(
            f.blocked(),
            set(&[2, 3]),
            "a bad file keeps the last filter"
        );
        assert!(
            f.apply(Err(IoError::from(ErrorKind::PermissionDenied)))
                .is_err()
        );
        assert_eq!(f.blocked(), set(&[2, 3]));
        f.apply(Err(IoError::from(ErrorKind::NotFound))).unwrap();
        assert!(f.blocked().is_empty(), "a missing file blocks nothing");
        f.apply(Ok("1".into())).unwrap();
        f.apply(Ok(String::new())).unwrap();
        assert!(f.blocked().is_empty(), "an empty file blocks nothing");
    }

    #[tokio::test]
    async fn watch_file_follows_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("block");
        let f = std::sync::Arc::new(PeerFilter::default());
        let cancel = CancellationToken::new();
        let task = f
            .clone()
            .watch_file(path.clone(), Duration::from_millis(10), cancel.clone());
        let wait_for = |want: BTreeSet<u64>| {
            let f = f.clone();
            async move {
                for _ in 0..500 {
                    if f.blocked() == want {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("filter never became {want:?}, is {:?}", f.blocked());
            }
        };
        std::fs::write(&path, "3").unwrap();
        wait_for(set(&[3])).await;
        std::fs::write(&path, "oops").unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(f.blocked(), set(&[3]));
        std::fs::remove_file(&path).unwrap();
        wait_for(BTreeSet::new()).await;
        cancel.cancel();
        task.await.unwrap();
    }
}
