//! `stele dev --nodes N` (N > 1): a whole cell on loopback, one `stele
//! server` child process per node, certificates made on first start. Node
//! 1's process also runs the cell's one controller; every node registers
//! with it, and the controller places each tablet's voters (3 when N >= 3,
//! else 1) once the nodes are up.
//!
//! ```text
//! <data>/certs/ca, <data>/certs/node-<i>     cell CA and node certificates
//! <data>/node-<i>/                           each node's data directory
//! <data>/node-1/controller/                  the controller's quorum log
//! controller  http://127.0.0.1:<port>        (node 1's client port)
//! client API  127.0.0.1:<port + i - 1>       (port from --listen)
//! peer QUIC   127.0.0.1:<port + 100 + i - 1>
//! ```
//!
//! `stele dev --cells C` (C > 1): a one-member directory on `--listen`
//! (auto-creating namespaces on first use) and C such cells, `c1`..`cC`,
//! each registered with it; every node checks namespaces against it.
//!
//! ```text
//! <data>/directory/                          the directory's quorum log
//! <data>/cell-<c>/certs, <data>/cell-<c>/node-<i>
//! directory   http://127.0.0.1:<port>
//! client API  127.0.0.1:<port + 1 + (c - 1) N + i - 1>   (N: --nodes)
//! peer QUIC   that + 100
//! ```

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// The server flags a child needs besides its identity, addresses and peers.
pub struct ChildFlags {
    pub tablets: u32,
    pub tuning: Vec<String>,
    /// Environment of every node (the S3 keys: never on a command line).
    pub env: Vec<(String, String)>,
}

fn ensure_certs(dir: &Path, nodes: u64) -> anyhow::Result<()> {
    let ca = dir.join("ca");
    if !ca.join(stele_node::certs::CA_CERT_FILE).exists() {
        stele_node::certs::init_ca(&ca).context("create the dev cell CA")?;
    }
    for n in 1..=nodes {
        let out = dir.join(format!("node-{n}"));
        if !out.join(stele_node::certs::NODE_CERT_FILE).exists() {
            stele_node::certs::issue_node(&ca, n, &out)
                .with_context(|| format!("issue node {n} certificate"))?;
        }
    }
    Ok(())
}

/// Prints a line; a closed stdout is not a reason to stop the cell.
/// Every member's HTTP status listener: a free port on the cell's address
/// (printed by the member, relayed by `dev`).
fn http_any(ip: std::net::IpAddr) -> String {
    SocketAddr::new(ip, 0).to_string()
}

fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A node of a dev cell gets SIGTERM when `stele dev` dies, however it
/// dies (even SIGKILL), so no node outlives the cell that started it.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl(2), which is async-signal-safe and touches no memory of
    // the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[allow(unsafe_code)]
fn terminate(child: &Child) {
    // SAFETY: kill(2) on the pid of a child this process spawned and has
    // not yet reaped; no memory is involved.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
}

/// Creates the cell through its controller (nothing when it exists).
async fn init_cell(
    controller: &str,
    tablets: u32,
    replication: u32,
    cell_id: &str,
) -> anyhow::Result<bool> {
    let admin = stele_client::admin::Admin::new(vec![controller.to_string()])?;
    let req = stele_proto::pb::InitRequest {
        controllers: vec![stele_proto::pb::ControllerPeer {
            id: 1,
            endpoint: controller.to_string(),
        }],
        tablets,
        replication,
        cell_id: cell_id.into(),
    };
    let resp = admin
        .call(|mut c| {
            let req = req.clone();
            async move { c.init(req).await }
        })
        .await?;
    Ok(resp.created)
}

/// Waits until every tablet has its voters and a leader (the route map
/// names a leader for each), for 60 s plus 10 ms a tablet: each node
/// creates its replicas at a few hundred a second, one catalog commit
/// each, so 10,000 tablets take a minute or more on a slow disk.
async fn wait_ready(controller: &str, tablets: u32) -> anyhow::Result<()> {
    let admin = stele_client::admin::Admin::new(vec![controller.to_string()])?;
    let started = std::time::Instant::now();
    let deadline =
        std::time::Duration::from_secs(60) + std::time::Duration::from_millis(10) * tablets;
    loop {
        let routes = admin
            .call(|mut c| async move {
                c.get_routes(stele_proto::pb::GetRoutesRequest {
                    since_generation: 0,
                })
                .await
            })
            .await?;
        if routes.tablets.len() == tablets as usize
            && routes.tablets.iter().all(|t| !t.leader_endpoint.is_empty())
        {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < deadline,
            "the dev cell did not place and elect every tablet within {} s",
            deadline.as_secs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Turns on the newest tablet log format (coalesced appends) and delta
/// heartbeats: every member of a dev cell runs this binary. Nothing when
/// they are on already.
async fn enable_formats(controller: &str) -> anyhow::Result<()> {
    use stele_proto::formats::{HEARTBEAT, HEARTBEAT_MAX, LOG, LOG_MAX};
    let admin = stele_client::admin::Admin::new(vec![controller.to_string()])?;
    for (name, version) in [(LOG, LOG_MAX), (HEARTBEAT, HEARTBEAT_MAX)] {
        let req = stele_proto::pb::EnableFormatRequest {
            name: name.into(),
            version,
        };
        admin
            .call(|mut c| {
                let req = req.clone();
                async move { c.enable_format(req).await }
            })
            .await
            .with_context(|| format!("enable {name} format {version}"))?;
    }
    Ok(())
}

/// Creates the one-member directory (nothing when it exists) and registers
/// the cells with it.
async fn init_directory(directory: &str, cells: &[(String, String)]) -> anyhow::Result<()> {
    let dir = stele_client::admin::DirectoryAdmin::new(vec![directory.to_string()])?;
    let req = stele_proto::pb::DirectoryInitRequest {
        members: vec![stele_proto::pb::DirectoryPeer {
            id: 1,
            endpoint: directory.to_string(),
        }],
    };
    dir.call(|mut c| {
        let req = req.clone();
        async move { c.directory_init(req).await }
    })
    .await?;
    for (id, controller) in cells {
        let req = stele_proto::pb::RegisterCellRequest {
            id: id.clone(),
            controllers: vec![controller.clone()],
            labels: [("region".to_string(), "dev".to_string())].into(),
        };
        dir.call(|mut c| {
            let req = req.clone();
            async move { c.register_cell(req).await }
        })
        .await?;
    }
    Ok(())
}

/// One cell of a dev run.
struct DevCell {
    id: String,
    dir: std::path::PathBuf,
    /// Client port of node 1 (node i: `base + i - 1`; peer port `+ 100`).
    base: u16,
}

/// Runs the cell (or cells and a directory) until Ctrl-C or SIGTERM, then
/// stops every process.
pub async fn run(
    data_dir: &Path,
    listen: SocketAddr,
    cells: u64,
    nodes: u64,
    flags: ChildFlags,
) -> anyhow::Result<()> {
    anyhow::ensure!((1..=9).contains(&cells), "--cells must be 1 to 9");
    anyhow::ensure!(
        (1..=9).contains(&nodes) && (cells > 1 || nodes > 1),
        "--nodes must be 1 to 9 for a dev cell"
    );
    anyhow::ensure!(
        listen.port() != 0 && u32::from(listen.port()) + 200 <= 65_535,
        "a dev cell of several processes needs a fixed --listen port (peers must know each other's addresses)"
    );
    std::fs::create_dir_all(data_dir).with_context(|| format!("create {}", data_dir.display()))?;
    let ip = listen.ip();
    let directory = (cells > 1).then(|| format!("http://{listen}"));
    let dev_cells: Vec<DevCell> = if cells == 1 {
        vec![DevCell {
            id: String::new(),
            dir: data_dir.to_path_buf(),
            base: listen.port(),
        }]
    } else {
        (1..=cells)
            .map(|c| DevCell {
                id: format!("c{c}"),
                dir: data_dir.join(format!("cell-{c}")),
                base: listen.port() + 1 + ((c - 1) * nodes) as u16,
            })
            .collect()
    };
    let exe = std::env::current_exe().context("locate the stele binary")?;
    let mut children: Vec<(String, Child)> = Vec::new();
    // Each child's stdout lines, then `None` when it closes (the process
    // is exiting).
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Option<String>)>();
    // Children take every setting as a flag: a STELE_* variable of the
    // parent's environment must not override one (flags win, but a setting
    // `dev` leaves at its default would not).
    let inherited = crate::cmd::config::server_env_vars();
    let mut spawn = |label: String, mut cmd: Command| -> anyhow::Result<()> {
        for v in &inherited {
            cmd.env_remove(v);
        }
        cmd.envs(flags.env.iter().map(|(k, v)| (k, v)));
        // The children log as the parent was told to.
        cmd.env("STELE_LOG_FORMAT", crate::logging::format().name());
        // And export spans where the parent was told to (`--otlp-endpoint`).
        if let Some(url) = crate::otel::endpoint() {
            cmd.env(crate::otel::ENDPOINT_ENV, url);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_parent(&mut cmd);
        let mut child = cmd.spawn().with_context(|| format!("start {label}"))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let tx = tx.clone();
        let l = label.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((l.clone(), Some(line))).is_err() {
                    return;
                }
            }
            let _ = tx.send((l, None));
        });
        children.push((label, child));
        Ok(())
    };
    if let Some(_dir) = &directory {
        let mut cmd = Command::new(&exe);
        cmd.args(["server", "--roles", "directory", "--directory-id", "1"])
            .args(["--listen", &listen.to_string()])
            .args(["--http-listen", &http_any(ip)])
            .arg("--data-dir")
            .arg(data_dir.join("directory"))
            .arg("--auto-create-namespaces");
        spawn("directory".into(), cmd)?;
    }
    for cell in &dev_cells {
        let certs = cell.dir.join("certs");
        ensure_certs(&certs, nodes)?;
        let client = |n: u64| SocketAddr::new(ip, cell.base + (n - 1) as u16);
        let peer = |n: u64| SocketAddr::new(ip, cell.base + 100 + (n - 1) as u16);
        let controller = format!("http://{}", client(1));
        for n in 1..=nodes {
            let mut cmd = Command::new(&exe);
            cmd.arg("server");
            if n == 1 {
                // The cell's one controller lives in node 1's process.
                cmd.args(["--roles", "node,controller", "--controller-id", "1"]);
            }
            cmd.args(["--node-id", &n.to_string()])
                .args(["--listen", &client(n).to_string()])
                .args(["--http-listen", &http_any(ip)])
                // Each node serves the HTTP API too (plaintext, loopback).
                .arg("--http-api")
                .args(["--peer-listen", &peer(n).to_string()])
                .arg("--data-dir")
                .arg(cell.dir.join(format!("node-{n}")))
                .arg("--certs")
                .arg(certs.join(format!("node-{n}")))
                // A dev cell is plaintext on loopback; its certificates
                // serve node-to-node QUIC only.
                .arg("--insecure-plaintext")
                .args(["--controllers", &controller])
                // One machine, one zone: placement keeps voters on distinct nodes.
                .args(["--zone", "dev"])
                .args(&flags.tuning);
            if let Some(dir) = &directory {
                cmd.args(["--directory", dir, "--cell-id", &cell.id]);
            }
            let label = if cell.id.is_empty() {
                format!("node {n}")
            } else {
                format!("cell {} node {n}", cell.id)
            };
            spawn(label, cmd)?;
        }
    }
    drop(tx);
    let total = children.len();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut up = 0;
    let mut ready = false;
    let replication = if nodes >= 3 { 3 } else { 1 };
    let result = loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break Ok(()),
            _ = term.recv() => break Ok(()),
            line = rx.recv() => match line {
                Some((label, None)) => {
                    // A process that exits before the cell is ready (a port
                    // in use, a bad data directory) ends the start; later a
                    // node may be stopped or killed on purpose (tests, a
                    // person trying failover) and the others go on.
                    if !ready {
                        break Err(anyhow::anyhow!(
                            "{label} exited while the cell was starting; see its messages above"
                        ));
                    }
                    say(format_args!("stele dev: {label} exited"));
                }
                Some((label, Some(line))) => {
                    if let Some(url) = line.split("HTTP status (/metrics, /healthz, /readyz) at ").nth(1) {
                        say(format_args!("stele dev: {label} HTTP status at {url} (/metrics, /healthz, /readyz)"));
                        // The controller's process (node 1 of a cell) and
                        // the directory serve the console at `/`.
                        if label == "directory" {
                            say(format_args!("stele dev: console (namespaces by cell) at {url}/"));
                        } else if let Some(cell) = label.strip_suffix("node 1") {
                            let cell = match cell.trim() {
                                "" => "cell",
                                c => c,
                            };
                            say(format_args!("stele dev: {cell} console at {url}/"));
                        }
                        continue;
                    }
                    let Some(rest) = line.split("listening on ").nth(1) else {
                        say(format_args!("{label}: {line}"));
                        continue;
                    };
                    up += 1;
                    let endpoint = rest.split_whitespace().next().unwrap_or_default();
                    say(format_args!("stele dev: {label} up at {endpoint} ({up}/{total})"));
                    if up < total {
                        continue;
                    }
                    let mut registered = Vec::new();
                    let mut failed = None;
                    for cell in &dev_cells {
                        let controller = format!("http://{}", SocketAddr::new(ip, cell.base));
                        let id = if cell.id.is_empty() { "dev" } else { cell.id.as_str() };
                        match init_cell(&controller, flags.tablets, replication, id).await {
                            Ok(created) => say(format_args!(
                                "stele dev: cell {id} {} ({} tablets, replication {replication}); controller at {controller}",
                                if created { "created" } else { "reopened" },
                                flags.tablets
                            )),
                            Err(e) => {
                                failed = Some(e.context(format!("create dev cell {id}")));
                                break;
                            }
                        }
                        if let Err(e) = wait_ready(&controller, flags.tablets).await {
                            failed = Some(e);
                            break;
                        }
                        if let Err(e) = enable_formats(&controller).await {
                            failed = Some(e.context(format!("dev cell {id}")));
                            break;
                        }
                        registered.push((id.to_string(), controller));
                    }
                    if let Some(e) = failed {
                        break Err(e);
                    }
                    ready = true;
                    match &directory {
                        Some(dir) => match init_directory(dir, &registered).await {
                            Ok(()) => say(format_args!(
                                "stele dev: cell ready: listening on {dir} (the directory; cells {})",
                                registered.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>().join(", ")
                            )),
                            Err(e) => break Err(e.context("create the dev directory")),
                        },
                        None => say(format_args!(
                            "stele dev: cell ready: listening on {} (every tablet placed and led)",
                            registered[0].1
                        )),
                    }
                }
                None => break Err(anyhow::anyhow!("a process exited; see its messages above")),
            },
        }
    };
    for (_, child) in &children {
        terminate(child);
    }
    for (label, mut child) in children {
        let status = child.wait().with_context(|| format!("wait for {label}"))?;
        if !status.success() {
            eprintln!("{label} exited with {status}");
        }
    }
    result
}
