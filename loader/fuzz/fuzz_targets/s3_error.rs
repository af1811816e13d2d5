//! Arbitrary text as an S3 error response: the error-document parser finds a code and message or
//! nothing, never panics, and what it finds is text that was there (entities unescaped).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some((code, message)) = loader::s3_error(text) {
        assert!(!code.is_empty());
        assert!(text.contains("<Code>") && text.contains("</Code>"));
        assert!(code.len() <= text.len() && message.len() <= text.len());
    }
});
