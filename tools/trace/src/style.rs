//! Terminal colour: on for a terminal unless `NO_COLOR` is set (<https://no-color.org>), or
//! forced with `--color always|never`.

use std::io::Write;

use anstyle::{AnsiColor, Style};

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorChoice {
    /// Colour when the output is a terminal and `NO_COLOR` is unset or empty.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl ColorChoice {
    /// Decides, given whether the output is a terminal.
    pub fn enabled(self, is_terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
                let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
                is_terminal && !no_color && !dumb
            }
        }
    }
}

/// What a piece of text is, for colouring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Connection setup messages (REQ, REP, RTU).
    Setup,
    /// Teardown (DREQ, DREP).
    Teardown,
    /// REJ, bad ICRC, timeouts.
    Bad,
    /// MRA, retransmissions.
    Warn,
    /// Frame numbers, times, secondary details.
    Dim,
    /// Headings.
    Head,
    /// Other CM messages (SIDR, LAP, APR, CPI).
    Other,
}

impl Role {
    fn style(self) -> Style {
        let fg = |c: AnsiColor| Style::new().fg_color(Some(c.into()));
        match self {
            Role::Setup => fg(AnsiColor::Green).bold(),
            Role::Teardown => fg(AnsiColor::Blue).bold(),
            Role::Bad => fg(AnsiColor::Red).bold(),
            Role::Warn => fg(AnsiColor::Yellow).bold(),
            Role::Dim => Style::new().dimmed(),
            Role::Head => Style::new().bold(),
            Role::Other => fg(AnsiColor::Cyan).bold(),
        }
    }
}

/// Colour on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Palette {
    /// Whether to emit ANSI escapes.
    pub on: bool,
}

impl Palette {
    /// Writes `text` in `role`'s style.
    pub(crate) fn paint(&self, out: &mut Vec<u8>, role: Role, text: &str) {
        if self.on {
            let s = role.style();
            let _ = write!(out, "{}{text}{}", s.render(), s.render_reset());
        } else {
            out.extend_from_slice(text.as_bytes());
        }
    }

    /// Starts `role`'s style (pair with [`Palette::end`]).
    pub(crate) fn start(&self, out: &mut Vec<u8>, role: Role) {
        if self.on {
            let _ = write!(out, "{}", role.style().render());
        }
    }

    /// Ends a style started with [`Palette::start`].
    pub(crate) fn end(&self, out: &mut Vec<u8>, role: Role) {
        if self.on {
            let _ = write!(out, "{}", role.style().render_reset());
        }
    }
}

/// The colour role of a CM message.
pub(crate) fn msg_role(attr: ibcm_mad::AttrId) -> Role {
    use ibcm_mad::AttrId;
    match attr {
        AttrId::Req | AttrId::Rep | AttrId::Rtu => Role::Setup,
        AttrId::Dreq | AttrId::Drep => Role::Teardown,
        AttrId::Rej => Role::Bad,
        AttrId::Mra => Role::Warn,
        _ => Role::Other,
    }
}
