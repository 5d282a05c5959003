//! `stele restore cell` and `stele restore directory`: rebuild a whole
//! managed cell (its controllers with their state, every node's replicas)
//! or the directory quorum from the bucket into new data directories.
//!
//! ```text
//! bucket: cells/<cell>/control/latest ─> controller state (tablets, voters, nodes)
//!         cells/<cell>/tablets/*/manifests, segments ─> each replica's rows
//! OUT/controller-<i>/   seeded quorum: members = --controllers, ids 1.. in order
//! OUT/node-<id>/        the replicas the state places on node <id> (ids kept)
//! ```
//! Everything is built under a temporary sibling of OUT and renamed into
//! place at the end: a refused or failed restore leaves nothing behind.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use stele_controller::backup::Target;

/// The bucket's control-plane backup locations, from the cold-tier flags
/// (the same store the tier opens: `stele_node::tier::open_store`).
#[derive(Debug, Clone)]
pub struct Bucket {
    pub controller: Target,
    pub directory: Target,
}

impl Bucket {
    pub fn open(o: &stele_node::tier::TierOptions) -> anyhow::Result<Bucket> {
        o.validate()
            .with_context(|| format!("object store {}", o.url))?;
        let (store, prefix) =
            stele_node::tier::open_store(o).with_context(|| format!("object store {}", o.url))?;
        Ok(Bucket {
            controller: Target::controller(store.clone(), &prefix, &o.cell),
            directory: Target::directory(store, &prefix),
        })
    }
}

#[derive(clap::Subcommand)]
pub enum RestoreCommand {
    /// Rebuild a whole managed cell from the bucket: new controllers seeded
    /// with the backed-up cell state, and a data directory per node with
    /// the replicas that state places on it (node ids kept).
    Cell(RestoreCellArgs),
    /// Rebuild the directory quorum from its backup in the bucket.
    Directory(RestoreDirectoryArgs),
}

#[derive(clap::Args)]
pub struct BucketArgs {
    /// The object store: `s3://bucket/prefix` or `file:///dir`.
    #[arg(long)]
    from: String,
    #[arg(long)]
    s3_endpoint: Option<String>,
    #[arg(long)]
    s3_region: Option<String>,
    #[arg(long)]
    s3_allow_http: bool,
}

impl BucketArgs {
    fn options(&self, cell: &str) -> stele_node::tier::TierOptions {
        let mut o = stele_node::tier::TierOptions::new(self.from.clone(), cell);
        o.s3_endpoint = self.s3_endpoint.clone();
        o.s3_region = self.s3_region.clone();
        o.s3_allow_http = self.s3_allow_http
            || self
                .s3_endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://127.") || e.starts_with("http://localhost"));
        o
    }
}

#[derive(clap::Args)]
pub struct RestoreCellArgs {
    #[command(flatten)]
    bucket: BucketArgs,
    /// The cell id the objects were written under (the nodes' --cell-id).
    #[arg(long)]
    cell: String,
    /// A new (absent or empty) directory for the restored data directories.
    #[arg(long)]
    out: PathBuf,
    /// gRPC endpoints of the new controllers, `URL,...`: controller ids
    /// 1, 2, ... in this order (each started with that --controller-id and
    /// listening where its endpoint points).
    #[arg(long, value_delimiter = ',', required = true)]
    controllers: Vec<String>,
}

#[derive(clap::Args)]
pub struct RestoreDirectoryArgs {
    #[command(flatten)]
    bucket: BucketArgs,
    /// A new (absent or empty) directory for the members' data directories.
    #[arg(long)]
    out: PathBuf,
    /// gRPC endpoints of the new directory members, `URL,...`: ids 1, 2, ...
    #[arg(long, value_delimiter = ',', required = true)]
    members: Vec<String>,
}

pub async fn run(cmd: RestoreCommand) -> anyhow::Result<()> {
    match cmd {
        RestoreCommand::Cell(a) => restore_cell(a).await,
        RestoreCommand::Directory(a) => restore_directory(a).await,
    }
}

/// Member ids 1.. for the endpoints, refusing an empty or repeated list.
fn members(flag: &str, endpoints: &[String]) -> anyhow::Result<BTreeMap<u64, String>> {
    anyhow::ensure!(!endpoints.is_empty(), "{flag}: name at least one endpoint");
    let mut seen = BTreeSet::new();
    for ep in endpoints {
        anyhow::ensure!(
            ep.starts_with("http://") || ep.starts_with("https://"),
            "{flag}: {ep:?} is not an http(s):// endpoint"
        );
        anyhow::ensure!(seen.insert(ep), "{flag}: {ep} is named twice");
    }
    Ok((1..).zip(endpoints.iter().cloned()).collect())
}

/// Refuses an `out` that exists and is not an empty directory; returns the
/// temporary sibling to build in.
fn staging(out: &Path) -> anyhow::Result<PathBuf> {
    if out.exists() {
        let mut entries = std::fs::read_dir(out)
            .with_context(|| format!("--out {}: not a directory", out.display()))?;
        anyhow::ensure!(
            entries.next().is_none(),
            "--out {} is not empty: restore into a new directory",
            out.display()
        );
    }
    let name = out
        .file_name()
        .with_context(|| format!("--out {}: no directory name", out.display()))?;
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok(parent.join(format!(
        ".{}.restoring-{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Moves the finished `stage` to `out` (an empty `out` is replaced).
fn publish(stage: &Path, out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        std::fs::remove_dir(out).with_context(|| format!("replace {}", out.display()))?;
    }
    std::fs::rename(stage, out)
        .with_context(|| format!("rename {} to {}", stage.display(), out.display()))?;
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    stele_node::fsutil::fsync_dir(parent).with_context(|| format!("sync {}", parent.display()))
}

/// Runs `build` in a fresh staging directory, then publishes it as `out`;
/// on any error the staging directory is removed and `out` is untouched.
async fn staged<T, F, Fut>(out: &Path, build: F) -> anyhow::Result<T>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let stage = staging(out)?;
    if stage.exists() {
        std::fs::remove_dir_all(&stage).with_context(|| format!("clear {}", stage.display()))?;
    }
    let result = async {
        let t = build(stage.clone()).await?;
        publish(&stage, out)?;
        Ok(t)
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&stage);
    }
    result
}

async fn restore_cell(a: RestoreCellArgs) -> anyhow::Result<()> {
    let controllers = members("--controllers", &a.controllers)?;
    staging(&a.out)?;
    let options = a.bucket.options(&a.cell);
    let bucket = Bucket::open(&options)?;
    let (restored, state) = stele_controller::backup::read_latest(&bucket.controller, &a.cell)
        .await
        .with_context(|| format!("controller state of cell {} in {}", a.cell, a.bucket.from))?;
    for note in &restored.notes {
        eprintln!("warning: {note}");
    }
    let plans = plan(&state);
    let tier = stele_node::tier::Tier::open(options)
        .with_context(|| format!("object store {}", a.bucket.from))?;
    let manifests = stele_node::tier::restore_cell::latest_manifests(&tier)
        .await
        .with_context(|| format!("manifests of cell {}", a.cell))?;
    let newer: Vec<u64> = manifests
        .keys()
        .filter(|t| !state.tablets.contains_key(t))
        .copied()
        .collect();
    let log_index = restored.backup.log_index;
    let progress = super::progress::Progress::bytes(&format!("restoring cell {}", a.cell), false);
    progress.set_total(
        plans
            .values()
            .map(|p| stele_node::tier::restore_cell::bytes_to_fetch(p, &manifests))
            .sum(),
    );
    let (controllers_ref, plans_ref, tier_ref, manifests_ref, state_ref, progress_ref) =
        (&controllers, &plans, &tier, &manifests, &state, &progress);
    let lines = staged(&a.out, |stage| async move {
        let mut lines = Vec::new();
        for (id, ep) in controllers_ref {
            let dir = stage.join(format!("controller-{id}"));
            stele_controller::backup::seed(&dir, controllers_ref, state_ref, log_index)
                .with_context(|| format!("seed controller {id} ({ep})"))?;
        }
        for (node, replicas) in plans_ref {
            let dir = stage.join(format!("node-{node}"));
            let r = stele_node::tier::restore_cell::restore_node(
                tier_ref,
                &dir,
                replicas,
                manifests_ref,
                progress_ref,
            )
            .await
            .with_context(|| format!("node {node}"))?;
            let rows: u64 = r.replicas.iter().map(|x| x.3).sum();
            let segments: usize = r.replicas.iter().map(|x| x.2).sum();
            let empty: Vec<u64> = r
                .replicas
                .iter()
                .filter(|x| x.1 == 0)
                .map(|x| x.0)
                .collect();
            lines.push(format!(
                "node {node}: {} replicas, {segments} segments, {rows} rows, {} bytes{}",
                r.replicas.len(),
                r.bytes,
                if empty.is_empty() {
                    String::new()
                } else {
                    format!(" (tablets {empty:?} had no manifest: restored empty)")
                }
            ));
        }
        Ok(lines)
    })
    .await
    .with_context(|| format!("restore cell {} into {}", a.cell, a.out.display()));
    match &lines {
        Ok(_) => progress.finish(),
        Err(_) => progress.abandon(),
    }
    let lines = lines?;
    let b = &restored.backup;
    println!(
        "cell {}: controller state of log index {} (term {}, written by controller {} at {} ms since the epoch): {} tablets, {} nodes",
        a.cell,
        b.log_index,
        b.term,
        b.writer,
        b.written_at_ms,
        state.tablets.len(),
        plans.len()
    );
    if !newer.is_empty() {
        println!(
            "warning: tablets {newer:?} have manifests but are not in the controller state (made after its backup): not restored"
        );
    }
    for line in &lines {
        println!("{line}");
    }
    let out = a.out.display();
    let ctl = a.controllers.join(",");
    for id in controllers.keys() {
        println!(
            "start controller {id}: stele server --roles controller --controller-id {id} --data-dir {out}/controller-{id} --listen HOST:PORT --object-store {} --cell-id {}",
            a.bucket.from, a.cell
        );
    }
    for node in plans.keys() {
        println!(
            "start node {node}: stele server --node-id {node} --data-dir {out}/node-{node} --controllers {ctl} --object-store {} --cell-id {} --listen ... --peer-listen ... --certs ...",
            a.bucket.from, a.cell
        );
    }
    Ok(())
}

/// Each node's replicas as the controller state places them: the desired
/// voters plus a replica still leaving (a move in flight), which the
/// restored controllers then finish.
fn plan(
    state: &stele_controller::state::CellState,
) -> BTreeMap<u64, Vec<stele_node::tier::restore_cell::ReplicaPlan>> {
    let mut out: BTreeMap<u64, Vec<_>> = BTreeMap::new();
    for t in state.tablets.values() {
        let replicas: Vec<_> = t.voters.iter().chain(t.leaving.iter()).collect();
        let voters: Vec<u64> = replicas.iter().map(|r| r.replica_id).collect();
        for r in replicas {
            out.entry(r.node)
                .or_default()
                .push(stele_node::tier::restore_cell::ReplicaPlan {
                    tablet: t.id,
                    replica_id: r.replica_id,
                    vshard_lo: t.lo,
                    vshard_hi: t.hi,
                    range_generation: t.range_generation,
                    voters: voters.clone(),
                });
        }
    }
    out
}

async fn restore_directory(a: RestoreDirectoryArgs) -> anyhow::Result<()> {
    let members = members("--members", &a.members)?;
    staging(&a.out)?;
    let bucket = Bucket::open(&a.bucket.options("directory"))?;
    let restored = stele_directory::backup::read_latest(&bucket.directory)
        .await
        .with_context(|| format!("directory state in {}", a.bucket.from))?;
    for note in &restored.notes {
        eprintln!("warning: {note}");
    }
    staged(&a.out, |stage| async move {
        for id in members.keys() {
            let dir = stage.join(format!("directory-{id}"));
            stele_directory::backup::seed(
                &dir,
                &members,
                &restored.backup.state,
                restored.backup.log_index,
            )
            .with_context(|| format!("seed directory member {id}"))?;
        }
        Ok(())
    })
    .await?;
    println!(
        "directory: state of log index {} restored for {} members into {}",
        restored.backup.log_index,
        a.members.len(),
        a.out.display()
    );
    Ok(())
}
