//! Stele wire and disk types. Depends on no workspace crate.
