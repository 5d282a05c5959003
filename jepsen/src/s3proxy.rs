//! A TCP proxy between the nodes and the S3 server (moto), for the `s3`
//! nemesis: it passes bytes through, stalls every connection (requests
//! hang mid-flight, as a saturated or wedged endpoint does), or answers
//! each request `503 Slow Down` and closes (as S3 does under throttling).
//!
//! ```text
//! node ──HTTP──▶ proxy (runner) ──▶ moto
//!                 │ Pass:  copy both ways
//!                 │ Stall: stop copying; new connections are held
//!                 │ Fail:  open connections cut; each new request gets 503
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    Stall,
    Fail,
}

pub struct S3Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bytes forwarded to the server and back.
    bytes: Arc<[AtomicU64; 2]>,
    task: tokio::task::JoinHandle<()>,
}

impl S3Proxy {
    /// Listens on `listen` (port 0: any) and forwards to `upstream`. Must
    /// be called within a tokio runtime.
    pub fn start(listen: SocketAddr, upstream: SocketAddr) -> anyhow::Result<S3Proxy> {
        let listener = std::net::TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = TcpListener::from_std(listener)?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let bytes: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let counters = bytes.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    continue;
                };
                let (rx, counters) = (rx.clone(), counters.clone());
                tokio::spawn(async move {
                    let _ = serve(conn, upstream, rx, &counters).await;
                });
            }
        });
        Ok(S3Proxy {
            addr,
            mode,
            bytes,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Bytes forwarded so far: (to the server, back to the nodes).
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.bytes[0].load(Ordering::Relaxed),
            self.bytes[1].load(Ordering::Relaxed),
        )
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for S3Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until the mode is not `Stall`; the mode then.
async fn unstalled(rx: &mut watch::Receiver<Mode>) -> Mode {
    match rx.wait_for(|m| *m != Mode::Stall).await {
        Ok(m) => *m,
        Err(_) => Mode::Fail,
    }
}

async fn serve(
    mut conn: TcpStream,
    upstream: SocketAddr,
    mut rx: watch::Receiver<Mode>,
    bytes: &[AtomicU64; 2],
) -> std::io::Result<()> {
    if unstalled(&mut rx).await == Mode::Fail {
        return refuse(conn).await;
    }
    let mut up = TcpStream::connect(upstream).await?;
    let (mut cr, mut cw) = conn.split();
    let (mut ur, mut uw) = up.split();
    let mut rx2 = rx.clone();
    let to_up = pump(&mut cr, &mut uw, &mut rx, &bytes[0]);
    let to_client = pump(&mut ur, &mut cw, &mut rx2, &bytes[1]);
    tokio::select! {
        r = to_up => r,
        r = to_client => r,
    }
}

/// Copies `from` to `to` while the mode allows: a stall holds the bytes
/// read so far, a failure ends the connection.
async fn pump<R, W>(
    from: &mut R,
    to: &mut W,
    rx: &mut watch::Receiver<Mode>,
    count: &AtomicU64,
) -> std::io::Result<()>
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            n = from.read(&mut buf) => n?,
            _ = rx.wait_for(|m| *m == Mode::Fail) => return Ok(()),
        };
        if n == 0 {
            return to.shutdown().await;
        }
        if unstalled(rx).await == Mode::Fail {
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Reads one request's head and answers `503 Slow Down`, then closes.
async fn refuse(mut conn: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code><Message>injected by the s3 nemesis</Message></Error>";
    let resp = format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An upstream that answers every request line with `ok`.
    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut c, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = c.read(&mut buf).await {
                        if n == 0 || c.write_all(b"ok").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn ask(c: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        c.write_all(b"GET / HTTP/1.1\r\n\r\n").await?;
        let mut buf = vec![0u8; 4096];
        let n = c.read(&mut buf).await?;
        buf.truncate(n);
        Ok(buf)
    }

    #[tokio::test]
    async fn passes_stalls_and_fails_requests() {
        let up = echo_server().await;
        let proxy = S3Proxy::start("127.0.0.1:0".parse().unwrap(), up).unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(ask(&mut c).await.unwrap(), b"ok");
        // A stall holds an open connection's request until it ends.
        proxy.set(Mode::Stall);
        let held = tokio::time::timeout(Duration::from_millis(300), ask(&mut c)).await;
        assert!(held.is_err(), "answered during a stall");
        proxy.set(Mode::Pass);
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"ok", "the held request goes through after");
        // A failure cuts open connections and answers new ones 503.
        proxy.set(Mode::Fail);
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "an open connection is cut");
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        let resp = ask(&mut fresh).await.unwrap();
        assert!(
            resp.starts_with(b"HTTP/1.1 503"),
            "{}",
            String::from_utf8_lossy(&resp)
        );
        proxy.set(Mode::Pass);
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(ask(&mut again).await.unwrap(), b"ok");
        let (up_bytes, down_bytes) = proxy.bytes();
        assert!(up_bytes > 0 && down_bytes > 0, "{up_bytes} {down_bytes}");
    }
}
