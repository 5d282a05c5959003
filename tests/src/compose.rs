//! A cell of containers from `deploy/compose.yaml` for the Docker tests:
//! the image from `deploy/build-image` (the binary under test, nothing
//! pulled), certificates from `stele cert` as the walk-through issues them
//! (every gRPC listener TLS, the `cli` container an operator), and a
//! Compose project of its own, taken down with its volumes and image when
//! dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{run, stele_bin};

/// Whether a Docker daemon answers (`docker info`).
pub fn docker_answers() -> bool {
    Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The members of the compose cell.
pub const CONTROLLERS: [&str; 3] = ["ctl1", "ctl2", "ctl3"];
pub const NODES: [&str; 3] = ["node1", "node2", "node3"];
/// The HTTP status port of every member, inside its container.
pub const HTTP_PORT: u16 = 7480;

pub struct ComposeCell {
    pub project: String,
    pub image: String,
    root: PathBuf,
    certs: tempfile::TempDir,
    /// `docker compose` (the plugin) or `docker-compose` (Compose v1).
    compose: Vec<&'static str>,
}

fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl ComposeCell {
    /// Builds the image from the binary under test (`deploy/build-image
    /// --no-build`) and makes the certificates; starts nothing.
    pub fn build() -> ComposeCell {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root")
            .to_path_buf();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let project = format!("stele-test-{}-{nanos}", std::process::id());
        let image = format!("stele:{project}");
        let bin = stele_bin();
        let profile = bin
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|p| p.to_str())
            .unwrap_or("debug")
            .to_string();
        let out = Command::new(root.join("deploy/build-image"))
            .args(["--no-build", "--tag", &image])
            .env("STELE_BUILD_PROFILE", &profile)
            .output()
            .expect("run deploy/build-image");
        assert!(
            out.status.success(),
            "deploy/build-image: {}",
            output_text(&out)
        );
        let certs = tempfile::tempdir().unwrap();
        make_certs(certs.path());
        let compose = if Command::new("docker")
            .args(["compose", "version"])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            vec!["docker", "compose"]
        } else {
            vec!["docker-compose"]
        };
        ComposeCell {
            project,
            image,
            root,
            certs,
            compose,
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(self.compose[0]);
        c.args(&self.compose[1..])
            .arg("-f")
            .arg(self.root.join("deploy/compose.yaml"))
            .env("COMPOSE_PROJECT_NAME", &self.project)
            .env("STELE_IMAGE", &self.image)
            .env("STELE_CERTS", self.certs.path());
        c
    }

    /// `docker compose <args>` for this project; panics with its output
    /// when it fails.
    pub fn compose(&self, args: &[&str]) -> String {
        let out = self
            .command()
            .args(args)
            .output()
            .expect("run docker compose");
        assert!(
            out.status.success(),
            "docker compose {args:?}: {}",
            output_text(&out)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `stele <args>` in a client container on the cell network (the
    /// `tools` profile's `cli`): (success, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let out = self
            .command()
            .args(["run", "--rm", "-T", "cli"])
            .args(args)
            .output()
            .expect("run docker compose run");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    /// Starts `stele <args>` in a client container named `name` and
    /// returns at once (stdout piped); `docker kill -s SIGTERM name`
    /// stops it.
    pub fn spawn_cli(&self, name: &str, args: &[&str]) -> Child {
        self.command()
            .args(["run", "--rm", "-T", "--name", name, "cli"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn docker compose run")
    }

    /// The container id of a service.
    pub fn container(&self, service: &str) -> String {
        let id = self.compose(&["ps", "-q", service]).trim().to_string();
        assert!(!id.is_empty(), "no container for {service}");
        id
    }

    /// The cell's network (`<project>_cell`).
    pub fn network(&self) -> String {
        format!("{}_cell", self.project)
    }

    /// The host port (on 127.0.0.1) a service's container port is
    /// published on, if it is.
    pub fn host_port(&self, service: &str, port: u16) -> Option<u16> {
        let out = self
            .command()
            .args(["port", service, &port.to_string()])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let addr = text.trim();
        if !addr.starts_with("127.0.0.1:") {
            return None;
        }
        addr.rsplit(':').next()?.parse().ok()
    }

    /// The HTTP status code of `path` on a service's status port, from the
    /// host (None: no answer).
    pub fn http_status(&self, service: &str, path: &str) -> Option<u16> {
        let port = self.host_port(service, HTTP_PORT)?;
        let out = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-m", "2", "-w", "%{http_code}"])
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .ok()
            .filter(|c| *c != 0)
    }

    /// Waits until `path` answers 200 on a service (`/healthz`, `/readyz`).
    pub fn wait_http(&self, service: &str, path: &str, timeout: Duration) {
        let started = Instant::now();
        loop {
            let status = self.http_status(service, path);
            if status == Some(200) {
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "{service} {path} not 200 after {timeout:?} (last {status:?}); logs:\n{}",
                self.logs(service)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until every member answers `/readyz`.
    pub fn wait_all_ready(&self, timeout: Duration) {
        for s in CONTROLLERS.iter().chain(NODES.iter()) {
            self.wait_http(s, "/readyz", timeout);
        }
    }

    /// The last lines a service logged.
    pub fn logs(&self, service: &str) -> String {
        self.command()
            .args(["logs", "--no-color", "--tail", "40", service])
            .output()
            .map(|o| output_text(&o))
            .unwrap_or_default()
    }
}

/// `docker <args>`; panics with its output when it fails.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("run docker");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        output_text(&out)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The walk-through's certificates (docs/OPERATIONS.md "Deploy a cell"),
/// in `root`: the CA, `ctl-N`, `node-N`, `dir-1` and `operator` (the
/// `cli` container's), each directory readable by the image's uid.
fn make_certs(root: &Path) {
    let ca = root.join("ca");
    let ca = ca.to_str().unwrap();
    let (ok, _, err) = run(&["cert", "init", "--out", ca]);
    assert!(ok, "stele cert init: {err}");
    let mut issued = Vec::new();
    for n in 1..=NODES.len() {
        issued.push((format!("ctl-{n}"), "--controller-id", n));
        issued.push((format!("node-{n}"), "--node-id", n));
    }
    issued.push(("dir-1".to_string(), "--directory-id", 1));
    for (dir, flag, id) in &issued {
        let out = root.join(dir);
        let id = id.to_string();
        let args = [
            "cert",
            "issue",
            "--ca",
            ca,
            *flag,
            &id,
            "--out",
            out.to_str().unwrap(),
        ];
        let (ok, _, err) = run(&args);
        assert!(ok, "stele cert issue {flag} {id}: {err}");
    }
    let operator = root.join("operator");
    let args = [
        "cert",
        "operator",
        "--ca",
        ca,
        "--name",
        "admin",
        "--out",
        operator.to_str().unwrap(),
    ];
    let (ok, _, err) = run(&args);
    assert!(ok, "stele cert operator: {err}");
    // The image runs as uid 10001; the temporary directory around these
    // stays private to this user on the host.
    for (dir, _, _) in &issued {
        make_readable(&root.join(dir));
    }
    make_readable(&operator);
}

fn make_readable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

impl Drop for ComposeCell {
    fn drop(&mut self) {
        let _ = self
            .command()
            .args(["down", "-v", "--remove-orphans", "-t", "5"])
            .output();
        let _ = Command::new("docker")
            .args(["image", "rm", "-f", &self.image])
            .output();
    }
}
