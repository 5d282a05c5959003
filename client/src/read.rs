//! Reads of one key (its latest record, or its records page by page),
//! sent to the key's tablet leader through the driver.

use stele_proto::limits;
use stele_proto::pb::{self, ReadOptions, Row};
use stele_proto::vshard::vshard;

use crate::driver::{Budget, Target};
use crate::{Client, Result, RouteTable};

/// One page of a scan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScanPage {
    pub rows: Vec<Row>,
    /// `None` when the scan is complete.
    pub next_cursor: Option<Vec<u8>>,
    pub watermark: u64,
    pub missing_tablets: Vec<u64>,
}

impl From<pb::ScanResponse> for ScanPage {
    fn from(r: pb::ScanResponse) -> Self {
        ScanPage {
            rows: r.rows,
            next_cursor: (!r.next_cursor.is_empty()).then_some(r.next_cursor),
            watermark: r.watermark,
            missing_tablets: r.missing_tablets,
        }
    }
}

impl Client {
    /// Where a read of `vshard` goes: its tablet's leader if known, else
    /// the seed node (which answers or redirects).
    pub(crate) fn read_target(&self, routes: &RouteTable, vshard: u32) -> Target<()> {
        match routes.lookup(vshard) {
            Some(r) => Target {
                tablet: Some(r.tablet),
                endpoint: self.endpoint_of(r).to_string(),
                payload: (),
            },
            None => Target {
                tablet: None,
                endpoint: self.inner.seed.clone(),
                payload: (),
            },
        }
    }

    /// The latest record of a key.
    pub async fn get(&self, namespace: &str, key: &[u8], read: ReadOptions) -> Result<Option<Row>> {
        self.get_routed(namespace, key, None, read).await
    }

    /// The latest record of a key written with `routing_key` (it lives in
    /// the routing key's tablet).
    pub async fn get_routed(
        &self,
        namespace: &str,
        key: &[u8],
        routing_key: Option<&[u8]>,
        read: ReadOptions,
    ) -> Result<Option<Row>> {
        limits::validate_namespace(namespace)?;
        limits::validate_key("key", key)?;
        if let Some(r) = routing_key {
            limits::validate_key("routing_key", r)?;
        }
        let req = pb::GetRequest {
            namespace: namespace.to_string(),
            key: key.to_vec(),
            routing_key: routing_key.map(<[u8]>::to_vec),
            read: Some(read),
        };
        let by = routing_key.unwrap_or(key);
        self.drive(
            "get",
            &mut Budget::start(),
            |routes| Ok(self.read_target(routes, vshard(namespace, by))),
            |mut c, _| {
                let req = req.clone();
                async move { c.get(req).await }
            },
            |_, reply| reply.map(|r| r.row).into(),
        )
        .await
    }

    /// One page of a key's records with `ts_from <= ts < ts_to` (`ts_to` 0:
    /// unbounded), ascending. Pass the previous page's `next_cursor` to go on.
    #[allow(clippy::too_many_arguments)]
    pub async fn scan_key(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        limit: u32,
        cursor: Option<Vec<u8>>,
        read: ReadOptions,
    ) -> Result<ScanPage> {
        self.scan_key_routed(namespace, key, None, ts_from, ts_to, limit, cursor, read)
            .await
    }

    /// [`Client::scan_key`] of a key written with `routing_key`.
    #[allow(clippy::too_many_arguments)]
    pub async fn scan_key_routed(
        &self,
        namespace: &str,
        key: &[u8],
        routing_key: Option<&[u8]>,
        ts_from: u64,
        ts_to: u64,
        limit: u32,
        cursor: Option<Vec<u8>>,
        read: ReadOptions,
    ) -> Result<ScanPage> {
        limits::validate_namespace(namespace)?;
        limits::validate_key("key", key)?;
        if let Some(r) = routing_key {
            limits::validate_key("routing_key", r)?;
        }
        let by = routing_key.unwrap_or(key);
        let req = pb::ScanKeyRequest {
            namespace: namespace.to_string(),
            key: key.to_vec(),
            routing_key: routing_key.map(<[u8]>::to_vec),
            ts_from,
            ts_to,
            limit,
            cursor: cursor.unwrap_or_default(),
            read: Some(read),
        };
        self.drive(
            "scan_key",
            &mut Budget::start(),
            |routes| Ok(self.read_target(routes, vshard(namespace, by))),
            |mut c, _| {
                let req = req.clone();
                async move { c.scan_key(req).await }
            },
            |_, reply| reply.map(ScanPage::from).into(),
        )
        .await
    }

    /// Every record of a key in the range, following cursors to the end.
    pub async fn scan_key_all(
        &self,
        namespace: &str,
        key: &[u8],
        ts_from: u64,
        ts_to: u64,
        read: ReadOptions,
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        let mut cursor = None;
        loop {
            let page = self
                .scan_key(
                    namespace,
                    key,
                    ts_from,
                    ts_to,
                    self.inner.opts.page_records,
                    cursor,
                    read,
                )
                .await?;
            rows.extend(page.rows);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => return Ok(rows),
            }
        }
    }
}
