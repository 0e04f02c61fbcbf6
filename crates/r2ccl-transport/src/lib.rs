//! r2ccl-transport (being written).
