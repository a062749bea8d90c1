//! Storage backends. Each loads state, applies a `rules` function and persists
//! the result inside one serializable unit.

pub mod embedded;
pub mod memory;
pub mod postgres;
