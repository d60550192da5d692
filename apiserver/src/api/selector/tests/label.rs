//! Which labels a label selector matches.

use super::{LabelSelector, labels, sel};

#[test]
fn empty_label_selector_selects_everything() {
    for s in ["", " ", "\t\r\n "] {
        let selector = sel(s);
        assert!(selector.is_empty());
        assert!(selector.matches(&labels(&[])));
        assert!(selector.matches(&labels(&[("a", "b")])));
    }
    assert!(LabelSelector::default().is_empty());
    assert!(!sel("a").is_empty());
}

#[test]
fn equality() {
    for s in ["a=b", "a==b", " a = b ", "a\t==\nb"] {
        let selector = sel(s);
        assert!(selector.matches(&labels(&[("a", "b")])), "{s}");
        assert!(selector.matches(&labels(&[("a", "b"), ("c", "d")])), "{s}");
        assert!(!selector.matches(&labels(&[("a", "c")])), "{s}");
        assert!(!selector.matches(&labels(&[])), "{s}");
    }
    assert_eq!(sel("a=b"), sel("a==b"));
}

#[test]
fn inequality_matches_absent_key() {
    let selector = sel("a!=b");
    assert!(!selector.matches(&labels(&[("a", "b")])));
    assert!(selector.matches(&labels(&[("a", "c")])));
    assert!(selector.matches(&labels(&[])));
}

#[test]
fn missing_exact_value_is_the_empty_value() {
    let selector = sel("a=");
    assert!(selector.matches(&labels(&[("a", "")])));
    assert!(!selector.matches(&labels(&[("a", "x")])));
    assert!(!selector.matches(&labels(&[])));
    let selector = sel("a!=,b");
    assert!(selector.matches(&labels(&[("a", "x"), ("b", "")])));
    assert!(!selector.matches(&labels(&[("a", ""), ("b", "")])));
}

#[test]
fn set_based() {
    let selector = sel("env in (prod, staging)");
    assert!(selector.matches(&labels(&[("env", "prod")])));
    assert!(selector.matches(&labels(&[("env", "staging")])));
    assert!(!selector.matches(&labels(&[("env", "dev")])));
    assert!(!selector.matches(&labels(&[])));

    let selector = sel("env notin (prod)");
    assert!(!selector.matches(&labels(&[("env", "prod")])));
    assert!(selector.matches(&labels(&[("env", "dev")])));
    assert!(selector.matches(&labels(&[])));

    assert_eq!(sel("a in(x,y)"), sel("a in (y , x)"));
    assert_eq!(sel("a in (x)"), sel("a=x"));
    assert_eq!(sel("a notin (x)"), sel("a!=x"));
    assert_eq!(sel("a in (x,x)"), sel("a in (x)"));
}

#[test]
fn empty_list_elements_are_the_empty_value() {
    for s in ["a in (x,)", "a in (,x)", "a in (x,,)", "a in (x,,x)"] {
        let selector = sel(s);
        assert!(selector.matches(&labels(&[("a", "x")])), "{s}");
        assert!(selector.matches(&labels(&[("a", "")])), "{s}");
        assert!(!selector.matches(&labels(&[("a", "y")])), "{s}");
    }
    assert_eq!(sel("a in (,)"), sel("a="));
}

#[test]
fn existence() {
    let selector = sel("a");
    assert!(selector.matches(&labels(&[("a", "")])));
    assert!(!selector.matches(&labels(&[("b", "")])));

    let selector = sel("!a");
    assert!(!selector.matches(&labels(&[("a", "")])));
    assert!(selector.matches(&labels(&[("b", "")])));
    assert_eq!(sel(" ! a "), selector);
}

#[test]
fn terms_are_anded() {
    let selector = sel("tier=db, env in (prod,staging), !legacy, owner, ver notin (1)");
    let base = [("tier", "db"), ("env", "prod"), ("owner", "x")];
    assert!(selector.matches(&labels(&base)));
    assert!(selector.matches(&labels(&[("ver", "2"), base[0], base[1], base[2]])));
    assert!(!selector.matches(&labels(&[("ver", "1"), base[0], base[1], base[2]])));
    assert!(!selector.matches(&labels(&[("legacy", ""), base[0], base[1], base[2]])));
    assert!(!selector.matches(&labels(&base[..2])));
    assert!(!selector.matches(&labels(&[("tier", "web"), base[1], base[2]])));
    assert!(sel("a=b,c!=d,e").matches(&labels(&[("a", "b"), ("e", "f")])));
}

#[test]
fn term_order_does_not_matter() {
    assert_eq!(sel("b=2,a=1,!c"), sel("!c,a=1,b=2"));
}

#[test]
fn keywords_are_identifiers_outside_operator_position() {
    let selector = sel("in in (in, notin)");
    assert!(selector.matches(&labels(&[("in", "notin")])));
    assert!(!selector.matches(&labels(&[("in", "x")])));
    assert!(sel("notin=in").matches(&labels(&[("notin", "in")])));
    assert!(sel("notin").matches(&labels(&[("notin", "")])));
    assert!(sel("!in").matches(&labels(&[])));
    assert!(sel("a notin (notin)").matches(&labels(&[("a", "in")])));
}

#[test]
fn prefixed_keys_and_valid_values() {
    let selector = sel("app.kubernetes.io/name=Postgre_SQL-1.2");
    assert!(selector.matches(&labels(&[("app.kubernetes.io/name", "Postgre_SQL-1.2")])));
    assert!(
        sel(&format!("{}={}", "k".repeat(63), "v".repeat(63))).matches(&labels(&[(
            "k".repeat(63).as_str(),
            "v".repeat(63).as_str()
        )]))
    );
}

#[test]
fn greater_and_less_than() {
    let gt = sel("replicas>3");
    assert!(gt.matches(&labels(&[("replicas", "4")])));
    assert!(!gt.matches(&labels(&[("replicas", "3")])));
    assert!(!gt.matches(&labels(&[("replicas", "-7")])));
    assert!(!gt.matches(&labels(&[("replicas", "many")])));
    assert!(!gt.matches(&labels(&[("replicas", "")])));
    assert!(!gt.matches(&labels(&[("replicas", "99999999999999999999")])));
    assert!(!gt.matches(&labels(&[])));
    assert!(gt.matches(&labels(&[("replicas", "+10")])));

    let lt = sel("replicas < 10");
    assert!(lt.matches(&labels(&[("replicas", "9")])));
    assert!(lt.matches(&labels(&[("replicas", "-9")])));
    assert!(!lt.matches(&labels(&[("replicas", "10")])));
    assert!(!lt.matches(&labels(&[])));

    assert!(sel("a>0,a<2").matches(&labels(&[("a", "1")])));
    assert!(sel(&format!("a<{}", i64::MAX)).matches(&labels(&[("a", "0")])));
}
