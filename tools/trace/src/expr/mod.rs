//! `-Y EXPR`: a field filter expression over the CM messages.
//!
//! ```text
//! cm-trace -Y 'rej.reason == 28 && sid.port == 4420' capture.pcap
//! cm-trace -Y 'msg == REQ && !(mtu >= 4096) || retrans' capture.pcap
//! cm-trace -Y 'addr == 10.0.0.1 and (msg == DREQ or msg == DREP)' capture.pcap
//! ```
//! Grammar (`parse.rs`): comparisons `FIELD OP VALUE` with `==`, `!=`, `<`, `>`, `<=`, `>=`
//! (the order comparisons only on numbers), a bare `FIELD` (true when the message has it, and
//! for a flag when it is set), `!` / `not`, `&&` / `and`, `||` / `or` (`!` binds tightest,
//! then `&&`), parentheses. Numbers are decimal or `0x` hex; names compare without regard to
//! case and may be quoted (`rej.name == "consumer defined"`); addresses are IP addresses, GIDs
//! in IPv6 notation or `lid:N` (an IPv4 address also matches its IPv4-mapped GID). A
//! comparison on a field the message does not have is false. The fields are in `fields.rs`
//! ([`field_table`]).
//!
//! In the per-MAD views the expression selects messages; in the connection views
//! (`--ladder`, `--stats`, `--timeline`) it keeps the connections with at least one message
//! that matches.

mod fields;
mod parse;

use std::fmt;

use crate::conn::Note;
use crate::operand::AddrMatch;
use crate::trace::CmEvent;

use fields::{get, Field, Got};

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Eq,
    Ne,
    Lt,
    Gt,
    Le,
    Ge,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Gt => ">",
            Op::Le => "<=",
            Op::Ge => ">=",
        }
    }
}

/// A literal of a comparison, already of its field's kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val {
    Num(u64),
    /// Lower-case.
    Str(String),
    Bool(bool),
    Addr(AddrMatch),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cmp {
    field: Field,
    op: Op,
    val: Val,
}

/// The expression tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Or(Vec<Node>),
    And(Vec<Node>),
    Not(Box<Node>),
    Cmp(Cmp),
    /// A bare field.
    Test(Field),
}

/// A parsed `-Y` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterExpr {
    src: String,
    node: Node,
}

/// An error in a `-Y` expression: what is wrong and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExprError {
    /// The expression.
    pub expr: String,
    /// Byte offset of the problem in the expression.
    pub at: usize,
    /// What is wrong.
    pub msg: String,
}

impl fmt::Display for ExprError {
    /// `column N: message`, then the expression and a caret under the column.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let col = self
            .expr
            .get(..self.at)
            .map_or(self.at, |s| s.chars().count());
        writeln!(f, "column {}: {}", col + 1, self.msg)?;
        writeln!(f, "  {}", self.expr)?;
        write!(f, "  {}^", " ".repeat(col))
    }
}

impl std::error::Error for ExprError {}

impl std::str::FromStr for FilterExpr {
    type Err = ExprError;

    fn from_str(s: &str) -> Result<Self, ExprError> {
        parse::parse(s)
            .map(|node| FilterExpr {
                src: s.to_string(),
                node,
            })
            .map_err(|e| ExprError {
                expr: s.to_string(),
                at: e.at,
                msg: e.msg,
            })
    }
}

impl fmt::Display for FilterExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.src)
    }
}

/// The fields of the grammar: (name, kind, meaning), for the documentation and `--help`.
pub fn field_table() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    fields::TABLE
        .iter()
        .map(|&(name, _, kind, doc)| (name, kind.what(), doc))
}

fn cmp_num(op: Op, a: u64, b: u64) -> bool {
    match op {
        Op::Eq => a == b,
        Op::Ne => a != b,
        Op::Lt => a < b,
        Op::Gt => a > b,
        Op::Le => a <= b,
        Op::Ge => a >= b,
    }
}

fn eval_cmp(c: &Cmp, ev: &CmEvent, note: &Note) -> bool {
    let Some(got) = get(c.field, ev, note) else {
        return false;
    };
    let eq = match (&c.val, got) {
        (Val::Num(v), Got::Num(g)) => return cmp_num(c.op, g, *v),
        (Val::Str(v), Got::Str(g)) => g.eq_ignore_ascii_case(v),
        (Val::Bool(v), Got::Bool(g)) => g == *v,
        (Val::Addr(a), Got::Addr(g)) => a.matches(&g),
        (Val::Addr(a), Got::Addrs(x, y)) => {
            // `addr != X`: neither end is X.
            let any = a.matches(&x) || a.matches(&y);
            return if c.op == Op::Ne { !any } else { any };
        }
        _ => return false,
    };
    if c.op == Op::Ne {
        !eq
    } else {
        eq
    }
}

fn eval(n: &Node, ev: &CmEvent, note: &Note) -> bool {
    match n {
        Node::Or(v) => v.iter().any(|n| eval(n, ev, note)),
        Node::And(v) => v.iter().all(|n| eval(n, ev, note)),
        Node::Not(n) => !eval(n, ev, note),
        Node::Cmp(c) => eval_cmp(c, ev, note),
        Node::Test(f) => match get(*f, ev, note) {
            Some(Got::Bool(b)) => b,
            Some(_) => true,
            None => false,
        },
    }
}

impl FilterExpr {
    /// Whether a message (with its tracking note) matches.
    pub(crate) fn matches(&self, ev: &CmEvent, note: &Note) -> bool {
        eval(&self.node, ev, note)
    }
}

#[cfg(test)]
mod tests;
