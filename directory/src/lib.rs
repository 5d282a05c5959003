//! The global directory: namespace -> cell, the cell registry and global
//! policy.
//!
//! Nothing is built here yet (see the directory issue).
