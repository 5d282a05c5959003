//! Request limits and input validation shared by client and server, so a bad
//! request is refused before any byte of it is written.

use crate::error::{Error, Result};

/// Largest key, in bytes.
pub const KEY_BYTES_MAX: usize = 4 * 1024;
/// Default largest value, in bytes (configurable per node).
pub const VALUE_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// Default largest batch (sum of keys and values), in bytes.
pub const BATCH_BYTES_MAX_DEFAULT: usize = 8 * 1024 * 1024;
/// Default largest number of records in one batch.
pub const BATCH_RECORDS_MAX_DEFAULT: usize = 10_000;
/// Length of a batch id.
pub const BATCH_ID_BYTES: usize = 16;
/// Longest namespace part (`workspace` or `project`).
pub const NAMESPACE_PART_BYTES_MAX: usize = 64;

/// Checks `workspace/project`: two non-empty parts of ASCII letters, digits,
/// `_`, `-` and `.`, each at most 64 bytes.
pub fn validate_namespace(namespace: &str) -> Result<()> {
    let bad = |reason: &str| Error::InvalidArgument {
        field: "namespace".into(),
        reason: format!("{reason}: {namespace:?} (want workspace/project)"),
    };
    let mut parts = namespace.split('/');
    let (Some(ws), Some(project), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("not two parts separated by one '/'"));
    };
    for part in [ws, project] {
        if part.is_empty() || part.len() > NAMESPACE_PART_BYTES_MAX {
            return Err(bad("each part must be 1 to 64 bytes"));
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(bad("parts may hold only letters, digits, '_', '-', '.'"));
        }
    }
    Ok(())
}

/// Checks a key: non-empty and at most [`KEY_BYTES_MAX`].
pub fn validate_key(field: &str, key: &[u8]) -> Result<()> {
    if key.is_empty() {
        return Err(Error::InvalidArgument {
            field: field.into(),
            reason: "empty".into(),
        });
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(Error::TooLarge {
            what: field.into(),
            size: key.len() as u64,
            limit: KEY_BYTES_MAX as u64,
        });
    }
    Ok(())
}

/// Parses a 16-byte batch id.
pub fn parse_batch_id(bytes: &[u8]) -> Result<u128> {
    let arr: [u8; BATCH_ID_BYTES] = bytes.try_into().map_err(|_| Error::InvalidArgument {
        field: "batch_id".into(),
        reason: format!("must be {BATCH_ID_BYTES} bytes, got {}", bytes.len()),
    })?;
    Ok(u128::from_be_bytes(arr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        for ok in ["a/b", "acme-corp/web.prod", "A_1/b-2"] {
            validate_namespace(ok).unwrap();
        }
        for bad in [
            "",
            "a",
            "/b",
            "a/",
            "a/b/c",
            "a b/c",
            "ü/x",
            &"x".repeat(65),
        ] {
            assert!(validate_namespace(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_namespace(&format!("{}/p", "x".repeat(65))).is_err());
    }

    #[test]
    fn keys() {
        assert!(matches!(
            validate_key("key", b""),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(matches!(
            validate_key("key", &vec![1; KEY_BYTES_MAX + 1]),
            Err(Error::TooLarge { .. })
        ));
        validate_key("key", &vec![1; KEY_BYTES_MAX]).unwrap();
    }

    #[test]
    fn batch_ids() {
        assert!(parse_batch_id(&[0; 15]).is_err());
        assert_eq!(parse_batch_id(&[0; 16]).unwrap(), 0);
    }
}
