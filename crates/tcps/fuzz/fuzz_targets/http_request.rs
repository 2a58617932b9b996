//! Fuzzes the file server's request-head parser: any bytes, any head limit,
//! split anywhere (as they arrive from a receive queue). It must never
//! panic, an incomplete head must stay within the limit, and a complete one
//! must lie within the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecore_tcps::http::{HttpError, parse};

fuzz_target!(|data: &[u8]| {
    let Some((&limit, rest)) = data.split_first() else {
        return;
    };
    let limit = 16 + usize::from(limit) * 32;
    for cut in [rest.len(), rest.len() / 2, 1.min(rest.len())] {
        let part = &rest[..cut];
        match parse(part, limit) {
            Ok(Some(r)) => {
                assert!(r.head_len <= part.len() && r.head_len <= limit);
                assert!(r.method == "GET" || r.method == "HEAD");
            }
            Ok(None) => assert!(part.len() <= limit),
            Err(e) => {
                let (code, _) = e.status();
                assert!(matches!(code, 400 | 405 | 413 | 431));
                if let HttpError::TooLarge { limit: l } = e {
                    assert_eq!(l, limit);
                }
            }
        }
    }
});
