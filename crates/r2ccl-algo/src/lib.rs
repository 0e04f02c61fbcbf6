//! r2ccl-algo (being written).
