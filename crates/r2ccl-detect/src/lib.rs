//! r2ccl-detect (being written).
