//! Object keys: pure functions of opaque ids, nothing else.
//!
//! ```text
//! <prefix>/cells/<cell>/tablets/<tablet>/segments/<segment-id>.seg
//! <prefix>/cells/<cell>/tablets/<tablet>/manifests/<generation:020>.cbor
//! ```

use object_store::path::Path;

/// True for a cell id usable as a key component: 1..=64 of `[a-z0-9-]`.
pub fn is_opaque_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn join(prefix: &Path, parts: &[&str]) -> Path {
    let mut p = prefix.clone();
    for part in parts {
        p = p.join(*part);
    }
    p
}

/// `<prefix>/cells/<cell>/tablets/<tablet>`
pub fn tablet(prefix: &Path, cell: &str, tablet: u64) -> Path {
    join(prefix, &["cells", cell, "tablets", &tablet.to_string()])
}

pub fn segment(prefix: &Path, cell: &str, tablet_id: u64, id: &str) -> Path {
    tablet(prefix, cell, tablet_id)
        .join("segments")
        .join(crate::segment::file_name(id))
}

pub fn manifests(prefix: &Path, cell: &str, tablet_id: u64) -> Path {
    tablet(prefix, cell, tablet_id).join("manifests")
}

pub fn manifest(prefix: &Path, cell: &str, tablet_id: u64, generation: u64) -> Path {
    manifests(prefix, cell, tablet_id).join(format!("{generation:020}.cbor"))
}

/// The generation of a manifest key's file name, if it is one.
pub fn manifest_generation(key: &Path) -> Option<u64> {
    let name = key.filename()?;
    let digits = name.strip_suffix(".cbor")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_functions_of_ids() {
        let p = Path::from("pre/fix");
        assert_eq!(
            segment(&p, "dev", 7, "0123456789abcdef0123456789abcdef").as_ref(),
            "pre/fix/cells/dev/tablets/7/segments/0123456789abcdef0123456789abcdef.seg"
        );
        let m = manifest(&Path::default(), "c-1", 3, 42);
        assert_eq!(
            m.as_ref(),
            "cells/c-1/tablets/3/manifests/00000000000000000042.cbor"
        );
        assert_eq!(manifest_generation(&m), Some(42));
        assert_eq!(manifest_generation(&Path::from("x/1.cbor")), None);
    }

    #[test]
    fn cell_ids_are_opaque_components() {
        for ok in ["dev", "c-01", "a"] {
            assert!(is_opaque_component(ok), "{ok}");
        }
        for bad in ["", "Dev", "a/b", "a b", "ns.label", &"x".repeat(65)] {
            assert!(!is_opaque_component(bad), "{bad}");
        }
    }
}
