//! The cell controller: node membership and health leases, placement, the
//! tablet table, split/move/merge orchestration and the route map.
//!
//! Nothing is built here yet (see the controller issue); until then a cell's
//! membership is static (`stele server --peers`).
