//! inputs (in progress)
