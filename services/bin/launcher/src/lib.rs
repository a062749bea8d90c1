//! The all-in-one launcher's library part: its settings (`config`), shared by
//! the `clawgate` binary and its tests.

pub mod config;
