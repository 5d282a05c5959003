//! Records and the limits a request is checked against before any byte is
//! sent.

use stele_proto::limits;
use stele_proto::pb::Record;
use stele_proto::vshard::vshard;

use crate::{ClientOptions, Error, Result};

/// A record with no routing key.
pub fn record(key: impl Into<Vec<u8>>, ts: u64, value: impl Into<Vec<u8>>) -> Record {
    Record {
        key: key.into(),
        ts,
        value: value.into(),
        routing_key: None,
    }
}

/// The vshard a record routes by.
pub fn record_vshard(namespace: &str, record: &Record) -> u32 {
    vshard(
        namespace,
        record.routing_key.as_deref().unwrap_or(&record.key),
    )
}

/// The bytes a record counts for against batch limits.
pub fn record_bytes(record: &Record) -> usize {
    record.key.len() + record.value.len() + record.routing_key.as_ref().map_or(0, Vec::len)
}

/// Checks a namespace and records against the limits, so an unacceptable
/// request is refused before anything is sent.
pub fn validate(namespace: &str, records: &[Record], opts: &ClientOptions) -> Result<()> {
    limits::validate_namespace(namespace)?;
    for r in records {
        limits::validate_key("key", &r.key)?;
        if let Some(rk) = &r.routing_key {
            limits::validate_key("routing_key", rk)?;
        }
        if r.value.len() > opts.value_bytes_max {
            return Err(stele_proto::Error::TooLarge {
                what: "value".into(),
                size: r.value.len() as u64,
                limit: opts.value_bytes_max as u64,
            }
            .into());
        }
        if record_bytes(r) > opts.batch_bytes_max {
            return Err(stele_proto::Error::TooLarge {
                what: "record".into(),
                size: record_bytes(r) as u64,
                limit: opts.batch_bytes_max as u64,
            }
            .into());
        }
    }
    Ok(())
}

/// Splits record indices into runs that respect the batch limits.
pub fn chunk(
    records: &[Record],
    idxs: Vec<usize>,
    records_max: usize,
    bytes_max: usize,
) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut bytes = 0;
    for i in idxs {
        let b = record_bytes(&records[i]);
        if !cur.is_empty() && (cur.len() >= records_max.max(1) || bytes + b > bytes_max) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += b;
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub(crate) fn invalid(field: &str, reason: &str) -> Error {
    stele_proto::Error::InvalidArgument {
        field: field.into(),
        reason: reason.into(),
    }
    .into()
}

pub(crate) fn too_large(what: &str, size: usize, limit: usize) -> Error {
    stele_proto::Error::TooLarge {
        what: what.into(),
        size: size as u64,
        limit: limit as u64,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use stele_proto::ErrorKind;

    use super::*;

    #[test]
    fn validation_refuses_before_sending() {
        let opts = ClientOptions {
            value_bytes_max: 10,
            ..Default::default()
        };
        let ok = [record("k", 1, "v")];
        validate("a/b", &ok, &opts).unwrap();
        let cases: Vec<(&str, Vec<Record>, &str)> = vec![
            ("nope", ok.to_vec(), "InvalidArgument"),
            ("a/b", vec![record("", 1, "v")], "InvalidArgument"),
            ("a/b", vec![record("k", 1, vec![0; 11])], "TooLarge"),
            (
                "a/b",
                vec![record(vec![1; limits::KEY_BYTES_MAX + 1], 1, "v")],
                "TooLarge",
            ),
        ];
        for (ns, records, want) in cases {
            let err = validate(ns, &records, &opts).unwrap_err();
            assert!(
                format!("{:?}", err.api().unwrap()).starts_with(want),
                "{err}"
            );
            assert_eq!(err.kind(), ErrorKind::Refuse);
        }
    }

    #[test]
    fn chunks_respect_limits() {
        let records: Vec<Record> = (0..10)
            .map(|i| record(vec![b'k'; 5], i, vec![0; 5]))
            .collect();
        let sizes = |c: Vec<Vec<usize>>| c.iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(
            sizes(chunk(&records, (0..10).collect(), 4, 1000)),
            [4, 4, 2]
        );
        assert_eq!(
            sizes(chunk(&records, (0..10).collect(), 100, 30)),
            [3, 3, 3, 1]
        );
        assert_eq!(sizes(chunk(&records, (0..10).collect(), 100, 1)), [1; 10]);
        assert!(chunk(&records, vec![], 4, 100).is_empty());
    }
}
