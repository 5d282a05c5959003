//! Routing client for Stele cells.
