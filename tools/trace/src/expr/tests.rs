use super::*;

fn err(s: &str) -> ExprError {
    s.parse::<FilterExpr>().unwrap_err()
}

fn node(s: &str) -> Node {
    s.parse::<FilterExpr>().unwrap().node
}

#[test]
fn precedence_not_and_or() {
    // a || b && !c  ==  a || (b && (!c))
    let n = node("retrans || msg == REQ && !dup");
    let Node::Or(v) = n else { panic!("{n:?}") };
    assert_eq!(v.len(), 2);
    assert!(matches!(&v[1], Node::And(a) if matches!(a[1], Node::Not(_))));
    // Keywords and symbols are the same.
    assert_eq!(
        node("not retrans and (msg == rej or msg == mra)"),
        node("!retrans && (msg == rej || msg == mra)")
    );
}

#[test]
fn values_take_their_field_kind() {
    assert!(matches!(
        node("sid == 0x0000000001061144"),
        Node::Cmp(Cmp {
            val: Val::Num(0x0106_1144),
            ..
        })
    ));
    assert!(
        matches!(node("msg == Req"), Node::Cmp(Cmp { val: Val::Str(ref s), .. }) if s == "req")
    );
    assert!(matches!(
        node("rej.name == \"consumer defined\""),
        Node::Cmp(_)
    ));
    assert!(matches!(
        node("src == fe80::1"),
        Node::Cmp(Cmp {
            val: Val::Addr(_),
            ..
        })
    ));
    assert!(matches!(
        node("dst == lid:5"),
        Node::Cmp(Cmp {
            val: Val::Addr(_),
            ..
        })
    ));
}

#[test]
fn errors_say_what_and_where() {
    let e = err("rej.reasn == 26");
    assert_eq!(e.at, 0);
    assert!(e.msg.contains("unknown field `rej.reasn`"), "{e}");
    let e = err("rej.reason == 26 && sid.port == x4420");
    assert_eq!(e.at, 32);
    assert!(e.msg.contains("is a number"), "{e}");
    let e = err("(msg == REQ");
    assert_eq!(e.at, 11);
    assert!(e.msg.contains("missing `)`"), "{e}");
    let e = err("msg == REQ)");
    assert_eq!(e.at, 10);
    assert!(e.msg.contains("unmatched"), "{e}");
    let e = err("msg < REQ");
    assert!(e.msg.contains("compares numbers"), "{e}");
    let e = err("msg ==");
    assert!(e.msg.contains("expected a value"), "{e}");
    let e = err("retrans &&");
    assert_eq!(e.at, 10);
    let e = err("== 3");
    assert_eq!(e.at, 0);
    let e = err("rej.name == \"open");
    assert!(e.msg.contains("unterminated"), "{e}");
    assert!(err("  ").msg.contains("empty"));
    // The caret sits under the column.
    let shown = err("msg == REQ && bogus").to_string();
    assert_eq!(
        shown,
        "column 15: unknown field `bogus` (the fields: cm-trace --help-fields)\n  msg == REQ && bogus\n                ^"
    );
}

#[test]
fn every_field_parses_and_has_a_kind() {
    for (name, kind, doc) in field_table() {
        assert!(!doc.is_empty());
        let v = match kind {
            "a number" => "1",
            "a name" => "x",
            "a flag" => "true",
            _ => "10.0.0.1",
        };
        let e = format!("{name} == {v}");
        assert!(e.parse::<FilterExpr>().is_ok(), "{e}");
        assert!(name.parse::<FilterExpr>().is_ok(), "{name}");
    }
}
