//! `stele scan`: records of a key or of a namespace, as a table for people
//! or JSON lines. The work is in `scan_rows`, the printing in the pure
//! formatters `format_table` and `row_json`, so both are tested.

use std::io::Write;

use clap::Args;
use stele_client::{ReadOptions, Row};

use super::client::{client_for, position_json, position_text};

/// `stele scan`: print records of a key (`--key`) or of a namespace.
#[derive(Debug, Clone, Args)]
pub struct ScanArgs {
    /// A node of the cell (default http://127.0.0.1:7450, unless a
    /// directory is given). Given, it wins over `STELE_DIRECTORY`.
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Route through the global directory instead (`URL,...`).
    #[arg(long, value_delimiter = ',', env = "STELE_DIRECTORY")]
    pub directory: Vec<String>,
    #[arg(long)]
    pub namespace: String,
    /// Scan one key's timeline (ScanKey); without it, the whole namespace (Scan).
    #[arg(long)]
    pub key: Option<String>,
    /// Only keys starting with this (namespace scans).
    #[arg(long, conflicts_with = "key")]
    pub prefix: Option<String>,
    /// Lowest ts, microseconds, inclusive.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// Highest ts, microseconds, exclusive; 0 for no bound.
    #[arg(long, default_value_t = 0)]
    pub to: u64,
    /// Most rows to print.
    #[arg(long, default_value_t = 1000)]
    pub limit: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Reads up to `args.limit` rows, following cursors.
pub async fn scan_rows(args: &ScanArgs) -> anyhow::Result<Vec<Row>> {
    let client = client_for(args.endpoint.as_deref(), &args.directory, &args.namespace).await?;
    let read = ReadOptions::default();
    let prefix = args.prefix.as_deref().unwrap_or("").as_bytes();
    let mut rows = Vec::new();
    let mut cursor = None;
    while rows.len() < args.limit {
        let want = (args.limit - rows.len()).min(1000) as u32;
        let page = match &args.key {
            Some(key) => {
                client
                    .scan_key(
                        &args.namespace,
                        key.as_bytes(),
                        args.from,
                        args.to,
                        want,
                        cursor,
                        read,
                    )
                    .await?
            }
            None => {
                client
                    .scan(
                        &args.namespace,
                        args.from,
                        args.to,
                        prefix,
                        want,
                        cursor,
                        read,
                    )
                    .await?
            }
        };
        if !page.missing_tablets.is_empty() {
            eprintln!(
                "warning: tablets {:?} could not be read",
                page.missing_tablets
            );
        }
        rows.extend(page.rows);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    rows.truncate(args.limit);
    Ok(rows)
}

/// One JSON line per row: ts, key and value as UTF-8 (lossy), position.
pub fn row_json(row: &Row) -> serde_json::Value {
    serde_json::json!({
        "ts": row.ts,
        "key": String::from_utf8_lossy(&row.key),
        "value": String::from_utf8_lossy(&row.value),
        "position": row.position.as_ref().map(position_json),
    })
}

/// A table for people; control characters in keys and values are escaped.
pub fn format_table(rows: &[Row]) -> String {
    let clean = |b: &[u8]| String::from_utf8_lossy(b).escape_debug().to_string();
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.ts.to_string(),
                clean(&r.key),
                clean(&r.value),
                position_text(r.position.as_ref()),
            ]
        })
        .collect();
    let mut t = super::table::new(&["TS", "KEY", "VALUE", "POSITION"], &[0]);
    for row in cells {
        t.add_row(row.to_vec());
    }
    super::table::render(&t)
}

pub async fn run(args: ScanArgs) -> anyhow::Result<()> {
    let rows = scan_rows(&args).await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        for row in &rows {
            writeln!(out, "{}", row_json(row))?;
        }
    } else {
        write!(out, "{}", format_table(&rows))?;
        writeln!(out, "({} rows)", rows.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Scans against the client's in-memory fake node.

    use stele_client::Position;
    use stele_client::fake::FakeNode;

    use super::*;
    use crate::cmd::append::{AppendArgs, append_one};

    #[test]
    fn table_and_json_lines() {
        let rows = vec![
            Row {
                key: b"k1".to_vec(),
                ts: 5,
                value: b"hello".to_vec(),
                position: Some(Position {
                    tablet: 1,
                    index: 2,
                    slot: 3,
                }),
            },
            Row {
                key: b"longer-key".to_vec(),
                ts: 12345,
                value: vec![0xff, b'\n'],
                position: None,
            },
        ];
        let table = format_table(&rows);
        let want = concat!(
            "   TS  KEY         VALUE  POSITION\n",
            "----------------------------------\n",
            "    5  k1          hello  1:2:3\n",
            "12345  longer-key  \u{fffd}\\n    -\n",
        );
        assert_eq!(table, want);
        let j = row_json(&rows[0]);
        assert_eq!(
            j,
            serde_json::json!({"ts": 5, "key": "k1", "value": "hello",
                "position": {"tablet": 1, "index": 2, "slot": 3}})
        );
    }

    #[tokio::test]
    async fn append_then_scan() {
        let node = FakeNode::one_tablet();
        let endpoint = node.serve().await.unwrap();
        for (key, ts) in [("a", 10), ("b", 20), ("a", 30)] {
            let args = AppendArgs {
                endpoint: Some(endpoint.clone()),
                directory: vec![],
                namespace: "acme/web".into(),
                key: key.into(),
                value: format!("v{ts}"),
                ts: Some(ts),
                json: false,
            };
            let (got_ts, pos) = append_one(&args).await.unwrap();
            assert_eq!((got_ts, pos.tablet), (ts, 1));
        }
        let mut args = ScanArgs {
            endpoint: Some(endpoint.clone()),
            directory: vec![],
            namespace: "acme/web".into(),
            key: Some("a".into()),
            prefix: None,
            from: 0,
            to: 0,
            limit: 1000,
            json: false,
        };
        let ts = |rows: Vec<Row>| rows.iter().map(|r| r.ts).collect::<Vec<_>>();
        assert_eq!(ts(scan_rows(&args).await.unwrap()), [10, 30]);
        args.key = None;
        assert_eq!(ts(scan_rows(&args).await.unwrap()), [10, 20, 30]);
        args.limit = 2;
        assert_eq!(ts(scan_rows(&args).await.unwrap()), [10, 20]);
        args.limit = 1000;
        args.from = 15;
        args.to = 30;
        assert_eq!(ts(scan_rows(&args).await.unwrap()), [20]);
    }
}
