//! Tests of the crate's private parts: the engines of every rank over the in-memory fabric,
//! and the OOB mesh over loopback.

mod engine_fabric;
mod oob;
