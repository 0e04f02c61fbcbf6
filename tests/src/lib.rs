//! r2ccl-tests: workspace-level integration tests that span several crates.
//!
//! The library part holds shared test helpers; the tests live in `tests/tests/`.
//! It is never published and nothing depends on it.
