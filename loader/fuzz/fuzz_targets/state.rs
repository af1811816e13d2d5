//! Arbitrary text through the `LoaderState` parser (`--resume`, `--state-file`, checkpoints): it never
//! panics, what it accepts writes back as a state that parses to the same value, and what it refuses is
//! said in a bounded message however long the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use loader::LoaderState;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match text.parse::<LoaderState>() {
        Ok(state) => {
            let again: LoaderState = state
                .to_string()
                .parse()
                .expect("a state's own text parses");
            assert_eq!(again, state);
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.len() < 4096, "{} bytes of message", message.len());
        }
    }
});
