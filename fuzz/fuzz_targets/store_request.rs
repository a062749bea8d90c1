#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| session_store::fuzzing::check_store_request(data));
