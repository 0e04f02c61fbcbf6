//! r2ccl-ucx (being written).
