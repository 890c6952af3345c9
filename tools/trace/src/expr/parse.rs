//! The `-Y` grammar, parsed with nom (tokens) by recursive descent (precedence):
//!
//! ```text
//! expr    := and ( ("||" | "or") and )*
//! and     := unary ( ("&&" | "and") unary )*
//! unary   := ("!" | "not") unary | primary
//! primary := "(" expr ")" | FIELD [ OP VALUE ]
//! OP      := "==" | "!=" | "<=" | ">=" | "<" | ">"
//! VALUE   := "quoted string" | a word: letters, digits, and . _ : - /
//! FIELD   := a word (see the field table in `fields.rs`)
//! ```
//! Each error carries its byte position in the expression.

use nom::branch::alt;
use nom::bytes::complete::{tag, take_while, take_while1};
use nom::character::complete::{char, multispace0};
use nom::combinator::value;
use nom::sequence::delimited;
use nom::{IResult, Parser};

use super::fields::{self, Field, Kind};
use super::{Cmp, Node, Op, Val};

/// A parse error: the message and the byte offset it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fail {
    pub(crate) at: usize,
    pub(crate) msg: String,
}

struct P<'a> {
    full: &'a str,
}

type R<'a, T> = Result<(&'a str, T), Fail>;

fn ws(s: &str) -> &str {
    let r: IResult<&str, &str> = multispace0(s);
    r.map_or(s, |(rest, _)| rest)
}

fn word(s: &str) -> IResult<&str, &str> {
    take_while1(|c: char| c.is_ascii_alphanumeric() || "._:-/".contains(c)).parse(s)
}

fn quoted(s: &str) -> IResult<&str, &str> {
    delimited(char('"'), take_while(|c: char| c != '"'), char('"')).parse(s)
}

fn op(s: &str) -> IResult<&str, Op> {
    alt((
        value(Op::Eq, tag("==")),
        value(Op::Ne, tag("!=")),
        value(Op::Le, tag("<=")),
        value(Op::Ge, tag(">=")),
        value(Op::Lt, tag("<")),
        value(Op::Gt, tag(">")),
    ))
    .parse(s)
}

/// A keyword operator (`and`, `or`, `not`) followed by something that is not part of a word.
fn keyword<'a>(s: &'a str, kw: &str) -> Option<&'a str> {
    let rest = s.strip_prefix(kw)?;
    match rest.chars().next() {
        Some(c) if c.is_ascii_alphanumeric() || "._:-/".contains(c) => None,
        _ => Some(rest),
    }
}

impl<'a> P<'a> {
    fn at(&self, s: &str) -> usize {
        self.full.len() - s.len()
    }

    fn fail<T>(&self, s: &str, msg: impl Into<String>) -> Result<T, Fail> {
        Err(Fail {
            at: self.at(s),
            msg: msg.into(),
        })
    }

    fn expr(&self, s: &'a str) -> R<'a, Node> {
        let (mut s, first) = self.and(s)?;
        let mut alts = vec![first];
        loop {
            let t = ws(s);
            let rest = match t.strip_prefix("||").or_else(|| keyword(t, "or")) {
                Some(r) => r,
                None => break,
            };
            let (r, n) = self.and(rest)?;
            alts.push(n);
            s = r;
        }
        Ok((
            s,
            if alts.len() == 1 {
                alts.remove(0)
            } else {
                Node::Or(alts)
            },
        ))
    }

    fn and(&self, s: &'a str) -> R<'a, Node> {
        let (mut s, first) = self.unary(s)?;
        let mut all = vec![first];
        loop {
            let t = ws(s);
            let rest = match t.strip_prefix("&&").or_else(|| keyword(t, "and")) {
                Some(r) => r,
                None => break,
            };
            let (r, n) = self.unary(rest)?;
            all.push(n);
            s = r;
        }
        Ok((
            s,
            if all.len() == 1 {
                all.remove(0)
            } else {
                Node::And(all)
            },
        ))
    }

    fn unary(&self, s: &'a str) -> R<'a, Node> {
        let s = ws(s);
        if let Some(rest) = s
            .strip_prefix('!')
            .filter(|r| !r.starts_with('='))
            .or_else(|| keyword(s, "not"))
        {
            let (r, n) = self.unary(rest)?;
            return Ok((r, Node::Not(Box::new(n))));
        }
        self.primary(s)
    }

    fn primary(&self, s: &'a str) -> R<'a, Node> {
        if let Some(rest) = s.strip_prefix('(') {
            let (r, n) = self.expr(rest)?;
            let r = ws(r);
            return match r.strip_prefix(')') {
                Some(r) => Ok((r, n)),
                None if r.is_empty() => self.fail(r, "missing `)`"),
                None => self.fail(r, "expected `)`, `&&` or `||`"),
            };
        }
        let Ok((rest, name)) = word(s) else {
            return if s.is_empty() {
                self.fail(s, "expected a field name at the end of the expression")
            } else {
                self.fail(s, "expected a field name, `!` or `(`")
            };
        };
        let Some(field) = fields::lookup(name) else {
            return self.fail(
                s,
                format!("unknown field `{name}` (the fields: cm-trace --help-fields)"),
            );
        };
        let t = ws(rest);
        let Ok((after_op, op)) = op(t) else {
            // A bare field: true when present and (for a flag) set.
            return Ok((rest, Node::Test(field)));
        };
        let v = ws(after_op);
        let (after, text) = match quoted(v).or_else(|_| word(v)) {
            Ok(x) => x,
            Err(_) if v.starts_with('"') => return self.fail(v, "unterminated string"),
            Err(_) => return self.fail(v, format!("expected a value after `{}`", op.as_str())),
        };
        let val = self.value(v, field, op, text)?;
        Ok((after, Node::Cmp(Cmp { field, op, val })))
    }

    /// Reads `text` as a value of `field`'s kind.
    fn value(&self, at: &str, field: Field, op: Op, text: &str) -> Result<Val, Fail> {
        let kind = field.kind();
        if !matches!(op, Op::Eq | Op::Ne) && kind != Kind::Num {
            return self.fail(
                at,
                format!(
                    "`{}` compares numbers; `{}` is {}",
                    op.as_str(),
                    field.name(),
                    kind.what()
                ),
            );
        }
        match kind {
            Kind::Num => match crate::operand::parse_u64(text) {
                Some(n) => Ok(Val::Num(n)),
                None => self.fail(
                    at,
                    format!("`{}` is a number; `{text}` is not", field.name()),
                ),
            },
            Kind::Bool => match text {
                "true" | "1" => Ok(Val::Bool(true)),
                "false" | "0" => Ok(Val::Bool(false)),
                _ => self.fail(at, format!("`{}` is true or false", field.name())),
            },
            Kind::Str => Ok(Val::Str(text.to_ascii_lowercase())),
            Kind::Addr => match text.parse() {
                Ok(a) => Ok(Val::Addr(a)),
                Err(e) => self.fail(at, format!("`{}` is an address: {e}", field.name())),
            },
        }
    }
}

/// Parses a whole expression.
pub(crate) fn parse(src: &str) -> Result<Node, Fail> {
    let p = P { full: src };
    if src.trim().is_empty() {
        return p.fail(src, "empty expression");
    }
    let (rest, node) = p.expr(src)?;
    let rest = ws(rest);
    if !rest.is_empty() {
        let what = if rest.starts_with(')') {
            "unmatched `)`"
        } else if op(rest).is_ok() {
            "a comparison needs a field on its left"
        } else {
            "expected `&&`, `||` or the end of the expression"
        };
        return p.fail(rest, what);
    }
    Ok(node)
}
