//! `stele gateway` processes and plain HTTP/1.1 requests to them (no HTTP
//! client crate: a request is a few lines on a socket, which also lets a
//! test hold a request open half sent).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::{Proc, stele_bin, tls};

/// A running gateway and its HTTP port.
pub struct Gateway {
    pub proc: Proc,
    pub port: u16,
}

impl Gateway {
    /// `stele gateway --controllers CTL --http-listen 127.0.0.1:0 EXTRA`,
    /// calling the cell with the test CA's operator certificate.
    pub fn start(controllers: &str, extra: &[&str]) -> Gateway {
        Gateway::start_with(&["--controllers", controllers], extra)
    }

    /// `stele gateway --nodes NODES ...`: routes relayed by the nodes.
    pub fn through_nodes(nodes: &str, extra: &[&str]) -> Gateway {
        Gateway::start_with(&["--nodes", nodes], extra)
    }

    fn start_with(route_from: &[&str], extra: &[&str]) -> Gateway {
        let certs = tls::test_ca().operator.to_str().unwrap().to_string();
        let mut args = vec!["gateway"];
        args.extend_from_slice(route_from);
        args.extend_from_slice(&["--http-listen", "127.0.0.1:0"]);
        args.extend_from_slice(extra);
        let proc = Proc::start_bin(&stele_bin(), &args, &[("STELE_CERTS_DIR", &certs)])
            .unwrap_or_else(|e| panic!("gateway: {e}"));
        let port = proc
            .endpoint
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {:?}", proc.endpoint));
        Gateway { proc, port }
    }

    /// The gRPC front's endpoint (`--grpc-listen`), from its start line.
    pub fn grpc_endpoint(&self) -> String {
        self.proc
            .started
            .iter()
            .find_map(|l| l.split("(stele.v1.Data) at ").nth(1))
            .unwrap_or_else(|| panic!("no gRPC line in {:?}", self.proc.started))
            .trim()
            .to_string()
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        request(self.port, method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// `POST /v1/namespaces/NS/records` with a JSON body.
    pub fn append(&self, ns: &str, body: &serde_json::Value, idem: Option<&str>) -> Resp {
        let mut h = vec![("Content-Type", "application/json")];
        if let Some(k) = idem {
            h.push(("Idempotency-Key", k));
        }
        self.call(
            "POST",
            &format!("/v1/namespaces/{ns}/records"),
            &h,
            body.to_string().as_bytes(),
        )
    }

    /// Every row of the namespace through the paged scan, `limit` a page.
    pub fn scan_all(&self, ns: &str, limit: u32) -> Vec<serde_json::Value> {
        let mut rows = Vec::new();
        let mut cursor = String::new();
        loop {
            let r = self.call(
                "GET",
                &format!("/v1/namespaces/{ns}/records?limit={limit}&cursor={cursor}"),
                &[],
                b"",
            );
            assert_eq!(r.status, 200, "scan: {}", r.body);
            let page = r.json();
            rows.extend(page["rows"].as_array().unwrap().iter().cloned());
            match page["next_cursor"].as_str() {
                Some(c) => cursor = c.to_string(),
                None => return rows,
            }
        }
    }
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The typed error's kind, if this is one.
    pub fn kind(&self) -> String {
        serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["kind"].as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// Sends the head of a request (with `Content-Length: declared`) and
/// returns the open connection, to send the body later or never.
pub fn send_head(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    declared: usize,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {declared}\r\n"
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    Ok(s)
}

/// Reads an answer to its end (the connection closes after it).
pub fn read_answer(mut s: TcpStream) -> std::io::Result<Resp> {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other(format!("no HTTP answer: {text:?}")))?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {head:?}")))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Ok(Resp {
        status,
        headers,
        body: body.to_string(),
    })
}

/// One request: head, body, answer.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Resp> {
    let mut s = send_head(port, method, path, headers, body.len())?;
    s.write_all(body)?;
    read_answer(s)
}
