//! io (in progress)
