//! r2ccl-policy (being written).
