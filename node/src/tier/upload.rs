//! Uploading one sealed segment: create-if-absent under its content-addressed
//! key, multipart above a threshold, verified when the object already exists.
//!
//! A create-if-absent PUT is not retried by `object_store` on a timeout, and
//! a retry after a lost response finds our own object: `AlreadyExists` is
//! therefore checked by size and content hash (the segment id is the xxh3-128
//! of the whole file), and only a mismatch is an error. A mismatching object
//! under a content address is damage; it is replaced with the right bytes.

use std::path::Path as FsPath;
use std::time::Duration;

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use super::{Error, Result, TierOptions};

/// How an upload ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This call wrote the object.
    Created,
    /// The object was already there with the right size and content.
    AlreadyPresent,
    /// The object was there but damaged; it was replaced.
    Repaired,
}

/// Checks that the object at `key` is exactly the segment `id` of `bytes` bytes.
pub async fn verify(store: &dyn ObjectStore, key: &Path, id: &str, bytes: u64) -> Result<()> {
    let meta = store.head(key).await?;
    if meta.size != bytes {
        return Err(Error::Mismatch {
            key: key.to_string(),
            what: format!("{} bytes, the segment has {bytes}", meta.size),
        });
    }
    let body = store.get(key).await?.bytes().await?;
    let actual = crate::segment::segment_id(&body);
    if actual != id {
        return Err(Error::Mismatch {
            key: key.to_string(),
            what: format!("content hashes to {actual}"),
        });
    }
    Ok(())
}

async fn put_multipart(
    store: &dyn ObjectStore,
    key: &Path,
    body: &bytes::Bytes,
    part_bytes: usize,
) -> Result<()> {
    let mut upload = store.put_multipart(key).await?;
    for start in (0..body.len()).step_by(part_bytes) {
        let end = (start + part_bytes).min(body.len());
        if let Err(e) = upload
            .put_part(PutPayload::from(body.slice(start..end)))
            .await
        {
            let _ = upload.abort().await;
            return Err(e.into());
        }
    }
    upload.complete().await?;
    Ok(())
}

/// One attempt at uploading the segment file at `path`.
pub async fn upload_once(
    store: &dyn ObjectStore,
    key: &Path,
    path: &FsPath,
    id: &str,
    options: &TierOptions,
) -> Result<Outcome> {
    let body = bytes::Bytes::from(tokio::fs::read(path).await.map_err(|e| Error::Io {
        context: format!("read {}", path.display()),
        source: e,
    })?);
    let bytes = body.len() as u64;
    if crate::segment::segment_id(&body) != id {
        return Err(Error::Mismatch {
            key: path.display().to_string(),
            what: "the local file does not hash to its id".into(),
        });
    }
    let exists = if bytes >= options.multipart_bytes_min {
        // Multipart completion is not conditional in object_store: look
        // first. Overwriting a content address with the same bytes is
        // harmless if two uploaders get here at once.
        match store.head(key).await {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => {
                put_multipart(store, key, &body, options.part_bytes).await?;
                return Ok(Outcome::Created);
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match store
            .put_opts(key, PutPayload::from(body.clone()), opts)
            .await
        {
            Ok(_) => return Ok(Outcome::Created),
            Err(object_store::Error::AlreadyExists { .. }) => true,
            Err(e) => return Err(e.into()),
        }
    };
    debug_assert!(exists);
    match verify(store, key, id, bytes).await {
        Ok(()) => Ok(Outcome::AlreadyPresent),
        Err(Error::Mismatch { what, .. }) => {
            tracing::warn!(%key, %what, "damaged segment object replaced");
            store.put(key, PutPayload::from(body)).await?;
            verify(store, key, id, bytes).await?;
            Ok(Outcome::Repaired)
        }
        Err(e) => Err(e),
    }
}

/// Uploads with bounded attempts and exponential backoff.
pub async fn upload(
    store: &dyn ObjectStore,
    key: &Path,
    path: &FsPath,
    id: &str,
    options: &TierOptions,
) -> Result<Outcome> {
    let mut backoff = options.upload_backoff;
    let cap = options.upload_backoff * 8;
    let mut attempt = 1;
    loop {
        match upload_once(store, key, path, id, options).await {
            Ok(o) => return Ok(o),
            Err(e) if attempt >= options.upload_attempts_max => return Err(e),
            Err(e) => {
                tracing::debug!(%key, attempt, error = %e, "segment upload failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(cap).max(Duration::from_millis(1));
                attempt += 1;
            }
        }
    }
}
