//! The one-pass decoder against what kplug did before: serde_json decoding
//! into `Reconcile`, a second pass for unknown field names, and a third for
//! each object's head. Table-driven: each case is a body and what it gives.

use super::*;
use crate::api::reconcile::differential::{self, serde_head};
use crate::v1alpha1::Reconcile;

const OBJECT: &str = r#"{"apiVersion":"v1","kind":"X","metadata":{"name":"a"}}"#;

fn body_with_spec(spec: &str) -> String {
    format!(r#"{{"apiVersion":"plugins.kplug.io/v1alpha1","kind":"Reconcile","spec":{spec}}}"#)
}

/// Checks a body the earlier decoder accepted: same fields, same unknown
/// names, same object heads, the object's exact bytes.
fn same_as_serde(body: &str) -> Request<'_> {
    let ours = request(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"));
    let theirs: Reconcile = serde_json::from_str(body).unwrap_or_else(|e| panic!("{body}: {e}"));
    if let Err(disagreement) = differential::same_as_serde(body.as_bytes(), &ours, &theirs) {
        panic!("{disagreement}");
    }
    ours
}

#[test]
fn decodes_what_serde_decoded_and_finds_the_same_unknown_fields() {
    let cases: &[(&str, &[&str])] = &[
        (&body_with_spec(&format!(r#"{{"object":{OBJECT}}}"#)), &[]),
        // A reference, typed; its unknown fields are not checked, as api's.
        (
            &body_with_spec(
                r#"{"objectRef":{"apiVersion":"v1","kind":"ConfigMap","namespace":"a","name":"b","extensionsPath":"spec.x","colour":1}}"#,
            ),
            &[],
        ),
        // Unknown fields at several depths: only the top level and spec
        // are checked, as before; the object and spec.api are not.
        (
            r#"{"zeta":1,"spec":{"object":{"apiVersion":"v1","kind":"X","metadata":{"name":"a","colour":1},"deep":{"x":[{"y":2}]}},"api":{"group":"g","resource":"r","extra":true},"colour":"blue","alpha":[]},"beta":{"nested":{"unknown":1}}}"#,
            &["beta", "zeta", "spec.alpha", "spec.colour"],
        ),
        // Repeated unknown fields are named once; escaped names decoded.
        (
            &body_with_spec(&format!(
                r#"{{"object":{OBJECT},"c\u006flour":1,"colour":2,"colour":3}}"#
            )),
            &["spec.colour"],
        ),
        // Known names written with escapes are still known.
        (
            &format!(r#"{{"sp\u0065c":{{"obj\u0065ct":{OBJECT}}}}}"#),
            &[],
        ),
        // Every field, whitespace everywhere, big numbers in the object.
        (
            r#" { "apiVersion" : "plugins.kplug.io/v1alpha1" , "kind" : "Reconcile" ,
                "metadata" : { "name" : "r" , "labels" : { "a" : "b" } } ,
                "spec" : { "operation" : "Finalize" , "dryRun" : true , "timeoutSeconds" : 9 ,
                  "object" : { "apiVersion" : "v1" , "kind" : "X" , "metadata" : { "name" : "a" } ,
                    "spec" : { "n" : 123456789012345678901234567890.000000000000000000001 ,
                               "m" : -18446744073709551617 , "e" : 1E+400 } } ,
                  "extensions" : [ { "apiVersion" : "v1" , "kind" : "E" , "metadata" : { "name" : "e" } } , { } , null , 7 ] ,
                  "api" : { "group" : "g" , "resource" : "r" , "version" : "v1" } ,
                  "preferredImplementation" : "P" , "requiredImplementation" : null , "plugin" : "p" } ,
                "status" : null } "#,
            &[],
        ),
        // Nulls for optional fields; no object at all.
        (
            &body_with_spec(r#"{"object":null,"operation":null,"timeoutSeconds":null}"#),
            &[],
        ),
        (r#"{"spec":{}}"#, &[]),
        // Non-ASCII text in strings and names.
        (
            &body_with_spec(
                r#"{"object":{"apiVersion":"v1","kind":"Grüße","metadata":{"name":"名前"}},"größe":1}"#,
            ),
            &["spec.größe"],
        ),
    ];
    for (body, unknown) in cases {
        let decoded = same_as_serde(body);
        assert_eq!(decoded.unknown, *unknown, "{body}");
    }
}

#[test]
fn reads_each_object_head_as_the_earlier_pass_did() {
    // An object and its head: None when unreadable, else its apiVersion,
    // kind, metadata.name and metadata.namespace where non-empty strings.
    type Expected<'a> = Option<(
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
    )>;
    let cases: &[(&str, Expected)] = &[
        (OBJECT, Some((Some("v1"), Some("X"), Some("a"), None))),
        (r#"{}"#, Some((None, None, None, None))),
        (
            r#"{"apiVersion":"","kind":null,"metadata":{"namespace":""}}"#,
            Some((None, None, None, None)),
        ),
        (
            r#"{"metadata":{"name":"a","name2":1,"namespace":"team-a"},"kind":"\u0000"}"#,
            Some((None, Some("\u{0}"), Some("a"), Some("team-a"))),
        ),
        (
            r#"{"spec":{"apiVersion":"v1"},"apiVersion":"v1"}"#,
            Some((Some("v1"), None, None, None)),
        ),
        (
            r#"{"metadata":{"namespace":"t\u0065am","name":"x\"y"}}"#,
            Some((None, None, Some("x\"y"), Some("team"))),
        ),
        // Head keys repeated: serde refused the head.
        (r#"{"apiVersion":"v1","apiVersion":"v2"}"#, None),
        (r#"{"kind":null,"kind":"X"}"#, None),
        (r#"{"metadata":{},"metadata":{}}"#, None),
        (r#"{"metadata":{"name":"a","name":"b"}}"#, None),
        (r#"{"metadata":{"namespace":"a","namespace":"b"}}"#, None),
        // Other keys repeated are fine.
        (
            r#"{"spec":1,"spec":2,"metadata":{"uid":1,"uid":2}}"#,
            Some((None, None, None, None)),
        ),
        // Wrong types.
        (r#"{"apiVersion":1}"#, None),
        (r#"{"kind":{}}"#, None),
        (r#"{"metadata":null}"#, None),
        (r#"{"metadata":"a"}"#, None),
        (r#"{"metadata":{"name":["a"]}}"#, None),
        (r#"{"metadata":{"namespace":7}}"#, None),
        (r#""just a string""#, None),
        ("42", None),
        ("null", None),
        // A key or value that does not decode to a string (lone surrogate).
        (r#"{"kind":"\ud800"}"#, None),
        (r#"{"\ud800":1}"#, None),
        (
            r#"{"kind":"\ud83d\ude00"}"#,
            Some((None, Some("\u{1F600}"), None, None)),
        ),
    ];
    for (object, expected) in cases {
        let owned = |v: Option<&str>| v.map(str::to_owned);
        let expected = expected.map(|(a, k, n, ns)| (owned(a), owned(k), owned(n), owned(ns)));
        assert_eq!(serde_head(object.as_bytes()), expected, "serde, {object}");
        let body = body_with_spec(&format!(r#"{{"extensions":[{object}]}}"#));
        let decoded = request(body.as_bytes()).unwrap_or_else(|e| panic!("{object}: {e}"));
        let head = decoded.spec.extensions[0].head;
        let value = |t: Option<Text<'_>>| t.map(|t| t.value().into_owned());
        assert_eq!(
            head.readable.then(|| (
                value(head.api_version),
                value(head.kind),
                value(head.name),
                value(head.namespace)
            )),
            expected,
            "{object}"
        );
        assert_eq!(decoded.spec.extensions[0].raw, object.as_bytes());
    }
}

#[test]
fn rejects_what_serde_rejected_with_the_same_message() {
    let cases: &[&str] = &[
        // Duplicate known fields, at the top and in spec.
        r#"{"spec":{},"spec":{}}"#,
        r#"{"kind":"Reconcile","spec":{},"kind":"Reconcile"}"#,
        r#"{"spec":{"object":{},"object":{}}}"#,
        r#"{"spec":{"plugin":"a","dryRun":false,"plugin":"b"}}"#,
        // A repeat is refused before its missing colon (found by fuzzing).
        r#"{"spec":{"plugin":"a","dryRun":false,"plugin"in""}}"#,
        r#"{"spec":{},"spec" {}}"#,
        "{\"spec\":{},\"spec\"\n{}}",
        // Missing spec.
        r#"{"apiVersion":"plugins.kplug.io/v1alpha1"}"#,
        "{\n  \"kind\": \"Reconcile\"\n}",
        // Wrong types, decoded by serde from the field's slice.
        r#"{"spec":{"dryRun":"yes"}}"#,
        r#"{"spec":{"objectRef":"users"}}"#,
        r#"{"spec":{"objectRef":{"name":7}}}"#,
        r#"{"spec":{"objectRef":{},"objectRef":{}}}"#,
        "{\"spec\":{\n\"timeoutSeconds\": 1.5}}",
        r#"{"spec":{"timeoutSeconds":9223372036854775808}}"#,
        r#"{"spec":{"operation":5}}"#,
        r#"{"spec":{"api":{"group":1}}}"#,
        r#"{"metadata":{"labels":[]},"spec":{}}"#,
        r#"{"kind":null,"spec":{}}"#,
        r#"{"spec":{},"status":{"success":true}}"#,
        // Not an object at all: serde_json describes the value it read
        // (found by fuzzing: `2` was "number" where serde said "integer `2`").
        "2",
        "-1.5e3",
        " \"text\" ",
        "true",
        "null",
        "18446744073709551616",
        r#"{"spec":5}"#,
        r#"{"spec":{"extensions":"none"}}"#,
        r#"{"spec":{"extensions":null}}"#,
        // A control character is reported at it in a skipped value, past it
        // in a decoded one (found by fuzzing).
        "{\"sn\":\"\u{1}\",\"spec\":{}}",
        "{\"metadata\":{\"name\":\"\u{1}\"},\"spec\":{}}",
        "{\"spec\":{\"object\":{\"k\u{1}\":1}}}",
        "{\"sp\u{1}ec\":{}}",
        "{\"spec\":\"plu\u{0}gin\"}",
        "{\"s\n\":1}",
        r#"{"s\ud83dTude00\ q":1}"#,
        r#"{"?spec":678901224":{34}"#,
        r#"{"spec":{"object":{"metadata":{"name":"a",}}}}"#,
        r#"{"spec":{"object":{"kind":"X","#,
        "{\"spec\":{\"object\":{\"a\":\"\\\n\"}}}",
        "{\"spec\":{\"object\":{\"a\":\"\\u12\n4\"}}}",
        "{\"spec\":{\"object\":{\"a\":-\n1}}}",
        "{\"spec\":{\"object\":{\"a\":1.\n}}}",
        "{\"spec\":{\"object\":{\"a\":0\n1}}}",
        "{\"sn\":fal\ns,\"spec\":{}}",
        r#"{"spec":{},"spec" }"#,
        r#"{"spec":{"extensions":{}}}"#,
        "{\"metadata\":{\"nam\n\ne\":\"r\"},\"spec\":{}}",
        // Syntax, truncation and trailing characters.
        "{not json",
        "",
        "   ",
        r#"{"spec":{"object":{"a":1}}"#,
        r#"{"spec":{"object":{"a":1}}}}"#,
        r#"{"spec":{"object":{"a":01}}}"#,
        r#"{"spec":{"object":{"a":"\x"}}}"#,
        // A bad \u escape is reported where serde_json reports it: after
        // four bytes, or as an EOF when fewer remain (found by fuzzing).
        r#"{"spec":{"object":{"a":"\ud83d\ukey"}}}"#,
        r#"{"spec":{"object":{"a":"\u12x"#,
        r#"{"spec":{"object":[1,]}}"#,
        r#"{"spec":{}} {"spec":{}}"#,
        // A key that does not decode, where serde decoded keys.
        r#"{"\ud800":1,"spec":{}}"#,
        r#"{"spec":{"\udfff":1}}"#,
    ];
    for body in cases {
        let serde = serde_json::from_str::<Reconcile>(body).expect_err(body);
        let ours = request(body.as_bytes()).expect_err(body);
        assert_eq!(ours.to_string(), serde.to_string(), "{body}");
    }
}

#[test]
fn rejects_more_than_serde_only_where_documented() {
    let cases: &[(&[u8], &str)] = &[
        // Structs written as arrays, which serde read by position.
        (
            br#"["plugins.kplug.io/v1alpha1","Reconcile",{},{}]"#,
            "invalid type: sequence, expected struct Reconcile at line 1 column 1",
        ),
        (
            br#"{"spec":["Reconcile"]}"#,
            "invalid type: sequence, expected struct ReconcileSpec at line 1 column 9",
        ),
        // Invalid UTF-8 in a value kplug ignores.
        (
            b"{\"spec\":{},\"colour\":\"\xff\"}",
            "invalid unicode code point at line 1 column 22",
        ),
        (
            b"{\"spec\":{\"x\":{\"y\":\"\xc3\"}}}",
            "invalid unicode code point at line 1 column 20",
        ),
    ];
    for (body, message) in cases {
        let error = request(body).expect_err(&String::from_utf8_lossy(body));
        assert_eq!(error.to_string(), *message);
    }
    // Found by fuzzing: in a typed value (metadata) serde_json decodes, with
    // more than serde_json's depth limit of containers after it in the body.
    let many = "{},".repeat(SERDE_DEPTH_LIMIT);
    let mut body = br#"{"metadata":{"x":""#.to_vec();
    body.push(0x8c);
    body.extend_from_slice(format!(r#""}},"spec":{{}},"c":[{many}{{}}]}}"#).as_bytes());
    let error = request(&body).expect_err(&String::from_utf8_lossy(&body));
    assert_eq!(
        error.to_string(),
        "invalid unicode code point at line 1 column 19"
    );
    if let Err(disagreement) = differential::check(&body) {
        panic!("{disagreement}");
    }
    // Where serde read the array, the head of an object is now unreadable
    // (its metadata is not an object).
    let body = body_with_spec(r#"{"object":{"apiVersion":"v1","kind":"X","metadata":["a"]}}"#);
    let decoded = request(body.as_bytes()).expect("decodes");
    assert!(decoded.spec.object.is_some_and(|o| !o.head.readable));
}

#[test]
fn invalid_utf8_anywhere_serde_looked_is_still_rejected() {
    let cases: &[&[u8]] = &[
        b"{\"spec\":{\"object\":{\"kind\":\"\xff\"}}}",
        b"{\"spec\":{\"object\":{\"a\":\"ok\",\"b\":\"\xe2\x82\"}}}",
        b"{\"spec\":{\"plugin\":\"\xc0\x80\"}}",
        b"{\"k\xffnd\":1,\"spec\":{}}",
        b"{\"spec\":{\"extensions\":[{\"s\":\"\xed\xa0\x80\"}]}}",
    ];
    for body in cases {
        assert!(serde_json::from_slice::<Reconcile>(body).is_err());
        let error = request(body).expect_err(&String::from_utf8_lossy(body));
        assert!(
            matches!(error.reason, Reason::InvalidUnicode | Reason::Field(_)),
            "{error}"
        );
    }
}

#[test]
fn every_truncation_of_a_valid_body_is_rejected() {
    let body = body_with_spec(&format!(
        r#"{{"operation":"Reconcile","timeoutSeconds":30,"object":{{"apiVersion":"v1","kind":"X","metadata":{{"name":"a\"b"}},"spec":{{"n":-1.5e-7,"t":true,"f":false,"z":null,"s":"\u00e9é"}}}},"extensions":[{OBJECT}],"api":{{"group":"g","resource":"r"}}}}"#
    ));
    same_as_serde(&body);
    for end in 0..body.len() {
        let prefix = &body.as_bytes()[..end];
        assert!(
            request(prefix).is_err(),
            "accepted {}",
            String::from_utf8_lossy(prefix)
        );
        // Never a position past the end.
        let error = request(prefix).expect_err("truncated");
        assert!(
            error.line == 1 && error.column <= end.max(1),
            "{error} for {end}"
        );
    }
}

#[test]
fn numbers_beyond_64_bits_pass_through_exactly() {
    for number in [
        "123456789012345678901234567890.000000000000000000001",
        "-18446744073709551616",
        "18446744073709551616",
        "1e400",
        "-0.0000000000000000000000000000000000001E-999",
        "0",
    ] {
        let object = format!(
            r#"{{"apiVersion":"v1","kind":"X","metadata":{{"name":"a"}},"spec":{{"n":{number},"list":[{number}]}}}}"#
        );
        let body = body_with_spec(&format!(r#"{{"object":{object}}}"#));
        let decoded = request(body.as_bytes()).expect("decodes");
        assert_eq!(
            decoded.spec.object.map(|o| o.raw),
            Some(object.as_bytes()),
            "{number}"
        );
    }
}

#[test]
fn nesting_is_refused_at_serde_jsons_depth_counted_from_the_body() {
    // Found by fuzzing: a typed value decoded from its own slice met
    // serde_json's limit of 128 levels two levels later than in the body.
    for levels in 120..130 {
        let deep = format!("{}{}", "[".repeat(levels), "]".repeat(levels));
        for body in [
            format!(r#"{{"spec":{{}},"status":{{"objectStatus":{deep}}}}}"#),
            format!(r#"{{"metadata":{{"managedFields":[{{"fieldsV1":{deep}}}]}},"spec":{{}}}}"#),
            format!(r#"{{"spec":{{"api":{deep}}}}}"#),
            // Truncated after many objects (found by fuzzing): still an EOF.
            format!(
                r#"{{"spec":{{}},"metadata":{{"a":[{}"#,
                r#"{},"#.repeat(levels)
            ),
            // Values serde_json skipped have no depth limit.
            format!(r#"{{"spec":{{"object":{{"a":{deep}}}}},"colour":{deep}}}"#),
        ] {
            if let Err(disagreement) = differential::check(body.as_bytes()) {
                panic!("{levels} levels: {disagreement}");
            }
        }
    }
}
