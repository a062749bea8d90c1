//! The conformance suite against every backend, in process.

mod suite;

mod memory {
    crate::conformance_cases!(crate::suite::harness::memory);
}

mod embedded {
    crate::conformance_cases!(crate::suite::harness::embedded);
}

mod postgres {
    crate::conformance_cases!(crate::suite::harness::postgres);
}
