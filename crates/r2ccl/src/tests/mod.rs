//! Tests of the crate's private parts: an engine fed forged control messages, the engines of
//! every rank over the in-memory fabric,
//! the OOB mesh over loopback, and the health-view switch against a reference model.

mod engine_ctrl;
mod engine_fabric;
mod oob;
mod switch;
