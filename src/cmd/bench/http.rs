//! `stele bench --gateway URL`: appends as a producer in another language
//! sends them, one HTTP/1.1 keep-alive connection per worker, each request
//! a JSON array of base64 records (docs/OPERATIONS.md "Gateways and the
//! HTTP API").

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use stele_client::Record;

/// One worker's connection to a gateway.
pub struct HttpAppender {
    authority: String,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl HttpAppender {
    /// `url` is `http://host:port`; connects on first use.
    pub fn new(url: &str) -> anyhow::Result<HttpAppender> {
        let authority = url
            .strip_prefix("http://")
            .context("--gateway takes http://host:port")?
            .trim_end_matches('/')
            .to_string();
        Ok(HttpAppender {
            authority,
            sender: None,
        })
    }

    async fn connect(&mut self) -> anyhow::Result<&mut SendRequest<Full<Bytes>>> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(&self.authority)
                .await
                .with_context(|| format!("connecting to {}", self.authority))?;
            stream.set_nodelay(true)?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("connected"))
    }

    /// Appends `records` to `namespace` in one request; an answer other
    /// than 200 is an error carrying the gateway's typed error.
    pub async fn append(&mut self, namespace: &str, records: &[Record]) -> anyhow::Result<()> {
        let body: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "key": STANDARD.encode(&r.key),
                    "value": STANDARD.encode(&r.value),
                    "ts": r.ts,
                    "encoding": "base64",
                })
            })
            .collect();
        let req = hyper::Request::post(format!("/v1/namespaces/{namespace}/records"))
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&body)?)))?;
        let sender = self.connect().await?;
        let result = sender.send_request(req).await;
        let resp = match result {
            Ok(r) => r,
            Err(e) => {
                self.sender = None;
                return Err(e.into());
            }
        };
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        anyhow::ensure!(
            status == hyper::StatusCode::OK,
            "gateway answered {status}: {}",
            String::from_utf8_lossy(&bytes)
        );
        Ok(())
    }
}
