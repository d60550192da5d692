#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kplug_apiserver::fuzzing::reconcile_body(data));
