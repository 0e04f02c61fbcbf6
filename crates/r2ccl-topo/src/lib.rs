//! r2ccl-topo (being written).
