//! The scanner against serde_json: the same values accepted, the same
//! reasons and positions for those refused.

use super::*;

fn skip(body: &str) -> Result<Range<usize>, Reason> {
    let mut scanner = Scanner::new(body.as_bytes());
    let range = scanner.skip_value().map_err(|e| e.reason)?;
    scanner.end().map_err(|e| e.reason)?;
    Ok(range)
}

#[test]
fn accepts_what_serde_json_accepts() {
    let valid = [
        "0",
        "-0",
        "-12.5e+3",
        "1E-2",
        "123456789012345678901234567890.000000000000000000001",
        " true ",
        "false",
        "null",
        r#""""#,
        r#""a\"\\\/\b\f\n\r\t\u00e9\ud800""#,
        "\"h\u{e9}llo \u{1F600} \u{4E16}\"",
        "[]",
        "{}",
        r#"{"a":[1,{"b":null}],"c":{"d":[[[]]]}}"#,
        " { \"a\" : 1 , \"b\" : [ 2 , 3 ] } ",
        "\"a string longer than eight bytes, with no escapes at all\"",
    ];
    for body in valid {
        assert!(
            serde_json::from_str::<serde::de::IgnoredAny>(body).is_ok(),
            "{body}"
        );
        let range = skip(body).unwrap_or_else(|e| panic!("{body}: {e}"));
        assert_eq!(&body[range], body.trim(), "{body}");
    }
}

#[test]
fn rejects_what_serde_json_rejects_with_its_reason() {
    let invalid: &[(&[u8], Reason)] = &[
        (b"", Reason::EofValue),
        (b"{", Reason::EofObject),
        (b"\"abc", Reason::EofString),
        (
            b"\"a long string that ends before its quote",
            Reason::EofString,
        ),
        (b"{\"a\" 1}", Reason::ExpectedColon),
        (b"{\"a\":1 \"b\":2}", Reason::ExpectedObjectCommaOrEnd),
        (b"[1 2]", Reason::ExpectedListCommaOrEnd),
        (b"{1:2}", Reason::KeyMustBeString),
        (b"[1,]", Reason::ExpectedValue),
        (b"[1,", Reason::EofValue),
        (b"{\"a\":1,}", Reason::KeyMustBeString),
        (b"tru", Reason::EofValue),
        (b"trUe", Reason::ExpectedIdent),
        (b"[x]", Reason::ExpectedValue),
        (b"01", Reason::InvalidNumber),
        (b"1.", Reason::InvalidNumber),
        (b"1.e3", Reason::InvalidNumber),
        (b"-", Reason::InvalidNumber),
        (b"-a", Reason::InvalidNumber),
        (b"1e+", Reason::InvalidNumber),
        (b"\"\\x\"", Reason::InvalidEscape),
        (b"\"\\u12G4\"", Reason::InvalidEscape),
        (b"\"tab\there\"", Reason::ControlCharacter),
        (b"\"12345678\x01\"", Reason::ControlCharacter),
        (b"\"\xff\"", Reason::InvalidUnicode),
        (b"\"\xc3\x28\"", Reason::InvalidUnicode),
        (b"\"\xed\xa0\x80\"", Reason::InvalidUnicode),
        (b"\"\xe2\x82", Reason::EofString),
        (b"1 2", Reason::TrailingCharacters),
        (b"{} x", Reason::TrailingCharacters),
    ];
    for (body, reason) in invalid {
        let mut scanner = Scanner::new(body);
        let got = scanner
            .skip_value()
            .and_then(|_| scanner.end())
            .map_err(|e| e.reason);
        assert_eq!(
            got,
            Err(reason.clone()),
            "{}",
            String::from_utf8_lossy(body)
        );
        // serde_json rejects these too (as a value it must read to the end).
        assert!(
            serde_json::from_slice::<Box<serde_json::value::RawValue>>(body).is_err(),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn positions_count_lines_and_columns_as_serde_json_does() {
    let body = b"{\n  \"a\": 1,\n  \"b\" 2\n}";
    let mut scanner = Scanner::new(body);
    let error = scanner.skip_value().expect_err("missing colon");
    let serde = serde_json::from_slice::<serde::de::IgnoredAny>(body).expect_err("invalid");
    assert_eq!(
        (error.line, error.column),
        (serde.line(), serde.column()),
        "{error} vs {serde}"
    );
    assert_eq!(error.to_string(), serde.to_string());
}

#[test]
fn nesting_has_no_depth_limit() {
    let depth = 100_000;
    let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert_eq!(skip(&body), Ok(0..body.len()));
}

#[test]
fn the_word_check_finds_the_first_special_byte_exactly() {
    let specials = [b'"', b'\\', 0x00, 0x1F, 0x80, 0xFF];
    for first in specials {
        for position in 0..8 {
            let mut word = *b"abcdefgh";
            word[position] = first;
            // Whatever follows the first special byte, it is found first.
            for later in specials.into_iter().chain([b'a', 0x01, 0x7F]) {
                word[position + 1..].fill(later);
                let marks = special(u64::from_le_bytes(word));
                assert_eq!(
                    marks.trailing_zeros() / 8,
                    position as u32,
                    "{first:#x} at {position}, then {later:#x}"
                );
            }
        }
    }
    assert_eq!(special(u64::from_le_bytes(*b" ~{}[]:,")), 0);
}
