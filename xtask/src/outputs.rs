//! The three outputs a run is judged by: `h`, `v_new` and `ht`.

use kda::{Outputs, rel_error};

/// The outputs' names, in the order of [`rel_errors`].
pub const NAMES: [&str; 3] = ["h", "v_new", "ht"];

/// Relative errors of `h`, `v_new`, `ht` against the reference.
pub fn rel_errors(got: &Outputs, want: &Outputs) -> [f64; 3] {
    [rel_error(&got.h, &want.h), rel_error(&got.v_new, &want.v_new), rel_error(&got.ht, &want.ht)]
}
