//! r2ccl-ucx-sys (being written).
