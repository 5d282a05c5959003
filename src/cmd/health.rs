//! `stele health --addr URL`: one probe of a server's HTTP status listener
//! (`http://HOST:PORT/readyz` or `/healthz`); exits 0 only on 200, so a
//! container healthcheck or a script can use it. Needs nothing in the
//! image but the binary.

use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args)]
pub struct HealthArgs {
    /// The probe's URL, e.g. `http://127.0.0.1:7480/readyz`.
    #[arg(long)]
    addr: String,
    /// Give up after this long, ms.
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
}

pub async fn run(a: HealthArgs) -> anyhow::Result<()> {
    let rest = a
        .addr
        .strip_prefix("http://")
        .with_context(|| format!("--addr {:?}: want http://HOST:PORT/PATH", a.addr))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/readyz"),
    };
    stele_proto::addr::dialable(authority).with_context(|| format!("--addr {:?}", a.addr))?;
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(authority).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut reply = Vec::new();
        s.take(64 * 1024).read_to_end(&mut reply).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&reply).into_owned())
    };
    let reply = tokio::time::timeout(Duration::from_millis(a.timeout_ms), probe)
        .await
        .with_context(|| format!("{}: no answer in {} ms", a.addr, a.timeout_ms))?
        .with_context(|| a.addr.clone())?;
    let status = reply.lines().next().unwrap_or_default();
    let body = reply.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    println!("{code} {body}");
    anyhow::ensure!(code == "200", "{}: {status}: {body}", a.addr);
    Ok(())
}
