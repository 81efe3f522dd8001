//! reference (in progress)
