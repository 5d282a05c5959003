//! The web console (docs/OPERATIONS.md "Console") of a running
//! `stele dev --nodes 3`.
//!
//! - Without a browser: the page, its assets and `/api/console` as served
//!   (security headers, the view's nodes and tablets), and no route that
//!   changes anything; the directory's namespaces by cell (`--cells 2`).
//! - In a real browser: `tests/browser/console.py` (headless Debian
//!   Chromium driven by Playwright from PyPI) reads the DOM: three nodes
//!   and every tablet, a node killed with SIGKILL marked dead within the
//!   lease, a split shown as an intent; it saves
//!   `target/console-screenshot.png`. Ignored by default (it needs
//!   Chromium and the Playwright venv that `scripts/lib.sh`'s
//!   `ensure_browser` installs); `scripts/test` runs it.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stele_tests::Proc;

/// Status line, headers and body of one HTTP/1.0 request.
fn http(port: u16, method: &str, path: &str) -> (String, String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase(), body.to_string())
}

/// The port of the console `stele dev` printed for the cell.
fn console_port(proc: &Proc) -> u16 {
    let line = proc
        .started
        .iter()
        .find(|l| l.contains("stele dev: cell console at http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no console URL printed: {:?}", proc.started));
    let url = line.rsplit(' ').next().unwrap();
    url.trim_start_matches("http://127.0.0.1:")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|_| panic!("no port in {line}"))
}

fn start_dev(dir: &std::path::Path) -> Proc {
    let listen = format!("127.0.0.1:{}", stele_tests::free_port_base(3));
    let d = dir.to_str().unwrap();
    let args = [
        "dev",
        "--nodes",
        "3",
        "--data-dir",
        d,
        "--listen",
        &listen,
        "--tablets",
        "4",
        "--election-timeout-ms",
        "1000",
    ];
    Proc::start(&args, &[]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_serves_its_page_and_the_cells_view() {
    let dir = tempfile::tempdir().unwrap();
    let proc = start_dev(dir.path());
    let port = console_port(&proc);
    let (status, headers, body) = http(port, "GET", "/");
    assert!(status.contains("200"), "{status}");
    assert!(headers.contains("content-security-policy: default-src 'none'"));
    assert!(body.contains("<script src=\"/console.js\""), "{body}");
    for asset in ["/console.js", "/console.css"] {
        let (status, headers, _) = http(port, "GET", asset);
        assert!(status.contains("200"), "{asset}: {status}");
        assert!(headers.contains("x-content-type-options: nosniff"));
    }
    // The view: three nodes up and four tablets once every node heartbeats.
    let started = Instant::now();
    let view = loop {
        let (status, headers, body) = http(port, "GET", "/api/console");
        assert!(status.contains("200"), "{status}");
        assert!(headers.contains("application/json"), "{headers}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let c = &v["controller"];
        let up = c["nodes"]
            .as_array()
            .map_or(0, |n| n.iter().filter(|n| n["state"] == "up").count());
        if up == 3 && c["tablets"].as_array().is_some_and(|t| t.len() == 4) {
            break v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never three nodes up and four tablets: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let c = &view["controller"];
    assert_eq!(c["leading"], true);
    assert_eq!(c["lease_ms"], 10_000);
    assert!(
        view["directory"].is_null(),
        "no directory in a one-cell dev"
    );
    for t in c["tablets"].as_array().unwrap() {
        assert_eq!(t["voters"].as_array().unwrap().len(), 3, "{t}");
        assert_eq!(t["health"], "ok", "{t}");
    }
    // Read-only: nothing answers a mutation.
    for method in ["POST", "PUT", "DELETE"] {
        for path in ["/", "/api/console"] {
            let (status, _, _) = http(port, method, path);
            assert!(status.contains("405"), "{method} {path}: {status}");
        }
    }
    proc.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_console_shows_namespaces_by_cell() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", stele_tests::free_port_base(3));
    let d = dir.path().to_str().unwrap();
    let args = [
        "dev",
        "--cells",
        "2",
        "--data-dir",
        d,
        "--listen",
        &listen,
        "--tablets",
        "2",
        "--election-timeout-ms",
        "1000",
    ];
    let proc = Proc::start(&args, &[]).unwrap();
    for cell in ["c1", "c2"] {
        let want = format!("stele dev: cell {cell} console at http://127.0.0.1:");
        assert!(
            proc.started.iter().any(|l| l.contains(&want)),
            "no console of {cell}: {:?}",
            proc.started
        );
    }
    let line = proc
        .started
        .iter()
        .find(|l| l.contains("stele dev: console (namespaces by cell) at "))
        .unwrap_or_else(|| panic!("no directory console: {:?}", proc.started));
    let port: u16 = line
        .rsplit("127.0.0.1:")
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let directory = format!("http://{listen}");
    let (ok, out, err) = stele_tests::run(&[
        "append",
        "--directory",
        &directory,
        "--namespace",
        "console/dir",
        "--key",
        "k",
        "--value",
        "v",
    ]);
    assert!(ok, "{out}{err}");
    let (status, _, body) = http(port, "GET", "/api/console");
    assert!(status.contains("200"), "{status}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["controller"].is_null(), "the directory runs alone: {v}");
    let cells = v["directory"]["cells"].as_array().expect("cells");
    let ids: Vec<&str> = cells.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["c1", "c2"], "{v}");
    let holders: Vec<&str> = cells
        .iter()
        .filter(|c| {
            c["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == "console/dir")
        })
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(holders.len(), 1, "one cell holds the namespace: {v}");
    proc.terminate();
}

/// The workspace root (the browser script's paths are relative to it).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
#[ignore = "needs Chromium and Playwright; scripts/test runs it"]
fn the_console_in_a_browser_shows_the_cell_a_dead_node_and_a_split() {
    let python = std::env::var("STELE_BROWSER_PYTHON").map_or_else(
        |_| stele_tests::target_dir().join("browser-venv/bin/python"),
        PathBuf::from,
    );
    let chromium = std::env::var("STELE_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        python.exists() && PathBuf::from(&chromium).exists(),
        "no {} or {chromium}: run scripts/lib.sh's ensure_browser (scripts/test does)",
        python.display()
    );
    let screenshot = stele_tests::target_dir().join("console-screenshot.png");
    let _ = std::fs::remove_file(&screenshot);
    let base = stele_tests::free_port_base(3).to_string();
    let mut child = Command::new(&python)
        .arg(root().join("tests/browser/console.py"))
        .args(["--stele", stele_tests::stele_bin().to_str().unwrap()])
        .args(["--port-base", &base])
        .args(["--chromium", &chromium])
        .arg("--screenshot")
        .arg(&screenshot)
        .args(["--deadline-s", "110"])
        .stdin(Stdio::null())
        .spawn()
        .expect("start the browser script");
    // The script bounds itself; this bounds a script that hangs anyway.
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(150) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the browser script ran past 150 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "the browser script failed: {status}");
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a screenshot: {} bytes",
        png.len()
    );
}
