//! Multi-process integration tests of whole cells live in `tests/tests/`.
