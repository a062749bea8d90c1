#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gateway_edge::fuzzing::check_method_params(data));
