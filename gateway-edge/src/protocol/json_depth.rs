//! How deeply a frame nests, found before it is parsed: a frame nested
//! deeper than `EDGE_MAX_JSON_DEPTH` is refused as an invalid request frame
//! without building its tree (the JSON parser would otherwise recurse into
//! it, up to its own bound of 127 levels, and fail as "not JSON", which the
//! protocol ignores in silence).

/// The largest `EDGE_MAX_JSON_DEPTH`: the JSON parser refuses deeper.
pub const MAX_SETTING: u32 = 127;

/// Whether `text` opens more than `max` arrays or objects inside one
/// another. Brackets inside strings do not count; the text need not be
/// valid JSON (the parser judges that afterwards).
pub fn nests_deeper_than(text: &str, max: u32) -> bool {
    let mut depth = 0u32;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in text.as_bytes() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::{MAX_SETTING, nests_deeper_than};

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn counts_arrays_and_objects_but_not_strings() {
        assert!(!nests_deeper_than(&nested(3), 3));
        assert!(nests_deeper_than(&nested(4), 3));
        assert!(!nests_deeper_than(r#"{"a":{"b":[1]}}"#, 3));
        assert!(nests_deeper_than(r#"{"a":{"b":[{}]}}"#, 3));
        // Brackets in strings, escaped quotes included, are text.
        assert!(!nests_deeper_than(r#"{"a":"[[[[\"[[[["}"#, 1));
        assert!(!nests_deeper_than(r#"{"a":"\\"}"#, 1));
        assert!(nests_deeper_than(r#"{"a":"\\",  "b":[]}"#, 1));
        // Siblings do not add up.
        assert!(!nests_deeper_than("[[],[],[[]]]", 3));
    }

    /// The parser gives up past 127 levels: at the largest setting the
    /// edge answers before it does.
    #[test]
    fn the_largest_setting_is_within_the_parsers_bound() {
        let at = nested(MAX_SETTING as usize);
        assert!(!nests_deeper_than(&at, MAX_SETTING));
        assert!(serde_json::from_str::<serde_json::Value>(&at).is_ok());
        let over = nested(MAX_SETTING as usize + 1);
        assert!(serde_json::from_str::<serde_json::Value>(&over).is_err());
    }
}
