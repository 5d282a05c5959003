//! Stele wire and disk types: the gRPC API (generated from `proto/`), the
//! CBOR payloads of tablet Raft entries, the vshard hash and the typed error
//! kinds that cross the wire.
//!
//! **Architecture invariant:** this crate depends on no workspace crate.

pub mod addr;
pub mod command;
pub mod error;
pub mod formats;
pub mod limits;
pub mod vshard;

/// Generated protobuf and gRPC types of `stele.v1`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("stele.v1");

    /// Encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("stele_descriptor");
}

pub use error::{Error, ErrorKind, Result};
