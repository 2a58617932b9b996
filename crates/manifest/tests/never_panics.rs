//! Property: loading never panics, whatever the bytes, and every rejection
//! carries at least one diagnostic. Mutations of the built-in example exercise
//! the deep checks, random text the parser.
#![allow(clippy::unwrap_used, clippy::too_many_lines)] // test and benchmark code: a failed unwrap is a failed run; long scenarios read top to bottom

use proptest::prelude::*;
use sidecore_manifest::parse_str;

const EXAMPLE: &str = include_str!("../../../examples/checksum.toml");

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
        if let Err(e) = parse_str("fuzz.toml", &text) {
            prop_assert!(!e.diagnostics.is_empty());
            let _ = e.render(false);
        }
    }

    #[test]
    fn mutated_example_never_panics(cuts in proptest::collection::vec((0usize..EXAMPLE.len(), 0usize..40, "\\PC{0,12}"), 1..4)) {
        let mut text = EXAMPLE.to_string();
        for (at, len, insert) in cuts {
            let at = at.min(text.len());
            let at = (0..=at).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            let end = (at + len).min(text.len());
            let end = (end..=text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
            text.replace_range(at..end, &insert);
        }
        match parse_str("fuzz.toml", &text) {
            Ok(m) => prop_assert!(!m.offcodes.is_empty()),
            Err(e) => {
                prop_assert!(!e.diagnostics.is_empty());
                let _ = e.render(false);
            }
        }
    }
}
