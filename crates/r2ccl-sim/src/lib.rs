//! r2ccl-sim (being written).
